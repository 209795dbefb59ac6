"""Interleaved timing: a ``time_`` benchmark of two commits measured sample by sample, alternately.

Why: on a shared host the speed moves in steps that last seconds (measured here: one loop at 24, 30, 35 and 39 ms
within two minutes, docs/regressions.md). asv runs one commit at a time, so two asv runs of a 22 ms benchmark are
seconds apart and often land on different steps: a real 5% measured 1.02-1.09x. Two processes, one per commit,
each with its commit installed in a folder of its own (``AsvProject.install_into``) and the benchmark set up as asv
sets it up (``harness/ci/pairworker.py``), take one sample each in turn: the two samples of a pair are tens of
milliseconds apart, on the same step, and their ratio keeps the change while the step cancels. The order alternates
(base first, then head first) so that a host drifting one way favours neither side.

The two samples of a pair also run on the same CPU. This host's two vCPUs differ in speed by up to 13% for tens of
seconds (a loop timed on each in turn: cpu1/cpu0 0.87x to 1.13x, medians of 60 pairs), and an idle worker wakes on
the CPU it last ran on, so base's and head's processes tend to keep a CPU each: a 5% longer loop measured 1.022x,
its bounds below the 3% floor (tests/ci/test_gate.py, c4bf300). The first sample of a pair runs where the system
puts it; the second worker's main thread is then pinned to the CPU the first one ran on, and unpinned after its
sample (``os.sched_setaffinity`` on the process id: on Linux, its main thread alone; threads a benchmark's library
started, such as TensorFlow's pools, keep theirs). Pinning both to a fixed CPU instead made it worse beside a busy
process: the pair was forced onto the busy CPU, and the 5% loop measured 1.010-1.020x in 3 runs of 3 beside one CPU
hog. Where pinning is not available (not Linux, or refused), the workers run where the system puts them.

:func:`measure` samples until ``decide`` says the pairs are decided (``benchgate.decided``: the bounds exclude the
gate's factor), checking every ``batch`` pairs from ``min_pairs`` on, or until ``max_pairs`` or ``budget_s`` is
spent. It returns one :class:`~harness.ci.asvresults.Measurement` per sample and side, pairs in order, for
``benchgate.judge_rounds``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.ci.asvresults import Key, Measurement
from harness.ci.benchgate import MEDIAN_PAIRS
from harness.errors import Failed

__all__ = ["Sampled", "measure", "benchmark_id", "WORKER", "MIN_PAIRS", "MAX_PAIRS", "BATCH", "BUDGET_S"]

WORKER = Path(__file__).with_name("pairworker.py")
MIN_PAIRS = MEDIAN_PAIRS  # the first look: from here on, the median and its order-statistic bounds
BATCH = 20  # pairs between two looks at the bounds
MAX_PAIRS = 2000
BUDGET_S = 60.0  # seconds of sampling per benchmark combination, setup not counted
_READY_S = 600.0  # a worker's set-up (importing TensorFlow, building a model, setup_cache)
_SAMPLE_S = 120.0
# By path, and not as ``python pairworker.py``: that would put harness/ci first on sys.path, where bisect.py
# shadows the standard library's bisect.
_RUN_WORKER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


@dataclass(frozen=True)
class Sampled:
    """What :func:`measure` took: the pairs (``base[i]``, ``head[i]``), the calls per sample, and why it stopped."""

    base: tuple[Measurement, ...]
    head: tuple[Measurement, ...]
    number: int
    stopped: str  # "decided", "max pairs", "budget"
    skipped: str = ""  # a side's setup skipped the combination: no pairs


class _Worker:
    """One commit's ``pairworker.py`` process; answers are read with a timeout, so a hung benchmark cannot hang the
    gate."""

    def __init__(self, label: str, benchmark_dir: Path, benchmark_id: str, target: Path, cwd: Path):
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "ASV_PYTHONPATH")}
        env["PYTHONPATH"] = str(target)
        self.label = label
        argv = [sys.executable, "-c", _RUN_WORKER, str(WORKER), str(benchmark_dir), benchmark_id]
        self.process = subprocess.Popen(argv,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=cwd, env=env)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]

    def answer(self, timeout: float) -> dict:
        if not self._selector.select(timeout):
            raise Failed(f"the {self.label} side's benchmark process did not answer within {timeout:g} s")
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise Failed(f"the {self.label} side's benchmark process ended: {self._stderr()}")
        found = json.loads(line)
        if "error" in found:
            raise Failed(f"the {self.label} side's benchmark failed: {found['error'].strip().splitlines()[-1]}")
        return found

    def ask(self, timeout: float, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self.answer(timeout)

    def _stderr(self) -> str:
        self.process.wait(timeout=10)
        tail = (self.process.stderr.read() or "").strip().splitlines()[-3:]  # type: ignore[union-attr]
        return " / ".join(tail) or f"exit {self.process.returncode}"

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.stdin.write(json.dumps({"stop": True}) + "\n")  # type: ignore[union-attr]
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            self._selector.close()


def _cpus() -> list[int]:
    """The CPUs this process may run on, where there are two or more and threads can be pinned; else none."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    return cpus if len(cpus) > 1 else []


