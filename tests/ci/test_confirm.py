"""``harness regressions --confirm``: candidates from a history, measured again as the gate measures.

The end-to-end test: a throw-away repository (tests/ci/demorepo.py) of 18 commits where commit 7 makes
``gatedemo.work()`` 30% slower (a 20 ms sleep becomes 26 ms) and every other commit changes a note only, and an asv
results history of those commits (tests/ci/asv_history.py, in the repository's own ``.asv/results``, as the
nightly's ``--results .asv/results``) with two steps: the real one (commit 6 -> 7) and a planted false one of 25%
(commit 12 -> 13, whose code is the same). ``--confirm`` must time both in interleaved pairs (existing mode), report
the first confirmed near 1.3x with its bounds, the second not confirmed, exit 1 for the confirmed one alone, and
leave the history's files as they were. About 40 s on this 2-core host (asv's benchmark list discovered once, two
commits installed per candidate, 40 pairs or more each): extended.

The rest runs no benchmark: the verdict mapping on rows the gate's rule judges from synthetic pairs, the rounds
path (AB, BA, ...) on a stand-in project, the exit status rule, and the results folder put back as it was.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from harness.ci import benchgate, interleave
from harness.ci.asvresults import Measurement
from harness.ci.asvrun import AsvProject
from harness.ci.benchgate import judge_rounds
from harness.ci.tracking import confirm
from harness.ci.tracking.confirm import Confirmation, Verdict
from harness.ci.tracking.regressions import Change, Kind, Status
from harness.errors import Failed

_NAME = "bench.Work.time_work"
_MACHINE = "confirm-test"
_SLOW_AT, _FALSE_AT, _COMMITS = 6, 12, 18  # indices: the first bad commits of the two steps


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory):
    """The repository, its commits, the results folder's files before, and one ``harness regressions --confirm``."""
    pytest.importorskip("asv")
    import asv_history as ah
    from demorepo import commit, install_command, make_repo, run_harness, work_source

    repo = tmp_path_factory.mktemp("confirmdemo")
    commits = [make_repo(repo)]
    for number in range(1, _COMMITS):
        if number == _SLOW_AT:
            commits.append(commit(repo, {"gatedemo/__init__.py": work_source(0.026)}, "30% slower"))
        else:
            commits.append(commit(repo, {"NOTES.md": f"note {number}\n"}, f"note {number}"))  # not-a-reference
    levels = ah.levels(_COMMITS, 0.01, seed=7, base=0.02)
    values = [v * (1.3 if i >= _SLOW_AT else 1) * (1.25 if i >= _FALSE_AT else 1) for i, v in enumerate(levels)]
    results = repo / ".asv" / "results"
    bench = ah.benchmark(_NAME)
    ah.write_history(results, commits, [bench], {_NAME: [[v] for v in values]}, machine=_MACHINE)
    before = {path: path.read_bytes() for path in results.rglob("*") if path.is_file()}
    markdown = repo.parent / "confirm.md"
    done = run_harness(repo, "regressions", "--results", str(results), "--repo", ".", "--confirm", "--mode",
                       "existing", "--install-command", install_command(repo), "--confirm-budget", "40", "--json",
                       "--markdown", str(markdown))
    return repo, commits, results, before, done, markdown


def _said(done) -> str:
    return done.stdout[-3000:] + done.stderr[-4000:]


@pytest.mark.extended
def test_confirm_confirms_the_real_step_and_not_the_planted_one(confirmed):
    _, commits, _, _, done, _ = confirmed
    assert done.stdout.strip(), _said(done)
    report = json.loads(done.stdout)
    real, false = report["regressions"]
    print(json.dumps([real["confirmation"], false["confirmation"]], indent=1))  # pytest -rP: the figures
    assert (real["last_good"], real["first_bad"]) == (commits[_SLOW_AT - 1], commits[_SLOW_AT]), real
    assert (false["last_good"], false["first_bad"]) == (commits[_FALSE_AT - 1], commits[_FALSE_AT]), false
    assert real["status"] == false["status"] == "standing"
    got = real["confirmation"]
    assert got["verdict"] == "confirmed" and got["method"] == "interleaved pairs", got
    assert 1.2 < got["ratio"] < 1.45 and 1.03 < got["low"] < got["ratio"] < got["high"] < 1.6, got
    assert got["pairs"] >= interleave.MIN_PAIRS, got
    not_it = false["confirmation"]
    assert not_it["verdict"] == "not confirmed" and not_it["method"] == "interleaved pairs", not_it
    assert 0.95 < not_it["ratio"] < 1.03 and not_it["high"] < 1.03, not_it  # the history said 1.25x


