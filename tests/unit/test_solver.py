"""The split solver and the step-time fit: known optima, binding ceilings, useless devices, bad input."""

from __future__ import annotations

import itertools

import pytest

from harness.bench.tuning.solver import StepModel, best_split, fit_step_model, predict, solve_split


def brute_force(models, ceilings, global_batch):
    """The shortest step over every split of ``global_batch`` (small cases only)."""
    best = None
    for batches in itertools.product(*(range(c + 1) for c in ceilings)):
        if sum(batches) == global_batch:
            step = max(m.seconds(b) for m, b in zip(models, batches))
            best = step if best is None else min(best, step)
    return best


def test_proportional_split_without_fixed_cost():
    # Seed 000's cards (docs/background.md): 1345 and 875 samples/s; 1388 samples split 841/547
    # (the seed found 820/568 by hand).
    split = solve_split([StepModel(0, 1 / 1345), StepModel(0, 1 / 875)], [1100, 700], 1388)
    assert split.batches == (841, 547)
    assert split.samples_per_second == pytest.approx(2220, rel=1e-3)
    assert split.efficiency == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("global_batch", [1, 2, 7, 13, 30, 41])
def test_matches_brute_force(global_batch):
    models = [StepModel(0.010, 0.001), StepModel(0.002, 0.003), StepModel(0.030, 0.0005)]
    ceilings = [20, 9, 12]
    split = solve_split(models, ceilings, global_batch)
    assert split.global_batch == global_batch
    assert all(b <= c for b, c in zip(split.batches, ceilings))
    assert split.step_seconds == pytest.approx(brute_force(models, ceilings, global_batch), rel=1e-12)


def test_ceiling_binds():
    # Without a ceiling the fast device would take 750 of 1000; its memory holds 600.
    split = solve_split([StepModel(0, 1 / 3000), StepModel(0, 1 / 1000)], [600, 1000], 1000)
    assert split.batches == (600, 400)


def test_device_too_slow_to_be_worth_using():
    # One sample on the slow device takes 0.5 s; the fast one does the whole batch in 0.11 s.
    split = solve_split([StepModel(0.01, 0.001), StepModel(0.5, 0.01)], [1000, 1000], 100)
    assert split.batches == (100, 0)
    assert split.used == (0,)


def test_one_device():
    split = solve_split([StepModel(0.02, 0.001)], [500], 300)
    assert split.batches == (300,)
    assert split.step_seconds == pytest.approx(0.32)


def test_best_split_is_not_the_largest_batch():
    # Fast device capped at 1100: filling the slow one to its 700 would make the fast one wait.
    models = [StepModel(0.049, 1 / 1438), StepModel(0.060, 1 / 900)]
    best = best_split(models, [1100, 700])
    largest = predict(models, [1100, 700])
    assert best.batches == (1100, 678)
    assert best.samples_per_second > largest.samples_per_second
    for batch in range(2, 1800, 37):  # no global batch does better
        assert solve_split(models, [1100, 700], batch).samples_per_second <= best.samples_per_second + 1e-9


def test_best_split_without_fixed_costs_uses_the_ceilings_proportionally():
    best = best_split([StepModel(0, 1 / 1345), StepModel(0, 1 / 875)], [1100, 700])
    assert best.batches == (1076, 700)
    assert best.samples_per_second == pytest.approx(2220, rel=1e-3)


@pytest.mark.parametrize(
    ("models", "ceilings", "batch", "message"),
    [
        ([], [], 10, "at least one device"),
        ([StepModel(0, 0.001)], [100], 101, "global batch 101 exceeds .* ceilings \\[100\\]"),
        ([StepModel(0, 0.001)] * 2, [100, 0], 10, "ceilings must be ints >= 1.*\\[100, 0\\]"),
        ([StepModel(0, 0.001)] * 2, [100], 10, "one memory ceiling per device"),
        ([StepModel(0, 0.001)], [100], 0, "global batch must be an int >= 1; got 0"),
    ],
)
def test_bad_input_names_the_value(models, ceilings, batch, message):
    with pytest.raises(ValueError, match=message):
        solve_split(models, ceilings, batch)


def test_fit_recovers_seed_000_curve():
    # Seed 000: the 1080 Ti ran 684, 1128 and 1345 samples/s at batch 64, 256 and 1024.
    fit = fit_step_model([64, 256, 1024], [64 / 684, 256 / 1128, 1024 / 1345])
    assert fit.model.fixed_s == pytest.approx(0.049, abs=0.002)
    assert fit.model.peak_rate == pytest.approx(1438, rel=0.02)
    assert fit.max_relative_error < 0.01


def test_fit_clamps_negative_fixed_cost_and_reports_a_bad_fit():
    fit = fit_step_model([100, 200, 400], [0.09, 0.2, 0.41])
    assert fit.model.fixed_s == 0.0
    curved = fit_step_model([32, 64, 128, 256, 512], [0.01, 0.02, 0.04, 0.16, 0.64])  # not linear at all
    assert curved.max_relative_error > 0.3


@pytest.mark.parametrize(("batches", "seconds"), [([], []), ([1, 2], [0.1]), ([0], [0.1]), ([4], [-1.0])])
def test_fit_rejects_bad_points(batches, seconds):
    with pytest.raises(ValueError, match="batch"):
        fit_step_model(batches, seconds)


def test_step_model_rejects_nonsense():
    with pytest.raises(ValueError, match="per_sample_s must be"):
        StepModel(0.0, 0.0)
    with pytest.raises(ValueError, match="fixed_s must be"):
        StepModel(-1.0, 0.001)


def test_a_slowest_of_lines_model_splits_like_brute_force():
    """A device whose step is the slowest of several bounds (its compute; a transfer that runs beside it:
    tuner.linked_models' overlap): its time is the largest piece, its capacity the smallest, and the solver
    finds what a search over every split finds, the global batch given or free (where the slope changes)."""
    from harness.bench.tuning.solver import Slowest

    link_bound = Slowest((StepModel(0.001, 1 / 1000), StepModel(0.030, 1 / 4000)))  # 30 ms of transfers per step
    assert link_bound.seconds(20) == pytest.approx(0.035) and link_bound.seconds(100) == pytest.approx(0.101)
    assert link_bound.capacity(0.035, 500) == 20 and link_bound.capacity(0.029, 500) == 0
    assert link_bound.breakpoints(500) == (38, 39)  # 1 ms + b/1000 = 30 ms + b/4000 at b = 38.7
    assert link_bound.peak_rate == 1000
    models, ceilings = [StepModel(0.001, 1 / 1000), link_bound], [60, 60]
    for global_batch in (10, 40, 70, 100):
        split = solve_split(models, ceilings, global_batch)
        assert split.step_seconds == pytest.approx(brute_force(models, ceilings, global_batch), rel=1e-9)
    free = best_split(models, ceilings)
    rates = {b: (b[0] + b[1]) / max(m.seconds(n) for m, n in zip(models, b))
             for b in itertools.product(range(61), range(61)) if sum(b)}
    assert free.samples_per_second == pytest.approx(max(rates.values()), rel=1e-9)
    with pytest.raises(ValueError, match="at least one piece"):
        Slowest(())
