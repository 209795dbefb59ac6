"""The performance-regression gate: asv results of a base and a head commit -> verdict and summary.

asv's own verdicts have traps (docs/design.md, "asv 0.6.6"): ``asv compare`` always exits 0,
``asv continuous`` cannot run in a prebuilt image, and asv treats a larger value
as worse for every benchmark - a drop in samples/s would count as an
improvement. The gate reads the saved results itself and applies one rule:

- a benchmark is **worse** when head is worse than base by more than its
  threshold (head/base, or base/head for higher-is-better benchmarks) *and* the
  two are statistically different (asv's test: Mann-Whitney U on the recorded
  samples, else its confidence-interval check);
- the threshold is the larger of ``factor`` and ``1 + k * noise``, the noise
  measured per benchmark: from main's history where given, else from the
  gate's own interleaved rounds (base, head, base, head: each commit measured
  twice in one job, an A/A pair per side). ``threshold - 1`` is the smallest
  change the gate can detect for that benchmark;
- a benchmark with a single value on a side (``asv run --quick``, one round) is
  **unjudged**: one sample has no spread to compare against;
- a benchmark that ran on base and fails on head is an **error**.

Exit status (``harness.errors``' convention): 0 clean, 1 some benchmark worse, 3 no verdict: some benchmark
errored on head (errors win: a crash is never read as a pass, nor as a slow-down), or nothing was judged (no
benchmark compared, or every one skipped or with a single value). ``markdown`` renders a summary fit for a
pull-request comment, its first line naming the cause.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from harness.ci.asvresults import Key, Measurement, is_skipped
from harness.ci.noise import relative_noise
from harness.errors import EXIT_NO_VERDICT, EXIT_OK, EXIT_VERDICT, InvalidValue

__all__ = ["Verdict", "Row", "Rounds", "Noise", "higher_is_better", "judge", "judge_rounds", "is_borderline",
           "after_rerun", "judge_all", "worse_ratio", "threshold", "exit_status", "markdown", "NOISE_K", "FACTOR"]

# ``track_final_accuracy`` and ``track_ratio_to_stock`` (harness over stock samples/s) improve upwards,
# ``track_steps_to_accuracy`` (a count until reached) downwards.
_HIGHER = re.compile(r"(samples_per_second|efficiency|throughput|ratio_to_stock|(?<!_to)_accuracy)$")
NOISE_K = 3.0  # threshold = max(factor, 1 + NOISE_K * noise): ~3 sigma of round-to-round noise
# The floor under it: a 3% change is the least the gate calls worse, however quiet the rounds looked (2+2 rounds
# may show less spread than the runner has). Held to at most 1% false alarms per judgment by an A/A series
# (``harness bench-compare C C --aa-series N``, harness.ci.aaseries; docs/regressions.md has the figures).
FACTOR = 1.03


class Verdict(str, Enum):
    WORSE = "worse"
    BETTER = "better"
    SAME = "same"
    ERROR = "error"  # ran on base, failed on head
    FIXED = "fixed"  # failed on base, runs on head
    SKIPPED = "skipped"  # not run on one side (skipped combination, new or removed benchmark)
    UNJUDGED = "unjudged"  # a single value on a side: no spread to judge against


@dataclass(frozen=True)
class Noise:
    """A benchmark's relative noise (0.05: about 5% run to run) and where it was measured."""

    value: float
    source: str  # "history (n=23)", "A/A (2+2 rounds)"


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
    threshold: float | None = None  # the ratio beyond which head counts as worse
    noise: Noise | None = None
    rounds: tuple[int, int] = (1, 1)  # values per side
    note: str = ""

    @property
    def detectable(self) -> float | None:
        """The smallest relative change this benchmark's verdict could detect (0.1: 10%)."""
        return None if self.threshold is None else self.threshold - 1

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params, "unit": self.unit, "base": self.base, "head": self.head,
                "verdict": self.verdict.value, "ratio": self.ratio, "threshold": self.threshold,
                "detectable": self.detectable, "noise": None if self.noise is None else self.noise.value,
                "noise_source": None if self.noise is None else self.noise.source, "rounds": list(self.rounds),
                "note": self.note}