@pytest.mark.extended
def test_confirm_exits_1_for_the_confirmed_one_labels_both_and_keeps_the_history(confirmed):
    _, _, results, before, done, markdown = confirmed
    assert done.returncode == 1, _said(done)
    assert json.loads(done.stdout)["status"] == 1
    text = markdown.read_text()
    assert text.startswith("### :x: 2 standing regressions") and "measured again: 1 confirmed, 1 not confirmed" \
        in text, text
    assert "| measured again (99%) |" in text and "| confirmed 1." in text and "| not confirmed " in text, text
    assert "harness regressions: confirming 1 of 2: bench.Work.time_work" in done.stderr
    after = {path: path.read_bytes() for path in results.rglob("*") if path.is_file()}
    assert after == before  # the re-measurement's discovery (benchmarks.json) undone: the nights stay as they were


# -- no asv from here on ------------------------------------------------------------------------------------------


def _change(name: str = _NAME, unit: str = "seconds", higher_is_better: bool = False,
            status: Status = Status.STANDING, first_bad: str = "b" * 40) -> Change:
    return Change(Kind.REGRESSION, name, "", unit, higher_is_better, "a" * 40, first_bad, first_bad, 1, 1.0, 1.3,
                  1.3, 1.2, 1.4, 0.01, status)


def _pairs(change: float, spread: float, n: int, seed: int = 1) -> tuple[list[Measurement], list[Measurement]]:
    rng = random.Random(seed)
    base = [Measurement(_NAME, "", "seconds", 0.02) for _ in range(n)]
    head = [Measurement(_NAME, "", "seconds", 0.02 * change * math.exp(rng.gauss(0, spread))) for _ in range(n)]
    return base, head


def _logged(log_ratios: list[float]) -> tuple[list[Measurement], list[Measurement]]:
    return ([Measurement(_NAME, "", "seconds", 0.02) for _ in log_ratios],
            [Measurement(_NAME, "", "seconds", 0.02 * math.exp(d)) for d in log_ratios])


def test_the_gates_verdict_maps_to_a_confirmation():
    worse = judge_rounds(*_pairs(1.3, 0.02, 40), per_process=10)
    same = judge_rounds(*_pairs(1.0, 0.005, 40), per_process=10)
    straddling = judge_rounds(*_logged([0.0, 0.02, -0.01, 0.03]))  # mean 1%, its upper bound past 3%
    assert worse.verdict is benchgate.Verdict.WORSE and confirm.verdict_of(worse) is Verdict.CONFIRMED
    assert same.verdict is benchgate.Verdict.SAME and benchgate.decided(same)
    assert confirm.verdict_of(same) is Verdict.NOT_CONFIRMED
    assert straddling.verdict is benchgate.Verdict.SAME and not benchgate.decided(straddling), straddling
    assert confirm.verdict_of(straddling) is Verdict.INCONCLUSIVE
    better = judge_rounds(*_pairs(0.7, 0.02, 40))
    assert better.verdict is benchgate.Verdict.BETTER and confirm.verdict_of(better) is Verdict.NOT_CONFIRMED
    one = judge_rounds(*_pairs(1.3, 0.02, 10), per_process=10)  # one process pair: no spread between processes
    assert one.verdict is benchgate.Verdict.UNJUDGED and confirm.verdict_of(one) is Verdict.INCONCLUSIVE
    base, _ = _pairs(1.0, 0.0, 4)
    failed = judge_rounds(base, [Measurement(_NAME, "", "seconds", None)] * 4)
    assert failed.verdict is benchgate.Verdict.ERROR and confirm.verdict_of(failed) is Verdict.NO_VERDICT
    found = confirm.from_row(worse, benchgate.FACTOR, confirm.PAIRS, 12.5)
    assert found.verdict is Verdict.CONFIRMED and found.pairs == 40 and found.method == "interleaved pairs"
    assert found.low is not None and found.high is not None and found.low < found.ratio < found.high  # type: ignore
    assert found.label().startswith(f"confirmed {found.ratio:.3f}x ({found.low:.3f}-{found.high:.3f}), 40 inter")
    assert found.to_json()["verdict"] == "confirmed" and found.to_json()["seconds"] == 12.5
    lost = confirm.from_row(failed, benchgate.FACTOR, confirm.ROUNDS)
    assert lost.verdict is Verdict.NO_VERDICT and lost.note.startswith("the benchmark failed on first_bad")
    assert not lost.measured and lost.label().startswith("no verdict: the benchmark failed on first_bad")


