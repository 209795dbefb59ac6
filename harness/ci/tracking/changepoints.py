"""Change points of one benchmark's history: the steps between levels, located with their odds, and a drift apart.

:func:`find_steps` fits levels to a series of nightly values (oldest first) and
returns each step between two levels that is beyond the factor and significant
at the series' own noise, with the commit most likely to be the first of the new
level and the range that holds it with 95% odds. Numpy only. How it works, and
why each part is there (measured on seeded series), is docs/design.md's
"Change points"; in short:

1. Logarithms, so that a step is relative; the noise is the robust spread of
   night-to-night differences, which a few steps barely move; a night whose asv
   confidence interval is wide counts for less.
2. A night far from its neighbours' running median is pulled in to 3 standard
   deviations of it (heavy tails), and a level must hold :data:`MIN_RUN`
   nights: a one-night outlier, or a few nights on a slower host, is no step.
3. Levels by optimal partitioning (least squares plus a penalty per level,
   :data:`PENALTY` x ln n noise variances), then each step tested on its own:
   beyond the factor and :data:`Z_MIN` standard errors, over its whole levels
   *and* over at most :data:`WINDOW` nights on each side (a slow drift makes
   distant levels differ, not neighbouring nights); the weakest step that fails is
   merged away and the rest tested again.
4. Each step's position from the odds of every position between its neighbours
   (the profile likelihood): the most likely commit, moved where another holds
   clearly more odds within :data:`LOCATE_WITHIN` of it, and the 95% range.
5. A drift (a trend within the levels) is estimated and reported apart from steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.errors import InvalidValue

__all__ = ["Step", "Drift", "Fit", "find_steps", "MIN_RUN", "WINDOW", "Z_MIN", "PENALTY", "LOCATE_WITHIN",
           "LOCATE_GAIN", "CREDIBLE"]

MIN_RUN = 6  # nights a level must hold: five nights on a slower host are no step
WINDOW = 20  # nights on each side of a step that its local test compares
Z_MIN = 3.25  # standard errors a step must stand out by, over its levels and over its window
PENALTY = 2.0  # per level, in noise variances times ln(n): the Bayesian information criterion's
CLIP = 3.0  # a night further than this many standard deviations from its neighbours' running median is pulled in
LOCATE_WITHIN = 2  # the position reported is the one with the most odds within this many commits of it ...
LOCATE_GAIN = 0.01  # ... where that beats the most likely position's by this much; else the most likely
CREDIBLE = 0.95  # the odds the reported range of positions holds the step
NOISE_KEPT = 0.9  # the share of night-to-night differences the noise is measured on: the largest hold the steps
_Z_BOUNDS = 2.5758  # two-sided 99% bounds of a step's ratio
_MEDIAN_WINDOW = 5  # the running median's width: a level of 3 or more nights keeps it


@dataclass(frozen=True)
class Step:
    """One step between two levels; indexes count the values given (usable ones only).

    ``index``: the first value of the new level, the most likely one; ``first``..``last``: the positions the
    new level's first value lies in with :data:`CREDIBLE` odds (``first <= index <= last``); ``before`` and
    ``after``: the two levels (geometric means, in the values' unit); ``ratio``: ``after / before`` with its
    two-sided 99% ``low``/``high`` bounds; ``z``: the smaller of its two tests' standard scores.
    """

    index: int
    first: int
    last: int
    before: float
    after: float
    ratio: float
    low: float
    high: float
    z: float

    @property
    def up(self) -> bool:
        """The later level is higher (worse, for values where larger is worse)."""
        return self.ratio > 1


@dataclass(frozen=True)
class Drift:
    """A trend within the levels: ``per_value`` the relative change from one value to the next, ``total`` over
    the series (``(1 + per_value) ** (n - 1) - 1``), ``z`` its standard score."""

    per_value: float
    total: float
    z: float


@dataclass(frozen=True)
class Fit:
    """What :func:`find_steps` found: ``steps`` oldest first; ``noise`` the relative night-to-night spread;
    ``drift`` where one is beyond the factor and significant; ``levels`` as ``(start, end, level)``
    (end exclusive); ``outliers``: values pulled in to their neighbours."""

    steps: tuple[Step, ...]
    noise: float | None
    drift: Drift | None = None
    levels: tuple[tuple[int, int, float], ...] = ()
    outliers: tuple[int, ...] = ()


def _trimmed_variance(kept: float) -> float:
    """The variance of a standard normal variable within its central ``kept`` share: what the trimmed mean
    square of normal noise comes to."""
    c = _normal_quantile(0.5 + kept / 2)
    density = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    return 1 - 2 * c * density / kept


def _normal_quantile(p: float) -> float:
    """The standard normal quantile, by bisection on the error function (no scipy)."""
    low, high = -10.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


_TRIMMED_VARIANCE = _trimmed_variance(NOISE_KEPT)


def find_steps(values: Sequence[float], errors: Sequence[float | None] | None = None, factor: float = 1.03,
               min_run: int = MIN_RUN) -> Fit:
    """The steps of a series beyond ``factor`` (either way) that stand out of its noise.

    Args:
        values: the nightly values, oldest first; all finite (leave failed and skipped nights out).
        errors: each value's own standard error (from asv's confidence interval), None where unknown; a night
            measured less precisely counts for less.
        factor: the smallest step reported, as a ratio (1.03: 3% either way).
        min_run: the fewest values a level holds.

    Raises:
        InvalidValue: a value is not finite, ``factor`` is not above 1, ``min_run`` is below 2, or ``errors``
            does not match ``values``.

    Example:
        >>> fit = find_steps([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01] + [1.1, 1.11, 1.09, 1.1, 1.12, 1.1, 1.09])
        >>> [(s.index, round(s.ratio, 2)) for s in fit.steps]
        [(8, 1.1)]
    """
    x, scale = _scaled(values, factor, min_run)
    n = len(x)
    if n < 2 * min_run:
        return Fit((), _relative(_noise(x), scale) if n > 2 else None)
    sigma = _noise(x)
    if not sigma > 0:  # flat: any change is a step; a tiny noise keeps the arithmetic finite
        sigma = max(float(np.max(np.abs(x))) * 1e-9, 1e-12)
    weights = _weights(x, sigma, errors, scale)
    x, outliers = _clip(x, sigma)
    threshold = math.log(factor) if scale == "log" else factor - 1
    cuts = _cuts(x, weights, threshold, min_run)
    bounds = [0, *cuts, n]
    steps = tuple(_step(x, weights, bounds[j], c, bounds[j + 2], scale) for j, c in enumerate(cuts))
    starts = [0, *sorted(step.index for step in steps), n]  # the levels between the located steps
    levels = tuple((a, b, _unscale(_mean(x, weights, a, b), scale)) for a, b in zip(starts, starts[1:]))
    return Fit(steps, _relative(sigma, scale), _drift(x, weights, bounds, threshold, scale), levels, outliers)


def _cuts(x: np.ndarray, w: np.ndarray, threshold: float, min_run: int) -> list[int]:
    cuts = _partition(x, w, PENALTY * math.log(len(x)), min_run)  # the squared error is in noise variances
    cuts = _prune(x, w, cuts, threshold)
    cuts = _relocate(x, w, cuts, min_run)
    return _prune(x, w, cuts, threshold)


def _slope(x: np.ndarray, w: np.ndarray, bounds: list[int]) -> tuple[float, float]:
    """The trend within the levels (each level's own slope, pooled) and its standard error."""
    num = den = 0.0
    for a, b in zip(bounds, bounds[1:]):
        t = np.arange(a, b, dtype=float)
        center = np.sum(w[a:b] * t) / np.sum(w[a:b])
        level = _mean(x, w, a, b)
        num += float(np.sum(w[a:b] * (t - center) * (x[a:b] - level)))
        den += float(np.sum(w[a:b] * (t - center) ** 2))
    return (num / den, 1 / math.sqrt(den)) if den > 0 else (0.0, math.inf)


def _scaled(values: Sequence[float], factor: float, min_run: int) -> tuple[np.ndarray, str]:
    """The values on the scale steps are fitted on: logarithms where all are positive, else values relative to
    the median's size (a series with zeros or negatives)."""
    if not factor > 1:
        raise InvalidValue(f"factor must be a ratio above 1 (1.03: 3%); got factor={factor!r}")
    if min_run < 2:
        raise InvalidValue(f"min_run must be at least 2 values; got min_run={min_run!r}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise InvalidValue(f"values must be finite numbers, failed and skipped nights left out; got {list(values)!r}")
    if x.size and np.all(x > 0):
        return np.log(x), "log"
    size = float(np.median(np.abs(x))) if x.size else 0.0
    return (x / size if size > 0 else x), "linear"


def _unscale(level: float, scale: str) -> float:
    return math.exp(level) if scale == "log" else level


def _relative(sigma: float, scale: str) -> float:
    return math.expm1(sigma) if scale == "log" else sigma


def _noise(x: np.ndarray) -> float:
    """The spread of one value from successive differences (a step moves one difference): the root mean square
    of the smallest NOISE_KEPT of them, made unbiased for normal noise, over sqrt 2."""
    if len(x) < 3:
        return 0.0
    d = np.sort(np.abs(np.diff(x)))
    kept = d[: max(2, math.ceil(NOISE_KEPT * len(d)))]
    return float(np.sqrt(np.mean(kept ** 2) / _TRIMMED_VARIANCE) / math.sqrt(2))


def _weights(x: np.ndarray, sigma: float, errors, scale: str) -> np.ndarray:
    """1 / variance per value: the night-to-night variance, plus a night's own where asv measured it worse than
    most nights (the spread of differences already holds the typical night's own error)."""
    if errors is None:
        return np.full(len(x), 1 / sigma ** 2)
    if len(errors) != len(x):
        raise InvalidValue(f"errors must have one entry per value ({len(x)}); got {len(errors)}")
    own = np.array([0.0 if e is None or not math.isfinite(e) or e < 0 else float(e) for e in errors])
    if scale == "log":  # a relative error on the log scale
        own = own / np.exp(x)
    typical = float(np.median(own))
    extra = np.maximum(own ** 2 - typical ** 2, 0.0)
    return 1 / (sigma ** 2 + extra)


def _clip(x: np.ndarray, sigma: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """Each value pulled in to within CLIP sigma of its neighbours' running median (which keeps any level of
    three or more values); the indexes pulled."""
    half = _MEDIAN_WINDOW // 2
    padded = np.pad(x, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, _MEDIAN_WINDOW)
    center = np.median(windows, axis=1)
    clipped = center + np.clip(x - center, -CLIP * sigma, CLIP * sigma)
    return clipped, tuple(int(i) for i in np.flatnonzero(clipped != x))


def _sums(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    zero = np.zeros(1)
    return (np.concatenate([zero, np.cumsum(w)]), np.concatenate([zero, np.cumsum(w * x)]),
            np.concatenate([zero, np.cumsum(w * x * x)]))


def _partition(x: np.ndarray, w: np.ndarray, penalty: float, min_run: int) -> list[int]:
    """Optimal partitioning: the cuts minimising the weighted squared error plus ``penalty`` per level, each
    level at least ``min_run`` long (exact, O(n^2))."""
    n = len(x)
    cw, cx, cxx = _sums(x, w)
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    start = np.zeros(n + 1, dtype=int)
    for end in range(min_run, n + 1):
        s = np.arange(0, end - min_run + 1)
        s = s[np.isfinite(best[s])]
        weight = cw[end] - cw[s]
        total = cx[end] - cx[s]
        cost = best[s] + (cxx[end] - cxx[s]) - total * total / weight + penalty
        j = int(np.argmin(cost))
        best[end], start[end] = cost[j], s[j]
    cuts, end = [], n
    while end > 0:
        end = int(start[end])
        if end > 0:
            cuts.append(end)
    return sorted(cuts)


def _mean(x: np.ndarray, w: np.ndarray, a: int, b: int) -> float:
    return float(np.sum(w[a:b] * x[a:b]) / np.sum(w[a:b]))


def _test(x: np.ndarray, w: np.ndarray, a: int, c: int, b: int) -> tuple[float, float]:
    """The difference of the weighted means of ``[c, b)`` and ``[a, c)``, and its standard error."""
    return _mean(x, w, c, b) - _mean(x, w, a, c), math.sqrt(1 / np.sum(w[a:c]) + 1 / np.sum(w[c:b]))


def _score(x: np.ndarray, w: np.ndarray, a: int, c: int, b: int, threshold: float) -> float:
    """How far the step at ``c`` between levels ``[a, c)`` and ``[c, b)`` clears its tests (>= 1: it does): its
    size against ``threshold`` and its standard score against Z_MIN, over the whole levels and over WINDOW
    values each side, the two sizes of one sign."""
    whole, whole_se = _test(x, w, a, c, b)
    near, near_se = _test(x, w, max(a, c - WINDOW), c, min(b, c + WINDOW))
    if whole * near <= 0:
        return 0.0
    return min(abs(whole) / threshold, abs(near) / threshold, abs(whole) / whole_se / Z_MIN,
               abs(near) / near_se / Z_MIN)


def _prune(x: np.ndarray, w: np.ndarray, cuts: list[int], threshold: float) -> list[int]:
    """The cuts left after merging away, one at a time, the weakest step that fails its tests."""
    cuts = list(cuts)
    while cuts:
        bounds = [0, *cuts, len(x)]
        scores = [_score(x, w, bounds[j], c, bounds[j + 2], threshold) for j, c in enumerate(cuts)]
        weakest = int(np.argmin(scores))
        if scores[weakest] >= 1:
            break
        cuts.pop(weakest)
    return cuts


def _relocate(x: np.ndarray, w: np.ndarray, cuts: list[int], min_run: int) -> list[int]:
    """Each cut moved to the best split between its neighbours, in turn, until none moves: the partition's
    positions were chosen beside cuts that pruning removed."""
    cuts = list(cuts)
    for _ in range(10):
        moved = False
        for j in range(len(cuts)):
            a = cuts[j - 1] if j else 0
            b = cuts[j + 1] if j + 1 < len(cuts) else len(x)
            positions = np.arange(a + min_run, b - min_run + 1)
            if positions.size == 0:
                continue
            gain = _split_gain(x, w, a, b, positions)
            c = int(positions[int(np.argmax(gain))])
            if c != cuts[j]:
                cuts[j], moved = c, True
        if not moved:
            break
    return cuts


def _split_gain(x: np.ndarray, w: np.ndarray, a: int, b: int, positions: np.ndarray) -> np.ndarray:
    """For each position c in ``(a, b)``: how much splitting ``[a, b)`` at c lowers the weighted squared error
    (the between-levels sum of squares)."""
    cw, cx, _ = _sums(x[a:b], w[a:b])
    i = positions - a
    w1, x1, wt, xt = cw[i], cx[i], cw[-1], cx[-1]
    return x1 * x1 / w1 + (xt - x1) ** 2 / (wt - w1) - xt * xt / wt


def _locate(x: np.ndarray, w: np.ndarray, a: int, b: int, c: int) -> tuple[int, int, int]:
    """The step's position between ``a`` and ``b`` by the odds of each (exp of half the split's gain, the noise
    known): the most likely one, unless another holds LOCATE_GAIN more odds within LOCATE_WITHIN of it (then the
    most likely of those that do), and the smallest range holding CREDIBLE."""
    positions = np.arange(a + 2, b - 1)  # two values on each side at least
    log_odds = _split_gain(x, w, a, b, positions) / 2
    odds = np.exp(log_odds - log_odds.max())
    odds /= odds.sum()
    near = np.convolve(odds, np.ones(2 * LOCATE_WITHIN + 1), mode="same")
    close = np.flatnonzero(near >= near.max() - LOCATE_GAIN)  # off the most likely only for a real gain
    best = int(positions[close[np.argmax(odds[close])]])
    order = np.argsort(-odds)
    held = order[: int(np.searchsorted(np.cumsum(odds[order]), CREDIBLE)) + 1]
    first, last = int(positions[held.min()]), int(positions[held.max()])
    return best, min(first, best), max(last, best)


def _step(x: np.ndarray, w: np.ndarray, a: int, c: int, b: int, scale: str) -> Step:
    index, first, last = _locate(x, w, a, b, c)
    diff, se = _test(x, w, a, index, b)
    near, near_se = _test(x, w, max(a, index - WINDOW), index, min(b, index + WINDOW))
    before, after = _mean(x, w, a, index), _mean(x, w, index, b)
    z = min(abs(diff) / se, abs(near) / near_se)
    if scale == "log":
        return Step(index, first, last, math.exp(before), math.exp(after), math.exp(diff),
                    math.exp(diff - _Z_BOUNDS * se), math.exp(diff + _Z_BOUNDS * se), z)
    ratio = after / before if before else math.inf
    low, high = ((after - _Z_BOUNDS * se) / before, (after + _Z_BOUNDS * se) / before) if before else (ratio, ratio)
    return Step(index, first, last, before, after, ratio, min(low, high), max(low, high), z)


def _drift(x: np.ndarray, w: np.ndarray, bounds: list[int], threshold: float, scale: str) -> Drift | None:
    """The trend within the levels, where it adds up to more than ``threshold`` over the series and stands out
    by Z_MIN."""
    slope, se = _slope(x, w, bounds)
    span = slope * (len(x) - 1)
    if abs(span) < threshold or abs(slope) < Z_MIN * se:
        return None
    if scale == "log":
        return Drift(math.expm1(slope), math.expm1(span), abs(slope) / se)
    return Drift(slope, span, abs(slope) / se)