@dataclass
class Rounds:
    """The measurements of every round, per benchmark combination and side (``"base"``, ``"head"``)."""

    base: dict[Key, list[Measurement]] = field(default_factory=dict)
    head: dict[Key, list[Measurement]] = field(default_factory=dict)

    def add(self, side: str, measured: Mapping[Key, Measurement], only: set[Key] | None = None) -> None:
        if side not in ("base", "head"):
            raise InvalidValue(f"side must be 'base' or 'head'; got {side!r}")
        target = getattr(self, side)
        for key, measurement in measured.items():
            if only is None or key in only:
                target.setdefault(key, []).append(measurement)

    def keys(self) -> list[Key]:
        return sorted(set(self.base) | set(self.head))

    def to_json(self) -> dict:
        return {side: {f"{name} ({params})" if params else name: [m.value for m in ms]
                       for (name, params), ms in sorted(getattr(self, side).items())} for side in ("base", "head")}


def higher_is_better(name: str, unit: str) -> bool:
    """Throughput-like benchmarks (``samples/s``, ``track_*efficiency``, ``track_*_accuracy``) improve upwards."""
    return unit.strip().endswith("/s") or bool(_HIGHER.search(name.split(".")[-1]))


def judge(name: str, unit: str, base, head, base_stats=None, head_stats=None, factor: float = 1.1,
          different=None) -> tuple[Verdict, float | None]:
    """The verdict for one value per side and how much worse head is (``> 1``: worse), with ``factor`` alone.

    Args:
        base, head: the values (None: failed; NaN: skipped).
        base_stats, head_stats: ``(stats dict, samples list)`` as asv records them, or None.
        factor: the tolerated ratio, > 1.
        different: ``(samples_a, samples_b, stats_a, stats_b) -> bool``; defaults to asv's test.
    """
    _check_factor(factor)
    status = _status(base, head)
    if status is not None:
        return status, None
    return _compare(higher_is_better(name, unit), base, head, factor,
                    lambda: _significant(base_stats, head_stats, different))


def judge_rounds(base: Sequence[Measurement], head: Sequence[Measurement], factor: float = FACTOR, k: float = NOISE_K,
                 noise: Noise | None = None, different=None) -> Row:
    """The verdict on several rounds per side: medians compared against a noise-calibrated threshold.

    Args:
        base, head: one measurement per round of the same benchmark combination (a round's value is asv's
            for that run: the median of its samples for ``time_`` benchmarks).
        factor: the smallest tolerated ratio, > 1.
        k: the threshold is ``max(factor, 1 + k * noise)``.
        noise: the benchmark's noise from elsewhere (main's history); None measures it from the rounds
            (each side's values relative to their median: the spread of an A/A pair).
        different: as in :func:`judge`; it gets the samples of all rounds pooled.
    """
    _check_factor(factor)
    if not k >= 0:
        raise InvalidValue(f"k must be >= 0; got k={k!r}")
    first = (base or head)[0]
    counts = (len(base), len(head))
    row = Row(first.name, first.params, first.unit, None, None, Verdict.SAME, None, rounds=counts)
    base_value, head_value = _side_value(base), _side_value(head)
    row = replace(row, base=base_value, head=head_value)
    status = _status(base_value, head_value)
    if status is not None or base_value is None or head_value is None:
        return replace(row, verdict=status or Verdict.SAME)
    if min(counts) < 2:
        return replace(row, verdict=Verdict.UNJUDGED,
                        note=f"{min(counts)} value on a side (asv --quick or one round): no spread to judge against")
    if noise is None:  # each side relative to its own median: the two sides' A/A spreads pooled
        spread = relative_noise([v / base_value for v in _values(base)] + [v / head_value for v in _values(head)]
                                if base_value and head_value else [])
        noise = Noise(spread or 0.0, f"A/A ({counts[0]}+{counts[1]} rounds)")
    limit = threshold(factor, noise.value, k)
    verdict, ratio = _compare(higher_is_better(first.name, first.unit), base_value, head_value, limit,
                              lambda: _significant(_pooled(base), _pooled(head), different))
    return replace(row, verdict=verdict, ratio=ratio, threshold=limit, noise=noise)


