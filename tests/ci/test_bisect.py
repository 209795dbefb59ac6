"""``harness bisect`` on a planted regression: a throw-away repository of eleven commits.

Commit 6 of the first ten makes ``gatedemo.work()`` twice as slow (20 ms -> 40 ms
of sleep); the others change nothing the benchmarks see, and the test's
``--factor 1.5`` stays above what a loaded host adds to an unchanged commit
(beside two CPU hogs and the other pytest worker an unchanged commit measured
1.20x its GOOD in one asv run); an eleventh breaks ``work()``. Bisection runs in
*existing* mode (as inside a prebuilt image), each probe decided against GOOD by
the gate's rule (interleaved pairs for the ``time_`` benchmark, asv rounds for a
rate), and must name commit 6 within ceil(log2 n) + 1 probes, for a timing
benchmark and for a higher-is-better rate (items/s, which drops); say so when
BAD is no worse than GOOD; stop with exit 3 on a failing probe and exit 2 on bad
input. A second repository holds a CPU-bound busy loop made 5% longer at one
commit of six: bisected at the default factor (the gate's 1.03) in interleaved
pairs, it must be named, a step one asv run a commit does not resolve (runs of
a 5% longer loop seconds apart measured 1.02-1.09x, harness.ci.interleave). The
search itself, the name resolution and the probe's verdict are tested without
asv, in milliseconds.
"""

from __future__ import annotations

import json
import math
import random
import re
import textwrap

import pytest
from demorepo import BENCH, commit, install_command, make_repo, run_harness, work_source

from harness.ci import benchgate
from harness.ci.asvresults import Measurement
from harness.ci.benchgate import judge_rounds, worse_ratio
from harness.ci.tracking.bisection import Target, Verdict, _parse_find, probe_verdict, resolve_target, run_bound, search

_BENCH = BENCH.replace("number = 3\n    repeat = 10", "number = 2\n    repeat = 6") + textwrap.dedent('''

    class Rate:
        def track_rate(self):
            # One value per run (a track_ benchmark): the best of five, as a busy host only makes a call slower.
            import time

            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                gatedemo.work()
                best = min(best, time.perf_counter() - start)
            return 1 / best

        track_rate.unit = "items/s"
''')


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    pytest.importorskip("asv")
    repo = tmp_path_factory.mktemp("bisectdemo")
    commits = [make_repo(repo, _BENCH)]
    for number in range(2, 11):
        if number == 6:
            commits.append(commit(repo, {"gatedemo/__init__.py": work_source(0.040)}, "2x slower"))
        else:
            commits.append(commit(repo, {"NOTES.md": f"note {number}\n"}, f"note {number}"))  # not-a-reference
    broken = "def work():\n    raise RuntimeError('broken')\n"
    commits.append(commit(repo, {"gatedemo/__init__.py": broken}, "broken"))
    return repo, commits


def _bisect(repo, *argv: str, mode: str = "existing"):
    return run_harness(repo, "bisect", *argv, "--mode", mode, "--machine", "bisect-test", "--install-command",
                       install_command(repo))


def _report(done) -> dict:
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timing
def test_bisect_names_the_planted_slow_commit_within_the_bound(history):
    repo, commits = history
    done = _bisect(repo, "bench.Work.time_work", commits[0], commits[9], "--json", "--factor", "1.5")
    report = _report(done)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["first_bad"]["commit"] == commits[5] and report["first_bad"]["subject"] == "2x slower"
    assert report["runs"] == len(report["probes"]) <= math.ceil(math.log2(10)) + 1 == report["bound"]
    assert report["first_bad"]["ratio"] > 1.5 and report["first_bad"]["before_commit"] == commits[4]
    assert [p["verdict"] for p in report["probes"]][0] == "good" and 1.5 <= report["threshold"] < 2
    assert "harness bisect: [2] commit 6 of 10" in done.stderr  # progress as it goes: 6 is the first probe


