"""The rebalancing rule: the next split from measured busy times. Pure Python: no TensorFlow here.

A synchronous step waits for its slowest device, so a split is balanced when
every device is busy equally long per step. Over a window of steps each device
reports its busy seconds and samples; its *rate* is samples per busy second.
The rule sets the new ratios to the measured rates:

- without a fixed cost per step (``t = n / rate``) one move balances the devices;
- with one (``t = overhead + n / rate``) a device measures a higher rate at a
  larger slice (its overhead spreads over more samples); setting ratios to the
  measured rates is a fixed-point iteration whose fixed point is equal step
  times, and it converges in a few windows (the step-time model of
  ``harness.bench.tuning.solver``).

The split moves only when the slowest device's busy time per step exceeds the
fastest's by more than ``tolerance`` (noise must not reshuffle a balanced split),
and only when the new ratios change some device's batch. Memory ceilings
(``max_batches``) are never crossed: a device whose proportional share would
exceed its ceiling gets the ceiling and the rest is split over the others by
their rates (a re-split must not turn a slow step into an out-of-memory crash).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import InvalidValue
from harness.split import split_batch, validate_ratios

__all__ = ["Decision", "busy_imbalance", "capped_split", "decide", "describe"]


@dataclass(frozen=True)
class Decision:
    """What one measured window says about the split."""

    ratios: tuple[float, ...]  # the split to use from now on (the current one unless ``resplit``)
    resplit: bool
    reason: str
    rates: tuple[float | None, ...]  # samples per busy second, per device (None: no work measured)
    step_seconds: tuple[float | None, ...]  # busy seconds per step, per device
    imbalance: float  # slowest / fastest busy time per step - 1 (NaN when unknown)

    def to_json(self) -> dict:
        return {"ratios": list(self.ratios), "resplit": self.resplit, "reason": self.reason,
                "rates": list(self.rates), "step_seconds": list(self.step_seconds), "imbalance": self.imbalance}


def busy_imbalance(step_seconds: Sequence[float]) -> float:
    """How much longer the slowest device is busy per step than the fastest: ``max / min - 1``.

    Example:
        >>> busy_imbalance([0.25, 0.1])
        1.5
    """
    if not step_seconds or any(not (math.isfinite(s) and s >= 0) for s in step_seconds):
        raise InvalidValue(f"step_seconds must be finite numbers >= 0; got {list(step_seconds)!r}")
    low = min(step_seconds)
    return math.inf if low == 0 else max(step_seconds) / low - 1.0


def capped_split(batch: int, rates: Sequence[float], max_batches: Sequence[int | None]) -> tuple[int, ...] | None:
    """``split_batch(batch, rates)`` with no device above its ceiling; None when the ceilings cannot hold ``batch``.

    Example:
        >>> capped_split(1388, [1345, 875], [1100, 500])
        (888, 500)
    """
    caps = [batch if m is None else int(m) for m in max_batches]
    if len(caps) != len(rates):
        raise InvalidValue(f"need one ceiling per device ({len(rates)}); got max_batches={list(max_batches)}")
    if sum(min(c, batch) for c in caps) < batch:
        return None
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(len(rates)) if i not in fixed]
        left = batch - sum(fixed.values())
        shares = dict(zip(free, split_batch(left, [rates[i] for i in free]) if free else ()))
        over = [i for i in free if shares[i] > caps[i]]
        if not over:
            return tuple(fixed[i] if i in fixed else shares[i] for i in range(len(rates)))
        fixed.update({i: caps[i] for i in over})


def decide(
    ratios: Sequence[float],
    busy_seconds: Sequence[float],
    samples: Sequence[int],
    steps: Sequence[int],
    *,
    batch: int,
    tolerance: float = 0.05,
    max_batches: Sequence[int | None] | None = None,
) -> Decision:
    """The split after a window in which device ``i`` was busy ``busy_seconds[i]`` for ``samples[i]``.

    Args:
        ratios: the current split.
        busy_seconds, samples, steps: per device, what it did in the window.
        batch: the global batch, to tell whether new ratios change any device's batch.
        tolerance: re-split only when the busy imbalance exceeds this fraction.
        max_batches: per-device memory ceilings (None: no ceiling); the new
            split of ``batch`` keeps every device within its ceiling.

    Returns:
        A ``Decision``; ``resplit`` says whether ``ratios`` changed.

    Raises:
        ValueError: mismatched lengths, negative figures, a bad tolerance or ratios.

    Example:
        >>> d = decide([1, 1], busy_seconds=[1.0, 2.5], samples=[1000, 1000], steps=[10, 10], batch=200)
        >>> d.resplit, d.ratios, split_batch(200, d.ratios)
        (True, (1000.0, 400.0), (143, 57))
    """
    current = validate_ratios(ratios)
    k = len(current)
    if not (len(busy_seconds) == len(samples) == len(steps) == k):
        raise InvalidValue(f"need one busy time, sample count and step count per device ({k} devices); got "
                           f"busy_seconds={list(busy_seconds)}, samples={list(samples)}, steps={list(steps)}")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise InvalidValue(f"tolerance must be a number >= 0; got tolerance={tolerance!r}")
    if any(not (math.isfinite(s) and s >= 0) for s in busy_seconds) or min(samples) < 0 or min(steps) < 0:
        raise InvalidValue(f"busy seconds, samples and steps must be >= 0; got busy_seconds={list(busy_seconds)}, "
                           f"samples={list(samples)}, steps={list(steps)}")
    rates = tuple(n / s if n > 0 and s > 0 else None for n, s in zip(samples, busy_seconds))
    per_step = tuple(s / m if m > 0 else None for s, m in zip(busy_seconds, steps))

    def keep(reason: str, imbalance: float = math.nan) -> Decision:
        return Decision(current, False, reason, rates, per_step, imbalance)

    measured_rates = tuple(r for r in rates if r is not None)
    measured_steps = tuple(p for p in per_step if p is not None)
    if len(measured_rates) < len(rates) or len(measured_steps) < len(per_step):
        return keep("some device did no measured work in the window")
    imbalance = busy_imbalance(measured_steps)
    if imbalance <= tolerance:
        return keep(f"balanced: busy times per step within {100 * tolerance:g}%", imbalance)
    proposed = tuple(float(r) for r in measured_rates)
    if max_batches is not None and any(m is not None for m in max_batches):
        capped = capped_split(batch, proposed, max_batches)
        if capped is None:
            return keep(f"the memory ceilings {list(max_batches)} cannot hold the batch of {batch}", imbalance)
        if any(b == 0 for b in capped):
            return keep(f"the ceilings {list(max_batches)} would leave a device empty", imbalance)
        proposed = tuple(float(b) for b in capped)  # ratios equal to batches split the batch into exactly them
    if split_batch(batch, proposed) == split_batch(batch, current):
        return keep("the measured rates give the same batches", imbalance)
    return Decision(proposed, True, f"busy times per step differ by {100 * imbalance:.0f}%", rates, per_step,
                    imbalance)


def describe(entry: dict) -> str:
    """One line for one ``Rebalance.history`` entry (``harness.parallel.rebalance``)."""
    rates = ", ".join("-" if r is None else f"{r:.0f}" for r in entry["rates"])
    head = f"Rebalance: step {entry['step']}: measured {rates} samples/busy s"
    if entry["resplit"]:
        return f"{head}; re-split {entry['previous_batches']} -> {entry['batches']} of {entry['batch']}"
    return f"{head}; kept {entry['batches']} ({entry['reason']})"
