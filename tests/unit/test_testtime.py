"""harness test-time: where a run's time went (JUnit + the plugin's properties) and the steps against their budget."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from harness.ci import testtime
from harness.cli import main

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="demo.parallel.test_a" name="test_slow[keras3]" time="12.5">
  <properties><property name="markers" value="timing"/><property name="tf_processes" value="2"/></properties>
</testcase>
<testcase classname="demo.parallel.test_a" name="test_fast" time="0.5">
  <properties><property name="markers" value=""/><property name="tf_processes" value="0"/></properties>
</testcase>
<testcase classname="demo.unit.test_b.TestGroup" name="test_failing" time="3.0"><failure message="x"/></testcase>
<testcase classname="demo.unit.test_b" name="test_skipped" time="0.0"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>
"""
BUDGET = """
[host]
probe_s = 0.1
fail_factor = 1.5
total_s = 100

[steps.quick]
seconds = 40
what = "the quick loop"
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "quick.xml").write_text(JUNIT)
    (tmp_path / "budget.toml").write_text(BUDGET)
    return tmp_path


def _steps(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_junit_file_gives_each_tests_time_markers_and_processes(files):
    tests = testtime.read_junit(files / "quick.xml")
    assert [(t.nodeid, t.file, t.outcome, t.markers, t.tf_processes) for t in tests] == [
        ("demo/parallel/test_a.py::test_slow[keras3]", "demo/parallel/test_a.py", "passed", ("timing",), 2),
        ("demo/parallel/test_a.py::test_fast", "demo/parallel/test_a.py", "passed", (), 0),
        ("demo/unit/test_b.py::TestGroup::test_failing", "demo/unit/test_b.py", "failed", (), None),
        ("demo/unit/test_b.py::test_skipped", "demo/unit/test_b.py", "skipped", (), None)]
    report = testtime.step_report("quick", tests, 9.0, top=2)
    assert report.splitlines()[0] == ("quick: 3 tests ran (1 failed, 2 passed, 1 skipped), 16 s of test time in 9 s "
                                      "wall; TensorFlow processes started: 2")
    assert "the 2 slowest tests:" in report and "test_fast" not in report.split("time per file")[0]
    assert "13.0      2   2  demo/parallel/test_a.py" in report  # per file: seconds, tests, TF processes
    assert "12.5      1  timing" in report and "3.5      2  (no marker)" in report


def test_a_step_fails_only_far_beyond_its_budget_scaled_to_the_host(files):
    budgets = testtime.read_budgets(files / "budget.toml")
    at = {wall: testtime.judge([testtime.Step("quick", wall, 0, probe_s=0.1)], budgets)[0] for wall in (59, 61)}
    assert not at[59].over and at[61].over and at[61].limit_s == pytest.approx(60)
    # A host twice as slow (its probe takes twice as long) gets twice the budget.
    slow_host = testtime.judge([testtime.Step("quick", 100, 0, probe_s=0.2)], budgets)[0]
    assert (slow_host.over, slow_host.limit_s) == (False, pytest.approx(120))
    assert testtime.judge([testtime.Step("docs", 1e6, 0)], budgets)[0].over is False  # no budget: no verdict


def test_a_faster_host_lowers_the_budget_so_a_step_that_doubled_fails_there(files):
    """The planted defect: budgets scaled one way (max(1, probe / reference)) keep the reference's 60 s limit on a
    host whose probe says 0.6 x, where the step's 24 s doubled (48 s) would pass."""
    budgets = testtime.read_budgets(files / "budget.toml")
    usual, doubled = (testtime.judge([testtime.Step("quick", wall, 0, probe_s=0.06)], budgets)[0] for wall in (24, 48))
    assert not usual.over and doubled.over
    assert (usual.scale, usual.limit_s) == (pytest.approx(0.6), pytest.approx(36))  # 40 s x 0.6 x 1.5
    # However fast a probe reads, the budget keeps SCALE_FLOOR of itself: 40 s x 0.5 x 1.5 = 30 s.
    floored = testtime.judge([testtime.Step("quick", 29, 0, probe_s=0.001)], budgets)[0]
    assert (floored.scale, floored.limit_s, floored.over) == (testtime.SCALE_FLOOR, pytest.approx(30), False)
    line = testtime.budget_line("quick loop", 48, budgets.steps["quick"], budgets, 0.06)
    assert line == ("quick loop: 48 s, budget 40 s x 0.60 (this host's probe 0.060 s vs reference 0.100 s, 1 worker) "
                    f"= 24 s ({budgets.path}, [steps.quick]); OVER 36 s (1.5 x the scaled budget), where .ci/run fails")
    assert "x 0.50 (the floor; this host's probe 0.001 s" in testtime.budget_line(
        "quick loop", 1, budgets.steps["quick"], budgets, 0.001)
    assert testtime.budget_line("quick loop", 61, budgets.steps["quick"], budgets, None) == (
        f"quick loop: 61 s, budget 40 s unscaled (no probe of this host) ({budgets.path}, [steps.quick]); OVER 60 s "
        "(1.5 x the scaled budget), where .ci/run fails")


