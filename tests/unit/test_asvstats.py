"""harness.ci.asvstats: asv's private statistics, pinned (an asv upgrade that changes them fails here)."""

from __future__ import annotations

import pytest

pytest.importorskip("asv")

from harness.ci.asvstats import is_different, weight  # noqa: E402


def _stats(values):
    import statistics

    mean = statistics.fmean(values)
    return {"ci_99_a": min(values), "ci_99_b": max(values), "q_25": mean, "q_75": mean, "repeat": len(values),
            "number": 1}


def test_two_clearly_different_sample_sets_differ_and_one_set_does_not_differ_from_itself():
    fast = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00, 1.01]
    slow = [v * 1.3 for v in fast]
    assert is_different(fast, slow, _stats(fast), _stats(slow))
    assert not is_different(fast, list(fast), _stats(fast), _stats(fast))


def test_the_weight_is_two_over_the_confidence_interval():
    assert weight({"ci_99_a": 1.0, "ci_99_b": 1.5}) == pytest.approx(2 / 0.5)
    assert weight(None) is None  # a result without statistics has no weight
