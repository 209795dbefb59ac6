"""The package stays light: no TensorFlow on import or --help; the CLI's error paths."""

import subprocess
import sys

from harness.cli import main


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout


def test_import_does_not_import_tensorflow():
    out = _run("import sys, harness; harness.split_batch(4, [1, 1]); print('tensorflow' in sys.modules)")
    assert out.strip() == "False"


def test_help_does_not_import_tensorflow():
    code = (
        "import sys, contextlib, io\n"
        "from harness.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['check', '--help'])\n"
        "    except SystemExit: pass\n"
        "print('tensorflow' in sys.modules)"
    )
    assert _run(code).strip() == "False"


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "check" in capsys.readouterr().out


def test_bad_option_values_exit_2_with_one_line(capsys):
    assert main(["check", "--batch-size", "0", "--models", "dense"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size and --samples must be positive; got 0" in err
    assert "Traceback" not in err


def test_unknown_model_is_rejected_by_argparse(capsys):
    assert main(["check", "--models", "nope"]) == 2  # main() returns the code; it never exits itself
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_plugin_markers_are_registered(pytestconfig):
    markers = "\n".join(pytestconfig.getini("markers"))
    for name in ("gpu", "multi_gpu", "slow", "docker", "zoo", "timing", "extended"):
        assert f"{name}:" in markers
    # a single GPU is split, so multi_gpu tests skip only without a GPU
    assert "multi_gpu: runs on the gpu_devices fixture's 2+ GPU devices" in markers
    assert "one GPU split into logical GPUs (skipped without a GPU)" in markers


def test_the_command_freezes_what_is_left_so_the_interpreter_ends_without_a_full_collection():
    # After harness tune the last collection took 0.2-17 s (harness.cli.console);
    # main() alone freezes nothing (a test or a notebook goes on collecting).
    code = (
        "import gc, sys, contextlib, io\n"
        "from harness.cli import console, main\n"
        "sys.argv = ['harness', '--version']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    status = main(['--version'])\n"
        "    after_main = gc.get_freeze_count()\n"
        "    status = console()\n"
        "print(status, after_main, gc.get_freeze_count() > 0)"
    )
    assert _run(code).split() == ["0", "0", "True"]
    done = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip()
