"""Step-time models and the split solver. Pure Python: no TensorFlow here.

The step-time model of one device is ``t(b) = fixed + b * per_sample``: a cost
every step pays whatever its batch (kernel launches, the optimizer update,
host-device traffic of the weights, Python) plus a cost per sample. The GTX 1080
Ti of seed 000 (docs/background.md) fits it to within 1%: 684, 1128 and 1345
samples/s at batch 64, 256 and 1024 are 49 ms + b / 1438 samples/s. It is the model Cannikin and
Poplar profile too; ``fit_step_model`` reports how well it fits each device so
a poor fit (a curve that bends: caches, memory-bound kernels) shows.

Synchronous data parallelism waits for the slowest device, so a split
``b_1..b_n`` takes ``T = max_i t_i(b_i)``. For a global batch ``B`` the best
split is the smallest ``T`` with ``sum_i cap_i(T) >= B``, where ``cap_i(T)`` is
the most samples device i finishes within ``T`` (at most its ceiling; zero if
even one sample takes longer than ``T``: such a device is not worth using).
With the global batch free, samples/s ``S(T) / T`` is monotone between the
points where a device joins or reaches its ceiling, so the best ``T`` is one of
those points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import InvalidValue

__all__ = ["StepModel", "Slowest", "Fit", "Split", "fit_step_model", "solve_split", "best_split", "predict"]


@dataclass(frozen=True)
class StepModel:
    """Seconds per step of one device: ``fixed_s + batch * per_sample_s``."""

    fixed_s: float
    per_sample_s: float

    def __post_init__(self):
        if not (math.isfinite(self.fixed_s) and self.fixed_s >= 0):
            raise InvalidValue(f"fixed_s must be a finite number >= 0; got fixed_s={self.fixed_s!r}")
        if not (math.isfinite(self.per_sample_s) and self.per_sample_s > 0):
            raise InvalidValue(f"per_sample_s must be a finite number > 0; got per_sample_s={self.per_sample_s!r}")

    def seconds(self, batch: int) -> float:
        """Step time at ``batch`` samples (0 for an unused device)."""
        return self.fixed_s + batch * self.per_sample_s if batch > 0 else 0.0

    def samples_per_second(self, batch: int) -> float:
        return batch / self.seconds(batch) if batch > 0 else 0.0

    def capacity(self, seconds: float, ceiling: int) -> int:
        """The most samples (<= ``ceiling``) one step finishes within ``seconds``."""
        room = (seconds - self.fixed_s) / self.per_sample_s
        # A relative epsilon: t(b) computed from b must count as "within" t(b) itself.
        return max(0, min(ceiling, math.floor(room * (1 + 1e-12) + 1e-9)))

    @property
    def peak_rate(self) -> float:
        """Samples/s the device approaches at large batches (``1 / per_sample_s``)."""
        return 1.0 / self.per_sample_s

    def to_json(self) -> dict:
        return {"fixed_ms": 1000 * self.fixed_s, "per_sample_us": 1e6 * self.per_sample_s,
                "peak_samples_per_second": self.peak_rate}

    def breakpoints(self, ceiling: int) -> tuple[int, ...]:
        """Batches where the step's time changes slope (none: a line)."""
        return ()


@dataclass(frozen=True)
class Slowest:
    """Seconds per step of a device whose step ends with the last of several bounds, each a ``StepModel``:
    ``t(b) = max_k pieces[k].seconds(b)`` (a step whose transfers run beside its compute: each transfer, and the
    compute, bounds the step; ``harness.bench.tuning.tuner.linked_models``). Convex: the solver's search holds."""

    pieces: tuple[StepModel, ...]

    def __post_init__(self):
        if not self.pieces:
            raise InvalidValue("a Slowest step model needs at least one piece")

    def seconds(self, batch: int) -> float:
        return max(p.seconds(batch) for p in self.pieces) if batch > 0 else 0.0

    def samples_per_second(self, batch: int) -> float:
        return batch / self.seconds(batch) if batch > 0 else 0.0

    def capacity(self, seconds: float, ceiling: int) -> int:
        return min(p.capacity(seconds, ceiling) for p in self.pieces)

    @property
    def peak_rate(self) -> float:
        return min(p.peak_rate for p in self.pieces)

    def breakpoints(self, ceiling: int) -> tuple[int, ...]:
        found = set()
        for a in self.pieces:
            for b in self.pieces:
                if a.per_sample_s > b.per_sample_s:
                    cross = (b.fixed_s - a.fixed_s) / (a.per_sample_s - b.per_sample_s)
                    found |= {n for n in (math.floor(cross), math.ceil(cross)) if 1 <= n <= ceiling}
        return tuple(sorted(found))

    def to_json(self) -> dict:
        return {"pieces": [p.to_json() for p in self.pieces], "peak_samples_per_second": self.peak_rate}


