"""``harness launch``: N local worker processes of one command, a loopback cluster for multi-worker runs.

Each worker gets ``TF_CONFIG`` (``harness.cluster.tf_config``) naming every worker on a free
loopback port, plus ``HARNESS_WORKER_INDEX`` and ``HARNESS_WORKERS`` (and, with
``devices_per_worker``, ``HARNESS_WORKER_DEVICES``: how many devices ``harness.use_cluster``
gives that worker). Their output is
interleaved line by line, each line prefixed ``[worker i]``. The launch ends:

- with status 0 when every worker exits 0;
- with the first failing worker's status (128 + N for a worker killed by signal N) as soon as
  one fails: the others are stopped (SIGTERM to their process groups, SIGKILL after a grace
  period), and one line on stderr names the worker that failed first;
- with status 124 when ``timeout_s`` passes (every worker stopped the same way), and 130 on
  Ctrl-C.

No worker outlives the launch: each runs in its own session (its process group holds
whatever it starts), the groups are killed at the end whatever happened, and on Linux a
worker whose launcher dies gets SIGKILL from the kernel (``PR_SET_PDEATHSIG``).

Pure Python: no TensorFlow here (the workers import it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from harness.cluster import DEVICES_VARIABLE, dumps, free_ports, tf_config
from harness.errors import InvalidValue

__all__ = ["launch", "LaunchResult", "TIMEOUT_STATUS", "INTERRUPT_STATUS", "DEVICES_VARIABLE", "device_counts"]

TIMEOUT_STATUS = 124  # as timeout(1)
INTERRUPT_STATUS = 130  # as a shell after Ctrl-C
_POLL_S = 0.05


def device_counts(counts: Sequence[int] | None, workers: int) -> list[int] | None:
    """Each worker's device count: one count for every worker, or one per worker (None: not set).

    Raises:
        ValueError: naming the bad value: a count that is not an int >= 1, or neither 1 nor ``workers`` counts.
    """
    if counts is None:
        return None
    counts = list(counts)
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidValue(f"a worker's device count must be an int >= 1; got {count!r} in {counts}")
    if len(counts) not in (1, workers):
        raise InvalidValue(f"give one device count for every worker or one per worker ({workers}); got {counts}")
    return counts * workers if len(counts) == 1 else counts


@dataclass
class LaunchResult:
    """How a launch ended: ``status`` (the exit status of the launch), each worker's own ``statuses``
    (None: stopped by the launcher before it exited on its own), the worker that failed first (or None),
    and why the launch ended (``"done"``, ``"failed"``, ``"timeout"``, ``"interrupted"``)."""

    status: int
    statuses: list[int | None]
    first_failure: int | None
    reason: str
    addresses: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _status(returncode: int) -> int:
    """A shell's exit status for a Popen return code (negative: killed by that signal)."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (status {_status(returncode)})"
    return f"exited with status {returncode}"


