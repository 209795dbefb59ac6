"""Where a test run's time goes, and whether each step of a CI run stays within its budget.

Reads what pytest writes (``--junitxml``; with harness' plugin each test case carries the properties
``markers`` and ``tf_processes``, harness/pytest_timing.py) and what ``.ci/run`` records of its steps
(one JSON object a line: ``step``, ``wall_s``, ``status``, ``junit``, ``probe_s``, ``probe_workers``), and holds
the steps against a budget file (TOML)::

    [host]
    probe_s = 0.60         # probe_host(workers=2) on the host the budgets were set on
    probe_workers = 2      # the worker count of that probe (default 1: a file from before it had one)
    fail_factor = 1.5      # a step fails only beyond fail_factor x its budget (noise never trips it)
    probe_exponent = 0.5   # how far the steps follow the probe (default 1: in proportion)

    [steps.quick]
    seconds = 480
    what = "the README's test command"

A budget is seconds on the reference host. On another host every budget is scaled by the same factor, this host's
probe over the reference's: a slower host (its probe takes longer) gets more, a faster one less, so a step that
doubles fails on either; the factor never goes below ``SCALE_FLOOR``. The factor is the probes' ratio raised to
``probe_exponent``: 1 (the default) where the steps' times follow the probe in proportion; below 1 where they were
measured to move less far than the probe between hosts (a suite whose time is partly imports, waits and native
code, beside a pure-Python probe). The probe runs in as many processes at once
as the steps' own workers (``pytest -n 2``): two cores that are one core's hyper-threads, or that another load
shares, read as slow as the steps find them. The verdict is about the suite, not about the machine it ran on.
Framework-neutral: the standard library only.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomllib

from harness.errors import InvalidValue

__all__ = ["TestTime", "Step", "Budget", "Budgets", "Verdict", "read_junit", "read_steps", "read_budgets",
           "probe_host", "probe_rounds", "step_report", "steps_table", "judge", "budget_line", "PROBE_REPEATS",
           "PROBE_WORKERS", "SCALE_FLOOR"]

UNMARKED = "(no marker)"
PROBE_REPEATS = 5
PROBE_WORKERS = 2  # the steps' own worker count: .ci/run's pytest steps run -n 2 on a 2-core host
# The least a budget is scaled by, however fast this host's probe. A probe is the fastest of its rounds, so load only
# slows it: on this 2-core box, 14 probes of 2 processes given the CPUs (nice -20 beside a CI run; .ci/test-budget.toml)
# read 0.88-1.31x their median, 30 at plain priority beside it 0.50-2.76x theirs (the load coming and going), never
# below the idle speed. What reads far below the reference is a host that is faster, or a probe that stopped measuring
# the suite (a changed workload, an interpreter that optimises it away): past 2x the budgets stop following, so such
# a probe at most halves them. At the floor a step fails beyond 0.5 x fail_factor 1.5 = 0.75 x its budget.
SCALE_FLOOR = 0.5


@dataclass(frozen=True)
class TestTime:
    """One test case of a JUnit file: its time (setup, call and teardown) and what harness' plugin recorded."""

    __test__ = False  # not a test class, whatever its name

    nodeid: str
    file: str
    seconds: float
    outcome: str  # passed, failed, error or skipped
    markers: tuple[str, ...] = ()
    tf_processes: int | None = None  # None: the plugin did not count (another plugin wrote the file)


@dataclass(frozen=True)
class Step:
    """One step of a CI run as ``.ci/run`` records it."""

    name: str
    wall_s: float
    status: int
    junit: tuple[str, ...] = ()
    probe_s: float | None = None
    probe_workers: int = 1  # the processes its probe ran in at once (a record without it: 1, as before they had one)


@dataclass(frozen=True)
class Budget:
    """A step's budget on the reference host, and what the step is."""

    step: str
    seconds: float
    what: str = ""


