"""A repository's harness configuration: its workloads and how to check and benchmark them.

A project that adopted harness (``harness init``) names its workloads in a
``[tool.harness]`` table of its ``pyproject.toml``, or at the top level of a
``harness.toml`` beside it (harness.toml wins where both exist)::

    [tool.harness]
    devices = 2              # devices a check or benchmark splits over: GPUs where there are enough, else logical CPUs
    ratios = [3, 2]          # the uneven split, one per device (default: even)
    methods = ["mirrored"]   # harness' parallel methods to check and benchmark (towers, mirrored)
    backend = "tensorflow"   # Keras' backend the check trains on: "tensorflow", or "jax" (Keras 3 on JAX devices,
                             # method towers, no TensorFlow; methods default to ["towers"] there)
    emulate = "400,250"      # emulated devices for harness run/tune on a machine without GPUs
    matrix = ["tf221"]       # harness docker/matrix.toml entries the Docker workflow tests in
    harness-requirement = "keras-harness==0.2.0"  # how generated CI installs harness (harness init writes it)
    branch = "main"          # the branch generated workflows test and benchmark (harness init reads git's)

    [tool.harness.workloads.classifier]
    model = "mypkg.model:build"     # MODULE:ATTR or path/to/file.py:ATTR (docs/user-models.md)
    data = "mypkg.data:batches"     # optional: real data; default made up from the model's inputs and loss
    batch-size = 64                 # the benchmarks' global batch
    check-batch-size = 20           # the equivalence check's global batch
    check-samples = 166             # samples the check trains on: one epoch, 8 steps and a partial one
    tol = 1e-6                      # exact below this; above, the float64 rounding verdict decides
    expect = "exact"                # what each method must come out as: "exact", "as accurate" (as
                                    # accurate as one device) or a refusal's id ("custom-train-step");
                                    # per method: expect = { towers = "custom-train-step" }

``load_project`` reads it (one line naming the file and key for a bad value);
``check_workload`` runs ``harness check`` on one workload in a process of its own
(its devices are laid out there, whatever the caller's process imported) and
returns its verdict held to what the workload expects of each method: what the
pytest file ``harness init`` writes asserts (on a pass judged with random layers
off, it warns ``RandomLayersOff``, naming them). The
asv suites of ``harness.suites`` read the same configuration. Standard library
only: nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import REFUSALS, InvalidValue, Unavailable

__all__ = ["CONFIG_FILES", "WorkloadEntry", "Project", "CheckResult", "RandomLayersOff", "find_config", "load_project",
           "outcome", "meets", "parse_config", "check_workload", "judge", "read_toml", "read_toml_text"]

CONFIG_FILES = ("harness.toml", "pyproject.toml")  # looked for in this order in each folder
METHODS = ("towers", "mirrored")
BACKENDS = ("tensorflow", "jax")
JAX_METHODS = ("towers",)  # mirrored is TensorFlow's MirroredStrategy
EXACT, AS_ACCURATE = "exact", "as accurate"
# One epoch of 8 full steps at the default check batch (20) and a partial one of 6: enough steps for a drift to
# show (an optimizer's state, compared too, builds up over them), a partial last batch split as well.
CHECK_SAMPLES = 166
_REFERENCE = re.compile(r"^[^:\s]+:[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class WorkloadEntry:
    """One ``[tool.harness.workloads.NAME]`` table."""

    name: str
    model: str
    data: str | None = None
    batch_size: int = 64
    check_batch_size: int = 20
    check_samples: int = CHECK_SAMPLES
    tol: float = 1e-6
    expect: Mapping[str, str] = field(default_factory=dict)  # method -> "exact" | "as accurate" | a refusal id

    def expected(self, method: str) -> str:
        """What ``method`` must come out as on this workload (default ``"exact"``)."""
        return self.expect.get(method, EXACT)


@dataclass(frozen=True)
class Project:
    """A repository's harness configuration; ``root`` is the folder of ``source``."""

    source: Path
    workloads: tuple[WorkloadEntry, ...]
    devices: int = 2
    ratios: tuple[float, ...] | None = None
    methods: tuple[str, ...] = ("mirrored",)
    emulate: str | None = None
    matrix: tuple[str, ...] = ("tf221",)
    extra: Mapping[str, Any] = field(default_factory=dict)
    backend: str = "tensorflow"

    @property
    def root(self) -> Path:
        return self.source.parent

    def workload(self, name: str) -> WorkloadEntry:
        """The workload called ``name``.

        Raises:
            InvalidValue: no such workload (the message lists the configured ones).
        """
        for entry in self.workloads:
            if entry.name == name:
                return entry
        raise InvalidValue(f"no workload {name!r} in {self.source}; configured: "
                           f"{', '.join(e.name for e in self.workloads) or 'none'}")

    def split(self) -> tuple[float, ...]:
        """The ratios the checks and benchmarks split by: ``ratios``, else even."""
        return self.ratios if self.ratios is not None else (1.0,) * self.devices

    def check_argv(self, entry: WorkloadEntry, devices: Sequence[str] | None = None) -> list[str]:
        """``harness check`` arguments of ``entry``: its model on ``devices`` (default: ``devices`` logical CPUs;
        on JAX, JAX CPU devices), the project's split and methods, the float64 rounding verdict, no step timings,
        JSON; ``--backend jax`` where the project's backend is JAX."""
        where = ["--devices", *devices] if devices else ["--logical-cpus", str(self.devices)]
        argv = ["check", "--model", entry.model, *where, "--ratios", *(f"{r:g}" for r in self.split()),
                "--methods", *self.methods, "--batch-size", str(entry.check_batch_size),
                "--samples", str(entry.check_samples), "--tol", f"{entry.tol:g}", "--reference", "float64",
                "--time-steps", "0", "--json"]
        if entry.data:
            argv[3:3] = ["--data", entry.data]
        if self.backend != "tensorflow":
            argv[1:1] = ["--backend", self.backend]
        return argv


