"""The performance-regression gate: asv results of a base and a head commit -> verdict and summary.

asv's own verdicts have traps (docs/design.md, "asv 0.6.6"): ``asv compare`` always exits 0,
``asv continuous`` cannot run in a prebuilt image, and asv treats a larger value
as worse for every benchmark - a drop in samples/s would count as an
improvement. The gate reads the saved results itself and applies one rule:

- a benchmark is **worse** when head is worse than base by more than ``factor``
  (head/base > factor, or base/head for higher-is-better benchmarks) *and* the
  two are statistically different (asv's test: Mann-Whitney U on the recorded
  samples, else its confidence-interval check);
- a benchmark that ran on base and fails on head is an **error**.

Exit status: 0 clean, 1 some benchmark worse, 2 some benchmark errored (errors
win). ``markdown`` renders a summary fit for a pull-request comment.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

__all__ = ["Verdict", "Row", "higher_is_better", "judge", "exit_status", "markdown", "load_rows"]

_HIGHER = re.compile(r"(samples_per_second|efficiency|throughput)$")


class Verdict(str, Enum):
    WORSE = "worse"
    BETTER = "better"
    SAME = "same"
    ERROR = "error"  # ran on base, failed on head
    FIXED = "fixed"  # failed on base, runs on head
    SKIPPED = "skipped"  # not run on one side (skipped combination, new or removed benchmark)


@dataclass(frozen=True)
class Row:
    """One benchmark (one parameter combination) on both commits."""

    name: str
    params: str
    unit: str
    base: float | None
    head: float | None
    verdict: Verdict
    ratio: float | None  # how much worse head is: > 1 worse, whatever the direction

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params, "unit": self.unit, "base": self.base, "head": self.head,
                "verdict": self.verdict.value, "ratio": self.ratio}


def higher_is_better(name: str, unit: str) -> bool:
    """Throughput-like benchmarks (``samples/s``, ``track_*efficiency``) improve upwards."""
    return unit.strip().endswith("/s") or bool(_HIGHER.search(name.split(".")[-1]))


def judge(name: str, unit: str, base, head, base_stats=None, head_stats=None, factor: float = 1.1,
          different=None) -> tuple[Verdict, float | None]:
    """The verdict for one benchmark and how much worse head is (``> 1``: worse).

    Args:
        base, head: the values (None: failed; NaN: skipped).
        base_stats, head_stats: ``(stats dict, samples list)`` as asv records them, or None.
        factor: the tolerated ratio, > 1.
        different: ``(samples_a, samples_b, stats_a, stats_b) -> bool``; defaults to asv's test.
    """
    if factor <= 1:
        raise ValueError(f"factor must be > 1; got factor={factor!r}")
    if _skipped(base) or _skipped(head):
        return Verdict.SKIPPED, None
    if base is None:
        return (Verdict.SAME, None) if head is None else (Verdict.FIXED, None)
    if head is None:
        return Verdict.ERROR, None
    up = higher_is_better(name, unit)
    worse_ratio = _ratio(base, head) if up else _ratio(head, base)
    if worse_ratio is None:
        return Verdict.SAME, None
    if worse_ratio <= factor and 1 / worse_ratio <= factor:
        return Verdict.SAME, worse_ratio
    if not _significant(base_stats, head_stats, different):
        return Verdict.SAME, worse_ratio
    return (Verdict.WORSE if worse_ratio > factor else Verdict.BETTER), worse_ratio


def _skipped(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _ratio(numerator: float, denominator: float) -> float | None:
    if denominator == 0:
        return None if numerator == 0 else math.inf
    return numerator / denominator


def _significant(base_stats, head_stats, different) -> bool:
    if not base_stats or not head_stats or not base_stats[0] or not head_stats[0]:
        return True  # no statistics (e.g. a single run): the factor alone decides, as asv does
    if base_stats[0].get("repeat", 0) == 1 or head_stats[0].get("repeat", 0) == 1:
        return True
    if different is None:
        from asv import _stats  # asv 0.6.6: the test `asv compare` uses

        different = _stats.is_different
    return bool(different(base_stats[1], head_stats[1], base_stats[0], head_stats[0]))


def exit_status(rows: list[Row]) -> int:
    """2 if a benchmark errored on head, else 1 if one got worse, else 0."""
    if any(r.verdict is Verdict.ERROR for r in rows):
        return 2
    return 1 if any(r.verdict is Verdict.WORSE for r in rows) else 0


def markdown(rows: list[Row], base: str, head: str, factor: float) -> str:
    """A pull-request comment: verdict line, then the table (worse and errors first)."""
    status = exit_status(rows)
    counts = {v: sum(r.verdict is v for r in rows) for v in Verdict}
    head_line = {0: ":white_check_mark: No benchmark got worse", 1: ":x: Performance regression",
                 2: ":boom: Benchmark errors"}[status]
    lines = [f"### {head_line}: `{head[:12]}` vs `{base[:12]}` (factor {factor:g})", "",
             ", ".join(f"{counts[v]} {v.value}" for v in Verdict if counts[v]) or "no benchmarks compared", ""]
    order = [Verdict.ERROR, Verdict.WORSE, Verdict.BETTER, Verdict.FIXED, Verdict.SAME, Verdict.SKIPPED]
    lines += ["| | benchmark | before | after | worse by | unit |", "|---|---|---|---|---|---|"]
    marks = {Verdict.ERROR: "!", Verdict.WORSE: "+", Verdict.BETTER: "-", Verdict.FIXED: "*"}
    for row in sorted(rows, key=lambda r: (order.index(r.verdict), r.name, r.params)):
        name = row.name + (f" ({row.params})" if row.params else "")
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        lines.append(f"| {marks.get(row.verdict, '')} | `{name}` | {_value(row.base)} | {_value(row.head)} | "
                     f"{ratio} | {row.unit} |")
    lines += ["", "`+` worse beyond the factor and statistically different, `-` better, `!` failed on head, "
              "`*` fixed; samples/s and efficiency count higher as better."]
    return "\n".join(lines)


def _value(value) -> str:
    if value is None:
        return "failed"
    if _skipped(value):
        return "n/a"
    return f"{value:.4g}"


def load_rows(config_path: Path | str, machine: str, base_hash: str, head_hash: str, factor: float) -> list[Row]:
    """Reads both commits' saved asv results (any environment) and judges every benchmark.

    Raises:
        ValueError: no results for a commit on ``machine``.
    """
    from asv.benchmarks import Benchmarks
    from asv.config import Config
    from asv.results import iter_results_for_machine_and_hash

    conf = Config.load(str(config_path))
    root = Path(config_path).resolve().parent
    for attr in ("results_dir", "benchmark_dir"):  # relative to the config file, as asv's commands read them
        setattr(conf, attr, str(root / getattr(conf, attr)))
    benchmarks = Benchmarks.load(conf)
    sides = []
    for commit in (base_hash, head_hash):
        found = list(iter_results_for_machine_and_hash(conf.results_dir, machine, commit))
        if not found:
            raise ValueError(f"no asv results for commit {commit[:12]} on machine {machine!r} in {conf.results_dir}")
        sides.append(found)
    rows = []
    for name, bench in sorted(benchmarks.items()):
        combos = list(itertools.product(*bench["params"])) if bench["params"] else [()]
        base = _values(sides[0], name, bench, benchmarks)
        head = _values(sides[1], name, bench, benchmarks)
        if base is None and head is None:
            continue
        for i, combo in enumerate(combos):
            b = base[i] if base else (math.nan, None)
            h = head[i] if head else (math.nan, None)
            verdict, ratio = judge(name, bench.get("unit", ""), b[0], h[0], b[1], h[1], factor)
            rows.append(Row(name, ", ".join(str(p) for p in combo), bench.get("unit", ""), b[0], h[0], verdict,
                            ratio))
    return rows


def _values(results, name, bench, benchmarks):
    """``[(value, (stats, samples))]`` per parameter combination from the first result that has ``name``."""
    for result in results:
        if name not in result.get_result_keys(benchmarks):
            continue
        params = bench["params"]
        values = result.get_result_value(name, params)
        stats = result.get_result_stats(name, params)
        samples = result.get_result_samples(name, params)
        if not isinstance(values, list):  # asv returns lists, also for a benchmark without parameters
            values, stats, samples = [values], [stats], [samples]
        return [(v, (s, smp)) for v, s, smp in zip(values, stats, samples)]
    return None