@dataclass(frozen=True)
class Fit:
    """A fitted step model and how well it matches the measured points."""

    model: StepModel
    points: int
    max_relative_error: float  # the largest |measured - fitted| / measured over the points

    def to_json(self) -> dict:
        return {**self.model.to_json(), "points": self.points, "max_relative_error": self.max_relative_error}


@dataclass(frozen=True)
class Split:
    """Per-device batches and what the step-time models predict for them."""

    batches: tuple[int, ...]
    step_seconds: float
    samples_per_second: float
    solo_samples_per_second: tuple[float, ...]  # each device alone at its batch, predicted

    @property
    def global_batch(self) -> int:
        return sum(self.batches)

    @property
    def efficiency(self) -> float:
        """Predicted total / the sum of each device's solo samples/s at its batch."""
        solo = math.fsum(self.solo_samples_per_second)
        return self.samples_per_second / solo if solo > 0 else 0.0

    @property
    def used(self) -> tuple[int, ...]:
        """Indices of the devices that get samples."""
        return tuple(i for i, b in enumerate(self.batches) if b > 0)

    def to_json(self) -> dict:
        return {"batches": list(self.batches), "global_batch": self.global_batch, "step_seconds": self.step_seconds,
                "samples_per_second": self.samples_per_second,
                "solo_samples_per_second": list(self.solo_samples_per_second), "efficiency": self.efficiency}


def fit_step_model(batches: Sequence[int], seconds: Sequence[float]) -> Fit:
    """Fits ``t(b) = fixed + b * per_sample`` to measured step times.

    Least squares on relative error (each point weighted by ``1 / t^2``), so
    small batches count as much as large ones. A negative fixed cost (noise) is
    clamped to 0 and the slope refitted through the origin.

    Raises:
        ValueError: fewer than one point, mismatched lengths, non-positive values.

    Example:
        >>> fit = fit_step_model([64, 256, 1024], [64 / 684, 256 / 1128, 1024 / 1345])
        >>> round(fit.model.fixed_s * 1000), round(fit.model.peak_rate)
        (49, 1438)
    """
    if len(batches) != len(seconds) or not batches:
        raise InvalidValue(f"need one step time per batch size, at least one; got batches={list(batches)}, "
                           f"seconds={list(seconds)}")
    if any(b < 1 for b in batches) or any(not (math.isfinite(t) and t > 0) for t in seconds):
        raise InvalidValue(f"batch sizes must be >= 1 and step times > 0; got batches={list(batches)}, "
                           f"seconds={list(seconds)}")
    if len(set(batches)) < 2:
        model = StepModel(0.0, math.fsum(t / b for b, t in zip(batches, seconds)) / len(batches))
    else:
        model = _weighted_line(batches, seconds)
    errors = [abs(t - model.seconds(b)) / t for b, t in zip(batches, seconds)]
    return Fit(model, len(batches), max(errors))


def _weighted_line(batches: Sequence[int], seconds: Sequence[float]) -> StepModel:
    w = [1.0 / (t * t) for t in seconds]
    sw = math.fsum(w)
    sx = math.fsum(wi * b for wi, b in zip(w, batches))
    sy = math.fsum(wi * t for wi, t in zip(w, seconds))
    sxx = math.fsum(wi * b * b for wi, b in zip(w, batches))
    sxy = math.fsum(wi * b * t for wi, b, t in zip(w, batches, seconds))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    fixed = (sy - slope * sx) / sw
    if fixed < 0 or slope <= 0:
        slope = sxy / sxx  # through the origin
        fixed = 0.0
    return StepModel(fixed, slope)


