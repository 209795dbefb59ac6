"""The nightly tracking steps of publish.yml, run for real on a synthetic history with stand-ins for gh and bisect.

The workflow's own scripts (read from the YAML) run under bash as Actions runs them; ``gh`` is a stand-in
that logs its arguments and answers ``issue list`` with the open issues of the scenario. The
regressions JSON comes from the real ``harness regressions`` on a history written by asv's own code
(tests/ci/asv_history.py), so a change of its fields breaks this test, not the night.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv")
yaml = pytest.importorskip("yaml")
if shutil.which("jq") is None:  # scripts/dev-env.sh installs it where it may (root, apt)
    pytest.skip("jq is not installed: the workflow's report step is jq over JSON", allow_module_level=True)

from asv_history import benchmark, levels, make_repo, write_history  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "github-ubuntu-latest"
_SAMPLES = "throughput.Throughput.track_samples_per_second"
_STEP = "throughput.TrainStep.time_train_step"


def _step(job: str, name: str) -> str:
    workflow = yaml.safe_load((ROOT / ".github/workflows/publish.yml").read_text())
    return next(step["run"] for step in workflow["jobs"][job]["steps"] if step.get("name") == name)


def _bash(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    # GitHub's `run:` default shell on Linux: bash --noprofile --norc -eo pipefail {0}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _stand_in(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    """60 commits, results every third night (20 nights): a 20% slower step at night 7 (commit 19) and a 25%
    samples/s drop at night 14 (commit 40), each in a range of 3 commits; the older step comes before --since
    (commit 28), so it is not new. A level holds 6 nights before the detector calls it one."""
    tmp = tmp_path_factory.mktemp("nightly")
    commits = make_repo(tmp / "repo", 60)
    nights = commits[::3]  # 20 nights
    ratio = benchmark(_SAMPLES, "samples/s", [["'mnist_maxing'"], ["'ratio'"]], ["workload", "split"])
    step = benchmark(_STEP, "seconds")
    series = {_SAMPLES: [[v] for v in levels(20, 0.02, seed=5, step_at=13, step=-0.25, base=2800)],
              _STEP: [[v] for v in levels(20, 0.02, seed=6, step_at=6, step=0.2, base=0.004)]}
    write_history(tmp / "results", nights, [ratio, step], series, machine=MACHINE)
    out = tmp / "regressions"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "harness", "regressions", "--results", str(tmp / "results"),
                           "--since", commits[28], "--json"], cwd=tmp / "repo", capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    (out / "regressions.json").write_text(done.stdout)
    report = json.loads(done.stdout)
    assert [(r["name"], r["new"], r["alert"], r["commits"], r["status"]) for r in report["regressions"]] == [
        (_STEP, False, False, 3, "standing"), (_SAMPLES, True, True, 3, "standing")]
    assert (report["regressions"][1]["last_good"], report["regressions"][1]["first_bad"]) == (commits[36],
                                                                                             commits[39])
    return tmp, commits, report


def test_the_bisect_step_bisects_each_new_regression_of_several_commits(nightly, tmp_path):
    tmp, commits, report = nightly
    runner = tmp_path / "runner"
    (runner / "regressions").mkdir(parents=True)
    (runner / "regressions" / "regressions.json").write_text(json.dumps(report))
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "python", 'printf "%s\\n" "$@" > "$RUNNER_TEMP/harness-args"\necho \'{"status": 0}\'\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUNNER_TEMP": str(runner),
           "ASV_MACHINE": MACHINE}
    done = _bash(_step("bench", "bisect new regressions"), tmp_path, env)
    assert done.returncode == 0, done.stderr
    new = report["regressions"][1]
    args = (runner / "harness-args").read_text().splitlines()
    assert args == ["-m", "harness", "bisect", _SAMPLES, new["last_good"], new["first_bad"],
                    "--params", "'mnist_maxing', 'ratio'", "--mode", "existing", "--machine", MACHINE, "--json"]
    assert json.loads((runner / "regressions" / "bisect-1.json").read_text()) == {"status": 0}
    assert not (runner / "regressions" / "bisect-0.json").exists()  # not new: not bisected


def _report(nightly, tmp_path, open_issues: list[dict]) -> list[list[str]]:
    """Runs the report step; each gh call's arguments."""
    _, commits, report = nightly
    runner = tmp_path / "runner"
    (runner / "regressions").mkdir(parents=True)
    (runner / "regressions" / "regressions.json").write_text(json.dumps(report))
    new = report["regressions"][1]
    bisect = {"status": 0, "runs": 2, "bound": 3, "unit": "samples/s", "first_bad": {
        "commit": commits[commits.index(new["first_bad"]) - 1], "subject": "commit 24", "before": 2790.0,
        "after": 2090.0}}
    (runner / "regressions" / "bisect-1.json").write_text(json.dumps(bisect))
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "gh", 'calls="$RUNNER_TEMP/gh-calls"; mkdir -p "$calls"\n'
                             'printf "%s\\0" "$@" > "$calls/$(printf %03d "$(ls "$calls" | wc -l)")"\n'
                             'if [ "$1 $2" = "issue list" ]; then printf "%s" "$OPEN_ISSUES"; fi\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUNNER_TEMP": str(runner),
           "GH_TOKEN": "t", "GH_REPO": "o/r", "RUN_URL": "https://example.invalid/run/1",
           "OPEN_ISSUES": json.dumps(open_issues)}
    done = _bash(_step("report", "open or update issues"), tmp_path, env)
    assert done.returncode == 0, done.stderr
    return [call.read_text().split("\0")[:-1] for call in sorted((runner / "gh-calls").iterdir())]