class _Project:
    """A stand-in for ``AsvProject``: ``run_commit`` records the order; the values come from ``values``."""

    config = Path("no-such-asv.conf.json")
    root = Path(".")
    machine = "stand-in"

    def __init__(self, mode: str = "virtualenv", fail: bool = False):
        self.mode, self.fail, self.runs = mode, fail, []

    def run_commit(self, commit, bench=(), append=False, extra=()):
        if self.fail:
            raise Failed(f"asv run on {commit[:12]} failed with exit status 1")
        self.runs.append((commit, tuple(bench)))
        return 0


def _rounds(monkeypatch, project: _Project, change: Change, ratio: float, spread: float) -> None:
    """asv's saved results, as ``read_commit`` would read them after each run: head ``ratio`` times worse."""
    rng = random.Random(4)

    def read_commit(config, machine, commit, since=None):
        worse = ratio if commit == change.first_bad else 1.0
        value = 1000.0 / worse if change.higher_is_better else 0.02 * worse
        value *= math.exp(rng.gauss(0, spread))
        return {(change.name, change.params): Measurement(change.name, change.params, change.unit, value)}

    monkeypatch.setattr(interleave.asvresults, "read_commit", read_commit)


def test_a_rate_is_confirmed_in_asv_rounds_the_order_alternating(monkeypatch):
    change = _change("bench.Rate.track_samples_per_second", "samples/s", higher_is_better=True)
    project = _Project(mode="existing")  # existing mode, but a track_ benchmark: rounds, not pairs
    assert confirm.method(project, change) == confirm.ROUNDS  # type: ignore[arg-type]
    _rounds(monkeypatch, project, change, 1.3, 0.01)
    found = confirm.confirm(project, change, budget_s=60)  # type: ignore[arg-type]
    assert found.verdict is Verdict.CONFIRMED and found.method == "asv rounds", found
    assert 1.2 < found.ratio < 1.4 and found.pairs >= 2, found  # type: ignore[operator]
    order = [commit[0] for commit, _ in project.runs]
    assert order[:4] == ["a", "b", "b", "a"] and len(order) == 2 * found.pairs  # AB, BA, ...
    assert {bench for _, bench in project.runs} == {(r"^bench\.Rate\.track_samples_per_second$",)}


def test_an_unchanged_pair_in_rounds_is_not_confirmed_and_a_failed_run_is_no_verdict(monkeypatch):
    change = _change()
    project = _Project()  # virtualenv mode: rounds even for a time_ benchmark
    assert confirm.method(project, change) == confirm.ROUNDS  # type: ignore[arg-type]
    assert confirm.method(_Project(mode="existing"), change) == confirm.PAIRS  # type: ignore[arg-type]
    _rounds(monkeypatch, project, change, 1.0, 0.002)
    found = confirm.confirm(project, change, budget_s=60)  # type: ignore[arg-type]
    assert found.verdict is Verdict.NOT_CONFIRMED and found.high is not None and found.high < 1.03, found
    _rounds(monkeypatch, project, change, 1.0, 0.2)
    noisy = confirm.confirm(_Project(), change, budget_s=60, max_rounds=3)  # type: ignore[arg-type]
    assert noisy.verdict is Verdict.INCONCLUSIVE and noisy.pairs == 3 and "stopped: max rounds" in noisy.note, noisy
    failed = confirm.confirm(_Project(fail=True), change)  # type: ignore[arg-type]
    assert failed.verdict is Verdict.NO_VERDICT and "asv run on aaaaaaaaaaaa failed" in failed.note, failed


