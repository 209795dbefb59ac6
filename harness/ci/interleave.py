"""Interleaved timing: a ``time_`` benchmark of two commits measured sample by sample, alternately.

Why: on a shared host the speed moves in steps that last seconds (measured here: one loop at 24, 30, 35 and 39 ms within
two minutes, docs/design.md, "The gate, measured"). asv runs one commit at a time, so two asv runs of a 22 ms benchmark
are seconds apart and often land on different steps: a real 5% measured 1.02-1.09x. Two processes, one per commit, each
with its commit installed in a folder of its own (``AsvProject.install_into``) and the benchmark set up as asv sets it
up (``harness/ci/pairworker.py``), take one sample each in turn: the two samples of a pair are tens of milliseconds
apart, on the same step, and their ratio keeps the change while the step cancels. The order alternates (base first, then
head first) so that a host drifting one way favours neither side.

The two samples of a pair also run on the same CPU. This host's two vCPUs differ in speed by up to 13% for tens of
seconds (a loop timed on each in turn: cpu1/cpu0 0.87x to 1.13x, medians of 60 pairs), and an idle worker wakes on
the CPU it last ran on, so base's and head's processes tend to keep a CPU each: a 5% longer loop measured 1.022x,
its bounds below the 3% floor (tests/ci/test_gate.py, c4bf300). The first sample of a pair runs where the system
puts it; the second worker's main thread is then pinned to the CPU the first one ran on, and unpinned after its
sample (``os.sched_setaffinity`` on the process id: on Linux, its main thread alone; threads a benchmark's library
started, such as TensorFlow's pools, keep theirs). Unpinned is back to the CPU set it had (a benchmark that set its
own affinity keeps it; one confined to other CPUs than the first sample's is not pinned at all), and a thread started
while it was pinned, which inherited the pin, is released with it (:func:`_pin`, :func:`_release`). Pinning both
to a fixed CPU instead made it worse beside a busy process: the pair was forced onto the busy CPU, and the 5% loop
measured 1.010-1.020x in 3 runs of 3 beside one CPU hog. Where pinning is not available (not Linux, or refused),
the workers run where the system puts them.

A process pair takes ``PER_PROCESS`` pairs, then both processes are replaced by new ones. Two processes running the
same code differ in speed by a fixed share for their whole life: an A/A of this busy loop (one commit against
itself) measured 0.85x to 1.06x in 16 runs of one process pair each (60 to 100 pairs a run, spread ~4% within a
run), and neither a fixed hash seed nor address-space randomization turned off (``PYTHONHASHSEED=0 setarch -R``)
removed it (docs/design.md, "The gate, measured").
The pairs of one process pair share that offset, so more of them never average it away: a 5% longer loop measured
1.001x in CI, decided as no change (tests/ci/test_gate.py at 8871b78). ``benchgate.judge_rounds`` judges each
process pair's median (``per_process``), its spread the spread between process pairs.

A process pair's size follows from what it costs (:func:`process_pair_size`): as many pairs as fit in the time its
set-up took, in tens from ``PER_PROCESS`` to ``MOST_PER_PROCESS``, and the rule scaled to look at the same numbers of
process pairs (``Stopping.sized``). The busy loop (0.4-0.5 s to start, 75-100 ms a pair) keeps 10; a JAX model
benchmark takes seconds to start against tens of milliseconds a pair, and its pairs are far noisier than its processes
are off (onjax: a pair's spread 0.30, process pairs of 100 pairs 0.03-0.06 apart, docs/design.md, "The gate,
measured"), so its process pairs take 200 pairs. Its workers share a JAX compilation cache (set-up only). Without
``--pair-budget`` a costly benchmark gets the budget that reaches its look at
``AUTO_BUDGET_PROCESS_PAIRS`` process pairs (:func:`auto_budget`).

Where the host is busy, a sample's wall time holds other processes' time, on both sides of a pair alike, which
dilutes a change toward 1x: beside two CPU hogs the 5% longer loop's wall-time ratio was 0.5 to 1.2 points below
the CPU-time ratio of the same samples (four runs of 400 pairs, docs/design.md, "The gate, measured").
So the worker times a benchmark on the default wall clock with that clock stopped while its thread waits on a run
queue (``pairworker._net_clock``: the kernel's per-thread run-queue wait, ``/proc/.../schedstat``): sleeps, I/O
and waits on other threads still count, the time the host gave to other processes does not; a wait that the CPU
time of the benchmark's own other threads could explain counts too (a busy helper thread a change adds is its cost,
``pairworker._NetClock``). A benchmark with a timer of its own keeps it, as does a kernel without schedstat
(``Sampled.net`` says which).

:func:`measure` samples until its rule says the pairs are decided (``benchgate.Stopping``, the one rule the gate,
its rounds and the A/A study share; :func:`pairs_rule`: the bounds exclude the gate's factor, looked at every
``BATCH`` pairs from ``MIN_PAIRS`` on), or until ``max_pairs`` or ``budget_s`` is spent (the first process pair's
set-up not counted, the later ones' counted). It returns one :class:`~harness.ci.asvresults.Measurement` per sample
and side, pairs in order, for ``benchgate.judge_rounds``.

The comparisons the gate, ``harness regressions --confirm`` and ``harness bisect`` share, one benchmark combination
of two commits, base against head, judged by the gate's rule (``benchgate.judge_rounds``) into a ``benchgate.Row``:

- :func:`compare`: a ``time_`` benchmark (existing mode) in interleaved pairs, the two commits installed by
  :func:`install_pair`; measured until :func:`~harness.ci.benchgate.decided` or ``budget_s`` is spent;
- :func:`compare_rounds`: any benchmark, in whole asv runs of each commit (``AsvProject.run_commit``), the order
  alternating round by round (base, head, then head, base, ...), from 2 rounds a side until decided, ``max_rounds``
  or ``budget_s``: what is left where pairs cannot be taken (virtualenv mode, ``track_`` and other benchmarks
  that asv times or counts itself);
- :func:`pairable`: which of the two a combination gets.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from harness.ci import asvresults, benchgate
from harness.ci.asvresults import Key, Measurement
from harness.ci.asvrun import AsvProject
from harness.ci.benchgate import ALPHA, FACTOR, Noise, Row, Stopping
from harness.errors import Failed, InvalidValue

__all__ = ["Sampled", "measure", "benchmark_id", "compare", "compare_rounds", "install_pair", "pairable", "timed",
           "pairs_rule", "rounds_rule", "process_pair_size", "auto_budget",
           "bench_regex", "WORKER", "MIN_PAIRS", "MAX_PAIRS", "BATCH", "BUDGET_S", "PER_PROCESS", "MOST_PER_PROCESS",
           "PACE_PAIRS", "AUTO_BUDGET_PROCESS_PAIRS", "REFUSED_PROCESS_PAIRS",
           "MAX_ROUNDS"]

WORKER = Path(__file__).with_name("pairworker.py")
# The first look: four process pairs (PER_PROCESS each), Student's t at 3 degrees of freedom. At two, two process
# pairs whose medians happened to agree decided alone: a README change measured "better", 0.941x, from 2 process
# pairs 0.0% apart, beside two CPU hogs.
MIN_PAIRS = 40
BATCH = 20  # pairs between two looks at the bounds
MAX_PAIRS = 2000
# Each look at least this many times the pairs of the last (40, 60, 100, 160, 240, 360, 540, 820, 1240, 1860): the
# judgment's false alarms are split among its looks (benchgate.Stopping.alpha_at), 10 up to MAX_PAIRS where looks
# every BATCH pairs would be 99, each at a hundredth of the level.
GROWTH = 1.5
BUDGET_S = 60.0  # seconds of sampling per benchmark combination, the first process pair's set-up not counted
# Pairs a process pair takes before both are replaced: even (as many base-first as head-first), and dividing
# MIN_PAIRS and BATCH, so that every look at the bounds sees whole process pairs. The busy loop's noise (between
# process pairs ~4%, a pair ~5%, a process pair's start ~0.5 s against 25 ms a pair) puts the cheapest size for a
# given precision near 7; 10 keeps the looks on whole process pairs.
PER_PROCESS = 10
# A process pair is sized from what it costs (:func:`process_pair_size`), in multiples of PER_PROCESS, at most
# MOST_PER_PROCESS. A model benchmark's pair is far noisier than its process pair's offset: onjax's towers-even step
# (5-7 ms, one call a sample) measured a spread of 0.30-0.35 between the pairs of one process pair, and its process
# pairs' values spread 0.03-0.06 at 100 pairs each, about what that spread alone gives (0.04): the processes
# themselves were hardly off (docs/design.md, "The gate, measured").
MOST_PER_PROCESS = 200
PACE_PAIRS = PER_PROCESS  # the first process pair's first pairs, timed to size the process pairs
# Without --pair-budget: sampling gets at least what reaching the look at this many process pairs costs (its third:
# 4, 6, 10), at the pace the first process pair measured, so that a costly benchmark is judged on its bounds and
# not on a budget that could hold no look at all.
AUTO_BUDGET_PROCESS_PAIRS = 10
# A later process pair whose set-up skips the combination (a side judged the host too busy: benchmarks/common.py's
# refuse_host_bound, beside the other side's set-up) is replaced, this many times at most; then sampling stops with
# the pairs taken. A skip in the first process pair is the combination's (Sampled.skipped).
REFUSED_PROCESS_PAIRS = 3
MAX_ROUNDS = 6  # compare_rounds: asv runs of each commit at most (the gate's --max-rounds)
_READY_S = 600.0  # a worker's set-up (importing TensorFlow, building a model, setup_cache)
_SAMPLE_S = 120.0
# By path, and not as ``python pairworker.py``: that would put harness/ci first on sys.path, where a module of
# harness' could shadow one of the standard library's.
_RUN_WORKER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


@dataclass(frozen=True)
class Sampled:
    """What :func:`measure` took: the pairs (``base[i]``, ``head[i]``), the calls per sample, and why it stopped."""

    base: tuple[Measurement, ...]
    head: tuple[Measurement, ...]
    number: int
    stopped: str  # "decided", "max pairs", "budget", "set-up skipped N times (why)"
    skipped: str = ""  # a side's setup skipped the combination: no pairs
    per_process: int = 0  # pairs from one process pair before the next (0: all from one, as recorded before)
    net: bool = False  # timed with the run-queue waits taken out (pairworker._net_clock) on both sides
    seconds: float = 0.0  # sampling's time counted against the budget (the first process pair's set-up not)
    set_up: float = 0.0  # seconds the first process pair took to start (both workers ready and warm)
    pair: float = 0.0  # seconds a pair took, its two answers included (the first process pair's first pairs)
    budget: float = 0.0  # the sampling budget that applied (seconds)


class _Worker:
    """One commit's ``pairworker.py`` process; answers are read with a timeout, so a hung benchmark cannot hang the
    gate."""

    def __init__(self, label: str, benchmark_dir: Path, benchmark_id: str, target: Path, cwd: Path):
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "ASV_PYTHONPATH")}
        env["PYTHONPATH"] = str(target)
        # JAX compiles each process's programs anew: 3.5 s of onjax's 5.6 s set-up (the model's initializers, the first
        # step), 0.4 s from a cache the processes share (the same program on the same JAX gives the same executable; a
        # program that differs compiles anew).
        # Set-up only: the samples come after the warm-up. A cache the user set is kept.
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cwd / "jax-compilation-cache"))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        self.label = label
        argv = [sys.executable, "-c", _RUN_WORKER, str(WORKER), str(benchmark_dir), benchmark_id]
        self.process = subprocess.Popen(argv,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=cwd, env=env)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        self._hung = False

    def answer(self, timeout: float) -> dict:
        if not self._selector.select(timeout):
            self._hung = True  # no teardown to wait for: close() kills it
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
            if self._hung:  # a hung benchmark gets no teardown: killed at once, not after 3 s
                self.process.kill()
                self.process.wait()
            elif self.process.poll() is None:
                self.process.stdin.write(json.dumps({"stop": True}) + "\n")  # type: ignore[union-attr]
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            self._selector.close()


def _can_pin() -> bool:
    """Whether threads can be pinned here and this process may run on two CPUs or more."""
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1


@dataclass(frozen=True)
class _Pinned:
    """A worker's main thread pinned to ``cpu``: its own CPU set before (``own``, the benchmark's choice, kept), and
    the threads it had then (``before``: a thread started while pinned inherits the pin, and is released with it)."""

    pid: int
    cpu: int
    own: frozenset[int]
    before: frozenset[str]


def _pin(pid: int, leader: int) -> _Pinned | None:
    """Pins the main thread of ``pid`` to the CPU ``leader``'s main thread last ran on (``/proc/PID/stat``'s
    ``processor``), where that CPU is one of its own (a benchmark that confined itself to other CPUs is left where it
    chose, as is one already on that CPU alone): what :func:`_release` undoes, or None where nothing was pinned.

    Raises:
        OSError, ValueError, IndexError: the system refuses or says nothing (following is then given up).
    """
    stat = Path(f"/proc/{leader}/stat").read_text()
    cpu = int(stat[stat.rindex(")") + 2:].split()[36])  # field 39; the command name may hold spaces
    own = frozenset(os.sched_getaffinity(pid))
    if cpu not in own or own == {cpu}:
        return None
    before = frozenset(os.listdir(f"/proc/{pid}/task"))
    os.sched_setaffinity(pid, {cpu})
    return _Pinned(pid, cpu, own, before)


def _release(pinned: _Pinned) -> None:
    """The main thread back on its own CPU set, and so is each thread started while it was pinned that still has the
    pin it inherited (one that chose a CPU set of its own keeps it; one that ended is gone).

    Raises:
        OSError: the system refuses (following is then given up).
    """
    os.sched_setaffinity(pinned.pid, pinned.own)
    try:
        born = set(os.listdir(f"/proc/{pinned.pid}/task")) - pinned.before
    except OSError:  # the process ended
        return
    for tid in born:
        try:
            if os.sched_getaffinity(int(tid)) == {pinned.cpu}:
                os.sched_setaffinity(int(tid), pinned.own)
        except OSError:  # it ended in between
            continue


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


def measure(key: Key, unit: str, config: Path, targets: tuple[Path, Path], rule: Stopping,
            max_pairs: int = MAX_PAIRS, budget_s: float | None = BUDGET_S,
            progress: Callable[[str], None] | None = None, size: bool = True) -> Sampled:
    """Pairs of samples of benchmark combination ``key`` of the asv project at ``config``, base from
    ``targets[0]``, head from ``targets[1]`` (folders the commits are installed in), ``rule.per_process`` from each
    process pair (0: all from one), until ``rule`` stops them (``Stopping.stops``, :func:`pairs_rule` for the gate's)
    or a limit is reached.

    Process pairs are sized from what they cost (:func:`process_pair_size`; with ``size`` False, or
    ``rule.per_process`` 0, they take ``rule.per_process``): the first process pair's set-up and its first
    ``PACE_PAIRS`` pairs give the size, and ``rule`` and ``max_pairs`` are scaled with it (``Stopping.sized``: the
    looks fall on the same numbers of process pairs). ``budget_s`` None: the larger of ``BUDGET_S`` and what
    ``AUTO_BUDGET_PROCESS_PAIRS`` process pairs cost at that pace. A side whose set-up skips the combination in the
    first process pair skips it (``Sampled.skipped``, no pairs); in a later one the process pair is replaced, up to
    ``REFUSED_PROCESS_PAIRS`` times, then sampling stops with the pairs taken.

    Raises:
        Failed: a side's benchmark failed to set up or to run, or stopped answering.
    """
    per_process = rule.per_process
    name, params = key
    benchmark_dir, bench_id = benchmark_id(config, key)
    base: list[Measurement] = []
    head: list[Measurement] = []
    number, start, stopped, nets, refused = 0, None, "", [], 0
    set_up = pair_s = 0.0
    budget = BUDGET_S if budget_s is None else budget_s
    with tempfile.TemporaryDirectory(prefix="harness-pairs-") as cwd:
        while not stopped and len(base) < max_pairs:
            began = time.perf_counter()
            workers = [_Worker(side, benchmark_dir, bench_id, target, Path(cwd))
                       for side, target in zip(("base", "head"), targets)]
            try:
                ready = [worker.answer(_READY_S) for worker in workers]
                skipped = [f"{worker.label}: {said['skip']}" for worker, said in zip(workers, ready)
                           if "skip" in said]
                if skipped and start is None:
                    return Sampled((), (), 0, "skipped", "; ".join(skipped), per_process)
                if skipped:  # a later process pair: its set-up judged the host (e.g. host-bound), not the commits
                    refused += 1
                    if refused > REFUSED_PROCESS_PAIRS:
                        stopped = f"set-up skipped {refused} times ({'; '.join(skipped)})"
                    continue
                nets += [bool(said.get("net", False)) for said in ready]
                number = number or int(ready[0]["number"]) or int(workers[0].ask(_SAMPLE_S, calibrate=True)["number"])
                for worker, said in zip(workers, ready):
                    worker.ask(_SAMPLE_S, warm=float(said.get("warmup", 0.1)))
                count = per_process or max_pairs
                if start is None:  # the first process pair: its cost sizes the rest
                    set_up = time.perf_counter() - began
                    start = time.perf_counter()
                    paced = min(PACE_PAIRS, count, max_pairs)
                    _sample(workers, name, params, unit, number, (base, head), paced, lambda: "", math.inf)
                    pair_s = (time.perf_counter() - start) / paced
                    if per_process and size:
                        per_process = process_pair_size(set_up, pair_s, per_process)
                        scale = per_process // rule.per_process
                        rule, max_pairs = rule.sized(per_process), max_pairs * scale
                    if budget_s is None:
                        budget = max(BUDGET_S, auto_budget(set_up, pair_s, per_process or max_pairs))
                    if progress is not None and per_process:
                        progress(f"process pairs of {per_process} pairs (set-up {set_up:.1f} s, a pair "
                                 f"{1000 * pair_s:.0f} ms); sampling budget {budget:.0f} s")
                    count = (per_process or max_pairs) - paced
                    stopped = _look(base, head, rule, max_pairs, progress)  # a look due among the timed pairs
                if not stopped and count:
                    stopped = _sample(workers, name, params, unit, number, (base, head), count,
                                      partial(_look, base, head, rule, max_pairs, progress), start + budget)
            finally:
                for worker in workers:
                    worker.close()
    return Sampled(tuple(base), tuple(head), number, stopped or "max pairs", per_process=per_process,
                   net=bool(nets) and all(nets), seconds=0.0 if start is None else time.perf_counter() - start,
                   set_up=set_up, pair=pair_s, budget=budget)


def process_pair_size(set_up: float, pair: float, least: int = PER_PROCESS) -> int:
    """Pairs a process pair takes: as many as fit in the time its set-up took (``set_up`` s, both workers ready and
    warm; ``pair`` s a pair), rounded down to a multiple of ``least``, from ``least`` to ``MOST_PER_PROCESS``: a
    process pair then spends about as long sampling as starting, at most twice what its sampling alone would cost.
    The busy loop of the gate's tests (0.4-0.5 s to start, 75-100 ms a pair) keeps ``least``; onjax's JAX step (7-11
    s, 25-36 ms) takes 200, the ci grid's TensorFlow step on 3 emulated devices (6.6-8.5 s, 1.08 s) 10.

    Raises:
        InvalidValue: ``least`` below 2 or odd, or a time not a positive finite number.
    """
    if least < 2 or least % 2:
        raise InvalidValue(f"a process pair's least size must be even and at least 2; got {least}")
    if not (0 < pair < math.inf and 0 <= set_up < math.inf):
        raise InvalidValue(f"a process pair's set-up and pair times must be finite, the pair's positive; got "
                           f"set_up={set_up!r}, pair={pair!r}")
    fits = int(set_up / pair) // least * least
    return max(least, min(MOST_PER_PROCESS // least * least, fits))


def auto_budget(set_up: float, pair: float, per_process: int) -> float:
    """Seconds of sampling that reach the look at ``AUTO_BUDGET_PROCESS_PAIRS`` process pairs of ``per_process``
    pairs, at ``set_up`` s to start a process pair and ``pair`` s a pair (the first process pair's set-up is not
    counted against a budget)."""
    pairs = AUTO_BUDGET_PROCESS_PAIRS
    return (pairs - 1) * set_up + pairs * per_process * pair


def _look(base: list, head: list, rule: Stopping, max_pairs: int, progress) -> str:
    """After a pair: "decided" where ``rule`` stops the pairs, "max pairs" once there are ``max_pairs``, else ""
    (go on)."""
    if rule.due(len(base)):
        if rule.stops(base, head):
            return "decided"
        if progress is not None:
            progress(f"{len(base)} pairs, not decided yet")
    return "max pairs" if len(base) >= max_pairs else ""


def _sample(workers: list[_Worker], name: str, params: str, unit: str, number: int, sides: tuple[list, list],
            count: int, look: Callable[[], str], end: float) -> str:
    """Up to ``count`` pairs from one process pair, appended to ``sides``; why the sampling stops ("decided",
    "max pairs", or "budget": ``time.perf_counter()`` past ``end``), or "" where only this process pair's share is
    taken."""
    base, head = sides
    following = _can_pin()
    for _ in range(count):
        order = (0, 1) if len(base) % 2 == 0 else (1, 0)
        seconds = {}
        pinned = None
        try:
            for side in order:
                seconds[side] = float(workers[side].ask(_SAMPLE_S, sample=number)["seconds"])
                if not 0 < seconds[side] < math.inf:  # never judged as a zero value: a clock gone wrong is no verdict
                    raise Failed(f"the {workers[side].label} side's benchmark process answered a sample of "
                                 f"{seconds[side]!r} s")
                if following and side == order[0]:  # the second sample where the first ran
                    try:
                        pinned = _pin(workers[order[1]].process.pid, workers[side].process.pid)
                    except (OSError, ValueError, IndexError):
                        following = False
        finally:
            if pinned is not None:
                try:
                    _release(pinned)
                except OSError:
                    following = False
        base.append(Measurement(name, params, unit, seconds[0]))
        head.append(Measurement(name, params, unit, seconds[1]))
        said = look()
        if said:
            return said
        if time.perf_counter() > end:
            return "budget"
    return ""


def pairs_rule(factor: float = FACTOR, see: bool = True, alpha: float = ALPHA, most: int = MAX_PAIRS) -> Stopping:
    """The gate's rule for interleaved pairs: a first look at ``MIN_PAIRS``, then each ``GROWTH`` times the last (in
    ``BATCH``es) up to ``most`` pairs, each process pair's ``PER_PROCESS`` pairs one value judged; with ``see`` (the
    gate), a pass also goes on until it could see ``benchgate.sees``."""
    return Stopping(factor, first=MIN_PAIRS, every=BATCH, see=see, per_process=PER_PROCESS, alpha=alpha, most=most,
                    growth=GROWTH)


def rounds_rule(factor: float = FACTOR, first: int = 2, alpha: float = ALPHA,
                max_rounds: int = MAX_ROUNDS) -> Stopping:
    """The gate's rule for asv rounds: a first look at ``first`` rounds a side (``--rounds``), then every round up to
    ``max_rounds``."""
    return Stopping(factor, first=first, every=1, alpha=alpha, most=max(first, max_rounds))


def timed(name: str) -> bool:
    """A ``time_`` benchmark: one that :func:`measure` can time sample by sample."""
    return name.split(".")[-1].startswith("time_")


def pairable(project: AsvProject, name: str) -> bool:
    """Whether benchmark ``name`` of ``project`` is compared in interleaved pairs (:func:`compare`): a ``time_``
    benchmark in existing mode; else in asv rounds (:func:`compare_rounds`)."""
    return project.mode == "existing" and timed(name)


def bench_regex(key: Key) -> str:
    """asv's ``--bench`` regex for the one combination ``key`` (asv matches a parametrized benchmark's regex
    against ``name(params)``)."""
    name, params = key
    return "^" + re.escape(f"{name}({params})" if params else name) + "$"


def _label(key: Key) -> str:
    name, params = key
    return f"{name} ({params})" if params else name


def install_pair(project: AsvProject, base: str, head: str, folder: Path) -> tuple[Path, Path]:
    """``base`` and ``head`` each installed into a folder of its own under ``folder`` (one folder when they are one
    commit), for :func:`compare`.

    Raises:
        Unavailable: this Python lacks a commit's build requirements.
        Failed: pip failed.
    """
    targets = {}
    for commit in dict.fromkeys((base, head)):
        targets[commit] = folder / commit[:12]
        project.install_into(commit, targets[commit])
    return targets[base], targets[head]


def compare(project: AsvProject, key: Key, unit: str, targets: tuple[Path, Path], factor: float,
            budget_s: float | None = None, history_noise: Noise | None = None, no_rerun: bool = False,
            progress: Callable[[str], None] | None = None, *, see: bool = True, alpha: float = ALPHA) -> Row:
    """Benchmark combination ``key`` of ``project``, base (``targets[0]``) against head (``targets[1]``, folders
    from :func:`install_pair`), judged in interleaved pairs by the gate's rule.

    Pairs are taken until the judgment is decided (``benchgate.decided``: its bounds exclude ``factor``; with
    ``see``, a pass also until it could see ``benchgate.sees``, as the gate asks: :func:`pairs_rule`) or
    ``budget_s`` is spent (None: set from what the pairs cost, :func:`measure`); ``no_rerun``: judged at the first
    look. The row's note says how many calls a sample took,
    whether run-queue waits were taken out and why sampling stopped ("decided", "budget", "max pairs").

    Returns:
        The row (``Verdict.SKIPPED``, its note saying why, where a side's setup skipped the combination).

    Raises:
        Failed: a side's benchmark failed to set up or to run, or stopped answering; asv's benchmark list does not
            hold ``key``.
    """
    name, params = key
    rule = pairs_rule(factor, see=see, alpha=alpha, most=MIN_PAIRS if no_rerun else MAX_PAIRS)
    sampled = measure(key, unit, project.config, targets, rule, max_pairs=rule.most, budget_s=budget_s,
                      progress=progress)
    if sampled.skipped:
        return Row(name, params, unit, math.nan, math.nan, benchgate.Verdict.SKIPPED, None, rounds=(0, 0),
                   note=sampled.skipped, history=history_noise)
    again = rule.sized(sampled.per_process).judge(list(sampled.base), list(sampled.head), history_noise,
                                                  "interleaved pairs")
    waits = "; run-queue waits taken out" if sampled.net else ""
    said = f"{again.note}; " if again.note else ""  # e.g. a zero value: no paired bounds
    return replace(again, note=f"{said}{sampled.number} call(s) a sample{waits}; stopped: {sampled.stopped}",
                   seconds=sampled.seconds)


def compare_rounds(project: AsvProject, key: Key, base: str, head: str, factor: float,
                   budget_s: float = BUDGET_S, max_rounds: int = MAX_ROUNDS, history_noise: Noise | None = None,
                   progress: Callable[[str], None] | None = None, alpha: float = ALPHA) -> Row:
    """Benchmark combination ``key`` of ``project``, commit ``base`` against commit ``head``, judged by the gate's
    rule on whole asv runs (rounds): base then head, then head then base, ... (a host drifting one way favours
    neither side), from 2 rounds a side until decided (``benchgate.decided``), ``max_rounds`` a side, or
    ``budget_s`` spent (checked after each round; 2 rounds a side are always taken). asv saves each run's results
    (``project.machine``), read back at once.

    Raises:
        Failed: asv failed or installing a commit failed (existing mode), or asv saved no result for ``key``.
        Unavailable: existing mode, and this Python lacks a commit's build requirements.
        InvalidValue: ``max_rounds`` below 2.
    """
    if max_rounds < 2:
        raise InvalidValue(f"max_rounds must be at least 2 (one round a side gives no spread); got {max_rounds}")
    if base == head:
        raise InvalidValue(f"compare_rounds needs two commits; got {base[:12]} twice")
    regex = bench_regex(key)
    rule = rounds_rule(factor, alpha=alpha, max_rounds=max_rounds)
    sides: dict[str, list[Measurement]] = {base: [], head: []}
    start = time.perf_counter()
    number = 0
    while True:
        for commit in (base, head) if number % 2 == 0 else (head, base):  # AB, BA, AB, ...
            started = time.time()
            project.run_commit(commit, [regex])
            try:
                found = asvresults.read_commit(project.config, project.machine, commit, since=started).get(key)
            except ValueError as err:
                raise Failed(f"asv saved no results for {commit[:12]}: {err}") from None
            if found is None:
                raise Failed(f"asv saved no result for {_label(key)} on {commit[:12]}")
            sides[commit].append(found)
        number += 1
        if not rule.due(number):
            continue
        row = rule.judge(sides[base], sides[head], history_noise)
        if number >= max_rounds or rule.done(row):
            stopped = "decided" if rule.done(row) else "max rounds"
            break
        if time.perf_counter() - start > budget_s:
            stopped = "budget"
            break
        if progress is not None:
            progress(f"{number} rounds a side, not decided yet")
    said = f"{row.note}; " if row.note else ""
    return replace(row, note=f"{said}{number} asv rounds a side, AB/BA; stopped: {stopped}",
                   seconds=time.perf_counter() - start)