@pytest.mark.extended
def test_bisect_a_higher_is_better_rate_that_drops(history):
    # items/s: the slow commit lowers the value; a drop is the regression (asv counts higher as worse).
    repo, commits = history
    done = _bisect(repo, "Rate.track_rate", commits[2], commits[8], "--json", "--factor", "1.5")
    report = _report(done)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["higher_is_better"] and report["unit"] == "items/s" and report["benchmark"] == "bench.Rate.track_rate"
    first = report["first_bad"]
    assert first["commit"] == commits[5] and first["after"] < first["before"] / 1.5
    assert report["runs"] <= math.ceil(math.log2(7)) + 1


@pytest.mark.extended
def test_bisect_says_when_bad_is_no_worse_than_good(history):
    repo, commits = history
    done = _bisect(repo, "bench.Work.time_work", commits[6], commits[8])  # both after the slow-down
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "No commit moved: BAD " + commits[8][:12] + " is not worse than GOOD beyond" in done.stdout
    table = done.stdout.split("\n\n")[1].splitlines()
    assert table[0].split() == ["run", "commit", "hash", "value", "vs", "good", "verdict", "subject"]
    assert [row.split()[1] for row in table[1:]] == ["1/3", "3/3"]  # GOOD, then BAD alone decides
    assert "2 probes (bound ceil(log2 3) + 1 = 3)" in done.stdout
    assert "moved when the gate's rule says worse than GOOD beyond 1.03x, measured against it in interleaved " \
           "pairs" in done.stdout  # the default factor: the gate's


@pytest.mark.extended
def test_bisect_stops_with_3_no_verdict_where_the_benchmark_fails(history):
    repo, commits = history
    done = _bisect(repo, "bench.Work.time_work", commits[9], commits[10])
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    assert f"error: bench.Work.time_work failed on {commits[10][:12]} (broken): stopped there" in done.stdout
    assert "failed   broken" in done.stdout


def test_bisect_rejects_bad_input(history):
    repo, commits = history
    done = _bisect(repo, "bench.Work.time_work", commits[9], commits[0])
    assert done.returncode == 2 and f"{commits[9][:12]} is not an ancestor of {commits[0][:12]}" in done.stderr
    done = _bisect(repo, "bench.Work.time_nothing", commits[0], commits[9])
    assert done.returncode == 2
    assert "unknown benchmark 'bench.Work.time_nothing'; the suite has: bench.Rate.track_rate, bench.Work" \
           ".time_work" in done.stderr
    done = _bisect(repo, "bench.Work.time_work", commits[0], commits[9], "--factor", "0.9")
    assert done.returncode == 2 and "--factor must be > 1; got 0.9" in done.stderr


_BUSY_BENCH = "import busydemo\n\n\ndef time_loop():\n    busydemo.loop()\n"


def _loop(iterations: int) -> str:
    return f"def loop():\n    total = 0\n    for i in range({iterations}):\n        total += i * i\n    return total\n"


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """Six commits of a busy loop (about 22 ms, asv's default timing, as tests/ci/test_gate.py's); the fourth
    makes it 5% longer (the gate's busy-loop step)."""
    pytest.importorskip("asv")
    repo = tmp_path_factory.mktemp("bisectbusy")
    make_repo(repo, bench=_BUSY_BENCH)  # then renamed: a package that is not demorepo's
    conf = {**json.loads((repo / "asv.conf.json").read_text()), "project": "busydemo"}
    pyproject = (repo / "pyproject.toml").read_text().replace("gatedemo", "busydemo")
    (repo / "gatedemo" / "__init__.py").unlink()
    commits = [commit(repo, {"busydemo/__init__.py": _loop(400_000), "asv.conf.json": json.dumps(conf),
                             "pyproject.toml": pyproject}, "a busy loop")]
    commits.append(commit(repo, {"README.md": "a loop\n"}, "docs only"))
    commits.append(commit(repo, {"NOTES.md": "a note\n"}, "a note"))  # not-a-reference
    commits.append(commit(repo, {"busydemo/__init__.py": _loop(420_000)}, "the loop 5% longer"))
    commits.append(commit(repo, {"NOTES.md": "another note\n"}, "another note"))  # not-a-reference
    commits.append(commit(repo, {"README.md": "a longer loop\n"}, "docs again"))
    return repo, commits


