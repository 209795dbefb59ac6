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
                log.write(f"{self.side} {cpus}\\n")


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


def _measure(name, targets, decide=lambda base, head: False, **limits):
    return interleave.measure((f"pairs.{name}.time_call", ""), "seconds", Path("asv.conf.json"), targets, decide,
                              **limits)


def test_the_two_sides_are_sampled_in_turn_the_order_alternating_pair_by_pair(suite):
    folder, targets = suite
    looks = []

    def decide(base, head):
        looks.append(len(base))
        return len(base) >= 40

    done = _measure("Logged", targets, decide, min_pairs=20, batch=20)
    assert done.stopped == "decided" and len(done.base) == len(done.head) == 40 and looks == [20, 40]
    assert done.number == 1 and all(m.value > 0 for m in done.base + done.head)
    calls = [line.split() for line in (folder / "log").read_text().splitlines()]
    assert [side for side, _ in calls[:6]] == ["base", "head", "head", "base", "base", "head"] and len(calls) == 80
    # The second sample of each pair on the CPU the first ran on (where there are two CPUs to pin to)
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1:
        pinned = [(calls[2 * i][1], calls[2 * i + 1][1]) for i in range(40)]
        assert all(a == b for a, b in pinned), pinned


def test_limits_stop_the_sampling(suite):
    _, targets = suite
    assert _measure("Logged", targets, min_pairs=20, max_pairs=30).stopped == "max pairs"
    done = _measure("Logged", targets, min_pairs=20, budget_s=0.0)
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