@dataclass(frozen=True)
class Budgets:
    """A budget file: each step's budget, the reference host's probe (and the processes it ran in at once) and the
    factor beyond which a step fails."""

    path: str
    steps: dict[str, Budget]
    probe_s: float
    fail_factor: float
    total_s: float | None = None
    probe_workers: int = 1
    probe_exponent: float = 1.0

    def scale(self, probe_s: float | None) -> float:
        """This host's time over the reference host's, from its probe ``probe_s`` (taken with ``probe_workers``):
        ``(probe_s / the reference's) ** probe_exponent``, above 1 on a slower host, below on a faster one, never below
        ``SCALE_FLOOR``; 1 without a probe."""
        if probe_s is None or probe_s <= 0:
            return 1.0
        return max(SCALE_FLOOR, self.unfloored(probe_s))

    def unfloored(self, probe_s: float) -> float:
        """``scale`` before ``SCALE_FLOOR``: the probes' ratio to the power ``probe_exponent``."""
        return (probe_s / self.probe_s) ** self.probe_exponent


@dataclass(frozen=True)
class Verdict:
    """A step held against its budget: ``over`` when it took more than ``limit_s``."""

    step: str
    wall_s: float
    budget_s: float | None
    limit_s: float | None
    scale: float

    @property
    def over(self) -> bool:
        return self.limit_s is not None and self.wall_s > self.limit_s


def _where(classname: str, name: str) -> tuple[str, str]:
    """``(file, node id)`` of a JUnit case as pytest names it: ``tests.unit.test_split.TestY`` + ``test_z[p]`` is
    ``tests/unit/test_split.py`` and ``tests/unit/test_split.py::TestY::test_z[p]`` (a class starts with a capital)."""
    parts = classname.split(".") if classname else []
    module = [p for p in parts if not p[:1].isupper()]
    classes = parts[len(module):]
    file = "/".join(module) + ".py" if module else ""
    return file, "::".join([file, *classes, name]) if file else name


