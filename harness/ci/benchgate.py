"""The performance-regression gate: base and head measured in pairs -> verdict and summary.

asv's own verdicts have traps (docs/design.md, "asv 0.6.6"): ``asv compare`` always exits 0,
``asv continuous`` cannot run in a prebuilt image, and asv treats a larger value
as worse for every benchmark - a drop in samples/s would count as an
improvement. The gate reads the measurements itself and applies one rule.

Measurements come in **pairs**, base and head measured next to each other (the order alternating pair by pair, so a
host that drifts one way favours neither side): interleaved asv rounds (one pair a round), or, for ``time_``
benchmarks, single samples taken alternately from two processes that hold the two commits
(``harness.ci.interleave``: tens of milliseconds apart, where this host's speed moves by a third within seconds).
Each pair gives a log ratio, head against base, turned so that > 0 is worse (samples/s counted higher-is-better).
Interleaved pairs come from several *process pairs* (``per_process`` pairs each): one process runs the same code up
to 15% faster than another for its whole life, so the pairs of one process pair share an offset that more of its
pairs cannot average away. There the unit judged is a process pair: the mean of its base-first and head-first
pairs' median log ratios (:func:`judged_values`). :func:`paired` estimates the change from the values judged with
a one-sided bound at ``1 - ALPHA`` on each side: the mean with Student's t for a few values, the median with
order-statistic bounds (no assumption on the noise's shape) for ``MEDIAN_PAIRS`` values or more.

- a benchmark is **worse** when the estimate is worse than ``factor`` *and* its lower bound is above no change
  (``ALPHA`` = 1%: at most 1% false alarms per judgment where the pairs are independent);
- ``threshold`` is the ratio beyond which it is worse, ``max(factor, the bound's margin)``; *detects*
  (:attr:`Row.detectable`) is the change caught with probability ``POWER`` at this spread: the threshold plus
  1.645 standard errors. A verdict that could not resolve a change says so in that column, it is never claimed;
- a judgment is **decided** when its bounds exclude ``factor`` (:func:`decided`): the gate measures undecided
  benchmarks again, pair by pair or round by round, until decided or its budget is spent;
- main's night-to-night noise (``--history``) is shown beside each row, never used to widen its threshold: pairs
  taken in one job do not see the drift between jobs that it measures;
- a benchmark with a single value on a side (``asv run --quick``, one round) is **unjudged**;
- a benchmark that ran on base and fails on head is an **error**;
- a judgment still undecided when the measuring stops (:func:`conclude`: its budget or ``--max-rounds`` spent
  while its bounds straddle the factor, so that it could not tell a ``factor`` slow-down from none) is
  **inconclusive**, never a pass; so is a benchmark that ran on base and is skipped on head (nothing measured).

Exit status (``harness.errors``' convention, :func:`exit_status`): 0 clean, 1 some benchmark worse, 3 no verdict:
some benchmark errored on head (errors win: a crash is never read as a pass, nor as a slow-down), or nothing was
judged (no benchmark compared, or every one skipped or with a single value), or (``inconclusive="fail"``, the
default) some benchmark inconclusive; :func:`outcome` names which. ``markdown`` renders a summary fit for a
pull-request comment, its first line naming the cause.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from harness.ci.asvresults import Key, Measurement, is_skipped
from harness.errors import EXIT_NO_VERDICT, EXIT_OK, EXIT_VERDICT, InvalidValue

__all__ = ["Verdict", "Row", "Rounds", "Noise", "Paired", "higher_is_better", "judge", "judge_rounds", "paired",
           "decided", "settled", "conclude", "Stopping", "log_ratios", "outcome", "INCONCLUSIVE_POLICIES",
           "judge_all", "judged_values", "worse_ratio", "threshold", "exit_status", "markdown",
           "check_per_process", "NOISE_K", "FACTOR", "ALPHA", "POWER", "MEDIAN_PAIRS", "SEES_BEYOND", "sees",
           "FAMILY_ALPHA", "judgment_alpha", "t_quantile"]

# ``track_final_accuracy`` and ``track_ratio_to_stock`` (harness over stock samples/s) improve upwards,
# ``track_steps_to_accuracy`` (a count until reached) downwards.
_HIGHER = re.compile(r"(samples_per_second|efficiency|throughput|ratio_to_stock|(?<!_to)_accuracy)$")
NOISE_K = 3.0  # harness bisect's one-run threshold, max(factor, 1 + NOISE_K * noise) (harness.ci.tracking.bisection)
# The least change the gate calls worse, however precise the pairs: a real 1% change measured to 0.1% is not a
# red light. Between it and a 5% change lies the room the gate's spread must fit in (docs/regressions.md).
FACTOR = 1.03
ALPHA = 0.01  # one-sided: a judgment of one commit against itself says worse at most this often
POWER = 0.95  # *detects*: the change caught this often at the measured spread
MEDIAN_PAIRS = 20  # from this many pairs on, the median and its order-statistic bounds; below, the mean and t
# Interleaved pairs that pass go on until they could see this much beyond the factor (at the default factor, 5%):
# a pass whose bounds already exclude the factor but whose *detects* says 5.9% would read as a gate that cannot see
# 5% (tests/ci/test_gate.py's busy loop, beside other work: 1 such pass in 9 at c4bf300).
SEES_BEYOND = 0.02
_Z_POWER = statistics.NormalDist().inv_cdf(POWER)
# The false alarms a pull request may raise, over all its judgments at once: each judgment's bounds are taken at
# ``judgment_alpha(m)`` = min(ALPHA, FAMILY_ALPHA / m) for m judged combinations (Bonferroni: the chance that any
# of them says worse of one commit against itself is at most the sum of theirs). Up to 5 combinations nothing
# changes; a grid of 40 judges each at 0.125%.
FAMILY_ALPHA = 0.05


def judgment_alpha(judged: int, family: float = FAMILY_ALPHA) -> float:
    """Each judgment's one-sided level where ``judged`` combinations are judged at once: ``min(ALPHA, family /
    judged)``, so that a pull request says worse of an unchanged commit at most ``family`` of the time.

    Raises:
        InvalidValue: ``family`` not in (0, 1), or ``judged`` negative.
    """
    if not 0 < family < 1:
        raise InvalidValue(f"the family's false-alarm rate must be in (0, 1); got {family!r}")
    if judged < 0:
        raise InvalidValue(f"judged must be 0 or more; got {judged}")
    return min(ALPHA, family / max(1, judged))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (its continued fraction, modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at ``p`` (> 0.5) with ``df`` degrees of freedom (tests/unit/test_benchgate.py checks it
    against scipy's)."""
    tail = 1.0 - p

    def upper(t: float) -> float:  # P(T > t), t >= 0
        return 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))

    low, high = 0.0, 1.0
    while upper(high) > tail:
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        if upper(mid) > tail:
            low = mid
        else:
            high = mid
    return (low + high) / 2