def test_the_report_opens_one_issue_per_new_regression_with_the_bisected_commit(nightly, tmp_path):
    _, commits, report = nightly
    calls = _report(nightly, tmp_path, [])
    creates = [c for c in calls if c[:2] == ["issue", "create"]]
    assert len(creates) == 1  # the old regression (before --since) opens nothing
    new = report["regressions"][1]
    title = creates[0][creates[0].index("--title") + 1]
    assert title == f"Benchmark regression: {_SAMPLES} ('mnist_maxing', 'ratio') at {new['first_bad'][:8]}"
    body = creates[0][creates[0].index("--body") + 1]
    assert f"| `{_SAMPLES}` | 'mnist_maxing', 'ratio' | {new['last_good'][:8]}..{new['first_bad'][:8]} (3 commits)" \
        in body
    assert "`harness bisect` (2 runs, bound 3): first bad commit" in body and '"commit 24"' in body
    assert "machine `github-ubuntu-latest`" in body


def test_the_report_comments_on_the_open_issue_of_a_known_regression(nightly, tmp_path):
    _, _, report = nightly
    new = report["regressions"][1]
    title = f"Benchmark regression: {_SAMPLES} ('mnist_maxing', 'ratio') at {new['first_bad'][:8]}"
    calls = _report(nightly, tmp_path, [{"number": 7, "title": "other"}, {"number": 12, "title": title}])
    assert not [c for c in calls if c[:2] == ["issue", "create"]]
    comments = [c for c in calls if c[:2] == ["issue", "comment"]]
    assert len(comments) == 1 and comments[0][2] == "12"


def _confirm_step(nightly, tmp_path, answer: str, status: int) -> tuple[subprocess.CompletedProcess, Path]:
    """Runs the confirm step with a stand-in ``python`` that prints ``answer`` and exits ``status``."""
    _, _, report = nightly
    runner = tmp_path / "runner"
    (runner / "regressions").mkdir(parents=True)
    (runner / "regressions" / "regressions.json").write_text(json.dumps(report))
    (runner / "regressions" / "summary.md").write_text("unconfirmed summary\n")
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "python", 'printf "%s\\n" "$@" > "$RUNNER_TEMP/harness-args"\n'
                                 'for a in "$@"; do if [ "$prev" = --markdown ]; then echo confirmed > "$a"; fi; '
                                 'prev="$a"; done\nprintf "%s" "$ANSWER"\nexit "$STATUS"\n')
    summary = tmp_path / "summary"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUNNER_TEMP": str(runner),
           "ASV_MACHINE": MACHINE, "SINCE": "2025-02-01", "GITHUB_STEP_SUMMARY": str(summary), "ANSWER": answer,
           "STATUS": str(status)}
    return _bash(_step("bench", "confirm new regressions"), tmp_path, env), runner


def test_the_confirm_step_keeps_the_re_measured_report_and_survives_a_crash(nightly, tmp_path):
    _, _, report = nightly
    refuted = json.loads(json.dumps(report))
    refuted["regressions"][1].update(alert=False, confirmation={"verdict": "not confirmed", "method": "asv rounds",
                                                                "ratio": 1.0, "low": 0.99, "high": 1.01})
    done, runner = _confirm_step(nightly, tmp_path / "refuted", json.dumps(refuted), 0)
    assert done.returncode == 0, done.stderr
    args = (runner / "harness-args").read_text().splitlines()
    assert args[:3] == ["-m", "harness", "regressions"] and "--confirm" in args and "2025-02-01" in args
    assert json.loads((runner / "regressions" / "regressions.json").read_text()) == refuted
    assert (runner / "regressions" / "summary.md").read_text() == "confirmed\n"
    # a crash (exit 3, no JSON): the unconfirmed report stays, and the night says why
    done, runner = _confirm_step(nightly, tmp_path / "crashed", "Traceback ...", 3)
    assert done.returncode == 0, done.stderr
    assert json.loads((runner / "regressions" / "regressions.json").read_text()) == report
    assert "stay unconfirmed" in done.stdout
    # inconclusive (exit 3 with its JSON): kept, with a warning
    done, runner = _confirm_step(nightly, tmp_path / "inconclusive", json.dumps(report), 3)
    assert "did not resolve it" in done.stdout


def test_a_regression_its_re_measurement_refuted_opens_no_issue(nightly, tmp_path):
    _, _, report = nightly
    refuted = json.loads(json.dumps(report))
    refuted["regressions"][1].update(alert=False, confirmation={"verdict": "not confirmed", "method": "pairs",
                                                                "ratio": 1.0, "low": 0.99, "high": 1.01, "note": ""})
    confirmed = json.loads(json.dumps(report))
    confirmed["regressions"][1]["confirmation"] = {"verdict": "confirmed", "method": "interleaved pairs",
                                                   "ratio": 1.31, "low": 1.29, "high": 1.33, "note": "40 pairs"}
    assert not [c for c in _report((None, nightly[1], refuted), tmp_path / "a", []) if c[:2] == ["issue", "create"]]
    (create,) = [c for c in _report((None, nightly[1], confirmed), tmp_path / "b", []) if c[:2] == ["issue", "create"]]
    body = create[create.index("--body") + 1]
    assert "Measured again (interleaved pairs): confirmed, 1.31x (1.29-1.33) (40 pairs)." in body