def _child_setup() -> Callable[[], None] | None:
    """What a worker runs between fork and exec on Linux: SIGKILL when the launcher dies (``PR_SET_PDEATHSIG``).

    The C function is looked up here, in the launcher, so the child runs no import.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def die_with_parent() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG

    return die_with_parent


def launch(
    command: Sequence[str],
    workers: int,
    *,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    worker_env: Callable[[int], Mapping[str, str]] | None = None,
    devices_per_worker: Sequence[int] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    stop_on_failure: bool = True,
) -> LaunchResult:
    """Runs ``command`` as ``workers`` local worker processes of one cluster; returns how it ended.

    Args:
        command: the program and its arguments (no shell).
        workers: how many worker processes (>= 1); worker 0 is the chief.
        host: the loopback address the workers listen on.
        env: the workers' environment (default: this process's), before the cluster's variables.
        worker_env: extra variables per worker index (e.g. its emulated devices).
        devices_per_worker: how many devices each worker trains on (``HARNESS_WORKER_DEVICES``, read by
            ``harness.use_cluster``): one count for all, or one per worker, e.g. ``[1, 2]``.
        out: where the prefixed output lines go (default ``sys.stdout``).
        err: where the launcher's own lines go (default ``sys.stderr``).
        timeout_s: stop every worker after this many seconds (status 124); None: no limit.
        grace_s: seconds between SIGTERM and SIGKILL when stopping workers.
        stop_on_failure: stop the others as soon as one worker fails (default); False waits for every
            worker to end on its own (how a worker copes with a lost peer), the timeout still applies.

    Raises:
        ValueError: naming the bad value: an empty command, ``workers`` not an int >= 1, a timeout or
            grace that is not a positive number, bad ``devices_per_worker`` (``device_counts``).
        FileNotFoundError: the program does not exist (no worker is left running).
    """
    command = list(command)
    if not command:
        raise InvalidValue("harness launch needs a command to run; got none (put it after --)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidValue(f"workers must be an int >= 1; got {workers!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise InvalidValue(f"timeout must be > 0 seconds; got {timeout_s!r}")
    if not grace_s > 0:
        raise InvalidValue(f"grace must be > 0 seconds; got {grace_s!r}")
    counts = device_counts(devices_per_worker, workers)
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    addresses = [f"{host}:{port}" for port in free_ports(workers, host)]
    base = dict(os.environ if env is None else env)
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    setup = _child_setup()
    start = time.monotonic()
    try:
        for index in range(workers):  # all started before any reader thread (fork with few threads)
            worker = {**base, **({DEVICES_VARIABLE: str(counts[index])} if counts else {}),
                      **(worker_env(index) if worker_env else {}),
                      "TF_CONFIG": dumps(tf_config(addresses, index)),
                      "HARNESS_WORKER_INDEX": str(index), "HARNESS_WORKERS": str(workers),
                      "PYTHONUNBUFFERED": "1"}
            procs.append(subprocess.Popen(command, env=worker, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=setup))
        for index, proc in enumerate(procs):
            reader = threading.Thread(target=_relay, args=(proc, f"[worker {index}] ", out, lock), daemon=True)
            reader.start()
            readers.append(reader)
        result = _watch(procs, timeout_s, start, stop_on_failure)
    except KeyboardInterrupt:
        result = LaunchResult(INTERRUPT_STATUS, [p.poll() for p in procs], None, "interrupted")
    finally:
        _stop(procs, grace_s)
        for reader in readers:
            reader.join(timeout=grace_s)
    result.statuses = [None if s is None else _status(s) for s in result.statuses]
    result.addresses, result.seconds = addresses, time.monotonic() - start
    _report(result, procs, err)
    return result


def _relay(proc: subprocess.Popen, prefix: str, out: TextIO, lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()
    proc.stdout.close()


def _watch(procs: list[subprocess.Popen], timeout_s: float | None, start: float,
           stop_on_failure: bool = True) -> LaunchResult:
    """Waits until every worker exited 0, one failed (or, without ``stop_on_failure``, all ended), or the
    time is up; stops nothing itself. The first failure is the one seen first."""
    first: int | None = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if first is None and failed:
            first = failed[0]  # several at once: the lowest index (the poll cannot order them)
        if first is not None and (stop_on_failure or all(c is not None for c in codes)):
            return LaunchResult(_status(codes[first]), codes, first, "failed")  # type: ignore[arg-type]
        if all(c == 0 for c in codes):
            return LaunchResult(0, codes, None, "done")
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return LaunchResult(TIMEOUT_STATUS, codes, None, "timeout")
        time.sleep(_POLL_S)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every worker's process group still alive, SIGKILL after ``grace_s``; then the groups again."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:  # whatever a worker started lives in its group: nothing outlives the launch
        _signal_group(p, signal.SIGKILL)
        p.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _report(result: LaunchResult, procs: list[subprocess.Popen], err: TextIO) -> None:
    stopped = [i for i, s in enumerate(result.statuses) if s is None]
    tail = f"; stopped worker(s) {', '.join(map(str, stopped))}" if stopped else ""
    if result.reason == "failed" and result.first_failure is not None:
        code = procs[result.first_failure].returncode
        err.write(f"harness launch: worker {result.first_failure} {_describe(code)} first{tail}\n")
    elif result.reason == "timeout":
        err.write(f"harness launch: timed out after {result.seconds:.1f} s{tail}\n")
    elif result.reason == "interrupted":
        err.write(f"harness launch: interrupted{tail}\n")
    err.flush()
