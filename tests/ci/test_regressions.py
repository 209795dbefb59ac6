"""``harness regressions`` on synthetic asv histories.

Each history is a real git repository of 50 empty commits (one a day) and real
asv result files for them (tests/ci/asv_history.py writes them with asv's
own ``Results``). Noise is Gaussian, relative to the level, drawn per commit
(the drift between nightly jobs); time_ values also carry 10 samples 0.5% apart
(the noise within one job), from which asv computes its statistics and weights.

Noise levels: 3% for a quiet runner, and 17%, the spread measured on this
2-core box while other test suites ran (``timeit`` of a pure-Python loop in 20
separate processes: 1.4826 * MAD / median = 0.166).

How often the detector finds what it should over many seeds is
tests/ci/test_changepoints.py's (its own seeds) and docs/regressions.md's study;
these tests check what the command reports, on fixed seeds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv")

from harness.ci.asvresults import combos  # noqa: E402
from harness.ci.noise import relative_noise  # noqa: E402
from harness.ci.tracking.history import load_history  # noqa: E402
from harness.ci.tracking.regressions import find_changes, newer_than  # noqa: E402
from harness.cli import main  # noqa: E402


def find_regressions(history, **kwargs):
    return list(find_changes(history, **kwargs).regressions)

sys.path.insert(0, str(Path(__file__).parent))
import asv_history as ah  # noqa: E402

N, STEP_AT = 50, 30  # commit 31 (index 30) is the first bad one; commit 30 (index 29) the last good
TIME = ah.benchmark("throughput.Fit.time_step")
RATE = ah.benchmark("throughput.Fit.track_samples_per_second", unit="samples/s")
GRID = ah.benchmark("throughput.Split.time_epoch", params=[["'even'", "'ratio'"], ["1", "2"]],
                    param_names=["method", "devices"])
QUIET, MEASURED = 0.03, 0.17


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "repo"
    return path, ah.make_repo(path, N)


def _history(tmp_path: Path, commits, noise=QUIET, seed=0, time_step=0.0, rate_step=0.0, order=None,
             edit=None) -> Path:
    """Results of TIME (10 ms) and RATE (1000 samples/s) over ``commits``, steps planted at STEP_AT."""
    time = ah.levels(len(commits), noise, seed, STEP_AT, time_step, base=0.01)
    rate = ah.levels(len(commits), noise, seed + 1000, STEP_AT, rate_step, base=1000.0)
    series = {TIME["name"]: [[v] for v in time], RATE["name"]: [[v] for v in rate]}
    if edit:
        edit(series)
    results = tmp_path / "results"
    ah.write_history(results, commits, [TIME, RATE], series, order=order)
    return results


def test_written_results_read_back_through_asv(tmp_path, repo):
    from asv.results import iter_results_for_machine

    _, commits = repo
    results = _history(tmp_path, commits[:3])
    read = sorted(iter_results_for_machine(str(results), "ci"), key=lambda r: r.date)
    assert [r.commit_hash for r in read] == commits[:3]
    assert read[1].date == ah.commit_date_ms(1)
    value = read[0].get_result_value(TIME["name"], [])[0]
    assert value == pytest.approx(0.01, rel=0.1)
    assert read[0].get_result_stats(TIME["name"], [])[0]["repeat"] == 10  # asv computed its statistics


@pytest.mark.parametrize("bench, kwargs", [(TIME, {"time_step": 0.15}), (RATE, {"rate_step": -0.15})],
                         ids=["time-slower", "samples-per-second-drop"])
def test_planted_15_percent_step_found_at_commit_31_and_nothing_else(tmp_path, repo, bench, kwargs):
    path, commits = repo
    history = load_history(_history(tmp_path, commits, **kwargs), repo=path)
    assert history.commits == tuple(commits)
    found = find_regressions(history)
    assert len(found) == 1, found
    (regression,) = found
    assert regression.name == bench["name"]
    assert regression.likely == commits[STEP_AT]
    # the range that holds the step with 95% odds: commit 31 in it, a few commits at most
    assert commits.index(regression.last_good) <= STEP_AT - 1 < STEP_AT <= commits.index(regression.first_bad)
    assert regression.commits == commits.index(regression.first_bad) - commits.index(regression.last_good) <= 3
    assert regression.status.value == "standing" and regression.fixed_by is None
    assert regression.low < regression.ratio < regression.high
    assert regression.ratio == pytest.approx(1.15 if bench is TIME else 1 / 0.85, abs=0.04)
    assert regression.change == pytest.approx(0.15 if bench is TIME else -0.15, abs=0.04)
    # The noise is the spread around the fitted step, not the step itself (that would read as ~7%).
    assert 0.015 < regression.noise < 0.045


def test_a_15_percent_improvement_is_not_a_regression(tmp_path, repo):
    path, commits = repo
    history = load_history(_history(tmp_path, commits, time_step=-0.15, rate_step=0.15), repo=path)
    assert find_regressions(history) == []


@pytest.mark.parametrize("noise", [QUIET, MEASURED], ids=["3%", "17%-measured"])
@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
def test_pure_noise_reports_no_regression(tmp_path, repo, noise, seed):
    path, commits = repo
    history = load_history(_history(tmp_path, commits, noise=noise, seed=seed), repo=path)
    assert find_regressions(history) == []
    assert history.series[TIME["name"], ""].noise() == pytest.approx(noise, rel=0.5)


def test_parameter_combinations_are_separate_series(tmp_path, repo):
    path, commits = repo
    names = combos(GRID["params"])
    assert names == ["'even', 1", "'even', 2", "'ratio', 1", "'ratio', 2"]  # the gate's naming
    planted = "'ratio', 2"  # seed 0, as the other planted steps; the rest pure noise
    per_combo = [ah.levels(N, QUIET, 0 if name == planted else 20 + j, STEP_AT, 0.15 if name == planted else 0.0,
                           base=0.1) for j, name in enumerate(names)]
    results = tmp_path / "results"
    ah.write_history(results, commits, [GRID], {GRID["name"]: [list(row) for row in zip(*per_combo)]})
    history = load_history(results, repo=path)
    assert set(history.series) == {(GRID["name"], name) for name in names}
    (regression,) = find_regressions(history)
    assert (regression.params, regression.likely) == ("'ratio', 2", commits[STEP_AT])
    assert regression.label == "throughput.Split.time_epoch('ratio', 2)"
    assert find_regressions(history, bench=r"\('even'") == []


def test_failed_and_skipped_commits_do_not_break_detection(tmp_path, repo):
    path, commits = repo

    def holes(series):
        for i in (5, 17, 18):  # the benchmark raised: asv records None
            series[TIME["name"]][i] = [None]
            series[RATE["name"]][i] = [None]
        for i in (40, 41):  # skipped (NotImplementedError in setup): NaN
            series[TIME["name"]][i] = [math.nan]
        series[RATE["name"]][STEP_AT] = [None]  # the step's own commit failed

    results = _history(tmp_path, commits, time_step=0.15, rate_step=-0.15, edit=holes)
    history = load_history(results, repo=path)
    assert history.series[TIME["name"], ""].values[5] is None
    assert math.isnan(history.series[TIME["name"], ""].values[40])
    by_name = {r.name: r for r in find_regressions(history)}
    assert set(by_name) == {TIME["name"], RATE["name"]}
    assert by_name[TIME["name"]].likely == commits[STEP_AT]
    # commit 31 failed: the step lies between commit 30 and commit 32, and no range can split them
    rate = by_name[RATE["name"]]
    assert rate.likely == commits[STEP_AT + 1]
    assert commits.index(rate.last_good) <= STEP_AT - 1 and commits.index(rate.first_bad) >= STEP_AT + 1


def test_without_a_repository_commits_are_ordered_by_their_dates(tmp_path, repo):
    _, commits = repo
    shuffled = list(range(N))[::7] + [i for i in range(N) if i % 7]  # files written out of order
    history = load_history(_history(tmp_path, commits, time_step=0.15, order=shuffled))
    assert history.commits == tuple(commits)
    assert history.order == "commit dates recorded by asv"
    (regression,) = find_regressions(history)
    assert regression.likely == commits[STEP_AT]


def test_result_commits_off_the_branch_are_dropped(tmp_path, repo):
    path, commits = repo
    results = _history(tmp_path, commits, time_step=0.15)
    stray = "f" * 40  # a pull request's commit: not on main's first-parent line
    ah.write_commit(results, "ci", stray, ah.commit_date_ms(N), [TIME, RATE], {TIME["name"]: [1.0],
                                                                                RATE["name"]: [1.0]})
    history = load_history(results, repo=path)
    assert history.dropped == (stray,)
    assert stray not in history.commits
    assert [r.likely for r in find_regressions(history)] == [commits[STEP_AT]]


def test_newer_than_takes_dates_and_commit_prefixes(tmp_path, repo):
    _, commits = repo
    history = load_history(_history(tmp_path, commits, time_step=0.15))  # no repository: prefixes of tested commits
    (found,) = find_regressions(history)
    bad = commits.index(found.first_bad)  # the end of the step's range: commit 31 or a later one
    assert bad >= STEP_AT
    assert newer_than(history, [found], commits[bad - 1][:7]) == [found]
    assert newer_than(history, [found], commits[bad][:7]) == []
    assert newer_than(history, [found], f"2025-{1 + bad // 31:02d}-{1 + bad % 31:02d}T00:00:00+00:00") == []
    assert newer_than(history, [found], f"2025-{1 + (bad - 1) // 31:02d}-{1 + (bad - 1) % 31:02d}") == [found]
    with pytest.raises(ValueError, match="'main~1' is neither an ISO date"):
        newer_than(history, found, "main~1")
    with pytest.raises(ValueError, match="2025-13-01"):
        newer_than(history, found, "2025-13-01")


def test_relative_noise():
    assert relative_noise([100, 102, 98, 101, 99]) == pytest.approx(1.4826 / 100)
    assert relative_noise([5.0]) is None
    assert relative_noise([1.0, None, math.nan]) is None
    assert relative_noise([-1.0, 0.0, 1.0]) is None  # median 0: no relative spread


# --- the command line ---------------------------------------------------------------------------------------


def test_since_sets_the_exit_status(tmp_path, repo, capsys):
    path, commits = repo
    results = _history(tmp_path, commits, time_step=0.15)
    (found,) = find_regressions(load_history(results, repo=path))
    bad = commits.index(found.first_bad)  # the end of the step's range: commit 31 or one just after
    base = ["regressions", "--results", str(results), "--repo", str(path)]
    assert main(base) == 1  # no --since: any standing regression
    assert main([*base, "--since", commits[20][:10]]) == 1  # the step came after commit 21
    assert main([*base, "--since", commits[bad]]) == 0  # ... not after the end of its range
    assert main([*base, "--since", "main~5"]) == 0  # a ref, resolved in the repository
    assert main([*base, "--since", "2025-01-15"]) == 1  # commit 31 is dated 2025-01-31
    assert main([*base, "--since", "2025-02-15T00:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "throughput.Fit.time_step" in out
    assert f"{found.last_good[:8]}..{found.first_bad[:8]} ({found.commits})" in out
    assert main([*base, "--since", "not-a-commit"]) == 2
    assert "not-a-commit" in capsys.readouterr().err


def test_json_and_markdown(tmp_path, repo, capsys):
    path, commits = repo
    results = str(_history(tmp_path, commits, time_step=0.15, rate_step=-0.15))
    report = tmp_path / "regressions.md"
    status = main(["regressions", "--results", results, "--repo", str(path), "--since", commits[40], "--json",
                   "--markdown", str(report)])
    assert status == 0  # both regressions are older than commit 41
    data = json.loads(capsys.readouterr().out)
    assert data["machine"] == "ci" and data["commits"] == N and data["status"] == 0 and data["factor"] == 1.03
    assert {r["name"] for r in data["regressions"]} == {TIME["name"], RATE["name"]}
    assert data["improvements"] == [] and data["drifts"] == []
    rate = next(r for r in data["regressions"] if r["name"] == RATE["name"])
    assert set(rate) >= {"kind", "params", "unit", "last_good", "first_bad", "likely", "commits", "before", "after",
                         "ratio", "low", "high", "worse_by", "change", "noise", "status", "fixed_by",
                         "first_bad_date", "new"}
    assert (rate["kind"], rate["status"], rate["fixed_by"], rate["new"]) == ("regression", "standing", None, False)
    assert rate["likely"] == commits[STEP_AT]
    assert commits.index(rate["last_good"]) < STEP_AT <= commits.index(rate["first_bad"])
    assert rate["after"] < rate["before"] and rate["higher_is_better"]
    assert rate["low"] < rate["ratio"] < rate["high"] and rate["low"] > 1
    assert rate["first_bad_date"].startswith("2025-0")
    text = report.read_text()
    assert text.startswith("### :white_check_mark: 2 standing regressions, 0 fixed, 0 improvements over 50 commits")
    assert "| new | benchmark | status | last good..first bad | likely | before | after | change | worse by (99%) |" \
        in text
    assert f"| `{RATE['name']}` | standing | `{rate['last_good'][:8]}..{rate['first_bad'][:8]} " in text


def test_a_regression_undone_later_is_fixed_names_its_fix_and_is_not_alerted(tmp_path, repo, capsys):
    """A 12% slow-down at commit 21 undone at commit 41 (asv reports neither: the latest value is as good as the
    best); one night 40% slower at commit 10 is an outlier, no step."""
    path, commits = repo

    def undo(series):
        for i in range(40, N):
            series[TIME["name"]][i] = [series[TIME["name"]][i][0] / 1.12]
        series[TIME["name"]][9] = [series[TIME["name"]][9][0] * 1.4]

    results = tmp_path / "results"
    time = ah.levels(N, 0.02, 3, 20, 0.12, base=0.01)
    series = {TIME["name"]: [[v] for v in time]}
    undo(series)
    ah.write_history(results, commits, [TIME], series)
    history = load_history(results, repo=path)
    found = find_changes(history)
    (regression,) = found.regressions
    (fix,) = found.improvements
    assert regression.status.value == "fixed" and regression.likely == commits[20]
    assert regression.fixed_by == fix.likely == commits[40]
    assert fix.fixes == regression.first_bad and fix.ratio == pytest.approx(1.12, abs=0.03)
    base = ["regressions", "--results", str(results), "--repo", str(path)]
    assert main(base) == 0  # fixed: nothing stands, nothing to alert
    out = capsys.readouterr().out
    assert "0 standing regressions, 1 fixed, 1 improvement" in out and f"fixed by {commits[40][:8]}" in out
    assert main([*base, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["status"], r["fixed_by"]) for r in data["regressions"]] == [("fixed", commits[40])]
    assert [i["fixes"] for i in data["improvements"]] == [regression.first_bad]


def test_bench_filter_and_no_regression_exit_zero(tmp_path, repo, capsys):
    path, commits = repo
    results = str(_history(tmp_path, commits, time_step=0.15))
    assert main(["regressions", "--results", results, "--repo", str(path), "--bench", "samples"]) == 0
    assert "0 standing regressions, 0 fixed, 0 improvements over 50 commits" in capsys.readouterr().out


def test_default_order_falls_back_to_dates_outside_the_repository(tmp_path, repo, capsys, monkeypatch):
    _, commits = repo
    results = _history(tmp_path, commits, time_step=0.15)
    monkeypatch.chdir(tmp_path)  # not a git repository
    assert main(["regressions", "--results", str(results), "--markdown", "-"]) == 1
    out = capsys.readouterr().out
    assert "Order: commit dates recorded by asv" in out and TIME["name"] in out


def test_cli_errors_name_the_bad_value(tmp_path, repo, capsys):
    _, commits = repo
    missing = tmp_path / "nowhere"
    assert main(["regressions", "--results", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    results = _history(tmp_path, commits[:5])
    ah.write_benchmarks(results, [TIME, RATE], machine="other")  # a second machine folder
    assert main(["regressions", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "2 machines" in err and "ci, other" in err and "--machine" in err
    assert main(["regressions", "--results", str(results), "--machine", "gpu-box"]) == 2
    assert "'gpu-box'" in capsys.readouterr().err
    assert main(["regressions", "--results", str(results), "--machine", "other"]) == 2  # a folder, no results
    assert "no asv results for machine 'other'" in capsys.readouterr().err


def test_help_imports_neither_asv_nor_tensorflow():
    code = ("import sys; from harness.cli import main; main(['regressions', '--help']); "
            "print(sorted(m for m in ('asv', 'tensorflow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("[]"), done.stdout + done.stderr
    assert "change-point detector" in done.stdout