class Verdict(str, Enum):
    WORSE = "worse"
    BETTER = "better"
    SAME = "same"
    ERROR = "error"  # ran on base, failed on head
    FIXED = "fixed"  # failed on base, runs on head
    SKIPPED = "skipped"  # not run on one side (skipped combination, new or removed benchmark)
    UNJUDGED = "unjudged"  # a single value on a side: no spread to judge against
    INCONCLUSIVE = "inconclusive"  # measuring stopped before it could tell a factor slow-down from none


# What an inconclusive benchmark makes of the exit status: "fail" 3 (no verdict), "warn" none (said, exit 0 or 1).
INCONCLUSIVE_POLICIES = ("fail", "warn")


@dataclass(frozen=True)
class Noise:
    """A benchmark's relative noise (0.05: about 5%) and where it was measured."""

    value: float
    source: str  # "40 interleaved pairs", "4 rounds", "history (n=23)"


@dataclass(frozen=True)
class Paired:
    """What ``n`` pairs say about how much worse head is, on a log scale (> 0 worse).

    ``low`` and ``high`` are one-sided bounds, ``low`` at ``1 - alpha``, ``high`` at ``1 - ALPHA`` (:func:`paired`;
    -inf/inf where too few pairs give none); ``se`` the estimate's standard error; ``spread`` the spread of one pair's
    log ratio.
    """

    n: int
    estimate: float
    low: float
    high: float
    se: float
    spread: float
    method: str  # "mean" (t) or "median" (order statistics)
    alpha: float = ALPHA  # the bounds' one-sided level

    @property
    def margin(self) -> float:
        """How far below the estimate the lower bound lies (inf where there is none)."""
        return self.estimate - self.low

    def threshold(self, factor: float) -> float:
        """The ratio beyond which these pairs call head worse: ``max(factor, exp(margin))``."""
        return math.exp(max(math.log(factor), self.margin))

    def detectable(self, factor: float) -> float:
        """The change caught with probability ``POWER`` at this spread (0.05: 5%; inf where none is)."""
        if math.isinf(self.margin):
            return math.inf
        return math.exp(math.log(self.threshold(factor)) + _Z_POWER * self.se) - 1