def test_the_exit_status_counts_confirmed_new_standing_regressions_only():
    from harness.cli.regressions import _status

    real, false, old = _change(first_bad="b" * 40), _change(first_bad="c" * 40), _change(first_bad="d" * 40)
    fixed = _change(first_bad="e" * 40, status=Status.FIXED)

    def said(verdict: Verdict) -> Confirmation:
        return Confirmation(verdict, confirm.PAIRS)

    assert _status([real, false], None) == 1  # without --confirm: the history's word
    assert _status([fixed], None) == 0
    assert _status([real, false], {real: said(Verdict.CONFIRMED), false: said(Verdict.NOT_CONFIRMED)}) == 1
    assert _status([false], {real: said(Verdict.CONFIRMED), false: said(Verdict.NOT_CONFIRMED)}) == 0  # not new
    # inconclusive: the history's step neither confirmed nor refuted, never read as a pass
    assert _status([real, false], {real: said(Verdict.INCONCLUSIVE), false: said(Verdict.NOT_CONFIRMED)}) == 3
    assert _status([real, false], {real: said(Verdict.NO_VERDICT), false: said(Verdict.NOT_CONFIRMED)}) == 3
    assert _status([real, false], {real: said(Verdict.NO_VERDICT), false: said(Verdict.CONFIRMED)}) == 1
    assert _status([fixed], {fixed: said(Verdict.CONFIRMED)}) == 0  # --confirm-fixed: a fixed one never counts
    assert _status([old], {old: said(Verdict.NO_VERDICT)}) == 3  # nothing measured at all


def test_the_alert_is_a_new_standing_regression_that_no_measurement_refuted():
    from harness.cli.regressions import _alert

    real, old = _change(first_bad="b" * 40), _change(first_bad="d" * 40)
    fixed = _change(first_bad="e" * 40, status=Status.FIXED)
    new = [real, fixed]

    def said(verdict: Verdict) -> dict:
        return {real: Confirmation(verdict, confirm.PAIRS)}

    assert _alert(real, new, None) and not _alert(old, new, None) and not _alert(fixed, new, None)
    assert _alert(real, new, said(Verdict.CONFIRMED))
    assert _alert(real, new, said(Verdict.INCONCLUSIVE)) and _alert(real, new, said(Verdict.NO_VERDICT))
    assert not _alert(real, new, said(Verdict.NOT_CONFIRMED))  # labelled, not alerted


def test_the_results_of_the_commits_measured_again_are_put_back(tmp_path):
    pytest.importorskip("asv")
    from demorepo import CONF

    (tmp_path / "asv.conf.json").write_text(json.dumps(CONF))
    results = tmp_path / ".asv" / "results"
    machine = results / "nightly"
    machine.mkdir(parents=True)
    kept = {results / "benchmarks.json": "{}", machine / "machine.json": "{}", machine / "aaaaaaaa-env.json": "a",
            machine / "cccccccc-env.json": "c"}
    for path, text in kept.items():
        path.write_text(text)
    project = AsvProject(tmp_path / "asv.conf.json", "nightly")
    with confirm.kept_results(project, ["a" * 40, "b" * 40]):
        for path in (results / "benchmarks.json", machine / "machine.json", machine / "aaaaaaaa-env.json"):
            path.write_text("measured again")
        (machine / "aaaaaaaa-existing-py.json").write_text("new")  # a run in another environment
        (machine / "bbbbbbbb-env.json").write_text("new")
        (machine / "cccccccc-env.json").write_text("another commit's")  # not one of the two: left alone
    assert sorted(p.name for p in machine.iterdir()) == ["aaaaaaaa-env.json", "cccccccc-env.json", "machine.json"]
    assert {path: path.read_text() for path in kept} == {**kept, machine / "cccccccc-env.json": "another commit's"}