def test_a_budget_follows_the_probe_as_far_as_its_exponent_says(files):
    """A suite whose time moves as the square root of the probe's (the quick loop's, between two hosts, moved as its
    0.55th power: .ci/test-budget.toml) keeps one share of its budget on either host with ``probe_exponent = 0.5``;
    the planted defect, the probe followed in proportion (the default, 1), fails it on the faster host and lets it
    double unseen on the slower."""
    (files / "half.toml").write_text(BUDGET.replace("fail_factor", "probe_exponent = 0.5\nfail_factor"))
    half, whole = testtime.read_budgets(files / "half.toml"), testtime.read_budgets(files / "budget.toml")
    assert (half.probe_exponent, whole.probe_exponent) == (0.5, 1.0)

    def over(budgets, wall, probe):
        return testtime.judge([testtime.Step("quick", wall, 0, probe_s=probe)], budgets)[0].over

    for ratio in (0.49, 2.56):  # hosts whose suite takes 0.7 x and 1.6 x the reference's time, their probe that squared
        usual = 45 * ratio ** 0.5  # the step at 45 s on the reference host (its limit: 40 s x 1.5 = 60 s)
        assert not over(half, usual, 0.1 * ratio) and over(half, 2 * usual, 0.1 * ratio)
    assert over(whole, 45 * 0.7, 0.049)  # 31.5 s against 40 x 0.49 x 1.5 = 29.4 s: a red light for the host's speed
    assert not over(whole, 2 * 45 * 1.6, 0.256)  # 144 s, doubled, under 40 x 2.56 x 1.5 = 153.6 s: unseen
    assert testtime.judge([testtime.Step("quick", 1, 0, probe_s=0.049)], half)[0].scale == pytest.approx(0.7)
    assert "x 0.70 (this host's probe 0.049 s vs reference 0.100 s, 1 worker, their ratio to the power 0.5) = 28 s" in (
        testtime.budget_line("quick loop", 20, half.steps["quick"], half, 0.049))
    # The floor holds for the scale, not the probes' ratio: 0.16 ** 0.5 = 0.4 is floored, 0.49 ** 0.5 (above) is not.
    assert "x 0.50 (the floor; " in testtime.budget_line("quick loop", 1, half.steps["quick"], half, 0.016)


def test_a_probe_taken_with_other_workers_than_the_budgets_is_refused(files):
    (files / "b2.toml").write_text(BUDGET.replace("fail_factor", "probe_workers = 2\nfail_factor"))
    budgets = testtime.read_budgets(files / "b2.toml")
    steps = testtime.read_steps(_steps(files / "s.jsonl", {"step": "quick", "wall_s": 50, "status": 0, "probe_s": 0.1,
                                                           "probe_workers": 2}))
    assert (budgets.probe_workers, steps[0].probe_workers, testtime.judge(steps, budgets)[0].over) == (2, 2, False)
    old = testtime.read_steps(_steps(files / "s.jsonl", {"step": "quick", "wall_s": 50, "status": 0, "probe_s": 0.1}))
    with pytest.raises(ValueError, match="step 'quick' was probed in 1 process.* probe_s in 2: not comparable"):
        testtime.judge(old, budgets)