def check_per_process(per_process: int) -> None:
    """Raises InvalidValue unless ``per_process`` is 0 (every pair its own) or at least 2 pairs a process pair."""
    if per_process < 0 or per_process == 1:
        raise InvalidValue(f"per_process must be 0 (pairs independent) or at least 2; got per_process={per_process}")


def judged_values(log_ratios: Sequence[float], per_process: int = 0) -> list[float]:
    """The values :func:`paired` judges: the pairs' log ratios themselves (``per_process`` 0: each pair independent,
    as asv rounds are), or one value a process pair, the ratios taken ``per_process`` at a time in order (the last
    group may be shorter): the mean of the median of its base-first pairs and that of its head-first ones (they
    alternate). A pair's second sample can run slower than its first (the other process just ran on that CPU); a
    median of both orders together would fall between the two clusters, the mean of the two orders' medians cancels
    the effect where it is the same for both sides (an AB/BA crossover). A group of one pair is its own value.

    Raises:
        InvalidValue: ``per_process`` is negative or 1.
    """
    check_per_process(per_process)
    if not per_process:
        return list(log_ratios)
    values = []
    for start in range(0, len(log_ratios), per_process):
        group = log_ratios[start:start + per_process]
        orders = [group[0::2], group[1::2]]  # one order and the other (which is which does not change the mean)
        values.append(statistics.fmean([statistics.median(o) for o in orders]) if all(orders)
                      else statistics.median(group))
    return values


def paired(log_ratios: Sequence[float], alpha: float = ALPHA) -> Paired:
    """The estimate and its bounds from pairs' log ratios (> 0: head worse).

    Fewer than ``MEDIAN_PAIRS``: the mean, Student's t (a round-to-round spread is near normal and rounds are few).
    From ``MEDIAN_PAIRS`` on: the median, bounded by order statistics (the sign test: valid for any shape of noise,
    and a pair that straddled a jump in the host's speed moves it by one rank, not by its size).

    The lower bound, which a *worse* verdict must clear, is one-sided at ``1 - alpha`` (:func:`judgment_alpha` where
    a pull request judges many combinations: it is what bounds the false alarms of them all); the upper one, which
    settles a pass and says *better*, at ``1 - ALPHA`` whatever ``alpha`` is: a change a pass could not rule out is
    that benchmark's power, not a false alarm of the pull request's, and needs no share of the family's.

    Raises:
        InvalidValue: fewer than 2 pairs, or a value that is not finite.
    """
    values = sorted(float(d) for d in log_ratios)
    n = len(values)
    if n < 2:
        raise InvalidValue(f"a paired estimate needs at least 2 pairs; got {n}")
    if not all(math.isfinite(d) for d in values):
        raise InvalidValue(f"pairs' log ratios must be finite; got {[d for d in values if not math.isfinite(d)]}")
    if n < MEDIAN_PAIRS:
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        se = sd / math.sqrt(n)
        low, high = mean - t_quantile(1 - alpha, n - 1) * se, mean + t_quantile(1 - ALPHA, n - 1) * se
        return Paired(n, mean, low, high, se, sd, "mean", alpha)
    median = statistics.median(values)
    k_low, k_high = _order_bound(n, alpha), _order_bound(n, ALPHA)  # P(median < values[k - 1]) <= alpha
    low = values[k_low - 1] if k_low else -math.inf
    high = values[n - k_high] if k_high else math.inf
    k95 = _order_bound(n, 0.025)
    se = (values[n - k95] - values[k95 - 1]) / (2 * 1.96) if k95 else math.inf
    return Paired(n, median, low, high, se, se * math.sqrt(n) / 1.2533, "median", alpha)  # se = 1.2533 sd/sqrt(n)