def find_config(start: str | os.PathLike = ".") -> Path:
    """The nearest ``harness.toml``, or ``pyproject.toml`` with a ``[tool.harness]`` table, at or above ``start``
    (a folder, or a file whose folder is meant).

    Raises:
        Unavailable: none up to the file system's root (the message says how to make one).
    """
    here = Path(start).resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        if (folder / "harness.toml").is_file():
            return folder / "harness.toml"
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "harness" in read_toml(pyproject).get("tool", {}):
            return pyproject
    raise Unavailable(f"no harness.toml, and no pyproject.toml with a [tool.harness] table, in {here} or above it; "
                  "`harness init` writes one")


def load_project(start: str | os.PathLike = ".") -> Project:
    """The configuration ``find_config(start)`` finds, checked (``parse_config``)."""
    source = find_config(start)
    data = read_toml(source)
    table = data.get("tool", {}).get("harness") if source.name == "pyproject.toml" else data
    return parse_config(table, source)


def read_toml(path: Path) -> dict:
    """``path``'s TOML (``read_toml_text``)."""
    return read_toml_text(path.read_text(), path)


def read_toml_text(text: str, source: Path) -> dict:
    """TOML text read from ``source``.

    Raises:
        InvalidValue: not valid TOML, naming ``source`` and where.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover  the ci extra brings tomli to Python < 3.11
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InvalidValue(f"{source} is not valid TOML: {err}") from None


_TOP = {"devices", "ratios", "methods", "emulate", "matrix", "workloads", "reusable-workflows", "harness-requirement",
        "branch", "backend"}
_EXTRA = ("reusable-workflows", "harness-requirement", "branch")  # strings harness init reads back
_ENTRY = {"model", "data", "batch-size", "check-batch-size", "check-samples", "tol", "expect"}


def parse_config(table: Any, source: Path) -> Project:
    """A ``Project`` from a ``[tool.harness]`` table (or harness.toml's top level) read from ``source``.

    Raises:
        InvalidValue: an unknown key, a value of the wrong kind or out of range, no workloads; the message names the
            file and the key (``tool.harness.workloads.NAME.KEY``).
    """
    where = "tool.harness" if source.name == "pyproject.toml" else ""

    def bad(key: str, why: str) -> InvalidValue:
        return InvalidValue(f"{source}: {'.'.join(filter(None, (where, key)))}: {why}")

    if not isinstance(table, dict):
        raise bad("", "must be a table")
    unknown = sorted(set(table) - _TOP)
    if unknown:
        raise bad(unknown[0], f"unknown key (known: {', '.join(sorted(_TOP))})")
    devices = _integer(table.get("devices", 2), "devices", bad, least=1)
    ratios = table.get("ratios")
    if ratios is not None:
        if (not isinstance(ratios, list) or len(ratios) != devices
                or not all(_number(r) and math.isfinite(r) and r > 0 for r in ratios)):
            raise bad("ratios", f"must be {devices} positive numbers, one per device; got {ratios!r}")
        ratios = tuple(float(r) for r in ratios)
    backend = table.get("backend", "tensorflow")
    if backend not in BACKENDS:
        raise bad("backend", f"must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    allowed = JAX_METHODS if backend == "jax" else METHODS
    methods = table.get("methods", list(allowed[:1]) if backend == "jax" else ["mirrored"])
    if not isinstance(methods, list) or not methods or any(m not in allowed for m in methods):
        on = " on backend \"jax\" (mirrored is TensorFlow's MirroredStrategy)" if backend == "jax" else ""
        raise bad("methods", f"must be a list of {', '.join(allowed)}{on}; got {methods!r}")
    emulate = table.get("emulate")
    if emulate is not None and (not isinstance(emulate, str) or not emulate.strip()):
        raise bad("emulate", f"must be a string RATE[:MAXBATCH[:MS]],... (harness run --emulate); got {emulate!r}")
    matrix = table.get("matrix", ["tf221"])
    if not isinstance(matrix, list) or not matrix or not all(isinstance(m, str) and m for m in matrix):
        raise bad("matrix", f"must be a list of docker/matrix.toml entry names; got {matrix!r}")
    workloads = table.get("workloads")
    if not isinstance(workloads, dict) or not workloads:
        raise bad("workloads", "must hold at least one table [workloads.NAME] with model = \"MODULE:ATTR\"")
    entries = tuple(_entry(name, value, bad) for name, value in workloads.items())
    for key in _EXTRA:
        if key in table and not (isinstance(table[key], str) and table[key].strip()):
            raise bad(key, f"must be a non-empty string; got {table[key]!r}")
    extra = {k: table[k] for k in _EXTRA if k in table}
    return Project(source, entries, devices, ratios, tuple(methods), emulate, tuple(matrix), extra, backend)


def _entry(name: str, table: Any, bad) -> WorkloadEntry:
    key = f"workloads.{name}"
    if not _NAME.match(name):
        raise bad(key, "a workload's name must be a Python identifier (it names benchmarks and tests)")
    if not isinstance(table, dict):
        raise bad(key, "must be a table")
    unknown = sorted(set(table) - _ENTRY)
    if unknown:
        raise bad(f"{key}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(_ENTRY))})")
    for ref in ("model", "data"):
        value = table.get(ref)
        if (ref == "model" or value is not None) and not (isinstance(value, str) and _REFERENCE.match(value)):
            raise bad(f"{key}.{ref}", f"must be MODULE:ATTR or path/to/file.py:ATTR; got {value!r}")
    tol = table.get("tol", 1e-6)
    if not _number(tol) or not math.isfinite(tol) or tol < 0:
        raise bad(f"{key}.tol", f"must be a number >= 0; got {tol!r}")
    return WorkloadEntry(name, table["model"], table.get("data"),
                         _integer(table.get("batch-size", 64), f"{key}.batch-size", bad, least=1),
                         _integer(table.get("check-batch-size", 20), f"{key}.check-batch-size", bad, least=1),
                         _integer(table.get("check-samples", CHECK_SAMPLES), f"{key}.check-samples", bad, least=1),
                         float(tol), _expectations(table.get("expect", EXACT), f"{key}.expect", bad))


def _expectations(value: Any, key: str, bad) -> dict[str, str]:
    """``expect``: one outcome for every method, or a table of method -> outcome; the methods left out: exact."""
    table = {m: value for m in METHODS} if isinstance(value, str) else value
    if not isinstance(table, dict) or not table:
        raise bad(key, f'must be "exact", "as accurate", a refusal id, or a table of method -> one of them; '
                       f"got {value!r}")
    for method, outcome in table.items():
        if method not in METHODS:
            raise bad(f"{key}.{method}", f"not a method (methods: {', '.join(METHODS)})")
        if not isinstance(outcome, str) or outcome not in (EXACT, AS_ACCURATE, *REFUSALS):
            raise bad(f"{key}.{method}" if not isinstance(value, str) else key,
                      f'must be "exact", "as accurate" or a refusal\'s id ({", ".join(REFUSALS)}); got {outcome!r}')
    return {m: o for m, o in table.items() if o != EXACT}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value, key: str, bad, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise bad(key, f"must be an integer >= {least}; got {value!r}")
    return value


class RandomLayersOff(UserWarning):
    """The generated test's warning on a pass (``CheckResult.randomness_warning``): the workload was judged with
    its random layers off in training, which it names."""


@dataclass(frozen=True)
class CheckResult:
    """What ``check_workload`` found: ``passed`` (each method came out as the workload expects), and ``message``
    saying why (every method's verdict against what was expected, and the command to rerun)."""

    workload: str
    passed: bool
    message: str
    rows: tuple[Mapping[str, Any], ...] = ()

    @property
    def random_layers(self) -> tuple[str, ...]:
        """The random layers (class names, as ``harness check`` names them: ``harness.randomness.random_layers``)
        that ran as at inference in a method's check, each once, in model order; ``()`` where none did (a model
        without any; a method that refused the model ran nothing)."""
        return tuple(dict.fromkeys(name for row in self.rows if not row.get("refused") and not row.get("baseline")
                                   for name in row.get("random_layers") or ()))

    def randomness_warning(self) -> RandomLayersOff | None:
        """On a pass judged with random layers off, the warning the generated test gives, naming them; else None
        (a failure's message says it already)."""
        if not self.passed or not self.random_layers:
            return None
        return RandomLayersOff(f"workload {self.workload!r} passed with its random layers off in training (as at "
                               f"inference: each device draws its own numbers, equal in distribution, not in "
                               f"value): {', '.join(self.random_layers)}")


_HINT = ("where harness' own methods are exact, a model whose output for one row depends on the other rows of its "
         "batch (a batch statistic, a layer of its own that mixes rows) is not the single-device step on a split "
         "batch")


def outcome(row: Mapping[str, Any]) -> str:
    """A ``harness check --json`` row as an outcome: ``"exact"``, ``"as accurate"``, a refusal's id, or ``"FAIL"``."""
    if row.get("refused"):
        return str(row["refused"])
    verdict = row.get("verdict", EXACT if row.get("exact") else "FAIL")
    return AS_ACCURATE if str(verdict).startswith(AS_ACCURATE) else str(verdict)


def meets(got: str, expected: str) -> bool:
    """Whether outcome ``got`` meets ``expected``: the same, or exact where as accurate was expected."""
    return got == expected or (expected == AS_ACCURATE and got == EXACT)


def _row_line(row: Mapping[str, Any], expected: str) -> str:
    got = outcome(row)
    if row.get("refused"):
        said = f"refused ({got}): {row.get('error', '')}"
    else:
        said = f"{row.get('verdict', got)}, max deviation {row.get('max_deviation', float('nan')):.3e}"
        if row.get("why") and row["why"] != row.get("verdict"):
            said += f" ({row['why']})"
    random = row.get("random_layers") or []
    if random:
        other = row.get("with_randomness") or {}
        said += (f"; with randomness off: {', '.join(random)} draw per device (equal in distribution, not in value"
                 + (f"; with them on: {other.get('verdict')}, {other.get('max_deviation', float('nan')):.3e}"
                    if other else "") + ")")
    if meets(got, expected):
        better = "" if got == expected else f" (better than expected {expected!r}: expect = {got!r} would hold it)"
        return f"{row['method']}: {said}{better}"
    return f"{row['method']}: {said} -- expected {expected!r}"


def check_workload(project: Project, name: str, devices: Sequence[str] | None = None,
                   timeout: float = 1800) -> CheckResult:
    """Runs ``harness check`` on workload ``name`` in a new process (``python -m harness``, from the project's root,
    so ``MODULE:ATTR`` references import the project's package) and holds each method's verdict to the workload's
    ``expect``.

    Passed: every method came out as expected: exact where exact is expected (the default), exact or as accurate
    as one device where ``"as accurate"`` is (float64 rounding verdict, ``harness.EquivalenceReport.verdict``),
    refused with that id where a refusal's id is. A model with training-time randomness (Dropout, the Random*
    layers) is judged with it off, its random layers named. A check that could not run (a bad reference, an
    error in the model) is not passed; its message carries harness' own error line.
    """
    entry = project.workload(name)
    argv = [sys.executable, "-m", "harness", *project.check_argv(entry, devices)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(project.root),
                                                                      os.environ.get("PYTHONPATH"))))}
    if project.backend == "jax":  # harness check --backend jax sets KERAS_BACKEND and its JAX devices itself
        env.pop("TF_USE_LEGACY_KERAS", None)
    done = subprocess.run(argv, cwd=project.root, capture_output=True, text=True, timeout=timeout, env=env)
    command = "harness " + " ".join(argv[3:])
    try:
        rows = tuple(json.loads(done.stdout)["equivalence"])
    except (ValueError, KeyError, TypeError):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        return CheckResult(name, False, f"workload {name!r} ({entry.model}): `{command}` exited {done.returncode} "
                                        f"without a verdict:\n{tail}")
    return judge(project, entry, rows, done.returncode, command)


