"""Bad command lines fail before TensorFlow starts: one clear line naming the value, exit code 2."""

from __future__ import annotations

import pytest

from harness.cli import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--model", "nope"], "unknown workload 'nope'"),
        (["compare", "--model", "nope"], "unknown workload 'nope'"),
        (["run", "--size", "huge"], "unknown size 'huge'"),
        (["run", "--emulate", "1345,875", "--batches", "820", "568", "100"], "--batches has 3 sizes"),
        (["run", "--logical-cpus", "3", "--batches", "1", "2"], "for 3 devices"),
        (["run", "--emulate", "1345,0"], "rate must be a positive number"),
        (["run", "--emulate", "1345,-5:100"], "got rate=-5.0"),
        (["run", "--emulate", "1345:-1,875"], "MAXBATCH must be an int >= 0; got max_batch=-1"),
        (["run", "--emulate", "fast,875"], "got 'fast'"),
        (["run", "--emulate", "1345:big"], "got 'big'"),
        (["run", "--emulate", "1345,,875"], "RATE[:MAXBATCH[:OVERHEAD_MS]]"),
        (["run", "--seconds", "0"], "--seconds must be > 0; got 0"),
        (["compare", "--seconds", "-1"], "--seconds must be > 0; got -1"),
        (["run", "--windows", "0"], "--windows must be >= 1; got 0"),
        (["run", "--emulate", "1,2", "--method", "single"], "--method single runs on one device; got 2"),
        (["run", "--emulate", "1,2", "--devices", "0", "1"], "drop --devices"),
        (["run", "--emulate", "1,2", "--logical-cpus", "3"], "--emulate has 2 devices but --logical-cpus is 3"),
        (["run", "--batches", "820", "0"], "--batches must be >= 1 each; got [820, 0]"),
        (["run", "--emulate", "1,2", "--ratios", "3", "0"], "ratios"),
        (["compare", "--batch", "0"], "--batch must be >= 1; got 0"),
        (["run", "--rebalance", "0"], "--rebalance must be >= 1 (steps per measurement); got 0"),
        (["run", "--emulate", "1000", "--rebalance", "5"], "--rebalance re-splits the batch over several devices"),
        (["run", "--throttle", "1-400"], "--throttle wants INDEX:RATE@STEP entries such as 1:400@40; got '1-400'"),
        (["run", "--throttle", "1:400"], "got '1:400'"),
        (["run", "--throttle", "1:fast@3"], "--throttle RATE must be a number of samples/s; got 'fast' in '1:fast@3'"),
        (["run", "--throttle", "1:0@3"], "--throttle RATE must be a positive number of samples/s; got '1:0@3'"),
        (["run", "--emulate", "1,2", "--throttle", "2:400@3"], "INDEX must name one of the 2 devices (0..1); got"),
        (["run", "--logical-cpus", "2", "--throttle", "1:400@3"], "--throttle changes an emulated device's rate"),
        (["tune", "--emulate", "1345:1100,875:700", "--global-batch", "1801"],
         "--global-batch 1801 exceeds the emulated devices' memory together (1100+700 = 1800)"),
        (["tune", "--global-batch", "0"], "--global-batch must be >= 1; got 0"),
        (["tune", "--margin", "1"], "--margin must be in [0, 1); got 1"),
        (["tune", "--start-batch", "64", "--max-batch", "32"], "--max-batch must be >= --start-batch (64); got 32"),
        (["tune", "--max-step-s", "0"], "--max-step-s must be > 0; got 0"),
        (["tune", "--tolerance", "1.5"], "--tolerance must be in (0, 1); got 1.5"),
        (["tune", "--emulate", "1345:x"], "MAXBATCH must be an integer; got 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"harness {argv[0]}: error: ")
    assert needle in err


def test_usage_errors_return_2_instead_of_exiting(capsys):
    assert main(["run", "--method", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_help_lists_the_subcommands_and_returns_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("run", "compare", "tune", "check", "env"):
        assert command in out