@functools.lru_cache(maxsize=4096)
def _order_bound(n: int, alpha: float) -> int:
    """The largest k with P(Binomial(n, 1/2) <= k - 1) <= alpha (0: none): the k-th smallest of n values is a lower
    bound of their median at 1 - alpha, the k-th largest an upper bound."""
    total, k = 0.0, 0
    while k < n:
        total += math.comb(n, k) / 2 ** n
        if total > alpha:
            return k
        k += 1
    return k


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
    noise: Noise | None = None  # one value's spread (a pair's, or a process pair's median), as measured
    rounds: tuple[int, int] = (1, 1)  # values per side
    note: str = ""
    detects: float | None = None  # the change caught with probability POWER (0.05: 5%)
    history: Noise | None = None  # main's night-to-night noise (--history): shown, never used to judge
    pairs: Paired | None = None
    seconds: float | None = None  # what measuring the pairs took, counted against their budget

    @property
    def detectable(self) -> float | None:
        """The smallest relative change this benchmark's verdict detects with probability ``POWER`` (0.1: 10%)."""
        return self.detects

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params, "unit": self.unit, "base": self.base, "head": self.head,
                "verdict": self.verdict.value, "ratio": self.ratio, "threshold": self.threshold,
                "detectable": None if self.detects is None or math.isinf(self.detects) else self.detects,
                "noise": None if self.noise is None else self.noise.value,
                "noise_source": None if self.noise is None else self.noise.source, "rounds": list(self.rounds),
                "history_noise": None if self.history is None else self.history.value,
                "pairs": None if self.pairs is None else self.pairs.n, "seconds": self.seconds, "note": self.note}


@dataclass
class Rounds:
    """The measurements of every round, per benchmark combination and side (``"base"``, ``"head"``): round i of
    base and round i of head are a pair."""

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


def judge_rounds(base: Sequence[Measurement], head: Sequence[Measurement], factor: float = FACTOR,
                 history: Noise | None = None, source: str = "rounds", per_process: int = 0,
                 alpha: float = ALPHA) -> Row:
    """The verdict on pairs: ``base[i]`` and ``head[i]`` measured next to each other (module docstring).

    Args:
        base, head: one measurement per pair (an asv round: asv's value for that run; an interleaved sample).
        factor: the smallest change called worse, > 1.
        history: main's night-to-night noise, shown in the row.
        source: what a pair is, for the row's noise cell ("rounds", "interleaved pairs").
        per_process: pairs taken from one process pair before the next (``interleave.Sampled.per_process``): each
            process pair's median is one value judged (:func:`judged_values`); 0: each pair is.
        alpha: the bounds' one-sided level (``ALPHA``; less where a pull request judges many combinations at once,
            :func:`judgment_alpha`).
    """
    _check_factor(factor)
    first = (base or head)[0]
    counts = (len(base), len(head))
    row = Row(first.name, first.params, first.unit, None, None, Verdict.SAME, None, rounds=counts, history=history)
    base_value, head_value = _side_value(base), _side_value(head)
    row = replace(row, base=base_value, head=head_value)
    status = _status(base_value, head_value)
    if status is Verdict.SKIPPED and head and not _missing(base_value):  # ran on base: head's setup skipped it
        return replace(row, verdict=Verdict.INCONCLUSIVE, note="skipped on head, ran on base: nothing measured")
    if status is not None or base_value is None or head_value is None:
        return replace(row, verdict=status or Verdict.SAME)
    if min(counts) < 2:
        return replace(row, verdict=Verdict.UNJUDGED,
                        note=f"{min(counts)} value on a side (asv --quick or one round): no spread to judge against")
    ratios = log_ratios(base, head)
    if ratios is None:  # a zero on a side: the medians decide, without bounds
        verdict, ratio = _compare(higher_is_better(first.name, first.unit), base_value, head_value, factor,
                                  lambda: True)
        return replace(row, verdict=verdict, ratio=ratio, threshold=factor, note="a zero value: no paired bounds")
    values = judged_values(ratios, per_process)
    if len(values) < 2:
        return replace(row, verdict=Verdict.UNJUDGED,
                       note="pairs from one process pair: no spread between processes to judge against")
    pairs = paired(values, alpha)
    limit = pairs.threshold(factor)
    ratio = math.exp(pairs.estimate)
    verdict = Verdict.SAME
    if pairs.estimate > math.log(factor) and pairs.low > 0:
        verdict = Verdict.WORSE
    elif pairs.estimate < -math.log(factor) and pairs.high < 0:
        verdict = Verdict.BETTER
    noise = Noise(pairs.spread, f"{len(ratios)} {source}" + (f" in {pairs.n} process pairs" if per_process else ""))
    return replace(row, verdict=verdict, ratio=ratio, threshold=limit, noise=noise, pairs=pairs,
                   detects=pairs.detectable(factor))


