"""The rebalancing rule: new ratios from measured busy times, without TensorFlow."""

from __future__ import annotations

import math

import pytest

from harness.parallel.resplit import busy_imbalance, capped_split, decide, describe
from harness.split import split_batch


def _window(rates, batches, steps=10, overhead_s=(0.0, 0.0)):
    """What an emulated device with ``time = overhead + n / rate`` logs over ``steps`` steps."""
    busy = [steps * (o + b / r) for r, b, o in zip(rates, batches, overhead_s)]
    return busy, [steps * b for b in batches], [steps] * len(batches)


def test_a_throttled_device_gets_a_share_proportional_to_its_rate():
    busy, samples, steps = _window([1000, 400], [100, 100])
    decision = decide([1, 1], busy, samples, steps, batch=200)
    assert decision.resplit and decision.ratios == pytest.approx((1000, 400))
    assert decision.imbalance == pytest.approx(1.5)
    assert split_batch(200, decision.ratios) == (143, 57)


def test_a_balanced_split_is_kept_within_tolerance():
    busy, samples, steps = _window([1000, 400], [143, 57])
    decision = decide([1000, 400], busy, samples, steps, batch=200, tolerance=0.05)
    assert not decision.resplit and decision.ratios == (1000.0, 400.0) and "balanced" in decision.reason
    noisy = decide([1, 1], [1.0, 1.04], [1000, 1000], [10, 10], batch=200, tolerance=0.05)
    assert not noisy.resplit


def test_no_resplit_when_the_batches_would_not_change():
    decision = decide([1, 1], [1.0, 1.2], [30, 30], [10, 10], batch=3, tolerance=0.05)
    assert not decision.resplit and "same batches" in decision.reason


def test_with_a_fixed_cost_per_step_the_rule_converges_to_equal_step_times():
    # n / 1000 and 30 ms + n / 400 at a global batch of 200: equal at b0 / 1000 = 0.03 + (200 - b0) / 400,
    # b0 = 151.4. The measured rates change with the split (the fixed cost spreads), so it takes a few windows.
    rates, overhead, batch = (1000.0, 400.0), (0.0, 0.03), 200
    ratios, moves = (1.0, 1.0), 0
    for _ in range(8):
        decision = decide(ratios, *_window(rates, split_batch(batch, ratios), overhead_s=overhead), batch=batch,
                          tolerance=0.02)
        ratios, moves = decision.ratios, moves + decision.resplit
    batches = split_batch(batch, ratios)
    times = [o + b / r for r, b, o in zip(rates, batches, overhead)]
    assert 2 <= moves <= 5 and batches in ((151, 49), (152, 48))
    assert max(times) / min(times) - 1 <= 0.02


def test_a_device_without_measured_work_keeps_the_split():
    decision = decide([1, 1], [1.0, 0.0], [100, 0], [10, 0], batch=20)
    assert not decision.resplit and decision.rates == (100.0, None)


def test_bad_measurements_are_named():
    with pytest.raises(ValueError, match="one busy time, sample count and step count per device"):
        decide([1, 1], [1.0], [10, 10], [1, 1], batch=20)
    with pytest.raises(ValueError, match="tolerance=-1"):
        decide([1, 1], [1.0, 1.0], [10, 10], [1, 1], batch=20, tolerance=-1)
    with pytest.raises(ValueError, match="ratios"):
        decide([1, 0], [1.0, 1.0], [10, 10], [1, 1], batch=20)
    with pytest.raises(ValueError, match="step_seconds"):
        busy_imbalance([1.0, math.nan])
    assert busy_imbalance([0.0, 1.0]) == math.inf


def test_describe_one_history_entry():
    entry = {"step": 17, "resplit": True, "rates": [1000.4, 399.6], "previous_batches": [100, 100],
             "batches": [143, 57], "batch": 200, "reason": "x"}
    assert describe(entry) == ("Rebalance: step 17: measured 1000, 400 samples/busy s; "
                               "re-split [100, 100] -> [143, 57] of 200")


def test_capped_split_never_crosses_a_ceiling():
    # Seed 000's 1080 (docs/background.md) ran out of memory at 710: a re-split must not put 771 samples there.
    assert split_batch(1388, [700, 875]) == (617, 771)
    assert capped_split(1388, [700, 875], [1100, 700]) == (688, 700)
    assert capped_split(1388, [1345, 875], [None, None]) == split_batch(1388, [1345, 875])
    assert capped_split(100, [1, 1], [40, 40]) is None
    assert capped_split(30, [5, 1, 1], [10, None, 12]) == (10, 10, 10)


def test_decide_respects_memory_ceilings():
    # Rates 5250 and 7000 would give 600/800; device 1 holds 700.
    d = decide([3, 1], busy_seconds=[2.0, 0.5], samples=[10500, 3500], steps=[10, 10], batch=1400,
               max_batches=[None, 700])
    assert d.resplit and split_batch(1400, d.ratios) == (700, 700)
    d = decide([1, 1], busy_seconds=[1.0, 2.0], samples=[7000, 7000], steps=[10, 10], batch=1400,
               max_batches=[650, 650])
    assert not d.resplit and "cannot hold the batch of 1400" in d.reason