def is_borderline(row: Row) -> bool:
    """A worse verdict less than twice its detectable change: worth one more round before failing."""
    return (row.verdict is Verdict.WORSE and row.ratio is not None and row.threshold is not None
            and row.ratio < 1 + 2 * (row.threshold - 1))


def after_rerun(before: Row, base: Measurement, head: Measurement) -> Row:
    """A worse verdict checked by one more round (``base``, ``head``): it stands only if that round alone is worse
    beyond the same threshold, else the benchmark counts as the same. The note says which."""
    if before.verdict is not Verdict.WORSE or before.threshold is None:
        return before
    counts = (before.rounds[0] + 1, before.rounds[1] + 1)
    status = _status(base.value, head.value)
    if status is Verdict.ERROR:
        return replace(before, verdict=status, rounds=counts, note="failed in a rerun")
    ratio = None
    if status is None and base.value is not None and head.value is not None:
        ratio = worse_ratio(base.value, head.value, higher_is_better(before.name, before.unit))
    if ratio is not None and ratio > before.threshold:
        return replace(before, rounds=counts, note=f"confirmed by a rerun ({ratio:.2f}x)")
    again = "n/a" if ratio is None else f"{ratio:.2f}x"
    return replace(before, verdict=Verdict.SAME, rounds=counts,
                   note=f"{before.ratio:.2f}x at first, {again} in a rerun: not confirmed")


def _check_factor(factor: float) -> None:
    if not factor > 1:
        raise InvalidValue(f"factor must be > 1; got factor={factor!r}")


def _side_value(measurements: Sequence[Measurement]) -> float | None:
    """The median of a side's rounds; None when any round failed; NaN when skipped (or absent)."""
    if not measurements or any(is_skipped(m.value) for m in measurements):
        return math.nan
    if any(m.value is None for m in measurements):
        return None
    return statistics.median(_values(measurements))


def _values(measurements: Sequence[Measurement]) -> list[float]:
    return [m.value for m in measurements if m.value is not None]


def _pooled(measurements: Sequence[Measurement]):
    """``(stats of the first round, samples of all rounds)`` for asv's test, or None without samples."""
    if any(m.samples is None for m in measurements):
        return None
    return measurements[0].stats, [s for m in measurements for s in m.samples]  # type: ignore[union-attr]


def _status(base, head) -> Verdict | None:
    """The verdict where a side failed or was skipped; None when both have values."""
    if is_skipped(base) or is_skipped(head):
        return Verdict.SKIPPED
    if base is None:
        return Verdict.SAME if head is None else Verdict.FIXED
    return Verdict.ERROR if head is None else None


def _compare(up: bool, base: float, head: float, limit: float, significant) -> tuple[Verdict, float | None]:
    ratio = worse_ratio(base, head, up)
    if 1 / limit <= ratio <= limit:
        return Verdict.SAME, ratio
    if not significant():
        return Verdict.SAME, ratio
    return (Verdict.WORSE if ratio > limit else Verdict.BETTER), ratio


def worse_ratio(base: float, head: float, higher_is_better: bool) -> float:
    """How much worse ``head`` is than ``base``, whatever the direction: > 1 worse, 1.0 for 0 and 0, inf past 0.

    Example:
        >>> worse_ratio(2000.0, 1500.0, higher_is_better=True)
        1.3333333333333333
    """
    numerator, denominator = (base, head) if higher_is_better else (head, base)
    if denominator == 0:
        return 1.0 if numerator == 0 else math.inf
    return numerator / denominator


def threshold(factor: float, noise: float | None, k: float = NOISE_K) -> float:
    """The ratio beyond which a change counts: ``max(factor, 1 + k * noise)`` (``factor`` without a noise)."""
    return factor if noise is None else max(factor, 1 + k * noise)


def _significant(base_stats, head_stats, different) -> bool:
    if not base_stats or not head_stats or not base_stats[0] or not head_stats[0]:
        return True  # no statistics (e.g. a track benchmark): the threshold alone decides, as asv does
    if base_stats[0].get("repeat", 0) == 1 or head_stats[0].get("repeat", 0) == 1:
        return True
    if different is None:
        from harness.ci.asvstats import is_different as different  # the test `asv compare` uses
    return bool(different(base_stats[1], head_stats[1], base_stats[0], head_stats[0]))


