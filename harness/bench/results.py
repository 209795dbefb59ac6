"""Run records and an atomic store. Framework-neutral: no TensorFlow here.

A record is a plain JSON-able ``dict``, so the run loop can add fields without a
schema change. :func:`new_record` fills the fixed fields; the writer adds the rest
and calls :func:`write_record` again whenever something worth keeping is done
(after each window, at the end), so a killed run still leaves its finished windows.

Schema 1 fields:

- ``schema`` (int): 1. Bumped only when a field changes meaning; readers should
  check it before relying on a field.
- ``kind`` (str): ``"run"`` (one configuration measured) or ``"compare"``
  (several configurations measured against each other).
- ``id`` (str): ``YYYYMMDDTHHMMSSZ-xxxxxx``, UTC time of creation plus six hex
  digits (a random start per process, counted up: distinct within a process, random
  across processes); sorts by creation time (to the second) and names the file
  ``<kind>-<id>.json``.
- ``created`` (str): ISO 8601 UTC time of creation, e.g. ``2026-11-22T10:15:00+00:00``.
- ``config`` (dict): what was asked for (workload, devices, ratios, batch size, ...).
- ``environment`` (dict): where it ran (versions, devices, driver, ...).
- ``status`` (str): ``"running"`` until the writer sets ``"complete"`` or ``"failed"``.
  A record left at ``"running"`` whose process is gone was interrupted.

Added by the writer as the run goes (optional, by convention):

- ``windows`` (list of dict): one entry per timed window, e.g. samples/s per device.
- ``summary`` (dict): :func:`summarize` of the windows' figure of merit.
- ``telemetry`` (dict): device samples (utilisation, memory, power).
- ``error`` (str): one line saying why a ``"failed"`` run failed.
- ``finished`` (str): ISO 8601 UTC time the run ended.

Non-finite floats (NaN, inf) are stored as ``null``: the files are strict JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import re
import secrets
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from harness.errors import InvalidType, InvalidValue

__all__ = [
    "SCHEMA_VERSION",
    "RecordKind",
    "RecordStatus",
    "cleanup_temp",
    "default_results_dir",
    "load_records",
    "new_record",
    "record_path",
    "summarize",
    "write_bytes_atomic",
    "write_record",
]

SCHEMA_VERSION = 1
# Six random hex digits alone collided within a second (birthday odds: 0.12% for 200 ids; it
# happened in a test): a random start per process, counted up, keeps one process's ids apart.
_ID_SPAN = 1 << 24
_ID_START = secrets.randbelow(_ID_SPAN)
_ID_COUNT = itertools.count()
_ID_PATTERN = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")


class RecordKind(str, Enum):
    """What a record measured."""

    RUN = "run"
    COMPARE = "compare"
    TUNE = "tune"
    CALIBRATE = "calibrate"


class RecordStatus(str, Enum):
    """Where a run stands."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"


