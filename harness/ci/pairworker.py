"""One commit's side of an interleaved timing: a process that holds one asv ``time_`` benchmark set up and times it
on request, one sample at a time (``harness.ci.interleave`` drives two of these, one per commit, alternately).

Run by path, never imported as ``harness.ci.pairworker``: the commit under test may be harness itself, installed in
a folder first on ``sys.path``, and that folder's harness need not have this module. It imports only the standard
library and ``asv_runner`` (asv's own benchmark runner: discovery, ``setup_cache``, ``setup``, the timer), so a
benchmark is set up and timed as ``asv run`` does. This file is the only place that reaches into ``asv_runner``'s
benchmark objects.

    python -c "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" \
        .../pairworker.py BENCHMARK_DIR BENCHMARK_ID     (BENCHMARK_ID as asv names it: ``name`` or ``name-INDEX``)

(not ``python pairworker.py``: that puts harness/ci first on ``sys.path``, where bisect.py shadows the standard
library's.)

Protocol: one JSON object a line on stdin, one answer a line on stdout (the benchmark's own prints go to stderr):

- at start, once set up: ``{"ready": true, "number": N, "warmup": seconds, "net": bool}`` (N: the benchmark's
  ``number``, 0 when it lets asv choose; ``net``: samples are timed on :func:`_net_clock`, the run-queue waits
  taken out), ``{"skip": reason}`` (setup raised ``NotImplementedError`` or the combination is skipped) or
  ``{"error": traceback}``;
- ``{"calibrate": true}``: the smallest ``number`` whose sample takes at least the benchmark's ``sample_time``
  (asv's rule), answered as ``{"number": N}``;
- ``{"sample": N}``: one call untimed, then one sample of N calls, answered as ``{"seconds": per_call}`` or
  ``{"error": traceback}``. The call first: the other side's process ran since this one's last sample, on the same
  CPU, and took the caches; asv's own samples run back to back, caches warm. Without it, the second sample of a pair
  was the cold one: a JSON round trip measured 2-5% slower second than first, and as the two orders' medians did not
  cancel, one commit against itself came out 1.2% faster on head (docs/design.md, "The gate, measured");
- ``{"stop": true}``: teardown, then exit.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import timeit
import traceback


def _answer(out, **fields) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


class _NetClock:
    """A clock that stops while this thread waits on a run queue for *another process*: ``time.perf_counter()`` less
    the thread's run-queue wait since :meth:`mark` (``/proc/self/task/TID/schedstat``'s second field, nanoseconds
    spent runnable while another task ran), less no more of it than the CPU time this process's other threads took
    meanwhile could explain. Sleeps, reads and waits on other threads still count, and so does a wait behind the
    benchmark's own threads: a change that adds a busy helper thread on the benchmark's CPU is time it costs, not the
    host's (the kernel does not say who ran while this thread waited; a wait no larger than the other threads' CPU
    time is counted, so where they also ran the clock leans to the wall clock, never below the benchmark's own work).
    Only the time the host gave to other processes while this one could have run is taken out
    (harness.ci.interleave's docstring). :meth:`mark` before each sample: the readings are relative to it.
    """

    def __init__(self, path: str):
        self._path = path
        self._start = (0, 0.0)
        self.mark()

    def _waited(self) -> int:
        with open(self._path) as stat:
            return int(stat.read().split()[1])

    @staticmethod
    def _others() -> float:
        """CPU seconds this process's other threads have taken (the process's less this thread's)."""
        return time.process_time() - time.thread_time()

    def _read(self) -> tuple[float, int, float]:
        # The kernel adds a wait to the thread's total when the thread runs again: a wait between reading the clock
        # and reading the total would land in one and not the other (beside busy processes it made a 12 ms sample
        # negative). Read the total on both sides of the clock until no wait ended in between.
        for _ in range(1000):
            before = self._waited()
            now = time.perf_counter()
            others = self._others()
            after = self._waited()
            if before == after:
                break
        return now, after, others

    def mark(self) -> None:
        """Starts a sample: the waits and the other threads' CPU time from here on."""
        _, waited, others = self._read()
        self._start = (waited, others)

    def __call__(self) -> float:
        now, waited, others = self._read()
        foreign = (waited - self._start[0]) / 1e9 - (others - self._start[1])
        return now - max(0.0, foreign)


def _net_clock() -> _NetClock | None:
    """:class:`_NetClock` for this thread, or None where the kernel does not say how long it waited."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    try:
        with open(path) as stat:
            int(stat.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return _NetClock(path)


def _timeit(bench, timer, net: _NetClock | None, number: int) -> float:
    """``number`` calls timed as asv times a sample: its setup not run again first (asv clears
    ``_redo_setup_next`` before each sample; left set, ``redo_setup`` tears the benchmark down and sets it up again
    before every sample: a model built, or a hog started, once a sample), the net clock (where it times them)
    marked first."""
    bench._redo_setup_next = False
    if net is not None:
        net.mark()
    return timer.timeit(number)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: pairworker.py BENCHMARK_DIR BENCHMARK_ID", file=sys.stderr)
        return 2
    root, benchmark_id = argv
    out = sys.stdout
    sys.stdout = sys.stderr  # the benchmark's prints must not reach the protocol
    try:
        from asv_runner.discovery import get_benchmark_from_name

        bench = get_benchmark_from_name(root, benchmark_id)
        if getattr(bench, "type", None) != "time":
            _answer(out, error=f"{benchmark_id} is a {getattr(bench, 'type', '?')} benchmark, not a time_ one")
            return 1
        bench.set_cache(bench.do_setup_cache() if bench.setup_cache_key is not None else None)
        if bench.do_setup():
            _answer(out, skip="setup skipped this combination")
            return 0
        params = bench._build_params()
        net = _net_clock() if bench.timer is timeit.default_timer else None  # a timer of its own is kept
        if net is not None:
            bench.timer = net
        timer = bench._get_timer(*params)
    except NotImplementedError:
        _answer(out, skip="setup raised NotImplementedError")
        return 0
    except Exception:  # the commit's benchmark failed to set up: the driver reports it, naming the commit
        _answer(out, error=traceback.format_exc())
        return 1
    warmup = bench.warmup_time if bench.warmup_time >= 0 else 0.1
    _answer(out, ready=True, number=int(bench.number), warmup=warmup, net=net is not None)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if "stop" in command:
                break
            try:
                if "calibrate" in command:
                    number = 1
                    while _timeit(bench, timer, net, number) < bench.sample_time and number < 10**7:
                        number *= 2
                    _answer(out, number=number)
                elif "sample" in command:
                    number = int(command["sample"])
                    _timeit(bench, timer, None, 1)  # untimed: the caches this side's last sample left, the other
                    # side has since used
                    _answer(out, seconds=_timeit(bench, timer, net, number) / number)
                elif "warm" in command:
                    end = time.perf_counter() + float(command["warm"])
                    while time.perf_counter() < end:
                        _timeit(bench, timer, None, 1)
                    _answer(out, warm=True)
                else:
                    _answer(out, error=f"unknown command {command!r}")
            except Exception:
                _answer(out, error=traceback.format_exc())
    finally:
        try:
            bench.do_teardown()
        except Exception:
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
