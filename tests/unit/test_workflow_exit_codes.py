"""The workflow steps that read harness' exit statuses, run for real: each step's own bash script (as the runner
runs it, ``bash -e {0}``) against a stand-in ``harness`` that exits with each status in turn.

The convention (harness.errors): 1 a negative verdict, 2 bad input, 3 no verdict (a benchmark or asv that failed,
an internal error). A step must never read 3 as a slow-down or a regression found, nor as a pass.
Harness' own workflows and the reusable ones ``harness init --reusable`` calls (whose inline form
tests/unit/test_adopt_ci.py holds to the same steps) are checked.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"

# (workflow file, job, step name)
GATES = [("bench.yml", "bench", "harness bench-compare"),
         ("reusable-bench-gate.yml", "bench", "harness bench-compare")]
HISTORY = [("publish.yml", "bench", "find regressions"), ("reusable-nightly.yml", "bench", "find regressions")]
CONFIRM = [("publish.yml", "bench", "confirm new regressions"),
           ("reusable-nightly.yml", "bench", "confirm new regressions")]
# The confirm step picks its regressions with jq (as the runners' images carry it; scripts/dev-env.sh installs it):
# without jq it would read every report as "nothing to confirm" and these tests would pass for the wrong reason.
needs_jq = pytest.mark.skipif(shutil.which("jq") is None,
                              reason="jq is not installed: the nightly's confirm step is jq over JSON")


def _script(file: str, job: str, name: str) -> str:
    steps = yaml.safe_load((WORKFLOWS / file).read_text())["jobs"][job]["steps"]
    step = next(s for s in steps if s.get("name") == name)
    assert "${{" not in step["run"], "the script reads its inputs from env, as zizmor asks"
    return step["run"]


def _run(tmp_path: Path, script: str, status: int, answer: str = '{"regressions": []}') -> subprocess.CompletedProcess:
    """``script`` under ``bash -e`` with a ``harness`` (and ``python -m harness``) that writes a summary, prints
    ``answer`` and exits ``status``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "harness"
    fake.write_text("#!/bin/bash\n"
                    'while [ $# -gt 0 ]; do if [ "$1" = --markdown ]; then echo "### summary" > "$2"; fi; shift; done\n'
                    f"echo '{answer}'\nexit {status}\n")
    fake.chmod(0o755)
    python = bin_dir / "python"
    python.write_text('#!/bin/bash\nif [ "$1 $2" = "-m harness" ]; then shift 2; exec harness "$@"; fi\nexit 127\n')
    python.chmod(0o755)
    (tmp_path / "summary").write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUNNER_TEMP": str(tmp_path / "runner"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"), "BASE_REF": "main", "BENCH_MODE": "existing",
           "ASV_MACHINE": "ci", "PR_NUMBER": "7", "BENCH": "", "INSTALL_COMMAND": "", "BENCH_ARGS": "",
           "SINCE_DAYS": "7", "SINCE": "2025-01-01", "GITHUB_ENV": str(tmp_path / "github-env")}
    (tmp_path / "runner").mkdir(exist_ok=True)
    (tmp_path / "step.sh").write_text(script)
    return subprocess.run(["bash", "-e", str(tmp_path / "step.sh")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("file", "job", "name"), GATES)
@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_the_gate_step_fails_with_harness_status_and_names_no_verdict_as_such(tmp_path, file, job, name, status):
    done = _run(tmp_path, _script(file, job, name), status)
    said = done.stdout + done.stderr
    assert done.returncode == status, said
    if status == 1:
        assert "::error::a benchmark is significantly slower" in said
    else:
        assert "slower" not in said, said  # a crash or bad input is never read as a slow-down
    if status >= 2:
        assert "::error::no verdict" in said, said
    if status == 3:
        assert "infrastructure error" in said and "not a slow-down" in said
    if status == 0:
        assert "::error::" not in said


_INCONCLUSIVE = '{\n  "status": 3,\n  "outcome": "inconclusive"\n}'  # as harness bench-compare --json writes it


@pytest.mark.parametrize(("file", "job", "name"), GATES)
@pytest.mark.parametrize("status", [0, 3])
def test_the_gate_step_tells_inconclusive_from_an_infrastructure_error(tmp_path, file, job, name, status):
    """3 with the JSON's outcome "inconclusive": said as such (what resolves it), never as an infrastructure error
    nor a slow-down; 0 with it (--inconclusive warn): a warning, the step passes."""
    done = _run(tmp_path, _script(file, job, name), status, _INCONCLUSIVE)
    said = done.stdout + done.stderr
    assert done.returncode == status, said
    assert "slower" not in said and "infrastructure error" not in said, said
    if status == 3:
        assert "::error::inconclusive, not a slow-down" in said and "--pair-budget" in said, said
    else:
        assert "::warning::inconclusive" in said and "::error::" not in said, said


@pytest.mark.parametrize(("file", "job", "name"), HISTORY)
@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_the_regressions_step_goes_on_with_a_verdict_and_stops_without_one(tmp_path, file, job, name, status):
    done = _run(tmp_path, _script(file, job, name), status)
    said = done.stdout + done.stderr
    if status <= 1:  # 1: regressions found: the JSON says which to report (`alert`), the confirm step adds it
        assert done.returncode == 0 and "::error::" not in said, said
        assert (tmp_path / "runner" / "regressions" / "summary.md").read_text() == "### summary\n"
    else:
        assert done.returncode == status, said
        assert "::error::no verdict: harness regressions could not read the history" in said
        assert "no regression" in said
    assert (tmp_path / "summary").read_text() == ""  # the job's summary is the confirm step's


_ALERT = '{"regressions": [{"alert": true}]}'


@needs_jq
@pytest.mark.parametrize(("file", "job", "name"), CONFIRM)
@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_the_confirm_step_keeps_a_verdict_and_never_loses_the_night(tmp_path, file, job, name, status):
    """``--confirm``'s 1 (confirmed) and 0 (none confirmed) replace the report; 3 with its JSON (inconclusive, no
    verdict) too, with a warning; 2, or 3 without JSON (a crash), keep the unconfirmed report, saying why. The step
    itself never fails the night: the regressions found are still reported."""
    out = tmp_path / "runner" / "regressions"
    out.mkdir(parents=True)
    (tmp_path / "runner" / "regressions-args").write_text("--results\n.asv/results\n")  # the find step's (reusable)
    (out / "regressions.json").write_text(_ALERT)
    (out / "summary.md").write_text("### unconfirmed\n")
    answer = '{"regressions": [{"alert": true, "confirmation": {}}]}' if status != 2 else "usage"
    done = _run(tmp_path, _script(file, job, name), status, answer)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    kept = status in (0, 1, 3)
    assert (out / "regressions.json").read_text().strip() == (answer if kept else _ALERT)
    assert (tmp_path / "summary").read_text() == ("### summary\n" if kept else "### unconfirmed\n")
    assert ("did not resolve it" in said) == (status == 3)
    assert ("stay unconfirmed" in said) == (status == 2)
    # a crash: exit 3 and no JSON
    (out / "regressions.json").write_text(_ALERT)
    done = _run(tmp_path, _script(file, job, name), 3, "Traceback (most recent call last):")
    assert done.returncode == 0 and "stay unconfirmed" in done.stdout + done.stderr
    assert (out / "regressions.json").read_text() == _ALERT


def _found(tmp_path: Path, report: str) -> Path:
    """The find step's output folder as the confirm step reads it: ``report`` as its JSON, a summary beside it."""
    out = tmp_path / "runner" / "regressions"
    out.mkdir(parents=True)
    (out / "regressions.json").write_text(report)
    (out / "summary.md").write_text("### found\n")
    return out


@needs_jq
@pytest.mark.parametrize(("file", "job", "name"), CONFIRM)
def test_the_confirm_step_measures_nothing_without_an_alert(tmp_path, file, job, name):
    _found(tmp_path, '{"regressions": [{"alert": false}]}')
    done = _run(tmp_path, _script(file, job, name), 1)
    assert done.returncode == 0 and "no new standing regression to confirm" in done.stdout
    assert (tmp_path / "summary").read_text() == "### found\n"


@needs_jq
@pytest.mark.parametrize(("file", "job", "name"), CONFIRM)
def test_the_confirm_step_fails_where_it_cannot_read_the_report(tmp_path, file, job, name):
    """A report that is not JSON, or a runner without jq, fails the step: never "nothing to confirm"."""
    out = _found(tmp_path, "Traceback (most recent call last):\n")
    done = _run(tmp_path, _script(file, job, name), 1)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "no new standing regression to confirm" not in said, said
    (out / "regressions.json").write_text(_ALERT)
    jq = tmp_path / "bin" / "jq"  # the runner's PATH finds this one first: jq as a runner without it answers
    jq.write_text("#!/bin/bash\necho 'jq: command not found' >&2\nexit 127\n")
    jq.chmod(0o755)
    done = _run(tmp_path, _script(file, job, name), 1)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "no new standing regression to confirm" not in said, said
