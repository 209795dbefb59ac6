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
from harness.ci.benchgate import Stopping, Verdict, judge_rounds  # noqa: E402
from harness.errors import Failed  # noqa: E402

_BENCH = textwrap.dedent('''
    import os
    import time
    from pathlib import Path


    STARTED = []


    class Logged:
        number = 1
        warmup_time = 0

        def setup(self):
            self.side = Path(os.environ["PYTHONPATH"]).name  # the folder of "the commit": base or head
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            if len(cpus) > 1 and not STARTED:  # each side starts on a CPU of its own, as the system may keep them:
                STARTED.append(True)  # (once a process: asv runs setup again before each sample) the pairs must not
                os.sched_setaffinity(0, {cpus[self.side == "head"]})
                end = time.perf_counter() + 0.05
                while time.perf_counter() < end:
                    pass
                os.sched_setaffinity(0, cpus)  # then free to run anywhere, its own CPU set all of them

        def time_call(self):
            stat = Path("/proc/self/stat").read_text() if Path("/proc/self/stat").exists() else ""
            cpus = stat[stat.rindex(")") + 2:].split()[36] if stat else "-"  # the CPU this sample ran on
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{self.side} {cpus} {os.getpid()}\\n")


    SETUPS = []


    class CountsSetUp:
        """Logs, at each call, how many times this process has set the benchmark up."""
        number = 1
        warmup_time = 0

        def setup(self):
            SETUPS.append(True)

        def time_call(self):
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{os.getpid()} {len(SETUPS)}\\n")


    STARTS = []


    class SlowStart:
        """A benchmark whose process takes half a second to set up and 0.5 to 1.5 ms a call."""
        number = 1
        warmup_time = 0

        def setup(self):
            if not STARTS:  # once a process: asv runs setup again before each sample
                STARTS.append(True)
                time.sleep(0.5)

        def time_call(self):
            import random
            end = time.perf_counter() + random.uniform(0.0005, 0.0015)
            while time.perf_counter() < end:
                pass
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{os.getpid()}\\n")


    class SkipsLater:
        """Head's set-up skips the combination in the processes whose numbers (1 the first) are in SKIP_IN."""
        number = 1
        warmup_time = 0

        def setup(self):
            if STARTS:  # once a process
                return
            side = Path(os.environ["PYTHONPATH"]).name
            count = Path(os.environ["PAIR_LOG"] + "." + side)
            started = len(count.read_text()) + 1 if count.exists() else 1
            count.write_text("x" * started)
            STARTS.append(started)
            if side == "head" and str(started) in os.environ["SKIP_IN"].split(","):
                raise NotImplementedError(f"host too busy in process {started}")

        def time_call(self):
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{os.getpid()} {STARTS[0]}\\n")


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


    HELPER = {}  # at module level: asv runs setup again before each sample


    class Helped:
        """A CPU-bound call on the one CPU the benchmark chose for itself once (base the first CPU, head the last);
        on head a helper thread of its own works on that CPU while the call runs (hashing: it lets go of the GIL), so
        head's call takes about twice as long."""
        number = 1
        warmup_time = 0

        def setup(self):
            import hashlib
            import threading
            if HELPER:
                return
            side = Path(os.environ["PYTHONPATH"]).name
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[-1] if side == "head" else cpus[0]})  # its choice: the helper inherits it
            HELPER.update(side=side, go=threading.Event())
            data = b"x" * (1 << 24)  # about 20 ms a hash, the GIL let go: the helper almost always runnable

            def helper():
                while True:
                    HELPER["go"].wait()
                    hashlib.sha256(data).digest()

            if side == "head":
                threading.Thread(target=helper, daemon=True).start()

        def time_call(self):
            HELPER["go"].set()
            wall, cpu = time.perf_counter(), time.thread_time()
            total = 0
            for i in range(300_000):
                total += i * i
            HELPER["go"].clear()
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{HELPER['side']} {time.perf_counter() - wall} {time.thread_time() - cpu} "
                          f"{','.join(map(str, sorted(os.sched_getaffinity(0))))}\\n")


    SPAWNED = []  # at module level: asv runs setup again before each sample


    class Spawns:
        """Each call starts a thread that lives on; each call logs the CPU sets of the threads earlier calls
        started (the driver pins this process's main thread for the second sample of a pair, and unpins it after)."""
        number = 1
        warmup_time = 0

        def time_call(self):
            import threading
            sets = [sorted(os.sched_getaffinity(t.native_id)) for t in SPAWNED]
            with open(os.environ["PAIR_LOG"], "a") as log:
                log.write(f"{len(os.sched_getaffinity(0))} {sets}\\n")
            thread = threading.Thread(target=threading.Event().wait, daemon=True)
            thread.start()
            SPAWNED.append(thread)


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

    def sized(self, per_process: int) -> _Looks:
        self.rule = self.rule.sized(per_process)
        self.per_process = per_process
        return self


def _measure(name, targets, rule=None, size=False, **limits):
    """``interleave.measure`` of benchmark ``pairs.NAME.time_call``; process pairs of the rule's size unless ``size``
    (then sized from their cost)."""
    return interleave.measure((f"pairs.{name}.time_call", ""), "seconds", Path("asv.conf.json"), targets,
                              rule or _Looks(), size=size, **limits)


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
        # Unpinned, 4 to 24 of 40 matched here (each side tends to keep the CPU it started on); pinned, 40 of 40 and 39
        # beside other tests (the first side can move between its sample and the driver reading where it ran).
        assert sum(a == b for a, b in pinned) >= 36, pinned


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


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists() or not hasattr(os, "sched_setaffinity")
                    or len(os.sched_getaffinity(0)) < 2,
                    reason="the kernel says nothing of run-queue waits here, or there are no two CPUs to pin to")
def test_a_helper_thread_a_change_adds_is_timed_and_the_benchmarks_own_cpu_kept(suite):
    # Head's helper thread takes its CPU from the call: a wait on the run queue behind the benchmark's own thread
    # is time it costs, caught by the gate's rule (a clock that took every run-queue wait out measured about 1.0x).
    # Each side chose its CPU, base the first and head the last: every call ran there, and the second sample of a
    # pair was not pinned to the other side's CPU (pinned there, head's helper would have had a CPU of its own).
    folder, targets = suite
    # the gate's rule on pairs from one process pair (cheaper: what is tested is the clock, not process pairs)
    done = _measure("Helped", targets, Stopping(first=20, every=20, see=True), max_pairs=60)
    row = judge_rounds(list(done.base), list(done.head), source="interleaved pairs", per_process=done.per_process)
    assert done.net and row.verdict is Verdict.WORSE and row.ratio > 1.3, (row, done.stopped)
    logged = [line.split() for line in (folder / "log").read_text().splitlines()]
    chosen = {side: {cpus for s, _, _, cpus in logged if s == side} for side in ("base", "head")}
    assert chosen == {"base": {"0"}, "head": {str(max(os.sched_getaffinity(0)))}}, chosen


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="no two CPUs to pin to")
def test_a_thread_started_while_pinned_is_released_with_the_main_thread(suite):
    folder, targets = suite
    _measure("Spawns", targets, _Looks(per_process=0), max_pairs=12)
    everywhere = len(os.sched_getaffinity(0))
    logged = [line.split(" ", 1) for line in (folder / "log").read_text().splitlines()]
    pinned = [line for line in logged if line[0] == "1"]  # calls while the driver had this process pinned
    assert pinned, logged  # the second sample of each pair (and its untimed call) was pinned
    assert len(eval(logged[-1][1])) > 10, logged  # threads from earlier calls, some started pinned
    for main, sets in logged:  # once unpinned, every earlier call's thread is free, whether or not it started pinned
        assert main == "1" or all(len(cpus) == everywhere for cpus in eval(sets)), logged


def test_a_process_sets_its_benchmark_up_once_as_asv_does(suite):
    # asv clears its redo-setup flag before each sample; left set, every sample tore the benchmark down and set it up
    # again: benchmarks/onjax.py rebuilt and traced its model each time, a 2.5 ms step taking 1.1-1.3 s a sample
    # (a process holding it answered in 6 ms once the flag was cleared).
    folder, targets = suite
    _measure("CountsSetUp", targets, _Looks(per_process=0), max_pairs=10)
    counts = {line.split()[1] for line in (folder / "log").read_text().splitlines()}
    assert counts == {"1"}, counts


def test_limits_stop_the_sampling(suite):
    _, targets = suite
    assert _measure("Logged", targets, max_pairs=30).stopped == "max pairs"
    done = _measure("Logged", targets, budget_s=0.0)  # the pairs that time a pair come first, whatever the budget
    assert done.stopped == "budget" and len(done.base) == interleave.PACE_PAIRS + 1


def test_a_process_pair_takes_as_many_pairs_as_its_set_up_took_time(suite):
    # A model benchmark's process takes seconds to set up and milliseconds a pair, and its pairs are far noisier than
    # its processes are off: process pairs of 10 pairs spent nearly all their time starting processes. This one
    # starts in about 0.9 s against about 8 ms a pair: about 100 pairs a process pair.
    folder, targets = suite
    rule = _Looks(first=20, every=20)
    done = _measure("SlowStart", targets, rule, size=True, max_pairs=20, budget_s=None)
    size = done.per_process
    assert size == interleave.process_pair_size(done.set_up, done.pair) and size > interleave.PER_PROCESS
    assert done.set_up > 0.5 and 0 < done.pair < 0.1
    # the rule and the most pairs scaled alike: two process pairs, one look where the rule's would be (2 of them)
    assert len(done.base) == 2 * size and done.stopped == "max pairs" and rule.looks == [2 * size]
    pids = (folder / "log").read_text().split()[1::2]  # each sample's timed call (one untimed call before it)
    groups = [pids[i:i + 2 * size] for i in range(0, len(pids), 2 * size)]
    assert [len(set(group)) for group in groups] == [2, 2] and len(set(pids)) == 4
    assert done.budget == max(interleave.BUDGET_S, interleave.auto_budget(done.set_up, done.pair, size))
    fixed = _measure("SlowStart", targets, _Looks(first=20, every=20), max_pairs=20)
    assert fixed.per_process == interleave.PER_PROCESS and len(fixed.base) == 20


def test_a_later_process_pair_whose_set_up_skips_is_replaced_and_the_pairs_taken_kept(suite, monkeypatch):
    # A TensorFlow step benchmark of the emulated grid skips where its set-up finds the host too busy for its emulated
    # devices; beside the other side's set-up it did so in a later process pair, and every pair taken was thrown away.
    folder, targets = suite
    monkeypatch.setenv("SKIP_IN", "2")
    done = _measure("SkipsLater", targets, _Looks(first=20, every=20), max_pairs=30)
    assert not done.skipped and done.stopped == "max pairs" and len(done.base) == 30
    processes = [line.split()[1] for line in (folder / "log").read_text().splitlines()][1::2]
    assert sorted(set(processes)) == ["1", "3", "4"], processes  # the second process pair replaced by the third
    for side in ("base", "head"):
        (folder / f"log.{side}").unlink()
    monkeypatch.setenv("SKIP_IN", ",".join(str(n) for n in range(2, 10)))
    kept = _measure("SkipsLater", targets, _Looks(first=20, every=20), max_pairs=60)
    assert not kept.skipped and len(kept.base) == interleave.PER_PROCESS
    assert kept.stopped == (f"set-up skipped {interleave.REFUSED_PROCESS_PAIRS + 1} times "
                            "(head: setup skipped this combination)"), kept.stopped
    (folder / "log.head").write_text("")
    monkeypatch.setenv("SKIP_IN", "1")
    first = _measure("SkipsLater", targets, _Looks(first=20, every=20), max_pairs=60)
    assert first.stopped == "skipped" and first.skipped == "head: setup skipped this combination" and not first.base


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
