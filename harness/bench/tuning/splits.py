"""The three splits of a global batch harness measures, in one place: even, ratio and tuned.

``harness compare`` (its rows), ``harness tune`` (its margin) and the asv suites (benchmarks/)
take their per-device batches from ``split_batches``; the tuned split's memory margin is
``TUNED_MARGIN`` everywhere.

- ``even``: equal shares (``harness.split.split_batch`` with equal ratios).
- ``ratio``: shares in proportion to ``ratios`` (given, or each device's samples/s alone).
- ``tuned``: ``harness.bench.tuning.solver.solve_split`` of the devices' step-time models within
  each memory ceiling less ``margin`` (a device may get 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.errors import InvalidValue, Refused

__all__ = ["SPLITS", "TUNED_MARGIN", "usable_ceilings", "split_batches"]

SPLITS = ("even", "ratio", "tuned")
TUNED_MARGIN = 0.05  # the share of each memory ceiling a tuned split leaves free (fragmentation, other processes)


def usable_ceilings(ceilings: Sequence[int | None], unbounded: int, margin: float = TUNED_MARGIN) -> list[int]:
    """Each memory ceiling less ``margin`` (at least 1); ``unbounded`` for a device without a ceiling (None)."""
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise InvalidValue(f"margin must be a fraction in [0, 1); got {margin!r}")
    return [unbounded if c is None else max(1, math.floor(c * (1 - margin))) for c in ceilings]


def split_batches(split: str, batch: int, count: int, *, ratios: Sequence[float] | None = None, models=None,
                  ceilings: Sequence[int | None] | None = None, margin: float = TUNED_MARGIN) -> tuple[int, ...]:
    """Per-device batches of a global ``batch`` over ``count`` devices.

    Args:
        split: ``even``, ``ratio`` (needs ``ratios``) or ``tuned`` (needs ``models``, the devices'
            ``solver.StepModel``; ``ceilings`` their memory ceilings, None where a device has none).
        margin: the share of each ceiling the tuned split leaves free.

    Raises:
        InvalidValue: an unknown split, ratios that are not ``count`` positive numbers, missing models.
        Refused: (``no-tuned-split``) the global batch exceeds the devices' usable memory together.
    """
    from harness.split import split_batch

    if split == "even":
        return split_batch(batch, [1.0] * count)
    if split == "ratio":
        if ratios is None:
            raise InvalidValue("the ratio split needs ratios (one per device)")
        if len(ratios) != count:
            raise InvalidValue(f"the ratio split needs one ratio per device ({count}); got {list(ratios)}")
        return split_batch(batch, ratios)  # split_batch checks each value
    if split == "tuned":
        from harness.bench.tuning.solver import solve_split

        if models is None or len(models) != count:
            raise InvalidValue(f"the tuned split needs a step-time model per device ({count}); got {models!r}")
        usable = usable_ceilings(ceilings if ceilings is not None else [None] * count, batch, margin)
        if batch > sum(usable):
            raise Refused("no-tuned-split", f"global batch {batch} exceeds the devices' memory together (usable "
                                            f"ceilings {usable}, {100 * margin:g}% left free): no tuned split")
        return tuple(solve_split(list(models), usable, batch).batches)
    raise InvalidValue(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
