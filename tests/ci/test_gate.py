"""The regression gate on planted regressions: throw-away repositories with a tiny package.

The first: the original, an unchanged copy (README only), a 30% slower one, one whose benchmark raises and a 45%
slower one (``work()`` sleeps). ``harness bench-compare`` must exit 0 on the unchanged pair and on five A/A runs of
one commit, 1 on the slowdown, 3 on the error; an undecided result is measured again; noise from a history is
shown and does not widen the threshold. A second adds a benchmark that counts operations (the same on every run)
and a commit doing 5% more: caught. A third is the case the gate once missed three times in three: a CPU-bound
busy loop of about 22 ms timed with asv's defaults, a README change (exit 0), the loop 5% longer (exit 1) and the
function raising (exit 3). The gate runs in *existing* mode (as inside a prebuilt image): each commit is installed
by pip into a private target directory (tests/ci/demorepo.py), and into a folder of its own for the interleaved
pairs of its ``time_`` benchmarks.

Each claim is a ``check_<claim>(gate, ...)`` asserting what the gate must say given the data. Its test runs it on
the real gate (asv measuring), then ``verify_claim`` (tests/ci/test_gate_plants.py) runs it on a replay of the same
measurements and on planted wrong gates over them (always 0, always 1, a threshold of 1.5): each must fail it.
Every verdict row must carry its noise and the smallest change it could detect: a gate that passes or fails
without looking (the two blind plants) has neither.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("asv")

from demorepo import BENCH, commit, install_command, make_repo, work_source  # noqa: E402
from test_gate_plants import RecordingGate, verify_claim  # noqa: E402

_NAME = "bench.Work.time_work"
# What an unchanged pair's row must be able to detect: 20% or less, so the 30% slower commit (measured at about
# 1.3x) stays visible. A gate passes any pair by being blind; a pass that could not see 30% is no pass of the claim.
_SEES = 0.2


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gatedemo")
    first = make_repo(repo)
    same = commit(repo, {"README.md": "unchanged code\n"}, "docs only")
    slower = commit(repo, {"gatedemo/__init__.py": work_source(0.026)}, "30% slower")
    broken = commit(repo, {"gatedemo/__init__.py": "def work():\n    raise RuntimeError('broken')\n"}, "broken")
    slowest = commit(repo, {"gatedemo/__init__.py": work_source(0.029)}, "45% slower")
    return repo, {"first": first, "same": same, "slower": slower, "broken": broken, "slowest": slowest}


def _compare(gate, repo: Path, base: str, head: str, *extra: str, mode: str = "existing"):
    return gate(repo, "bench-compare", base, head, "--mode", mode, "--machine", "gate-test",
                "--install-command", install_command(repo), "--markdown", str(repo.parent / "summary.md"), *extra)


def _said(done) -> str:
    return done.stdout + done.stderr[-3000:]


@dataclass(frozen=True)
class _Row:
    """One row of the gate's table: its mark (``+`` worse, ``!`` failed on head, empty: the same), how much worse
    head is, the noise cell, what it detects (0.03: 3%) and the note."""

    line: str
    mark: str
    ratio: float | None
    noise: str
    detects: float | None
    note: str


def _rows(done, name: str = _NAME) -> list[_Row]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ") and f"| `{name}" in line]
    assert lines, f"no row for {name}:\n{_said(done)}"
    rows = []
    for line in lines:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        assert len(cells) == 9, line
        mark, _, _, _, ratio, noise, detects, _, note = cells
        rows.append(_Row(line, mark, float(ratio.rstrip("x")) if ratio.endswith("x") else None, noise,
                         float(detects.rstrip("%")) / 100 if detects.endswith("%") else
                         float("inf") if detects == "none" else None, note))
    return rows


def _calibrated(row: _Row, source: str = "interleaved pairs") -> float:
    """What ``row`` detects, asserting it says so and where its noise came from; a ``+`` row must be worse than the
    3% floor."""
    assert source in row.noise and row.detects is not None, f"a verdict without its noise ({source}): {row.line}"
    if source == "interleaved pairs":  # judged by process pair, not pair by pair (harness.ci.interleave)
        assert re.search(r"interleaved pairs in \d+ process pairs", row.noise), row.line
    if row.mark == "+":
        assert row.ratio is not None and row.ratio > 1.03, row.line
    return row.detects


def check_passes_an_unchanged_pair(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["first"], commits["same"])
    assert done.returncode == 0, _said(done)
    assert "No benchmark got worse" in done.stdout and "1 same" in done.stdout
    (row,) = _rows(done)
    assert row.mark == "" and _calibrated(row) < _SEES, row.line


@pytest.mark.extended
def test_gate_passes_an_unchanged_pair(planted):
    verify_claim(check_passes_an_unchanged_pair, *planted)


def check_passes_five_a_a_runs(gate, repo: Path, commits: dict) -> None:
    # No false alarm in five (the claim is at most 1% per judgment), each a judgment that could see 20%.
    for _ in range(5):
        check_passes_an_a_a_run(gate, repo, commits)


def check_passes_an_a_a_run(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["first"], commits["first"])
    assert done.returncode == 0, _said(done)
    (row,) = _rows(done)
    assert row.mark == "" and _calibrated(row) < _SEES, row.line


@pytest.mark.extended
@pytest.mark.slow  # 102 s of the extended step (.ci/run at e7e42d3, --durations): slow.yml's. Each CI run still judges
# one commit against itself in test_an_a_a_series_counts_the_gates_false_alarms_and_catches_the_planted_slowdowns
# (6 real runs and their resamplings) and an unchanged pair in test_gate_passes_an_unchanged_pair.
def test_gate_passes_five_a_a_runs_of_one_commit(planted):
    # The same commit against itself, five times: never a regression (the gate's false alarms on
    # a shared runner; TorchBench moved its threshold from 10% to 30% for per-model noise of 5-9%).
    verify_claim(check_passes_five_a_a_runs, *planted)


def check_measures_an_undecided_benchmark_again(gate, repo: Path, first: str, slowest: str) -> None:
    # Each combination's value flips between 100 and 130 call by call (a counter beside the benchmark), so the pairs
    # disagree as much as they can (1.3x, then 1/1.3x: AB then BA): never decided, each combination is measured
    # again round by round up to --max-rounds, and then - the flips cancel, the spread does not - inconclusive (exit
    # 3, the default --inconclusive fail): a pass it could not see would be a silent one.
    done = _compare(gate, repo, first, slowest, "--max-rounds", "4")
    assert done.returncode == 3, _said(done)
    assert "not decided yet, measuring once more: bench.Work.track_flip ('large'), bench.Work.track_flip ('small')" \
        in done.stderr
    assert done.stdout.startswith("### :grey_question: Inconclusive: 2 benchmarks could not tell 1.03x"), _said(done)
    rows = _rows(done, "bench.Work.track_flip")
    assert len(rows) == 2 and all(row.noise.endswith(" 4 rounds") and row.mark == "~" for row in rows), done.stdout
    assert all(row.note.startswith("could not tell 1.03x from no change in 4 values") for row in rows), done.stdout


_PARAM_BENCH = textwrap.dedent('''
    from pathlib import Path


    class Work:
        params = [["small", "large"]]
        param_names = ["size"]

        def track_flip(self, size):
            counter = Path(__file__).with_name(f"count-{size}")
            count = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(count + 1))
            return 130.0 if count % 2 else 100.0
''')


@pytest.mark.extended
def test_an_undecided_parametrized_benchmark_is_measured_again_combination_by_combination(tmp_path):
    # asv matches --bench against ``name(params)`` for a parametrized benchmark: the regex of another round must
    # name the combination (``^bench.Work.time_work$`` selected nothing, asv run exited 1; found by
    # tests/ci/test_adopt.py). Not the plants: which rows a blind gate measures again is not this claim.
    repo = tmp_path / "params"
    repo.mkdir()
    first = make_repo(repo, bench=_PARAM_BENCH)
    slowest = commit(repo, {"gatedemo/__init__.py": work_source(0.029)}, "45% slower")
    real = RecordingGate()
    check_measures_an_undecided_benchmark_again(real, repo, first, slowest)
    assert "No benchmarks selected" not in real.calls[0].outcome.stderr  # asv's own output


# A count of operations measures the same on every run: the data, not the runner, decide its verdicts. (A 21 ms
# sleep for 20 ms is caught only where the rounds happen to be quieter than about 1.3%: a loaded host measured
# 2.2%, where 5% is undetectable.)
_COUNT = "bench.Count.track_operations"
_COUNT_BENCH = BENCH + textwrap.dedent('''

    class Count:
        def track_operations(self):
            return gatedemo.operations()

        track_operations.unit = "operations"
''')


def _counting(operations: int) -> str:
    return work_source(0.02) + f"\n\ndef operations():\n    return {operations}\n"


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    repo = tmp_path_factory.mktemp("countdemo")
    make_repo(repo, bench=_COUNT_BENCH)  # the package as demorepo writes it: no operations() yet
    first = commit(repo, {"gatedemo/__init__.py": _counting(200)}, "count operations")
    more = commit(repo, {"gatedemo/__init__.py": _counting(210)}, "5% more operations")
    return repo, {"first": first, "more": more}


def check_catches_a_5_percent_rise(gate, repo: Path, commits: dict) -> None:
    """No noise, so the threshold is the 3% floor: 5% more is worse, decided at once (no spread: no more rounds)."""
    done = _compare(gate, repo, commits["first"], commits["more"], "--bench", "Count")
    assert done.returncode == 1, _said(done)
    assert "measuring once more" not in done.stderr
    (row,) = _rows(done, _COUNT)
    assert row.mark == "+" and row.ratio == 1.05, row.line
    assert row.noise == "0.0% 2 rounds" and _calibrated(row, "2 rounds") == 0.03, row.line


@pytest.mark.extended
def test_gate_catches_a_planted_5_percent_rise_where_the_noise_allows(counted):
    verify_claim(check_catches_a_5_percent_rise, *counted)


def check_an_a_a_series(gate, repo: Path, commits: dict, saved: Path) -> None:
    """``--aa-series N``: N runs of one commit, judged by the gate's rule against themselves (false alarms) and with
    planted 3%, 5% and 10% slow-downs; the counted benchmark in rounds, the timed one in interleaved pairs."""
    saved.unlink(missing_ok=True)  # --save-runs appends to a new file only
    done = _compare(gate, repo, commits["first"], commits["first"], "--aa-series", "6", "--max-rounds", "3",
                    "--aa-pairs", "40", "--resampled", "400", "--json", "--save-runs", str(saved))
    assert done.returncode == 0, _said(done)
    found = json.loads(done.stdout)
    combos = found["combinations"]
    assert found["runs"] == 6 and combos[_COUNT]["kind"] == "rounds" and combos[_NAME]["kind"] == "pairs", combos
    count, timed = combos[_COUNT], combos[_NAME]
    # The count: one window of 3+3 rounds shares no run with another; no noise, so 5% is caught in every judgment.
    assert count["real"]["false_alarms"]["n"] == 1 and count["resampled"]["caught"]["5%"]["k"] == 400, count
    # The sleep, timed in pairs: one real judgment a run, none a false alarm; 10% caught in every one.
    assert timed["real"]["false_alarms"] == {**timed["real"]["false_alarms"], "k": 0, "n": 6}, timed
    assert timed["real"]["caught"]["10%"]["k"] == 6 and found["passes"], timed
    assert len(saved.read_text().splitlines()) == 6  # every run, for --from-runs
    assert _compare(gate, repo, commits["first"], commits["more"], "--aa-series", "8").returncode == 2


@pytest.mark.extended
def test_an_a_a_series_counts_the_gates_false_alarms_and_catches_the_planted_slowdowns(counted, tmp_path):
    # Not the threshold plant: a gate at factor 1.5 still has no false alarm here and misses nothing it claims.
    saved = tmp_path / "runs.jsonl"
    verify_claim(lambda gate, *args: check_an_a_a_series(gate, *args, saved), *counted,
                 plants=("always 0", "always 1"))


def test_gate_refuses_a_single_round(planted):
    # Usage, checked before anything is measured or decided: no planted decision reaches it.
    repo, commits = planted
    done = _compare(RecordingGate(), repo, commits["first"], commits["same"], "--rounds", "1")
    assert done.returncode == 2 and "--rounds must be at least 2; got 1" in done.stderr


def check_fails_a_30_percent_slowdown(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["same"], commits["slower"])
    assert done.returncode == 1, _said(done)
    assert "Performance regression" in done.stdout
    (row,) = _rows(done)
    assert row.mark == "+" and row.ratio is not None and 1.2 < row.ratio < 1.45, row.line
    _calibrated(row)
    assert (repo.parent / "summary.md").read_text().strip() == done.stdout.strip()


def test_gate_fails_a_planted_30_percent_slowdown(planted):
    # One asv comparison (about 20 s); the replay and the three plants over its measurements take about 0.6 s.
    verify_claim(check_fails_a_30_percent_slowdown, *planted)


def check_shows_the_noise_of_mains_history(gate, repo: Path, commits: dict, history: Path) -> None:
    # A nightly history where this benchmark swings ~20% night to night: shown beside the row, and not used to
    # widen its threshold (pairs taken in one job do not see drift between jobs): the 30% slowdown still fails.
    done = _compare(gate, repo, commits["same"], commits["slower"], "--history", str(history),
                    "--history-machine", "nightly")
    assert done.returncode == 1, _said(done)
    (row,) = _rows(done)
    assert row.mark == "+" and _calibrated(row) < _SEES, row.line
    night = float(row.noise.split("; ")[1].split("%")[0]) / 100
    assert "night to night, history (n=20)" in row.noise and 0.1 < night < 0.4, row.line  # drawn at sigma 0.2


@pytest.mark.extended
def test_gate_shows_the_noise_of_mains_history_and_does_not_widen_its_threshold(planted, tmp_path):
    from asv_history import benchmark, levels, make_repo, write_history

    history = tmp_path / "history"
    nights = make_repo(tmp_path / "nightly-repo", 20)
    bench = benchmark(_NAME)
    write_history(history, nights, [bench], {bench["name"]: [[v] for v in levels(20, 0.2, seed=3, base=0.02)]},
                  machine="nightly")
    verify_claim(check_shows_the_noise_of_mains_history, *planted, history)


def check_reports_a_benchmark_error_as_no_verdict(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["slower"], commits["broken"])
    assert done.returncode == 3, _said(done)
    assert "No verdict, an infrastructure error: 1 benchmark failed on head" in done.stdout and "| ! |" in done.stdout


@pytest.mark.extended
def test_gate_reports_a_benchmark_error_as_no_verdict_3_never_as_a_slow_down(planted):
    # Not the 1.5 threshold: a threshold has no say where head failed.
    verify_claim(check_reports_a_benchmark_error_as_no_verdict, *planted, plants=("always 0", "always 1"))


def check_builds_both_commits_in_virtualenvs(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["same"], commits["slower"], mode="virtualenv")
    assert done.returncode == 1, _said(done)
    (row,) = _rows(done)
    assert row.mark == "+", row.line
    _calibrated(row, "rounds")  # virtualenv mode: rounds alone, no interleaved pairs


@pytest.mark.slow
def test_gate_in_virtualenv_mode_builds_both_commits(planted):
    # asv creates a virtualenv and builds each commit there (about a minute here).
    repo, commits = planted
    real = verify_claim(check_builds_both_commits_in_virtualenvs, *planted)
    assert f"{commits['slower']}^!" in real.calls[0].outcome.stderr  # asv's own output: the real run only


# The case the gate once missed three times in three: a CPU-bound loop of about 22 ms, asv's default
# timing (no number, repeat or rounds set), a 5% longer loop. On this 2-core host its speed moves in steps lasting
# seconds, so asv runs of the two commits seconds apart measured 1.02-1.09x; interleaved pairs resolve it.
_BUSY_BENCH = "import busydemo\n\n\ndef time_loop():\n    busydemo.loop()\n"
_BUSY = "bench.time_loop"


def _loop(iterations: int) -> str:
    return f"def loop():\n    total = 0\n    for i in range({iterations}):\n        total += i * i\n    return total\n"


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    repo = tmp_path_factory.mktemp("busydemo")
    make_repo(repo, bench=_BUSY_BENCH)  # then renamed: a package that is not demorepo's
    conf = {**json.loads((repo / "asv.conf.json").read_text()), "project": "busydemo"}
    pyproject = (repo / "pyproject.toml").read_text().replace("gatedemo", "busydemo")
    (repo / "gatedemo" / "__init__.py").unlink()
    first = commit(repo, {"busydemo/__init__.py": _loop(400_000), "asv.conf.json": json.dumps(conf),
                          "pyproject.toml": pyproject}, "a busy loop")
    readme = commit(repo, {"README.md": "a loop\n"}, "docs only")
    longer = commit(repo, {"busydemo/__init__.py": _loop(420_000)}, "the loop 5% longer")
    raising = commit(repo, {"busydemo/__init__.py": "def loop():\n    raise RuntimeError('broken')\n"}, "raises")
    return repo, {"first": first, "readme": readme, "longer": longer, "raising": raising}


# Twice the default 60 s of pairs a combination: beside the other half of the extended step the gate then decides
# with room to spare (the A/A study on this loop beside two busy tox runs needed a median of 80 pairs, at most 400).
_BUSY_BUDGET = ("--pair-budget", "120")


def check_busy_loop_readme_change_passes(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["first"], commits["readme"], *_BUSY_BUDGET)
    assert done.returncode == 0, _said(done)
    (row,) = _rows(done, _BUSY)
    print(row.line)
    assert row.mark == "" and _calibrated(row) <= 0.05, row.line  # a pass that could see 5%


def check_busy_loop_5_percent_longer_fails(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["readme"], commits["longer"], *_BUSY_BUDGET)
    assert done.returncode == 1, _said(done)
    (row,) = _rows(done, _BUSY)
    # A worse verdict stops measuring once its lower bound clears the 3% floor (decided): its detects column is the
    # power at the spread it stopped with, which may be a little above 5% (CI at c4bf300: "5.2%" beside a caught
    # 1.053x). That the gate can see 5% is the pass's claim, above; here, that 5% is caught, its noise named.
    _calibrated(row)
    print(row.line)  # the real run's row first (pytest -rP): docs/regressions.md's figures
    assert row.mark == "+" and 1.03 < row.ratio < 1.09, row.line


def check_busy_loop_raising_is_no_verdict(gate, repo: Path, commits: dict) -> None:
    done = _compare(gate, repo, commits["longer"], commits["raising"], *_BUSY_BUDGET)
    assert done.returncode == 3 and "| ! |" in done.stdout, _said(done)


def _once_more_if_inconclusive(check, busy) -> None:
    """``verify_claim(check, *busy)``, asked once more where the real gate said it was inconclusive: beside other
    work this host's speed can move by a third for longer than the pairs' budget (.ci/run at 1315653: the pairs
    undecided after 120 s, then asv rounds 22% apart), and a gate that says so is right. A pass, a regression or no
    verdict is final; two inconclusive runs fail the test."""
    try:
        verify_claim(check, *busy)
    except AssertionError as err:
        if ":grey_question: Inconclusive" not in str(err):
            raise
        verify_claim(check, *busy)


@pytest.mark.extended
def test_a_readme_change_to_a_busy_loop_passes_and_the_pass_could_see_5_percent(busy):
    _once_more_if_inconclusive(check_busy_loop_readme_change_passes, busy)


@pytest.mark.extended
def test_a_busy_loop_5_percent_longer_fails_the_gate(busy):
    _once_more_if_inconclusive(check_busy_loop_5_percent_longer_fails, busy)


@pytest.mark.extended
def test_a_busy_loop_that_raises_is_no_verdict(busy):
    verify_claim(check_busy_loop_raising_is_no_verdict, *busy, plants=("always 0", "always 1"))