def default_results_dir() -> Path:
    """Where records go when no directory is given.

    Returns:
        ``$HARNESS_RESULTS_DIR`` if set, else ``$XDG_CACHE_HOME/harness/results``,
        else ``~/.cache/harness/results``.
    """
    explicit = os.environ.get("HARNESS_RESULTS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "harness" / "results"


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, mean, range and spread of repeated measurements.

    Quartiles use the inclusive method (numpy's default linear interpolation).

    Args:
        values: finite numbers, e.g. samples/s of each timed window.

    Returns:
        ``{"median", "mean", "min", "max", "iqr", "spread", "n"}`` where ``spread`` is
        ``iqr / median`` (``None`` when the median is 0, and for one value: one window has no
        spread to show, which tables print as n/a). For no values every figure is ``None`` and
        ``n`` is 0.

    Raises:
        ValueError: a value is NaN, infinite or not a number.
    """
    numbers = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidValue(f"values must be finite numbers; got values={list(values)!r}")
        numbers.append(float(value))
    if not numbers:
        return {"median": None, "mean": None, "min": None, "max": None, "iqr": None, "spread": None, "n": 0}
    median = statistics.median(numbers)
    if len(numbers) > 1:
        q1, _, q3 = statistics.quantiles(numbers, n=4, method="inclusive")
        iqr = q3 - q1
    else:
        iqr = 0.0
    return {
        "median": median,
        "mean": math.fsum(numbers) / len(numbers),
        "min": min(numbers),
        "max": max(numbers),
        "iqr": iqr,
        "spread": iqr / median if median != 0 and len(numbers) > 1 else None,
        "n": len(numbers),
    }


def new_record(kind: str, config: dict, environment: dict, *, now: datetime | None = None) -> dict[str, Any]:
    """Starts a record with status ``"running"``.

    Args:
        kind: ``"run"`` or ``"compare"``.
        config: what was asked for; stored as given.
        environment: where it runs; stored as given.
        now: the creation time (default: the current time); naive times are taken as UTC.

    Returns:
        A new record dict; see the module docstring for its fields.

    Raises:
        ValueError: ``kind`` is not a known kind.
        TypeError: ``config`` or ``environment`` is not a dict.

    Example:
        >>> record = new_record("run", {"ratios": [3, 2]}, {"python": "3.11"})
        >>> record["status"]
        'running'
    """
    kind = _check_kind(kind)
    for name, value in (("config", config), ("environment", environment)):
        if not isinstance(value, dict):
            raise InvalidType(f"{name} must be a dict; got {name}={value!r}")
    moment = now or datetime.now(timezone.utc)
    moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    moment = moment.replace(microsecond=0)
    return {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "id": f"{moment:%Y%m%dT%H%M%SZ}-{(_ID_START + next(_ID_COUNT)) % _ID_SPAN:06x}",
        "created": moment.isoformat(),
        "config": config,
        "environment": environment,
        "status": RecordStatus.RUNNING.value,
    }


def record_path(record: dict, results_dir: Path | str | None = None) -> Path:
    """The file a record is stored in: ``<results_dir>/<kind>-<id>.json``.

    Raises:
        ValueError: the record's ``kind`` or ``id`` is missing or malformed.
    """
    if not isinstance(record, dict):
        raise InvalidType(f"record must be a dict; got record={record!r:.200}")
    kind = _check_kind(record.get("kind"))
    record_id = record.get("id")
    if not isinstance(record_id, str) or not _ID_PATTERN.match(record_id):
        raise InvalidValue(f"record id must look like 20261122T101500Z-a1b2c3; got id={record_id!r}")
    directory = Path(results_dir) if results_dir is not None else default_results_dir()
    return directory / f"{kind}-{record_id}.json"


def write_record(record: dict, results_dir: Path | str | None = None) -> Path:
    """Writes (or rewrites) a record atomically.

    The record is serialised before the disk is touched, so a value JSON cannot hold
    leaves nothing behind. A reader, or a process killed mid-write, sees either the
    previous complete file or the new complete file, never a mix.

    Args:
        record: a record from :func:`new_record`, possibly extended. Not modified.
        results_dir: the directory (created if needed); default :func:`default_results_dir`.

    Returns:
        The path written.

    Raises:
        TypeError: a value is not JSON-serialisable; the message names its key path.
        ValueError: the record's ``kind`` or ``id`` is malformed, or it holds a cycle.
    """
    path = record_path(record, results_dir)
    data = json.dumps(_to_json(record, "record", set()), indent=1, allow_nan=False, ensure_ascii=False)
    return write_bytes_atomic(path, (data + "\n").encode("utf-8"))


def write_bytes_atomic(path: Path | str, data: bytes) -> Path:
    """Replaces ``path`` by ``data`` so that readers see the old or the new file, whole.

    Writes a hidden temp file (``.<name>.<random>.tmp``) in the same directory, fsyncs
    it, renames it onto ``path`` and fsyncs the directory. The temp file is removed on
    any error; only a killed process can leave one (see :func:`cleanup_temp`).

    Args:
        path: the target file; its directory is created if needed.
        data: the complete new contents.

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        # NamedTemporaryFile creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp.name, 0o666 & ~_umask())
        os.replace(tmp.name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp.name)
        raise
    _fsync_directory(path.parent)
    return path


def load_records(results_dir: Path | str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    """Reads stored records, oldest first.

    Temp files left by killed writers are ignored. A file that cannot be read or is
    not a record is skipped with one warning naming it.

    Args:
        results_dir: the directory; default :func:`default_results_dir`. A missing
            directory holds no records.
        kind: only records of this kind (``"run"`` or ``"compare"``); default all.

    Returns:
        The records sorted by id.

    Raises:
        ValueError: ``kind`` is not a known kind.
    """
    kind = _check_kind(kind) if kind is not None else None
    directory = Path(results_dir) if results_dir is not None else default_results_dir()
    if not directory.is_dir():
        return []
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{kind}-*.json" if kind else "*.json")):
        if path.name.startswith("."):
            continue
        record, problem = _read_record(path)
        if record is None:  # then problem says why
            warnings.warn(f"skipping result file {path}: {problem}", RuntimeWarning, stacklevel=2)
        elif kind is None or record["kind"] == kind:
            records.append(record)
    return sorted(records, key=lambda r: r["id"])


def cleanup_temp(results_dir: Path | str | None = None, older_than_s: float = 3600) -> list[Path]:
    """Removes temp files that killed writers left behind.

    Args:
        results_dir: the directory; default :func:`default_results_dir`.
        older_than_s: only files last modified at least this many seconds ago, so a
            writer that is still running keeps its temp file.

    Returns:
        The files removed.

    Raises:
        ValueError: ``older_than_s`` is negative or not finite.
    """
    if (
        isinstance(older_than_s, bool)
        or not isinstance(older_than_s, (int, float))
        or not (math.isfinite(older_than_s) and older_than_s >= 0)
    ):
        raise InvalidValue(f"older_than_s must be a finite number >= 0; got older_than_s={older_than_s!r}")
    directory = Path(results_dir) if results_dir is not None else default_results_dir()
    if not directory.is_dir():
        return []
    cutoff = time.time() - older_than_s
    removed = []
    for path in sorted(directory.glob(".*.tmp")):
        with contextlib.suppress(FileNotFoundError):  # another cleaner or the writer got there first
            if path.is_file() and path.stat().st_mtime <= cutoff:
                path.unlink()
                removed.append(path)
    return removed


def _check_kind(kind: object) -> str:
    allowed = [k.value for k in RecordKind]
    if kind not in allowed:
        raise InvalidValue(f"kind must be one of {allowed}; got kind={kind!r}")
    return RecordKind(kind).value


def _to_json(value: Any, where: str, active: set[int]) -> Any:
    """A strict-JSON copy of ``value``: non-finite floats become None, tuples lists."""
    if value is None or isinstance(value, (str, bool, int)):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Enum):
        return _to_json(value.value, where, active)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return _to_json(value.tolist(), where, active)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (dict, list, tuple)):
        if id(value) in active:
            raise InvalidValue(f"record holds a circular reference at {where}")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                return {_check_key(k, where): _to_json(v, f"{where}[{k!r}]", active) for k, v in value.items()}
            return [_to_json(v, f"{where}[{i}]", active) for i, v in enumerate(value)]
        finally:
            active.discard(id(value))
    raise InvalidType(
        f"record is not JSON-serialisable: {where} is {value!r:.80} of type {type(value).__name__}; "
        "allowed: dict (str keys), list, tuple, str, int, float, bool, None"
    )


def _check_key(key: object, where: str) -> str:
    if not isinstance(key, str):
        raise InvalidType(f"record keys must be str; got key {key!r} ({type(key).__name__}) in {where}")
    return key


def _read_record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Returns ``(record, None)`` or ``(None, why it is not a record)``."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{type(error).__name__}: {error}"
    if not isinstance(record, dict):
        return None, f"not a JSON object (got {type(record).__name__})"
    if not isinstance(record.get("id"), str) or record.get("kind") not in [k.value for k in RecordKind]:
        return None, f"not a result record (id={record.get('id')!r}, kind={record.get('kind')!r})"
    return record, None


def _umask() -> int:
    try:  # Linux reports it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it, briefly
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Makes the rename durable. Best effort: Windows and some filesystems cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