@pytest.mark.extended
def test_bisect_resolves_a_5_percent_step_of_a_busy_loop_in_interleaved_pairs(stepped):
    # Probes: commit 4 (the step: moved), then commit 3 (a note: the same): two probes beside GOOD's run. The budget
    # is the gate's busy-loop tests' (120 s a combination): beside other work the loop needs more process pairs.
    repo, commits = stepped
    done = _bisect(repo, "bench.time_loop", commits[0], commits[5], "--json", "--probe-budget", "120")
    report = _report(done)
    if done.returncode == 3 and any(p["verdict"] == "undecided" for p in report["probes"]):
        # A probe the host left undecided within its budget is no verdict on bisect (it says so, exit 3): once
        # more, as the tuner's host-bound runs are (tests/parallel/test_tune.py), with twice the budget.
        done = _bisect(repo, "bench.time_loop", commits[0], commits[5], "--json", "--probe-budget", "240")
        report = _report(done)
    print(json.dumps(report["probes"], indent=1))  # pytest -rP: the figures
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["method"] == "interleaved pairs" and report["factor"] == benchgate.FACTOR == report["threshold"]
    assert report["first_bad"]["commit"] == commits[3] and report["first_bad"]["before_commit"] == commits[2]
    assert report["runs"] <= report["bound"] == math.ceil(math.log2(6)) + 1
    probes = {p["index"]: p for p in report["probes"]}
    moved = probes[3]
    assert moved["verdict"] == "moved" and 1.03 < moved["ratio"] < 1.12 and 1 < moved["low"] < moved["ratio"], moved
    # Moved is the gate's worse (beyond the factor, the lower bound above no change: the line above), at a look where
    # the rule stopped or at the judgment where the probe's budget ended (.ci/run at e7e42d3: 781 pairs, 1.046x, low
    # 1.034x; at 3883fcd: 641 pairs, 1.045x, low 1.009x; both "stopped: budget").
    assert moved["pairs"] >= 40 and re.search(r"stopped: (decided|budget)", moved["note"]), moved
    for same in (p for p in report["probes"] if p["verdict"] == "same"):
        assert same["index"] < 3 and same["high"] < 1.03, same
    assert [p["verdict"] for p in report["probes"]].count("same") >= 1


def _logged(log_ratios: list[float]) -> tuple[list[Measurement], list[Measurement]]:
    name = "bench.time_loop"
    return ([Measurement(name, "", "seconds", 0.02) for _ in log_ratios],
            [Measurement(name, "", "seconds", 0.02 * math.exp(d)) for d in log_ratios])


def test_a_probes_verdict_is_the_gates_against_good():
    # Process pairs of a 5% step, spread 1%: worse beyond the 3% floor, decided -> moved; no change -> the same;
    # bounds that straddle the floor when the budget ends -> undecided (no verdict for the probe); a probe whose
    # benchmark has no value -> failed.
    rng = random.Random(2)
    stepped = _logged([0.05 + rng.gauss(0, 0.01) for _ in range(80)])
    step = judge_rounds(*stepped, per_process=10)
    flat = judge_rounds(*_logged([rng.gauss(0, 0.01) for _ in range(80)]), per_process=10)
    straddling = judge_rounds(*_logged([0.0, 0.02, -0.01, 0.03]))
    assert step.verdict is benchgate.Verdict.WORSE and probe_verdict(step) is Verdict.MOVED, step
    wide = judge_rounds(*stepped, 1.1, per_process=10)  # the same pairs against a 10% factor: no step that large
    assert probe_verdict(wide, 1.1) is Verdict.SAME, wide
    assert flat.verdict is benchgate.Verdict.SAME and probe_verdict(flat) is Verdict.SAME, flat
    assert probe_verdict(straddling) is Verdict.UNDECIDED, straddling
    base, _ = _logged([0.0] * 4)
    failed = judge_rounds(base, [Measurement("bench.time_loop", "", "seconds", None)] * 4)
    assert probe_verdict(failed) is Verdict.FAILED


