"""How noisy a benchmark is: one robust estimate for the gate, ``harness regressions`` and ``harness bisect``.

The spread is the median absolute deviation scaled by 1.4826 (the standard
deviation for normal noise, while one outlier barely moves it), relative to the
median: 0.05 means about 5% run to run. Shared CI runners drift between jobs
far more than within one (docs/regressions.md), so each caller says where its
values come from: main's history (between jobs) or the gate's interleaved rounds
(within one job).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

__all__ = ["MAD_TO_SIGMA", "relative_noise"]

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): the MAD of normal noise times this is its standard deviation


def relative_noise(values: Iterable[float | None]) -> float | None:
    """The robust relative spread of ``values`` (None and NaN left out).

    Returns:
        ``1.4826 * median(|v - median|) / |median|``, or None for fewer than 2 values or a median of 0.

    Example:
        >>> round(relative_noise([100, 102, 98, 101, 99]), 4)
        0.0148
    """
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    if len(kept) < 2:
        return None
    center = statistics.median(kept)
    if center == 0:
        return None
    return MAD_TO_SIGMA * statistics.median(abs(v - center) for v in kept) / abs(center)
