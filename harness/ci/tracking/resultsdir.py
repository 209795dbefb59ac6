"""An asv results folder read through asv's API: what ``history`` builds on.

The folder is ``.asv/results`` or a checkout of the ``asv-results`` branch the
nightly ``publish.yml`` keeps: ``<machine>/<hash8>-<env>.json``,
``<machine>/machine.json``, top-level ``benchmarks.json``. Values are read as
``asv publish`` reads them: a result whose benchmark version differs from
``benchmarks.json``'s is left out, and each value carries asv's weight (2 / width
of its 99% confidence interval, ``harness.ci.asvstats.weight``).
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.ci.asvresults import Key, combos, is_skipped
from harness.ci.benchgate import higher_is_better
from harness.errors import InvalidValue

__all__ = ["Point", "machines", "pick_machine", "load_benchmarks", "read_points", "combine", "is_usable"]

Point = tuple[float | None, float | None]  # (value, weight) of one environment on one commit


def machines(results_dir: Path | str) -> list[str]:
    """The machines with results in ``results_dir`` (folders holding a ``machine.json``), sorted."""
    return sorted(p.parent.name for p in Path(results_dir).glob("*/machine.json"))


def pick_machine(root: Path, machine: str | None) -> str:
    """``machine`` if ``root`` has it, else the only machine there.

    Raises:
        ValueError: ``machine`` is not there; no machine; several and none chosen (the message lists them).
    """
    found = machines(root)
    if machine is not None:
        if machine not in found:
            raise InvalidValue(f"no machine {machine!r} in {str(root)!r}; machines there: {', '.join(found) or 'none'}")
        return machine
    if not found:
        raise InvalidValue(f"no asv results in {str(root)!r}: no machine folder (<machine>/machine.json)")
    if len(found) > 1:
        raise InvalidValue(f"{len(found)} machines in {str(root)!r}: {', '.join(found)}; choose one with --machine")
    return found[0]


def load_benchmarks(root: Path) -> dict:
    """``benchmarks.json`` of a results folder: benchmark name -> asv's description (params, unit, version)."""
    from asv.util import load_json

    path = root / "benchmarks.json"
    if not path.is_file():
        raise InvalidValue(f"no benchmarks.json in {str(root)!r} (asv run writes it beside the machine folders)")
    return load_json(str(path), api_version=2)


def read_points(root: Path, machine: str, benchmarks: dict) -> tuple[dict[Key, tuple[str, dict[str, list[Point]]]],
                                                                     dict[str, int]]:
    """Every result of ``machine``: ``{key: (unit, {commit: [(value, weight) per environment]})}``, and
    ``{commit: date}`` (asv's commit date, milliseconds since the epoch)."""
    from asv.results import iter_results_for_machine

    points: dict[Key, tuple[str, dict[str, list[Point]]]] = {}
    dates: dict[str, int] = {}
    for result in iter_results_for_machine(str(root), machine):
        commit = result.commit_hash
        dates[commit] = result.date
        for name in sorted(result.get_result_keys(benchmarks)):  # current benchmark versions only, as asv
            bench = benchmarks[name]
            params = bench.get("params") or []
            unit = bench.get("unit", "")
            invert = higher_is_better(name, unit)
            values = result.get_result_value(name, params)
            stats = result.get_result_stats(name, params)
            for combo, value, stat in zip(combos(params), values, stats):
                by_commit = points.setdefault((name, combo), (unit, {}))[1]
                by_commit.setdefault(commit, []).append((value, _weight(stat, invert)))
    return points, dates


def _weight(stats: dict | None, invert: bool) -> float | None:
    """asv's weight (2 / width of the 99% confidence interval), of the inverted value where ``invert``."""
    from harness.ci.asvstats import weight as get_weight

    if stats and invert:
        a, b = stats.get("ci_99_a"), stats.get("ci_99_b")
        if a is None or b is None or not (a > 0 and b > 0):
            return None
        stats = {"ci_99_a": 1 / b, "ci_99_b": 1 / a}
    return get_weight(stats)


def combine(points: list[Point]) -> Point:
    """One commit's environments averaged, as asv's graphs do; a failure (None) only where none ran."""
    values = [v for v, _ in points if is_usable(v)]
    weights = [w for _, w in points if w is not None]
    if not values:
        return (None if any(v is None for v, _ in points) else math.nan), None
    return sum(values) / len(values), (sum(weights) / len(weights) if weights else None)  # type: ignore[arg-type]


def is_usable(value) -> bool:
    """A measured value: neither failed (None) nor skipped (NaN)."""
    return value is not None and not is_skipped(value)
