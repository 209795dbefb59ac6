"""The pytest side of harness' test-time report: what each test cost, and the run against its budget.

Registered by harness' pytest plugin (harness/pytest_plugin.py). Where a run writes JUnit XML
(``--junitxml``), each test case gets two properties that ``harness test-time`` reads
(harness/ci/testtime.py):

- ``markers``: the test's markers among the plugin's (``slow``, ``timing``, ``extended``, ...), comma-separated;
- ``tf_processes``: the TensorFlow processes the test started: its test process, if this test was the one that
  imported TensorFlow there, and every process it started (a CLI run, a cluster's workers) that loaded
  TensorFlow's library. A thread of each test process watches its descendants in ``/proc`` (Linux; elsewhere
  the property is left out): a TensorFlow process lives for seconds, far longer than the watch's interval.

With ``--time-budget STEP``, the run ends with one line holding its wall time against ``STEP``'s budget in
``--time-budget-file`` (default ``.ci/test-budget.toml`` under the rootdir), scaled by this host's probe (in the
budget file's ``probe_workers`` processes at once; the mean of one taken before the tests and one after, both
shown) against the reference host's, e.g. ``quick loop:
512 s, budget 480 s x 1.07 (this host's probe 0.112 s vs reference 0.105 s, 2 workers) = 514 s``; the line says
so where the run is a subset of the step (test paths or ``-k`` given), or ran in another number of workers.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

import pytest

__all__ = ["ProcessWatch", "TimingPlugin"]

TF_LIBRARIES = (b"libtensorflow_framework", b"_pywrap_tensorflow_internal")


def _stat(pid: str) -> tuple[int, str] | None:
    """``(parent pid, start time)`` of ``/proc/PID``; None where it ended meanwhile."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[1]), fields[19].decode()


def _loads_tensorflow(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return False
    return any(name in maps for name in TF_LIBRARIES)


class ProcessWatch:
    """Counts the descendants of this process that load TensorFlow, each for the test that was running when it
    was first seen (``begin``/``end`` around each test)."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.root = os.getpid()
        self._found: set[tuple[int, str]] = set()  # (pid, start time): a pid may be reused
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="harness-process-watch", daemon=True)

    @staticmethod
    def available() -> bool:
        return sys.platform.startswith("linux") and os.path.exists(f"/proc/{os.getpid()}/stat")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def scan(self) -> None:
        """One look at the process tree: descendants that loaded TensorFlow since the last look are counted."""
        parents: dict[int, list[tuple[int, str]]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _stat(entry)
                if stat is not None:
                    parents.setdefault(stat[0], []).append((int(entry), stat[1]))
        new = 0
        todo = [self.root]
        while todo:
            for child in parents.get(todo.pop(), ()):
                todo.append(child[0])
                if child not in self._found and _loads_tensorflow(child[0]):
                    self._found.add(child)
                    new += 1
        with self._lock:
            self._count += new

    def take(self) -> int:
        """The count since the last ``take``, after a last look."""
        self.scan()
        with self._lock:
            count, self._count = self._count, 0
        return count


class TimingPlugin:
    """The per-test properties and the budget line (the module's docstring)."""

    def __init__(self, config, markers):
        self.config = config
        self.markers = tuple(markers)
        self.junit = bool(config.getoption("xmlpath", None))
        self.watch = ProcessWatch() if self.junit and ProcessWatch.available() else None
        self.started = time.monotonic()
        self.probe_start: float | None = None
        if self.watch is not None:
            self.watch.start()

    def pytest_sessionstart(self, session):
        # The host's speed moves (on a 2-core CI host the probe read 0.13-0.21 s within one hour): one probe before
        # the tests and one after, their mean, halve a single probe's variance. Before xdist's workers start, so
        # that the tests do not load it.
        config = session.config
        if config.getoption("--time-budget", None) and not hasattr(config, "workerinput"):
            self.probe_start = self._probe(config)[0]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.watch is not None:
            self.watch.take()  # what started between tests (a session fixture's own) goes to no test
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        if call.when == "teardown" and self.junit:
            names = sorted(m.name for m in item.iter_markers() if m.name in self.markers)
            item.user_properties.append(("markers", ",".join(dict.fromkeys(names))))
            if self.watch is not None:
                imported = "tensorflow" in sys.modules and not getattr(item, "_harness_had_tf", True)
                item.user_properties.append(("tf_processes", self.watch.take() + int(imported)))
        yield

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        item._harness_had_tf = "tensorflow" in sys.modules

    def pytest_unconfigure(self, config):
        if self.watch is not None:
            self.watch.stop()

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        step = config.getoption("--time-budget", None)
        if not step or hasattr(config, "workerinput"):
            return
        from harness.ci import testtime
        from harness.errors import InvalidValue

        wall = time.monotonic() - self.started
        label = {"quick": "quick loop"}.get(step, f"step {step!r}")
        path = _budget_path(config)
        try:
            budgets = testtime.read_budgets(path)
            budgets = dataclasses.replace(budgets, path=os.path.relpath(path, config.rootpath))
        except InvalidValue as err:
            terminalreporter.write_line(f"harness: {label}: {wall:.0f} s; its budget cannot be read: {err}")
            return
        probe, failed = self._probe(config, budgets.probe_workers)
        if probe is not None and self.probe_start is not None:
            failed = (f" - this host's probe {self.probe_start:.3f} s before the tests, {probe:.3f} s after: "
                      f"their mean scales the budget")
            probe = (probe + self.probe_start) / 2
        line = testtime.budget_line(label, wall, budgets.steps.get(step), budgets, probe) + failed
        if _is_subset(config):
            line += " - this run is a subset of the step (test paths or -k given): the budget is the whole step's"
        workers = config.getoption("numprocesses", None) or 1  # pytest-xdist's -n (0 or absent: this process)
        if workers != budgets.probe_workers:
            line += f" - this run used {workers} worker(s), the step {budgets.probe_workers}"
        terminalreporter.write_line(f"harness: {line}")

    def _probe(self, config, workers: int | None = None) -> tuple[float | None, str]:
        """This host's probe, taken as the budget file's was (its worker count) so that the two compare (~1 s at 2
        workers), and why there is none."""
        from harness.ci import testtime
        from harness.errors import InvalidValue

        if workers is None:
            try:
                workers = testtime.read_budgets(_budget_path(config)).probe_workers
            except InvalidValue:
                return None, ""  # the end of the run says why the budget cannot be read
        try:
            return testtime.probe_host(3, workers=workers), ""
        except (RuntimeError, OSError) as err:  # the line still comes, unscaled, saying why
            return None, f" - this host's probe failed: {err}"


def _budget_path(config) -> str:
    return config.getoption("--time-budget-file", None) or str(Path(config.rootpath) / ".ci" / "test-budget.toml")


def _is_subset(config) -> bool:
    source = getattr(config, "args_source", None)
    return bool(config.getoption("keyword", "")) or (source is not None and source != config.ArgsSource.TESTPATHS)