def decided(row: Row, factor: float | None = None, *, see: bool = False) -> bool:
    """Whether more pairs could change ``row``'s verdict on ``factor`` (default: the row's own floor): False while
    its bounds straddle the factor (worse, or not, is not yet told apart from noise), and with ``see``, while a pass
    could not yet see :func:`sees` (interleaved pairs: cheap to take more of). Rows without pairs (errors, skips,
    blind verdicts) are decided."""
    if row.pairs is None or row.verdict not in (Verdict.SAME, Verdict.WORSE, Verdict.BETTER):
        return True
    return settled(row.pairs, factor if factor is not None else FACTOR, see=see)


def conclude(rows: Sequence[Row], factor: float = FACTOR) -> list[Row]:
    """``rows`` once the measuring has stopped: a pass (``same``) that is not :func:`decided` on ``factor`` - its upper
    bound still above the factor, so that a ``factor`` slow-down would have looked the same - is **inconclusive**,
    its note saying what it saw and about how many more values it would have needed."""
    concluded = []
    for row in rows:
        if row.verdict is Verdict.SAME and row.pairs is not None and not decided(row, factor):
            row = replace(row, verdict=Verdict.INCONCLUSIVE, note=_short_of(row.pairs, factor, row.seconds) +
                          (f"; {row.note}" if row.note else ""))
        concluded.append(row)
    return concluded


def _short_of(pairs: Paired, factor: float, seconds: float | None = None) -> str:
    """Why ``pairs`` are inconclusive, and roughly how many values would settle them (the bound's margin shrinking
    as one over the square root of their number, the estimate staying where it is): the upper bound below the
    factor where the estimate is, the lower one above it where the estimate is beyond it; with ``seconds`` (what
    measuring them took), the budget that would have taken at the same pace."""
    floor = math.log(factor)
    said = f"could not tell {factor:g}x from no change in {pairs.n} values (upper bound {math.exp(pairs.high):.3f}x)"
    needed = None
    if pairs.estimate < floor and math.isfinite(pairs.high):
        needed = math.ceil(pairs.n * ((pairs.high - pairs.estimate) / (floor - pairs.estimate)) ** 2)
    elif pairs.estimate > floor and math.isfinite(pairs.low):
        needed = math.ceil(pairs.n * ((pairs.estimate - pairs.low) / (pairs.estimate - floor)) ** 2)
    if needed is not None:
        said += f"; about {needed} would resolve it"
        if seconds:
            said += f" (about {seconds * needed / pairs.n:,.0f} s at this pace, against {seconds:,.0f} s spent)"
    return said


