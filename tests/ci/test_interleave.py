"""Interleaved pairs (``harness.ci.interleave`` and its worker): two processes, one per side, sampled in turn, the
order alternating; a side that fails to set up is named, one that skips is a skip; a hung side cannot hang the
gate. asv's benchmark list is not built here: ``benchmark_id`` is pointed at a folder of benchmarks directly."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("asv_runner")

from harness.ci import interleave  # noqa: E402
from harness.ci.benchgate import Stopping  # noqa: E402
from harness.errors import Failed  # noqa: E402

_BENCH = textwrap.dedent('''
    import os
    import time
    from pathlib import Path


    class Logged:
        number = 1
        warmup_time = 0

        def setup(self):
            self.side = Path(os.environ["PYTHONPATH"]).name  # the folder of "the commit": base or head
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            if len(cpus) > 1:  # each side on a CPU of its own, as the system may keep them: the pairs must not
                os.sched_setaffinity(0, {cpus[self.side == "head"]})

        def time_call(self):
            stat = Path("/proc/self/stat").read_text() if Path("/proc/self/stat").exists() else ""
            cpus = stat[stat.rindex(")") + 2:].split()[36] if stat else "-"  # the CPU this sample ran on
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{self.side} {cpus} {os.getpid()}\\n")


    class Broken:
        def setup(self):
            if Path(os.environ["PYTHONPATH"]).name == "head":
                raise RuntimeError("head's setup is broken")

        def time_call(self):
            pass


    class Skipped:
        def setup(self):
            raise NotImplementedError

        def time_call(self):
            pass


    class Crowded:
        """A CPU-bound call sharing its one CPU with a busy process: its wall time about twice its CPU time."""
        number = 1
        warmup_time = 0

        def setup(self):
            import subprocess
            import sys
            cpu = min(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpu})
            self.hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            os.sched_setaffinity(self.hog.pid, {cpu})
            time.sleep(0.2)

        def teardown(self):
            self.hog.kill()
            self.hog.wait()

        def time_call(self):
            wall, cpu = time.perf_counter(), time.thread_time()
            total = 0
            for i in range(300_000):
                total += i * i
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{time.perf_counter() - wall} {time.thread_time() - cpu}\\n")


    class Sleeps:
        number = 1
        warmup_time = 0

        def time_call(self):
            time.sleep(0.02)


    class OwnTimer:
        number = 1
        warmup_time = 0
        timer = time.process_time

        def time_call(self):
            pass


    class Hangs:
        number = 1
        warmup_time = 0

        def time_call(self):
            if Path(os.environ["PYTHONPATH"]).name == "head":
                time.sleep(60)
''')


@pytest.fixture()
def suite(tmp_path, monkeypatch):
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    (benchmarks / "__init__.py").write_text("")
    (benchmarks / "pairs.py").write_text(_BENCH)
    targets = (tmp_path / "base", tmp_path / "head")
    for target in targets:
        target.mkdir()
    monkeypatch.setenv("PAIR_LOG", str(tmp_path / "log"))
    monkeypatch.setattr(interleave, "benchmark_id", lambda config, key: (benchmarks, key[0]))
    return tmp_path, targets


class _Looks:
    """A stopping rule as ``interleave.measure`` asks it (``benchgate.Stopping``'s ``due``, ``stops`` and
    ``per_process``), its looks those of the real rule with ``first`` and ``every``: records each look and stops
    from ``at`` pairs on (never where None)."""

    def __init__(self, first: int = 20, every: int = 20, at: int | None = None,
                 per_process: int = interleave.PER_PROCESS):
        self.rule = Stopping(first=first, every=every, per_process=per_process)
        self.per_process, self.at, self.looks = per_process, at, []

    def due(self, n: int) -> bool:
        return self.rule.due(n)

    def stops(self, base, head) -> bool:
        self.looks.append(len(base))
        return self.at is not None and len(base) >= self.at


def _measure(name, targets, rule=None, **limits):
    return interleave.measure((f"pairs.{name}.time_call", ""), "seconds", Path("asv.conf.json"), targets,
                              rule or _Looks(), **limits)


def test_the_two_sides_are_sampled_in_turn_the_order_alternating_pair_by_pair(suite):
    folder, targets = suite
    rule = _Looks(at=40)
    done = _measure("Logged", targets, rule)
    assert done.stopped == "decided" and len(done.base) == len(done.head) == 40 and rule.looks == [20, 40]
    assert done.number == 1 and all(m.value > 0 for m in done.base + done.head)
    logged = [line.split() for line in (folder / "log").read_text().splitlines()]
    assert len(logged) == 160 and all(a[0] == b[0] for a, b in zip(logged[0::2], logged[1::2]))
    calls = logged[1::2]  # each sample: one call untimed, then the sample's (pairworker's "sample")
    assert [side for side, _, _ in calls[:6]] == ["base", "head", "head", "base", "base", "head"]
    # The second sample of each pair on the CPU the first ran on (where there are two CPUs to pin to)
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1:
        pinned = [(calls[2 * i][1], calls[2 * i + 1][1]) for i in range(40)]
        assert all(a == b for a, b in pinned), pinned


def test_each_process_pair_takes_its_share_of_pairs_then_both_are_new_processes(suite):
    # Two processes of one commit differ in speed for their whole life (interleave's docstring): the pairs come
    # from process pairs of PER_PROCESS pairs each, both sides' processes new for each, and say so for the judge.
    folder, targets = suite
    done = _measure("Logged", targets, _Looks(at=40))
    assert done.per_process == interleave.PER_PROCESS == 10 and len(done.base) == 40
    calls = [line.split() for line in (folder / "log").read_text().splitlines()][1::2]  # the timed calls
    pids = {side: [pid for s, _, pid in calls if s == side] for side in ("base", "head")}
    for side, seen in pids.items():
        groups = [set(seen[i:i + 10]) for i in range(0, 40, 10)]
        assert all(len(group) == 1 for group in groups) and len(set().union(*groups)) == 4, (side, seen)
    assert not set(pids["base"]) & set(pids["head"])
    one = _measure("Logged", targets, _Looks(per_process=0), max_pairs=30)  # 0: every pair from one
    assert one.per_process == 0 and len(one.base) == 30
    calls = [line.split() for line in (folder / "log").read_text().splitlines()][160:]
    assert len({pid for side, _, pid in calls if side == "base"}) == 1
    with pytest.raises(ValueError, match="got per_process=1"):
        _measure("Logged", targets, _Looks(per_process=1))


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists() or not hasattr(os, "sched_setaffinity"),
                    reason="the kernel says nothing of run-queue waits here, or threads cannot be pinned")
def test_a_sample_leaves_out_the_time_the_host_gave_to_other_processes(suite):
    # Beside a busy process on its one CPU a loop's wall time is about twice its CPU time; the sample the worker
    # answers is about its CPU time (the wait on the run queue taken out). A sleep still counts in full, and a
    # benchmark with a timer of its own keeps it.
    folder, targets = suite
    crowded = _measure("Crowded", targets, _Looks(first=100), max_pairs=6)
    assert crowded.net and len(crowded.base) == 6
    logged = [tuple(map(float, line.split())) for line in (folder / "log").read_text().splitlines()][1::2]
    assert len(logged) == 12 and sorted(w / c for w, c in logged)[6] > 1.5, logged  # it was crowded
    cpu = sorted(c for _, c in logged)[6]
    sampled = sorted(m.value for m in crowded.base + crowded.head)[6]
    assert 0.8 < sampled / cpu < 1.25, (sampled, cpu, logged)
    slept = _measure("Sleeps", targets, _Looks(first=100), max_pairs=4)
    assert slept.net and min(m.value for m in slept.base + slept.head) >= 0.02
    assert not _measure("OwnTimer", targets, _Looks(first=100), max_pairs=4).net


def test_limits_stop_the_sampling(suite):
    _, targets = suite
    assert _measure("Logged", targets, max_pairs=30).stopped == "max pairs"
    done = _measure("Logged", targets, budget_s=0.0)
    assert done.stopped == "budget" and len(done.base) == 1


def test_a_side_that_fails_is_named_and_one_that_skips_is_a_skip(suite):
    _, targets = suite
    with pytest.raises(Failed, match="the head side's benchmark failed: RuntimeError: head's setup is broken"):
        _measure("Broken", targets)
    skipped = _measure("Skipped", targets)
    assert skipped.stopped == "skipped" and "head: setup skipped this combination" in skipped.skipped
    assert not skipped.base and not skipped.head


def test_a_side_that_stops_answering_fails_within_its_timeout(suite, monkeypatch):
    _, targets = suite
    monkeypatch.setattr(interleave, "_SAMPLE_S", 1.0)
    with pytest.raises(Failed, match="the head side's benchmark process did not answer within 1 s"):
        _measure("Hangs", targets)
