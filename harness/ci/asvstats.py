"""The one place harness calls asv's private statistics (``asv._stats``, asv 0.6.6).

asv exposes no public API for the test ``asv compare`` applies (are two sets of samples
different?) or for the weight its graphs give a point (2 / width of its 99% confidence
interval); harness uses both, so a benchmark is judged and plotted as asv itself would.
They are private: tests/unit/test_asvstats.py pins what they return, so an asv upgrade
that changes them fails there rather than in a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["is_different", "weight"]


def is_different(samples_a: Sequence[float] | None, samples_b: Sequence[float] | None, stats_a: dict,
                 stats_b: dict) -> bool:
    """asv compare's test: whether two benchmark results differ statistically (Mann-Whitney U on the samples where
    both have them, else the overlap of the 99% confidence intervals)."""
    from asv import _stats

    return bool(_stats.is_different(samples_a, samples_b, stats_a, stats_b))


def weight(stats: dict | None) -> float | None:
    """asv's weight of a result in its step detection and graphs: 2 / the width of the 99% confidence interval."""
    from asv import _stats

    return _stats.get_weight(stats)