@dataclass(frozen=True)
class Stopping:
    """The gate's one sequential rule, shared by interleaved pairs (``harness.ci.interleave``), asv rounds (the same
    module and ``harness bench-compare``'s further rounds) and the A/A study that measures it
    (``harness.ci.aaseries``): look at the bounds once ``first`` values a side are in, then each time another
    ``growth - 1`` of them (rounded up to a multiple of ``every``, at least ``every``) is in (:meth:`due`: 40, 60,
    100, 160, 240, 360, ... pairs for the gate's pairs; every round for rounds); stop at a look where they are
    settled (:meth:`settles`: :func:`settled` on :func:`paired` of :func:`judged_values` with ``per_process``: the
    bounds exclude ``factor`` and, with ``see``, a pass could also see :func:`sees`), each look's lower bound at its
    share of ``alpha`` (:meth:`alpha_at`). A judgment still not settled when measuring ends is :func:`conclude`'s
    inconclusive.

    Raises:
        InvalidValue: ``factor`` not above 1, ``first`` below 2, ``every`` below 1, or ``per_process`` negative or 1.
    """

    factor: float = FACTOR
    first: int = 2
    every: int = 1
    see: bool = False
    per_process: int = 0
    alpha: float = ALPHA  # the judgment's false alarms, over all its looks (judgment_alpha: its share of a family's)
    most: int = 0  # the most values a side measuring takes (--max-rounds, interleave.MAX_PAIRS); 0: no end known
    growth: float = 1.0  # how far apart the looks are: each at least this many times the last (1: every ``every``)

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        if not 0 < self.alpha < 0.5:
            raise InvalidValue(f"a stopping rule's alpha must be in (0, 0.5); got alpha={self.alpha!r}")
        check_per_process(self.per_process)
        if self.most < 0:
            raise InvalidValue(f"a stopping rule's most values must be 0 (no end known) or more; got most={self.most}")
        if not self.growth >= 1:
            raise InvalidValue(f"a stopping rule's looks cannot come closer: growth must be >= 1; got {self.growth!r}")
        if self.first < 2 or self.every < 1:
            raise InvalidValue(f"a stopping rule looks from 2 values on, every 1 or more; got first={self.first}, "
                               f"every={self.every}")

    def look(self, n: int) -> tuple[int, int]:
        """The first look at ``n`` values a side or more: its number (1 the first) and its size."""
        k, size = 1, self.first
        while size < n:
            k, size = k + 1, size + max(self.every, math.ceil(size * (self.growth - 1) / self.every) * self.every)
        return k, size

    def due(self, n: int) -> bool:
        """Whether a look at the bounds is due once ``n`` values a side are in."""
        return n >= self.first and self.look(n)[1] == n

    @property
    def looks(self) -> int:
        """How many looks measuring can take: up to ``most`` values a side (0 where no end is known)."""
        return self.look(self.most)[0] if self.most else 0

    def alpha_at(self, n: int) -> float:
        """The level of the lower bound (what a *worse* verdict must clear) at ``n`` values a side: ``alpha`` split
        among the looks, ``alpha / L`` at each of the L that measuring up to ``most`` can take (Bonferroni over the
        looks); where no end is known, ``alpha / (k (k + 1))`` at the k-th (a half, a sixth, ...: the shares sum to
        ``alpha``). Looking again and again at one bound at ``alpha`` says worse of one commit against itself more
        often: an A/A of 40 noisy combinations in rounds (2 to 6 a side) measured 2.4% false alarms a judgment at
        alpha 1%, 1.1% with one look (docs/regressions.md)."""
        if self.most:
            return self.alpha / self.looks
        k = self.look(n)[0]
        return self.alpha / (k * (k + 1))

    def sized(self, per_process: int) -> Stopping:
        """This rule, written for process pairs of ``self.per_process`` pairs, for process pairs of ``per_process``
        (a multiple of it): its first look, the values between looks and its most values scaled alike, so that it
        looks at the same numbers of process pairs (4, 6, 10, ... for the gate's pairs) and splits its level among
        as many looks. ``per_process`` 0, or a rule of 0, only sets it.

        Raises:
            InvalidValue: ``per_process`` not a multiple of ``self.per_process``, or 1.
        """
        if not self.per_process or not per_process or per_process == self.per_process:
            return replace(self, per_process=per_process)
        if per_process % self.per_process:
            raise InvalidValue(f"process pairs of {per_process} pairs are not a multiple of the rule's "
                               f"{self.per_process}")
        scale = per_process // self.per_process
        return replace(self, per_process=per_process, first=self.first * scale, every=self.every * scale,
                       most=self.most * scale)

    def settles(self, log_ratios: Sequence[float]) -> bool:
        """Whether pairs with these log ratios (> 0: head worse) are settled, at this look's level."""
        values = judged_values(log_ratios, self.per_process)
        return len(values) >= 2 and settled(paired(values, self.alpha_at(len(log_ratios))), self.factor,
                                            see=self.see)

    def judge(self, base: Sequence[Measurement], head: Sequence[Measurement], history: Noise | None = None,
              source: str = "rounds") -> Row:
        """:func:`judge_rounds` by this rule: its factor, ``per_process`` and the level of the look at
        ``len(base)`` values."""
        return judge_rounds(base, head, self.factor, history, source, self.per_process, self.alpha_at(len(base)))

    def stops(self, base: Sequence[Measurement], head: Sequence[Measurement]) -> bool:
        """Whether measuring stops at these pairs: a look is due and they are settled, or (a zero value or a failure
        on a side) more pairs could not bound them."""
        if not self.due(len(base)):
            return False
        ratios = log_ratios(base, head)
        return ratios is None or self.settles(ratios)

    def stop_at(self, log_ratios: Sequence[float]) -> int:
        """How many of a recorded series' pairs the rule takes: the first look where they settle, else all."""
        size = min(self.first, len(log_ratios))
        while size < len(log_ratios) and not self.settles(log_ratios[:size]):
            size = min(len(log_ratios), self.look(size + 1)[1])
        return size

    def done(self, row: Row) -> bool:
        """:func:`decided` by this rule's factor and ``see``: a row judged by :meth:`judge` settles exactly where
        :meth:`settles` does on its pairs."""
        return decided(row, self.factor, see=self.see)