def read_junit(path: str | Path) -> list[TestTime]:
    """The test cases of a JUnit XML file as pytest writes it (``--junitxml``), in file order.

    Raises:
        InvalidValue: the file cannot be read or is not JUnit XML.
    """
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise InvalidValue(f"cannot read the JUnit file {str(path)!r}: {err}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise InvalidValue(f"{str(path)!r} is not a JUnit file: its root element is <{root.tag}>")
    tests = []
    for case in root.iter("testcase"):
        file, nodeid = _where(case.get("classname", ""), case.get("name", ""))
        properties = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag == "failure" else tag
                break
        processes = properties.get("tf_processes")
        tests.append(TestTime(
            nodeid=nodeid, file=file, seconds=float(case.get("time") or 0.0),
            outcome=outcome, markers=tuple(m for m in properties.get("markers", "").split(",") if m),
            tf_processes=int(processes) if processes not in (None, "") else None))
    return tests


def read_steps(path: str | Path) -> list[Step]:
    """The steps ``.ci/run`` recorded in ``path``, one JSON object a line.

    Raises:
        InvalidValue: the file cannot be read, or a line is not a step record (the line is named).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise InvalidValue(f"cannot read the steps file {str(path)!r}: {err.strerror or err}") from None
    steps = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            junit = record.get("junit") or ()
            steps.append(Step(str(record["step"]), float(record["wall_s"]), int(record["status"]),
                              tuple([junit] if isinstance(junit, str) else junit),
                              None if record.get("probe_s") is None else float(record["probe_s"]),
                              _workers(record.get("probe_workers", 1), "probe_workers")))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InvalidValue(f"{path}:{number}: not a step record ({err!r}): {line[:200]!r}") from None
    return steps


def _workers(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidValue(f"{where} must be a whole number of processes >= 1; got {value!r}")
    return value


def _positive(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidValue(f"{where} must be a positive number of seconds; got {value!r}")
    return float(value)


def read_budgets(path: str | Path) -> Budgets:
    """A budget file (the module's docstring).

    Raises:
        InvalidValue: the file cannot be read, is not TOML, or a value is missing or not positive (named).
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InvalidValue(f"cannot read the budget file {str(path)!r}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise InvalidValue(f"the budget file {str(path)!r} is not TOML: {err}") from None
    host, steps = data.get("host"), data.get("steps")
    if not isinstance(host, dict) or not isinstance(steps, dict) or not steps:
        raise InvalidValue(f"the budget file {str(path)!r} needs a [host] table and at least one [steps.NAME] table")
    probe = _positive(host.get("probe_s"), f"{path}: [host] probe_s")
    factor = _positive(host.get("fail_factor", 1.5), f"{path}: [host] fail_factor")
    if factor < 1:
        raise InvalidValue(f"{path}: [host] fail_factor must be at least 1; got {factor!r}")
    budgets = {}
    for name, table in steps.items():
        if not isinstance(table, dict):
            raise InvalidValue(f"{path}: steps.{name} must be a table with seconds = N; got {table!r}")
        budgets[name] = Budget(name, _positive(table.get("seconds"), f"{path}: [steps.{name}] seconds"),
                               str(table.get("what", "")))
    total = host.get("total_s")
    exponent = host.get("probe_exponent", 1.0)
    if isinstance(exponent, bool) or not isinstance(exponent, int | float) or not 0 < exponent <= 1:
        raise InvalidValue(f"{path}: [host] probe_exponent must be in (0, 1] (1: the steps follow the probe in "
                           f"proportion); got {exponent!r}")
    return Budgets(str(path), budgets, probe, factor,
                   None if total is None else _positive(total, f"{path}: [host] total_s"),
                   _workers(host.get("probe_workers", 1), f"{path}: [host] probe_workers"), float(exponent))


def _workload() -> None:
    """A fixed piece of pure-Python work: what dominates a suite of small models (tracing, Keras' Python)."""
    table: dict[int, list[int]] = {}
    for i in range(600_000):
        table.setdefault(i % 997, []).append((i * 7919) % 65_521)
    for values in table.values():
        values.sort()
    " ".join(str(len(v)) for v in table.values()).split()


# One probe process: the workload (its source, below) once per line on stdin, each run's seconds a line on stdout.
_PROBE_PROCESS = """
import sys, time
{workload}
print("ready", flush=True)
for _ in sys.stdin:
    start = time.perf_counter()
    _workload()
    print(start, time.perf_counter(), flush=True)
"""


def probe_host(repeats: int = PROBE_REPEATS, workers: int = 1) -> float:
    """Seconds this host takes for a fixed pure-Python workload run in ``workers`` processes at once, the fastest
    of ``repeats`` rounds (a round's time: the mean of its processes').

    A relative speed: compare it only with a probe taken the same way (the budget file's ``probe_s``, with its
    ``probe_workers``). With one worker the workload runs in this process; with more, in as many fresh
    interpreters, each round started in all of them together, so two workers on cores that are one core's
    hyper-threads, or shared with another load, each take longer than one alone, as a step's ``pytest -n 2``
    workers do. The fastest round is the least disturbed; under load it grows, as the tests' times do.

    Raises:
        InvalidValue: ``workers`` or ``repeats`` is not a whole number >= 1.
        RuntimeError: a probe process failed (its exit status and stderr).
    """
    _workers(workers, "probe_host's workers")
    _workers(repeats, "probe_host's repeats")
    if workers == 1:
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            _workload()
            best = min(best, time.perf_counter() - start)
        return best
    return min(sum(end - start for start, end in spans) / workers for spans in probe_rounds(repeats, workers))


def probe_rounds(repeats: int, workers: int) -> list[list[tuple[float, float]]]:
    """Each round of ``probe_host``'s workload in ``workers`` fresh processes at once: each process' ``(start,
    end)`` on the system's monotonic clock (``time.perf_counter``, one clock for every process on Linux).

    Raises:
        RuntimeError: a probe process failed (its exit status and stderr).
    """
    # Fresh interpreters fed by pipes, not multiprocessing: its spawn re-imports the caller's main script, and a
    # fork of a process with TensorFlow's threads (pytest's) can deadlock. -I: no PYTHON* variables, no user site.
    code = _PROBE_PROCESS.format(workload=inspect.getsource(_workload))
    processes = [subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(workers)]
    try:
        _answers(processes)  # each says "ready" once started: the first round starts in all of them together
        rounds = []
        for _ in range(repeats):
            for process in processes:
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            rounds.append([(float(a.split()[0]), float(a.split()[1])) for a in _answers(processes)])
        return rounds
    finally:
        for process in processes:
            if process.stdin is not None:
                process.stdin.close()  # its loop ends
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()


def _answers(processes: Sequence[subprocess.Popen]) -> list[str]:
    """The next line of each probe process.

    Raises:
        RuntimeError: one ended instead (its exit status and stderr).
    """
    lines = []
    for process in processes:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        if not line:
            status = process.wait()
            raise RuntimeError(f"a probe process ({sys.executable}) exited with status {status}: "
                               f"{process.stderr.read()[-2000:].strip()}")
        lines.append(line.strip())
    return lines


def _table(rows: Iterable[Sequence[str]], header: Sequence[str], left: Sequence[int] = ()) -> list[str]:
    """Aligned columns: figures to the right; the last column and those in ``left`` to the left."""
    rows = [list(header), *map(list, rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    last = len(header) - 1
    out = ["  ".join(c.ljust(w) if i in left else c.rjust(w) if i < last else c
                     for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def step_report(name: str, tests: Sequence[TestTime], wall_s: float | None = None, *, top: int = 25,
                files: int = 15) -> str:
    """The time of one step: its wall time, the ``top`` slowest tests, the time per file and per marker, and
    the TensorFlow processes its tests started (where harness' plugin counted them). A test's markers are those
    harness' plugin wrote for it (its own markers only)."""
    ran = [t for t in tests if t.outcome != "skipped"]
    total = sum(t.seconds for t in tests)
    counted = [t.tf_processes for t in tests if t.tf_processes is not None]
    outcomes = Counter(t.outcome for t in tests)
    head = f"{name}: {len(ran)} tests ran ({', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))}), " \
           f"{total:.0f} s of test time"
    if wall_s is not None:
        head += f" in {wall_s:.0f} s wall"
    head += f"; TensorFlow processes started: {sum(counted)}" if counted else "; TensorFlow processes: not counted"
    lines = [head, "", f"the {min(top, len(ran))} slowest tests:"]
    slowest = sorted(ran, key=lambda t: -t.seconds)[:top]
    lines += _table(([f"{t.seconds:.1f}", "-" if t.tf_processes is None else str(t.tf_processes), t.nodeid]
                     for t in slowest), ["s", "tf", "test"])
    per_file: dict[str, list[TestTime]] = defaultdict(list)
    for t in ran:
        per_file[t.file].append(t)
    ordered = sorted(per_file.items(), key=lambda kv: -sum(t.seconds for t in kv[1]))
    lines += ["", f"time per file ({min(files, len(ordered))} of {len(ordered)}):"]
    lines += _table(([f"{sum(t.seconds for t in ts):.1f}", str(len(ts)),
                      str(sum(t.tf_processes or 0 for t in ts)), f] for f, ts in ordered[:files]),
                    ["s", "tests", "tf", "file"])
    per_marker: dict[str, list[TestTime]] = defaultdict(list)
    for t in ran:
        per_marker[",".join(t.markers) or UNMARKED].append(t)
    lines += ["", "time per marker:"]
    lines += _table(([f"{sum(t.seconds for t in ts):.1f}", str(len(ts)), m]
                     for m, ts in sorted(per_marker.items(), key=lambda kv: -sum(t.seconds for t in kv[1]))),
                    ["s", "tests", "marker"])
    return "\n".join(lines)


def judge(steps: Sequence[Step], budgets: Budgets | None, probe_s: float | None = None) -> list[Verdict]:
    """Each step held against its budget, scaled to this host (the step's own probe, else ``probe_s``: one taken
    with the budget file's ``probe_workers``).

    Raises:
        InvalidValue: a step's probe ran in another number of processes than the budget file's (not comparable).
    """
    verdicts = []
    for step in steps:
        budget = budgets.steps.get(step.name) if budgets else None
        if budgets and step.probe_s is not None and step.probe_workers != budgets.probe_workers:
            raise InvalidValue(f"step {step.name!r} was probed in {step.probe_workers} process(es) at once, "
                               f"{budgets.path}'s probe_s in {budgets.probe_workers}: not comparable")
        scale = budgets.scale(step.probe_s if step.probe_s is not None else probe_s) if budgets else 1.0
        limit = budget.seconds * scale * budgets.fail_factor if budget and budgets else None
        verdicts.append(Verdict(step.name, step.wall_s, budget.seconds if budget else None, limit, scale))
    return verdicts


def steps_table(steps: Sequence[Step], verdicts: Sequence[Verdict], budgets: Budgets | None) -> str:
    """The end-of-run table: each step's wall time, status and budget, and the run's total."""
    rows = []
    for step, verdict in zip(steps, verdicts):
        budget = "-" if verdict.budget_s is None else f"{verdict.budget_s:.0f}"
        limit = "-" if verdict.limit_s is None else f"{verdict.limit_s:.0f}"
        share = "-" if verdict.budget_s is None else f"{verdict.wall_s / (verdict.budget_s * verdict.scale):.0%}"
        state = "OVER" if verdict.over else ("failed" if step.status else "ok")
        rows.append([step.name, f"{step.wall_s:.0f}", budget, share, limit, str(step.status), state])
    total = sum(s.wall_s for s in steps)
    lines = _table(rows, ["step", "wall s", "budget s", "of budget", "fails over s", "exit", "state"], left=(0,))
    total_budget = budgets.total_s if budgets else None
    scales = [v.scale for v in verdicts if v.budget_s is not None]
    line = f"total: {total:.0f} s"
    if total_budget is not None:
        line += f" of {total_budget:.0f} s"
    if scales and (max(scales) > 1.05 or min(scales) < 0.95):  # within: the probe's own noise
        low, high = min(scales), max(scales)
        line += (f" (budgets scaled by this host's probe against the reference host's: x{low:.2f}"
                 + (f" to x{high:.2f})" if high - low >= 0.005 else ")"))
    return "\n".join([*lines, line])


def budget_line(label: str, wall_s: float, budget: Budget | None, budgets: Budgets | None,
                probe_s: float | None = None) -> str:
    """One line for the end of a pytest run, its budget scaled by this host's probe ``probe_s`` (taken with the
    budget file's ``probe_workers``): ``quick loop: 512 s, budget 480 s x 1.07 (this host's probe 0.112 s vs
    reference 0.105 s, 2 workers) = 514 s (.ci/test-budget.toml, [steps.quick])``."""
    if budget is None or budgets is None:
        return f"{label}: {wall_s:.0f} s (no budget for it)"
    scale = budgets.scale(probe_s)
    where = f"({budgets.path}, [steps.{budget.step}])"
    if probe_s is None or probe_s <= 0:
        line = f"{label}: {wall_s:.0f} s, budget {budget.seconds:.0f} s unscaled (no probe of this host) {where}"
    else:
        floor = "the floor; " if (probe_s / budgets.probe_s) ** budgets.probe_exponent < SCALE_FLOOR else ""
        power = "" if budgets.probe_exponent == 1 else f", their ratio to the power {budgets.probe_exponent:g}"
        line = (f"{label}: {wall_s:.0f} s, budget {budget.seconds:.0f} s x {scale:.2f} ({floor}this host's probe "
                f"{probe_s:.3f} s vs reference {budgets.probe_s:.3f} s, {budgets.probe_workers} "
                f"worker{'s' if budgets.probe_workers > 1 else ''}{power}) = {budget.seconds * scale:.0f} s {where}")
    limit = budget.seconds * scale * budgets.fail_factor
    if wall_s > limit:
        line += f"; OVER {limit:.0f} s ({budgets.fail_factor:g} x the scaled budget), where .ci/run fails"
    return line
