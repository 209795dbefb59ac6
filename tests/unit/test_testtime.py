"""harness test-time: where a run's time went (JUnit + the plugin's properties) and the steps against their budget."""

import json
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
    # A host twice as slow (its probe takes twice as long) gets twice the budget; a faster one keeps it.
    slow_host = testtime.judge([testtime.Step("quick", 100, 0, probe_s=0.2)], budgets)[0]
    fast_host = testtime.judge([testtime.Step("quick", 61, 0, probe_s=0.05)], budgets)[0]
    assert (slow_host.over, slow_host.limit_s, fast_host.over) == (False, pytest.approx(120), True)
    assert testtime.judge([testtime.Step("docs", 1e6, 0)], budgets)[0].over is False  # no budget: no verdict


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


def test_the_probe_is_a_positive_time():
    assert 0 < testtime.probe_host(1) < 60


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
    (tmp_path / "budget.toml").write_text(BUDGET)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml", "run.xml",
                           "--time-budget", "quick", "--time-budget-file", "budget.toml", "test_run.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {t.nodeid.split("::")[-1]: t for t in testtime.read_junit(tmp_path / "run.xml")}
    assert {n: (t.markers, t.tf_processes) for n, t in found.items()} == {
        "test_starts_tensorflow": ((), 1), "test_starts_plain_python": ((), 0), "test_marked": (("timing",), 0)}
    assert "harness: quick loop: " in done.stdout
    assert " s of its 40 s budget (budget.toml, [steps.quick])" in done.stdout