@pytest.mark.slow
def test_bisect_in_virtualenv_mode_wraps_asv_find(history):
    # asv builds each commit it probes in its own virtualenv (about a minute here).
    repo, commits = history
    done = _bisect(repo, "bench.Work.time_work", commits[3], commits[7], "--json", mode="virtualenv")
    report = _report(done)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "$ asv find" in done.stderr and report["mode"] == "virtualenv" and report["bound"] is None
    assert report["first_bad"]["commit"] == commits[5] and report["first_bad"]["before_commit"] == commits[4]


@pytest.mark.parametrize("count", range(1, 34))
def test_search_finds_any_first_bad_commit_within_ceil_log2_of_the_outcomes(count: int) -> None:
    for first in range(1, count + 2):  # count + 1: none moved
        calls: list[int] = []

        def is_moved(index: int, first: int = first, calls: list[int] = calls) -> bool:
            calls.append(index)
            return index >= first

        found = search(count, is_moved)
        assert found == (first if first <= count else None)
        assert len(calls) <= math.ceil(math.log2(count + 1)) and all(1 <= i <= count for i in calls)
        assert len(calls) + 1 <= run_bound(count + 1)  # GOOD's run and the probes: ceil(log2 n) + 1


def test_run_bound_and_worse_ratio():
    assert [run_bound(n) for n in (2, 3, 4, 5, 8, 9, 10, 16, 17)] == [2, 3, 3, 4, 4, 5, 5, 5, 6]
    assert worse_ratio(20.0, 26.0, higher_is_better=False) == pytest.approx(1.3)
    assert worse_ratio(50.0, 40.0, higher_is_better=True) == pytest.approx(1.25)
    assert worse_ratio(0.0, 0.0, higher_is_better=False) == 1.0
    assert worse_ratio(10.0, 0.0, higher_is_better=True) == math.inf


def test_resolve_target_names_the_benchmark_and_combination():
    benchmarks = {"throughput.Throughput.track_samples_per_second":
                  {"params": [["'mnist'", "'gru'"], ["2", "3"]], "unit": "samples/s"},
                  "bench.Work.time_work": {"params": [], "unit": "seconds"}}
    work = resolve_target(benchmarks, "Work.time_work", None)
    assert work == Target("bench.Work.time_work", "", "seconds", 0, ()) and work.regex == r"^bench\.Work\.time_work$"
    rate = resolve_target(benchmarks, "throughput.Throughput.track_samples_per_second", "gru, 2")
    assert (rate.params, rate.combo, rate.higher_is_better) == ("'gru', 2", 2, True)
    assert rate.regex == r"^throughput\.Throughput\.track_samples_per_second\('gru',\ 2\)$"
    with pytest.raises(ValueError, match=r"has 4 parameter combinations; pick one with --params, one of: "
                                         r"\"'mnist', 2\""):
        resolve_target(benchmarks, "track_samples_per_second", None)
    with pytest.raises(ValueError, match=r"--params 'lstm, 2' is not a combination of throughput"):
        resolve_target(benchmarks, "track_samples_per_second", "lstm, 2")
    with pytest.raises(ValueError, match=r"unknown benchmark 'time_wrk'; the suite has: bench.Work.time_work"):
        resolve_target(benchmarks, "time_wrk", None)


def test_asv_find_output_is_parsed():
    # asv 0.6.6's log lines (a real run): the commits it ran, in order, and its answer.
    commits = ["7bf45c13" + "0" * 32, "82b356ff" + "0" * 32, "a173d28e" + "0" * 32, "71b09328" + "0" * 32]
    lines = ["· Running approximately 3 benchmarks within 10 commits", "·· For gatedemo commit 7bf45c13 <main~9>:",
             "··· bench.Work.time_work                                   20.1±0.04ms",
             "·· For gatedemo commit 71b09328 <main>:", "·· For gatedemo commit 82b356ff <main~5>:",
             "·· Building a173d28e <main~4> for virtualenv-py3.11", "·· For gatedemo commit a173d28e <main~4>:",
             "· Greatest regression found: a173d28e <main~4>"]
    assert _parse_find(lines, commits) == ([commits[0], commits[3], commits[1], commits[2]], 2)
