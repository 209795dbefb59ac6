"""One commit's saved asv results, read through asv's own API, one record per benchmark and parameter combination.

A parameter combination is named as the gate, ``harness regressions`` and
``harness bisect`` print it: ``", ".join(str(p) for p in combo)`` over
``itertools.product(*params)`` (``""`` for a benchmark without parameters).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.errors import InvalidValue

__all__ = ["Measurement", "Key", "load_config", "read_commit", "combos", "is_skipped"]

Key = tuple[str, str]  # (benchmark name, parameter combination)


@dataclass(frozen=True)
class Measurement:
    """One benchmark combination on one commit: its value, and its samples where asv recorded them.

    ``value`` is None when the benchmark failed and NaN when it was skipped.
    """

    name: str
    params: str
    unit: str
    value: float | None
    samples: tuple[float, ...] | None = None
    stats: dict | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None and not is_skipped(self.value)


def is_skipped(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def combos(params) -> list[str]:
    """The names of a benchmark's parameter combinations, in asv's order."""
    return [", ".join(str(p) for p in combo) for combo in itertools.product(*params)] if params else [""]


def load_config(config_path: Path | str):
    """``(asv Config, Benchmarks)`` of a config file; its folders taken relative to the file, as asv's commands do."""
    from asv.benchmarks import Benchmarks
    from asv.config import Config

    conf = Config.load(str(config_path))
    root = Path(config_path).resolve().parent
    for attr in ("results_dir", "benchmark_dir"):
        setattr(conf, attr, str(root / getattr(conf, attr)))
    return conf, Benchmarks.load(conf)


def read_commit(config_path: Path | str, machine: str, commit: str,
                since: float | None = None) -> dict[Key, Measurement]:
    """Every benchmark combination asv saved for ``commit`` on ``machine``; with ``since`` (seconds since the epoch,
    ``time.time()`` before the run), only those asv started at or after it: asv keeps a commit's earlier results of
    benchmarks a later ``--bench`` run did not select, and a verdict on them would judge what was not measured now.

    Several environments may hold results for one commit (an existing-mode and a virtualenv run): per
    benchmark, the one asv ran last wins.

    Raises:
        ValueError: no results for ``commit`` on ``machine``.
    """
    from asv.results import iter_results_for_machine_and_hash

    conf, benchmarks = load_config(config_path)
    found = list(iter_results_for_machine_and_hash(conf.results_dir, machine, commit))
    if not found:
        raise InvalidValue(f"no asv results for commit {commit[:12]} on machine {machine!r} in {conf.results_dir}")
    return {(m.name, m.params): m for m in _measurements(found, benchmarks, since)}


def _measurements(results, benchmarks, since: float | None = None) -> Iterator[Measurement]:
    for name, bench in sorted(benchmarks.items()):
        having = [r for r in results if name in r.get_result_keys(benchmarks)
                  and (since is None or (r.started_at.get(name) or 0) >= 1000 * since - 1)]  # asv: milliseconds
        for result in sorted(having, key=lambda r: r.started_at.get(name) or 0, reverse=True)[:1]:
            params = bench["params"]
            values = result.get_result_value(name, params)
            stats = result.get_result_stats(name, params)
            samples = result.get_result_samples(name, params)
            if not isinstance(values, list):  # asv returns lists, also for a benchmark without parameters
                values, stats, samples = [values], [stats], [samples]
            for combo, value, stat, sample in zip(combos(params), values, stats, samples):
                yield Measurement(name, combo, bench.get("unit", ""), value,
                                  tuple(sample) if sample is not None else None, stat)