def predict(models: Sequence[StepModel], batches: Sequence[int]) -> Split:
    """What the models predict for a given split (e.g. the even one)."""
    _check(models, [max(1, b) for b in batches])
    if len(batches) != len(models):
        raise InvalidValue(f"need one batch per device ({len(models)}); got batches={list(batches)}")
    step = max(m.seconds(b) for m, b in zip(models, batches))
    total = sum(batches)
    return Split(tuple(batches), step, total / step if step > 0 else 0.0,
                 tuple(m.samples_per_second(b) for m, b in zip(models, batches)))


def solve_split(models: Sequence[StepModel], ceilings: Sequence[int], global_batch: int) -> Split:
    """The per-device batches of ``global_batch`` samples with the shortest step.

    Args:
        models: each device's step-time model.
        ceilings: the largest batch each device may take (its memory ceiling).
        global_batch: samples per step, ``1 <= global_batch <= sum(ceilings)``.

    Returns:
        The split; a device whose single sample would take longer than the
        others' whole step gets 0 (leave it out of the parallel model).

    Raises:
        ValueError: no devices, bad ceilings, or a global batch that does not fit.

    Example:
        >>> solve_split([StepModel(0, 1 / 1345), StepModel(0, 1 / 875)], [1100, 700], 1388).batches
        (841, 547)
    """
    _check(models, ceilings)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise InvalidValue(f"global batch must be an int >= 1; got {global_batch!r}")
    if global_batch > sum(ceilings):
        raise InvalidValue(f"global batch {global_batch} exceeds what the devices hold together: the sum of their "
                           f"memory ceilings {list(ceilings)} is {sum(ceilings)}")
    lo, hi = 0.0, max(m.seconds(c) for m, c in zip(models, ceilings))
    for _ in range(200):  # bisection on the step time; each capacity is monotone in it
        mid = (lo + hi) / 2
        if sum(m.capacity(mid, c) for m, c in zip(models, ceilings)) >= global_batch:
            hi = mid
        else:
            lo = mid
        if hi - lo <= hi * 1e-15:
            break
    batches = [m.capacity(hi, c) for m, c in zip(models, ceilings)]
    while sum(batches) > global_batch:  # trim the slowest device first: the step only gets shorter
        slowest = max(range(len(batches)), key=lambda i: (models[i].seconds(batches[i]), -i))
        batches[slowest] -= 1
    return predict(models, batches)


def best_split(models: Sequence[StepModel], ceilings: Sequence[int]) -> Split:
    """The split (global batch free) with the most samples/s within the ceilings.

    Not simply the largest batch: once a fast device is at its ceiling, giving
    the slow ones more makes every step longer while the fast one waits.
    Among equally fast splits the larger global batch wins.
    """
    _check(models, ceilings)
    times = {m.seconds(c) for m, c in zip(models, ceilings)} | {m.seconds(1) for m in models}
    times |= {m.seconds(b) for m, c in zip(models, ceilings) for b in m.breakpoints(c)}  # where a slope changes
    best = None
    for t in sorted(times):
        batches = [m.capacity(t, c) for m, c in zip(models, ceilings)]
        if sum(batches) == 0:
            continue
        split = predict(models, batches)
        key = (round(split.samples_per_second, 9), split.global_batch)
        if best is None or key > best[0]:
            best = (key, split)
    assert best is not None  # at t = m.seconds(1) device m holds batch 1 (its ceiling is >= 1)
    return best[1]


def _check(models: Sequence[StepModel], ceilings: Sequence[int]) -> None:
    if not models:
        raise InvalidValue("need at least one device to split a batch over; got none")
    if len(ceilings) != len(models):
        raise InvalidValue(f"need one memory ceiling per device ({len(models)}); got ceilings={list(ceilings)}")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in ceilings):
        raise InvalidValue(f"memory ceilings must be ints >= 1 (a device that cannot hold one sample cannot be used); "
                           f"got ceilings={list(ceilings)}")