def log_ratios(base: Sequence[Measurement], head: Sequence[Measurement]) -> list[float] | None:
    """Each pair's log ratio, turned so that > 0 is worse (:func:`worse_ratio`); None where a value is missing,
    zero or not finite (no paired bounds)."""
    if not base or not head or any(_missing(m.value) for m in (*base, *head)):
        return None
    up = higher_is_better(base[0].name, base[0].unit)
    ratios = [worse_ratio(b.value, h.value, up) for b, h in zip(base, head)]  # type: ignore[arg-type]
    return [math.log(r) for r in ratios] if all(0 < r < math.inf for r in ratios) else None


def sees(factor: float = FACTOR) -> float:
    """The change a pass taken in interleaved pairs must be able to see before it stops: ``factor - 1`` plus
    ``SEES_BEYOND`` (0.05 at the default factor)."""
    return factor - 1 + SEES_BEYOND


def settled(pairs: Paired, factor: float = FACTOR, *, see: bool = False) -> bool:
    """Whether ``pairs``' bounds exclude ``factor`` (or show no spread at all): :func:`decided` on the pairs alone.
    With ``see``, bounds below the factor settle it only once the pairs detect :func:`sees` (``detectable``)."""
    floor = math.log(factor)
    if pairs.se == 0 or pairs.low > floor:
        return True
    return pairs.high < floor and (not see or pairs.detectable(factor) <= sees(factor) + 1e-12)


def _check_factor(factor: float) -> None:
    if not factor > 1:
        raise InvalidValue(f"factor must be > 1; got factor={factor!r}")


def _side_value(measurements: Sequence[Measurement]) -> float | None:
    """The median of a side's values; None when any failed; NaN when skipped (or absent)."""
    if not measurements or any(is_skipped(m.value) for m in measurements):
        return math.nan
    if any(m.value is None for m in measurements):
        return None
    return statistics.median([m.value for m in measurements if m.value is not None])


def _missing(value) -> bool:
    """No value: failed (None) or skipped (NaN)."""
    return value is None or is_skipped(value)


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


def judge_all(rounds: Rounds, factor: float = FACTOR, history: Mapping[Key, Noise] | None = None,
              alpha: float = ALPHA) -> list[Row]:
    """:func:`judge_rounds` for every benchmark combination measured on either side."""
    history = history or {}
    return [judge_rounds(rounds.base.get(key, []), rounds.head.get(key, []), factor, history.get(key), alpha=alpha)
            for key in rounds.keys()]


def outcome(rows: list[Row]) -> str:
    """What ``rows`` say as a whole, whatever the exit status makes of it: "no verdict" (a benchmark errored on head,
    or none was judged), "regression" (one got worse), "inconclusive" (one could not be told apart), or "clean"."""
    if _no_verdict(rows):
        return "no verdict"
    if any(r.verdict is Verdict.WORSE for r in rows):
        return "regression"
    return "inconclusive" if any(r.verdict is Verdict.INCONCLUSIVE for r in rows) else "clean"


def exit_status(rows: list[Row], inconclusive: str = "fail") -> int:
    """``EXIT_NO_VERDICT`` (3) if a benchmark errored on head or none was judged, else ``EXIT_VERDICT`` (1) if one
    got worse, else 3 if one is inconclusive and ``inconclusive`` is "fail", else 0.

    Raises:
        InvalidValue: ``inconclusive`` is not one of ``INCONCLUSIVE_POLICIES``.
    """
    if inconclusive not in INCONCLUSIVE_POLICIES:
        raise InvalidValue(f"inconclusive must be one of {', '.join(INCONCLUSIVE_POLICIES)}; got {inconclusive!r}")
    said = outcome(rows)
    if said == "no verdict" or (said == "inconclusive" and inconclusive == "fail"):
        return EXIT_NO_VERDICT
    return EXIT_VERDICT if said == "regression" else EXIT_OK