def judge(project: Project, entry: WorkloadEntry, rows: Sequence[Mapping[str, Any]], returncode: int,
          command: str) -> CheckResult:
    """``harness check --json``'s ``rows`` of ``entry`` (exit status ``returncode``) held to what the workload
    expects of each of the project's methods."""
    name = entry.name
    rows = tuple(r for r in rows if not r.get("baseline"))
    missing = [m for m in project.methods if m not in {r.get("method") for r in rows}]
    lines = [_row_line(r, entry.expected(r["method"])) for r in rows]
    lines += [f"{m}: no verdict (not in harness check's output) -- expected {entry.expected(m)!r}" for m in missing]
    passed = (returncode in (0, 1, 2) and bool(rows) and not missing
              and all(meets(outcome(r), entry.expected(r["method"])) for r in rows))
    failed = [r for r in rows if outcome(r) == "FAIL"]
    verdict = "came out as expected" if passed else "did NOT come out as expected"
    return CheckResult(name, passed, f"workload {name!r} ({entry.model}): parallel training on "
                                     f"{len(project.split())} devices, ratios {list(project.split())}, {verdict}:\n  "
                       + "\n  ".join(lines)
                       + ("" if passed else f"\n  rerun: {command}" + (f"\n  {_HINT}" if failed else "")), rows)
