"""Ratios -> per-device batch sizes. Pure Python: no TensorFlow here.

The rule (also implemented in-graph by ``harness.parallel.slicing`` for
partial batches whose size is only known at run time):

1. Largest-remainder rounding: each device gets ``floor(n * r_i / R)``; the
   samples left over go, one each, to the devices with the largest fractional
   parts, lower device index first on ties.
2. No device is starved while there are enough samples: as long as some share
   is 0 and ``n >= len(ratios)``, one sample moves from the largest share
   (lowest index on ties) to the first empty device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.errors import InvalidType, InvalidValue

__all__ = ["shares", "split_batch", "validate_ratios"]


def validate_ratios(ratios: Sequence[float], count: int | None = None) -> tuple[float, ...]:
    """Checks ratios and returns them as a tuple of floats.

    Args:
        ratios: one positive finite number per device.
        count: the number of devices the ratios must match, if known.

    Returns:
        The ratios as floats.

    Raises:
        TypeError: ``ratios`` is not a sequence of numbers.
        ValueError: a ratio is zero, negative, NaN or infinite, or the length
            does not match ``count``.
    """
    if isinstance(ratios, (str, bytes)) or not isinstance(ratios, Sequence):
        raise InvalidType(f"ratios must be a list of numbers, one per device; got ratios={ratios!r}")
    if len(ratios) == 0:
        raise InvalidValue("ratios must name at least one device; got ratios=[]")
    values = []
    for value in ratios:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidType(f"ratios must be numbers; got ratios={list(ratios)!r}")
        if not (math.isfinite(value) and value > 0):
            raise InvalidValue(f"ratios must be positive finite numbers; got ratios={list(ratios)!r}")
        values.append(float(value))
    if count is not None and len(values) != count:
        raise InvalidValue(
            f"ratios must have one entry per device ({count} devices); "
            f"got {len(values)} ratios={list(ratios)!r}"
        )
    return tuple(values)


def shares(ratios: Sequence[float]) -> tuple[float, ...]:
    """Each device's fraction of a batch. The in-graph split multiplies by the same floats,
    so host and graph agree bit for bit (a graph optimiser may rewrite ``n * r / total``)."""
    total = math.fsum(ratios)
    return tuple(r / total for r in ratios)


def split_batch(batch_size: int, ratios: Sequence[float]) -> tuple[int, ...]:
    """Splits ``batch_size`` samples across devices in proportion to ``ratios``.

    Args:
        batch_size: samples in the global batch, ``>= 0``.
        ratios: one positive finite number per device.

    Returns:
        Per-device batch sizes that sum to ``batch_size``.

    Raises:
        TypeError: ``batch_size`` is not an int.
        ValueError: ``batch_size`` is negative or the ratios are invalid.

    Examples:
        >>> split_batch(100, [768, 560])
        (58, 42)
        >>> split_batch(1000, [3, 2])
        (600, 400)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidType(f"batch_size must be an int; got batch_size={batch_size!r}")
    if batch_size < 0:
        raise InvalidValue(f"batch_size must be >= 0; got batch_size={batch_size}")
    values = validate_ratios(ratios)
    exact = [batch_size * w for w in shares(values)]
    sizes = [math.floor(e) for e in exact]
    left = batch_size - sum(sizes)
    # Stable sort on the negated fraction: ties keep the lower device index first.
    order = sorted(range(len(values)), key=lambda i: -(exact[i] - sizes[i]))
    for i in order[:left]:
        sizes[i] += 1
    if batch_size >= len(values):
        _fill_empty(sizes)
    return tuple(sizes)


def _fill_empty(sizes: list[int]) -> None:
    while 0 in sizes:
        donor = max(range(len(sizes)), key=lambda i: (sizes[i], -i))
        sizes[donor] -= 1
        sizes[sizes.index(0)] += 1