def _no_verdict(rows: list[Row]) -> str | None:
    """Why ``rows`` give no verdict (one line), or None where they give one."""
    errors = [r for r in rows if r.verdict is Verdict.ERROR]
    if errors:
        return f"{len(errors)} benchmark{'s' * (len(errors) > 1)} failed on head"
    if not any(r.verdict in (Verdict.WORSE, Verdict.BETTER, Verdict.SAME, Verdict.FIXED, Verdict.INCONCLUSIVE)
               for r in rows):
        return "no benchmark was compared" if not rows else "no benchmark judged (skipped, or one value a side)"
    return None


def markdown(rows: list[Row], base: str, head: str, factor: float, alpha: float = ALPHA) -> str:
    """A pull-request comment: verdict line, then the table (worse and errors first); ``alpha``: each judgment's
    one-sided level (:func:`judgment_alpha`)."""
    said, why = outcome(rows), _no_verdict(rows)
    counts = {v: sum(r.verdict is v for r in rows) for v in Verdict}
    unsure = counts[Verdict.INCONCLUSIVE]
    head_line = {"clean": ":white_check_mark: No benchmark got worse", "regression": ":x: Performance regression",
                 "inconclusive": f":grey_question: Inconclusive: {unsure} benchmark{'s' * (unsure > 1)} could not "
                                 f"tell {factor:g}x from no change (not a slow-down)",
                 "no verdict": f":grey_question: No verdict, an infrastructure error: {why}"}[said]
    if said == "regression" and unsure:
        head_line += f" ({unsure} more inconclusive)"
    lines = [f"### {head_line}: `{head[:12]}` vs `{base[:12]}` (factor {factor:g})", "",
             ", ".join(f"{counts[v]} {v.value}" for v in Verdict if counts[v]) or "no benchmarks compared", ""]
    order = [Verdict.ERROR, Verdict.WORSE, Verdict.INCONCLUSIVE, Verdict.BETTER, Verdict.FIXED, Verdict.UNJUDGED,
             Verdict.SAME, Verdict.SKIPPED]
    lines += ["| | benchmark | before | after | worse by | noise | detects | unit | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    marks = {Verdict.ERROR: "!", Verdict.WORSE: "+", Verdict.BETTER: "-", Verdict.FIXED: "*", Verdict.UNJUDGED: "?",
             Verdict.INCONCLUSIVE: "~"}
    for row in sorted(rows, key=lambda r: (order.index(r.verdict), r.name, r.params)):
        name = row.name + (f" ({row.params})" if row.params else "")
        ratio = "" if row.ratio is None else f"{row.ratio:.3f}x"
        noise = "" if row.noise is None else f"{100 * row.noise.value:.1f}% {row.noise.source}"
        if row.history is not None:
            noise += f"{'; ' if noise else ''}{100 * row.history.value:.1f}% night to night, {row.history.source}"
        detects = "" if row.detects is None else "none" if math.isinf(row.detects) else f"{100 * row.detects:.1f}%"
        lines.append(f"| {marks.get(row.verdict, '')} | `{name}` | {_value(row.base)} | {_value(row.head)} | "
                     f"{ratio} | {noise} | {detects} | {row.unit} | {row.note} |")
    lines += ["", f"`+` worse: beyond the factor and beyond the noise (its lower {100 * (1 - alpha):.4g}% bound above "
              f"no change; {_alpha_said(alpha)}), `-` "
              "better, `!` failed on head, `~` inconclusive (measuring stopped before it could tell the factor from no "
              "change, or skipped on head), `*` fixed, `?` unjudged (a single value, or one process pair: no spread); "
              "samples/s, "
              "efficiency and final accuracy count higher as better. *worse by*: the pairs' estimate (base and head "
              "measured next to each other); *noise*: the spread of one pair (of one process pair's median, where "
              "pairs come from several), and how many were judged (main's "
              "night-to-night noise beside it where a history was given: shown, not used); *detects*: the change "
              f"this row catches {100 * POWER:.0f}% of the time at that spread (the factor, {factor:g}, at least)."]
    return "\n".join(lines)


def _alpha_said(alpha: float) -> str:
    if alpha >= ALPHA:
        return f"at most {100 * alpha:.4g}% false alarms a benchmark"
    return f"{100 * alpha:.3g}% a benchmark: --family-alpha shared among all the benchmarks judged"


def _value(value) -> str:
    if value is None:
        return "failed"
    if is_skipped(value):
        return "n/a"
    return f"{value:.4g}"