def judge_all(rounds: Rounds, factor: float = FACTOR, k: float = NOISE_K,
              noise: Mapping[Key, Noise] | None = None, different=None) -> list[Row]:
    """:func:`judge_rounds` for every benchmark combination measured on either side."""
    noise = noise or {}
    return [judge_rounds(rounds.base.get(key, []), rounds.head.get(key, []), factor, k, noise.get(key), different)
            for key in rounds.keys()]


def exit_status(rows: list[Row]) -> int:
    """``EXIT_NO_VERDICT`` (3) if a benchmark errored on head or none was judged, else ``EXIT_VERDICT`` (1) if one
    got worse, else 0."""
    return EXIT_NO_VERDICT if _no_verdict(rows) else EXIT_VERDICT if any(r.verdict is Verdict.WORSE for r in rows) \
        else EXIT_OK


def _no_verdict(rows: list[Row]) -> str | None:
    """Why ``rows`` give no verdict (one line), or None where they give one."""
    errors = [r for r in rows if r.verdict is Verdict.ERROR]
    if errors:
        return f"{len(errors)} benchmark{'s' * (len(errors) > 1)} failed on head"
    if not any(r.verdict in (Verdict.WORSE, Verdict.BETTER, Verdict.SAME, Verdict.FIXED) for r in rows):
        return "no benchmark was compared" if not rows else "no benchmark judged (skipped, or one value a side)"
    return None


def markdown(rows: list[Row], base: str, head: str, factor: float) -> str:
    """A pull-request comment: verdict line, then the table (worse and errors first)."""
    status, why = exit_status(rows), _no_verdict(rows)
    counts = {v: sum(r.verdict is v for r in rows) for v in Verdict}
    head_line = {EXIT_OK: ":white_check_mark: No benchmark got worse", EXIT_VERDICT: ":x: Performance regression",
                 EXIT_NO_VERDICT: f":grey_question: No verdict, an infrastructure error: {why}"}[status]
    lines = [f"### {head_line}: `{head[:12]}` vs `{base[:12]}` (factor {factor:g})", "",
             ", ".join(f"{counts[v]} {v.value}" for v in Verdict if counts[v]) or "no benchmarks compared", ""]
    order = [Verdict.ERROR, Verdict.WORSE, Verdict.BETTER, Verdict.FIXED, Verdict.UNJUDGED, Verdict.SAME,
             Verdict.SKIPPED]
    lines += ["| | benchmark | before | after | worse by | noise | detects | unit | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    marks = {Verdict.ERROR: "!", Verdict.WORSE: "+", Verdict.BETTER: "-", Verdict.FIXED: "*", Verdict.UNJUDGED: "?"}
    for row in sorted(rows, key=lambda r: (order.index(r.verdict), r.name, r.params)):
        name = row.name + (f" ({row.params})" if row.params else "")
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        noise = "" if row.noise is None else f"{100 * row.noise.value:.1f}% {row.noise.source}"
        detects = "" if row.detectable is None else f"{100 * row.detectable:.0f}%"
        lines.append(f"| {marks.get(row.verdict, '')} | `{name}` | {_value(row.base)} | {_value(row.head)} | "
                     f"{ratio} | {noise} | {detects} | {row.unit} | {row.note} |")
    lines += ["", "`+` worse beyond its threshold and statistically different, `-` better, `!` failed on head, "
              "`*` fixed, `?` unjudged (a single value: no spread); samples/s, efficiency and final accuracy "
              "count higher as better. *noise*: the benchmark's relative spread (main's history, else the "
              "interleaved A/A rounds); *detects*: the smallest change its threshold, "
              f"max({factor:g}, 1 + {NOISE_K:g} x noise), lets through."]
    return "\n".join(lines)


def _value(value) -> str:
    if value is None:
        return "failed"
    if is_skipped(value):
        return "n/a"
    return f"{value:.4g}"