def test_the_command_prints_the_table_and_exits_1_naming_a_step_over_budget(files, capsys):
    steps = _steps(files / "steps.jsonl", {"step": "quick", "wall_s": 70, "status": 0,
                                           "junit": str(files / "quick.xml"), "probe_s": 0.1},
                   {"step": "lint", "wall_s": 5, "status": 0, "junit": str(files / "lint.xml"), "probe_s": 0.1})
    assert main(["test-time", "--steps", str(steps), "--budget", str(files / "budget.toml"), "--table-only"]) == 1
    out = capsys.readouterr().out
    assert "quick      70        40       175%            60     0  OVER" in out
    assert "total: 75 s of 100 s" in out
    assert ("step 'quick' took 70 s, over 60 s (1.5 x its 40 s budget x 1.00 for this host): its slowest tests: "
            "demo/parallel/test_a.py::test_slow[keras3] 12 s") in out
    steps = _steps(files / "steps.jsonl", {"step": "quick", "wall_s": 50, "status": 0, "junit": "", "probe_s": 0.1})
    assert main(["test-time", "--steps", str(steps), "--budget", str(files / "budget.toml")]) == 0


@pytest.mark.parametrize(("text", "message"), [
    ("[host]\nprobe_s = 0\n[steps.quick]\nseconds = 1\n", "probe_s must be a positive number of seconds; got 0"),
    ("[host]\nprobe_s = 1\n[steps.quick]\nseconds = 'a'\n", r"\[steps.quick\] seconds must be a positive .* got 'a'"),
    ("[host]\nprobe_s = 1\n", r"needs a \[host\] table and at least one \[steps.NAME\] table"),
    ("[host\n", "is not TOML"),
    ("[host]\nprobe_s = 1\nfail_factor = 0.5\n[steps.quick]\nseconds = 1\n", "fail_factor must be at least 1"),
    ("[host]\nprobe_s = 1\nprobe_workers = 0\n[steps.quick]\nseconds = 1\n",
     r"\[host\] probe_workers must be a whole number of processes >= 1; got 0"),
    ("[host]\nprobe_s = 1\nprobe_exponent = 1.5\n[steps.quick]\nseconds = 1\n",
     r"\[host\] probe_exponent must be in \(0, 1\] .*; got 1.5"),
    ("[host]\nprobe_s = 1\nprobe_exponent = 0\n[steps.quick]\nseconds = 1\n", r"probe_exponent must be in .*; got 0"),
    ("[host]\nprobe_s = 1\nprobe_exponent = 'a'\n[steps.quick]\nseconds = 1\n", r"probe_exponent .*; got 'a'"),
])
def test_a_bad_budget_file_is_named_and_exits_2(tmp_path, capsys, text, message):
    (tmp_path / "b.toml").write_text(text)
    with pytest.raises(ValueError, match=message):
        testtime.read_budgets(tmp_path / "b.toml")
    steps = _steps(tmp_path / "s.jsonl", {"step": "quick", "wall_s": 1, "status": 0})
    assert main(["test-time", "--steps", str(steps), "--budget", str(tmp_path / "b.toml")]) == 2
    assert "harness test-time: error: " in capsys.readouterr().err


def test_bad_inputs_exit_2_naming_them(tmp_path, capsys):
    (tmp_path / "s.jsonl").write_text('{"step": "quick"}\n')
    (tmp_path / "x.xml").write_text("<html/>")
    for args, said in ((["--steps", str(tmp_path / "s.jsonl")], "s.jsonl:1: not a step record"),
                       ([str(tmp_path / "x.xml")], "is not a JUnit file: its root element is <html>"),
                       ([str(tmp_path / "none.xml")], "cannot read the JUnit file"),
                       ([], "give JUnit files, or --steps FILE")):
        assert main(["test-time", *args]) == 2
        assert said in capsys.readouterr().err