def _follow(pid: int, leader: int | None, cpus: list[int]) -> list[int]:
    """Pins the main thread of ``pid`` to the CPU ``leader``'s main thread last ran on (``/proc/PID/stat``'s
    ``processor``), or with ``leader`` None back to all of ``cpus``; returns ``cpus``, or none (following given up)
    where the system refuses or says nothing."""
    try:
        if leader is None:
            os.sched_setaffinity(pid, cpus)
        else:
            stat = Path(f"/proc/{leader}/stat").read_text()
            cpu = int(stat[stat.rindex(")") + 2:].split()[36])  # field 39; the command name may hold spaces
            os.sched_setaffinity(pid, {cpu})
    except (OSError, ValueError, IndexError):
        return []
    return cpus


def benchmark_id(config: Path, key: Key) -> tuple[Path, str]:
    """The benchmark folder of the asv project at ``config`` and asv's id of ``key`` in it (``name``, or
    ``name-INDEX`` for a combination of a parametrized benchmark).

    Raises:
        Failed: asv's benchmark list does not hold ``key``.
    """
    from harness.ci.asvresults import combos, load_config

    conf, benchmarks = load_config(config)
    name, params = key
    bench = benchmarks.get(name)
    names = combos(bench["params"]) if bench is not None else []
    if params not in names:
        raise Failed(f"asv's benchmark list has no {name} ({params})")
    return Path(conf.benchmark_dir), f"{name}-{names.index(params)}" if bench["params"] else name


def measure(key: Key, unit: str, config: Path, targets: tuple[Path, Path],
            decide: Callable[[Sequence[Measurement], Sequence[Measurement]], bool], min_pairs: int = MIN_PAIRS,
            max_pairs: int = MAX_PAIRS, budget_s: float = BUDGET_S, batch: int = BATCH,
            progress: Callable[[str], None] | None = None) -> Sampled:
    """Pairs of samples of benchmark combination ``key`` of the asv project at ``config``, base from
    ``targets[0]``, head from ``targets[1]`` (folders the commits are installed in), until decided or a limit is
    reached.

    Raises:
        Failed: a side's benchmark failed to set up or to run, or stopped answering.
    """
    name, params = key
    benchmark_dir, bench_id = benchmark_id(config, key)
    with tempfile.TemporaryDirectory(prefix="harness-pairs-") as cwd:
        workers = [_Worker(side, benchmark_dir, bench_id, target, Path(cwd))
                   for side, target in zip(("base", "head"), targets)]
        try:
            ready = [worker.answer(_READY_S) for worker in workers]
            skipped = [f"{worker.label}: {said['skip']}" for worker, said in zip(workers, ready) if "skip" in said]
            if skipped:
                return Sampled((), (), 0, "skipped", "; ".join(skipped))
            number = int(ready[0]["number"]) or int(workers[0].ask(_SAMPLE_S, calibrate=True)["number"])
            for worker, said in zip(workers, ready):
                worker.ask(_SAMPLE_S, warm=float(said.get("warmup", 0.1)))
            base: list[Measurement] = []
            head: list[Measurement] = []
            start, stopped = time.perf_counter(), "max pairs"
            cpus = _cpus()
            while len(base) < max_pairs:
                order = (0, 1) if len(base) % 2 == 0 else (1, 0)
                seconds = {}
                for side in order:
                    seconds[side] = float(workers[side].ask(_SAMPLE_S, sample=number)["seconds"])
                    if cpus and side == order[0]:  # the second sample where the first ran
                        cpus = _follow(workers[order[1]].process.pid, workers[side].process.pid, cpus)
                if cpus:
                    cpus = _follow(workers[order[1]].process.pid, None, cpus)
                base.append(Measurement(name, params, unit, seconds[0]))
                head.append(Measurement(name, params, unit, seconds[1]))
                if len(base) >= min_pairs and len(base) % batch == 0:
                    if decide(base, head):
                        stopped = "decided"
                        break
                    if progress is not None:
                        progress(f"{len(base)} pairs, not decided yet")
                if time.perf_counter() - start > budget_s:
                    stopped = "budget"
                    break
            return Sampled(tuple(base), tuple(head), number, stopped)
        finally:
            for worker in workers:
                worker.close()