def test_the_probe_is_a_positive_time_in_one_process_or_several(monkeypatch):
    assert 0 < testtime.probe_host(1) < 60
    assert 0 < testtime.probe_host(1, workers=2) < 60
    with pytest.raises(ValueError, match="probe_host's workers must be a whole number of processes >= 1; got 0"):
        testtime.probe_host(1, workers=0)
    # A probe process that fails is named with its stderr, not waited on.
    # The source of the workload formatted into nothing (!r:.0): the process exits at once.
    monkeypatch.setattr(testtime, "_PROBE_PROCESS", "raise SystemExit('planted: no workload {workload!r:.0}')")
    with pytest.raises(RuntimeError, match="a probe process .* exited with status 1: planted: no workload"):
        testtime.probe_host(1, workers=2)


def test_two_probe_workers_run_their_rounds_at_once():
    """The 2-worker probe measures two processes computing together, as a step's two pytest workers do: in every
    round their spans overlap (on the one monotonic clock of the host), whatever else the host runs. Timed ratios
    (two workers pinned to one CPU against one) measured 2.3-2.6x idle but 1.0x beside CI's two CPU hogs, so the
    claim is checked by the spans, not by speed. The planted defect, workers started one after the other, leaves
    no overlap. About 1 s."""
    from harness.ci import testtime

    rounds = testtime.probe_rounds(2, workers=2)
    assert len(rounds) == 2 and all(len(spans) == 2 for spans in rounds), rounds
    for spans in rounds:
        assert all(end > start for start, end in spans), spans
        assert max(start for start, _ in spans) < min(end for _, end in spans), spans  # both running at once


PLUGIN_RUN = '''
import subprocess, sys

def test_starts_tensorflow():
    subprocess.run([sys.executable, "-c", "import tensorflow, time; time.sleep(1)"], check=True)

def test_starts_plain_python():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(1)"], check=True)

@pytest.mark.timing
def test_marked():
    pass
'''


def test_the_plugin_records_markers_and_the_tensorflow_processes_each_test_started(tmp_path):
    """The planted defects: a watch that misses a child loading TensorFlow, or counts one that does not."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["harness.pytest_plugin"]\n')
    (tmp_path / "test_run.py").write_text("import pytest\n" + textwrap.dedent(PLUGIN_RUN))
    # The reference probe at 2 workers: the plugin probes with 2 processes from a process that loaded TensorFlow.
    (tmp_path / "budget.toml").write_text(BUDGET.replace("fail_factor", "probe_workers = 2\nfail_factor"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml", "run.xml",
                           "--time-budget", "quick", "--time-budget-file", "budget.toml", "test_run.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {t.nodeid.split("::")[-1]: t for t in testtime.read_junit(tmp_path / "run.xml")}
    assert {n: (t.markers, t.tf_processes) for n, t in found.items()} == {
        "test_starts_tensorflow": ((), 1), "test_starts_plain_python": ((), 0), "test_marked": (("timing",), 0)}
    assert "harness: quick loop: " in done.stdout
    assert " s, budget 40 s x " in done.stdout and " s vs reference 0.100 s, 2 workers) = " in done.stdout
    line = next(line for line in done.stdout.splitlines() if line.startswith("harness: quick loop: "))
    assert "s (budget.toml, [steps.quick]) - this host's probe " in line, line
    assert "- this run is a subset" in line and "- this run used 1 worker(s), the step 2" in line, line
    # The scale is the mean of the probes before and after the tests.
    before, after = map(float, re.search(r"probe ([\d.]+) s before the tests, ([\d.]+) s after", line).groups())
    shown = float(re.search(r"this host's probe ([\d.]+) s vs reference", line).group(1))
    assert shown == pytest.approx((before + after) / 2, abs=1.5e-3), line
