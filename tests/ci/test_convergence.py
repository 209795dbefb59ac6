"""Time to accuracy: figures, grids, and a planted convergence bug the gate flags.

Seed 001 (docs/background.md): two GPUs that train at full speed and reach half the
accuracy. The throughput suite cannot see that; ``benchmarks/convergence.py`` can. The
planted bug here divides the parallel step's loss by its rows twice more (a mean
taken for a sum): every step still runs at the emulated devices' speed, but Adam's
updates shrink and the held-out accuracy lags far behind. The benchmark's figures of
the correct and the bugged code go through the gate's own verdict
(``harness.ci.benchgate.judge``), as ``harness bench-compare`` would judge two commits.

TensorFlow runs in subprocesses (one process per device layout); the rest is fast.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.bench.convergence import UNREACHED_FACTOR, ConvergenceResult, Goal
from harness.ci.benchgate import Verdict, judge

ROOT = Path(__file__).resolve().parents[2]
STEPS = "convergence.Convergence.track_steps_to_accuracy"
SECONDS = "convergence.Convergence.track_seconds_to_accuracy"
FINAL = "convergence.Convergence.track_final_accuracy"


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import common

    return common


def _result(steps, final, budget=120, seconds_run=7.5) -> ConvergenceResult:
    goal = Goal(target=0.9, budget=budget)
    run = steps or budget
    return ConvergenceResult(config={}, goal=goal, steps=steps, seconds=None if steps is None else seconds_run,
                             final_accuracy=final, steps_run=run, seconds_run=seconds_run, trace_seconds=1.0,
                             curve=((run, seconds_run, final),))


def test_a_missed_target_gives_finite_clearly_worse_figures():
    # asv records NaN as skipped: a run that never converges must be a number the gate compares, never NaN.
    reached, missed = _result(59, 0.95, seconds_run=4.0), _result(None, 0.18, seconds_run=8.0)
    assert (reached.steps_figure, reached.seconds_figure) == (59.0, 4.0)
    assert missed.steps_figure == UNREACHED_FACTOR * 120 == 240.0
    assert missed.seconds_figure == UNREACHED_FACTOR * 8.0
    assert all(math.isfinite(v) for v in (missed.steps_figure, missed.seconds_figure, missed.final_accuracy))
    assert not missed.reached and reached.reached
    saved = json.loads(json.dumps(missed.to_json()))  # what asv's setup_cache keeps
    assert (saved["steps_figure"], saved["reached"], saved["final_accuracy"]) == (240.0, False, 0.18)
    assert judge(STEPS, "steps", reached.steps_figure, missed.steps_figure) == (Verdict.WORSE, 240 / 59)
    assert judge(SECONDS, "s", reached.seconds_figure, missed.seconds_figure)[0] is Verdict.WORSE
    assert judge(FINAL, "accuracy", reached.final_accuracy, missed.final_accuracy)[0] is Verdict.WORSE
    assert judge(FINAL, "accuracy", 0.95, 0.96)[0] is Verdict.SAME


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"target": 0.0, "budget": 10}, "target must be an accuracy in (0, 1]; got target=0.0"),
    ({"target": 1.5, "budget": 10}, "target must be an accuracy in (0, 1]; got target=1.5"),
    ({"target": 0.9, "budget": 0}, "budget must be an int >= 1; got budget=0"),
    ({"target": 0.9, "budget": 10, "every": 2.5}, "every must be an int >= 1; got every=2.5"),
    ({"target": 0.9, "budget": 10, "held_out": True}, "held_out must be an int >= 1; got held_out=True"),
])
def test_goal_refuses_bad_values(kwargs, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Goal(**kwargs)


def test_the_mechanism_imports_no_tensorflow():
    code = ("import sys\nimport harness.bench.convergence\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_every_grid_has_goals_and_one_global_batch(common):
    from harness.bench import gridrun

    ci, smoke = common.GRIDS["ci"], common.GRIDS["smoke"]
    assert smoke.convergence_workloads == ci.convergence_workloads and smoke.convergence_batch == ci.convergence_batch
    assert set(smoke.convergence_device_counts) <= set(ci.convergence_device_counts)
    for grid in common.GRIDS.values():
        assert grid.convergence_workloads and grid.convergence_device_counts, grid.name
        for name in grid.convergence_workloads:
            assert isinstance(gridrun.convergence_goal(grid, name), Goal), grid.name
            assert grid.convergence_batch[name] >= 1, grid.name
    # Every device count and split trains the same global batch: their steps to accuracy compare.
    profiles = gridrun.convergence_profiles(ci)
    batches = {(split, n): gridrun.convergence_batches(ci, profiles, "mnist_maxing", split, n)
               for split in ("even", "ratio") for n in ci.convergence_device_counts}
    assert {sum(b) for b in batches.values()} == {ci.convergence_batch["mnist_maxing"]}
    assert batches["even", 3] == (40, 40, 40) and batches["ratio", 3] == (69, 34, 17)
    with pytest.raises(ValueError, match="a convergence split is even or ratio; got split='tuned'"):
        gridrun.convergence_batches(ci, profiles, "mnist_maxing", "tuned", 2)


def test_the_suite_skips_what_means_nothing_and_fails_what_failed(common, monkeypatch):
    monkeypatch.setenv(common.GRID_VARIABLE, "ci")
    from benchmarks import convergence

    suite = convergence.Convergence()
    results = {"mnist_maxing/towers/ratio/2": {"error": "OOM", "traceback": "..."},
               "mnist_maxing/mirrored/even/3": {"skip": "3 devices asked; this machine has 2"},
               "mnist_maxing/single/even/1": {**_result(None, 0.18).to_json(),
                                              "config": {"method": "single", "batches": [120]}}}
    with pytest.raises(NotImplementedError, match="method 'single' runs on one device"):
        suite.setup(results, "mnist_maxing", "single", "even", 2)
    with pytest.raises(NotImplementedError, match="this machine has 2"):
        suite.setup(results, "mnist_maxing", "mirrored", "even", 3)
    with pytest.raises(RuntimeError, match="towers ratio on 2 device"):
        suite.setup(results, "mnist_maxing", "towers", "ratio", 2)
    suite.setup(results, "mnist_maxing", "single", "even", 1)
    args = (results, "mnist_maxing", "single", "even", 1)
    assert (suite.track_steps_to_accuracy(*args), suite.track_seconds_to_accuracy(*args),
            suite.track_final_accuracy(*args)) == (240.0, 15.0, 0.18)


# One process: the correct code twice (an unchanged rerun), then with the planted bug. The goal, devices
# and split are the ci grid's own (benchmarks/common.py, harness.bench.gridrun), as the asv suite trains them.
_PLANTED = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    os.environ["HARNESS_BENCH_GRID"] = "ci"
    from benchmarks import common
    from harness.bench.convergence import train_to_accuracy

    grid, gridrun = common.current_grid(), common.gridrun()
    method, split, devices = {combination!r}
    config = gridrun.convergence_config(grid, gridrun.convergence_profiles(grid), "mnist_maxing", method, split,
                                        devices)
    goal = gridrun.convergence_goal(grid, "mnist_maxing")
    runs = [train_to_accuracy(config, goal).to_json() for _ in range(2)]

    import tensorflow as tf
    from harness.parallel.adapters import keras3

    right = keras3.Keras3Adapter.loss

    def divided_by_rows_twice(self, model, y, y_pred, sample_weight):
        # The planted bug: the loss of the rows it covers (the whole batch for towers, a replica's slice
        # for mirrored) divided by their count twice more, as if a mean were a sum.
        loss = right(self, model, y, y_pred, sample_weight)
        rows = tf.cast(tf.shape(tf.nest.flatten(y)[0])[0], loss.dtype)
        return loss / (rows * rows)

    keras3.Keras3Adapter.loss = divided_by_rows_twice
    runs.append(train_to_accuracy(config, goal).to_json())
    print(json.dumps(runs))
""")


def _accuracy_at(run: dict, step: int) -> float:
    return next(accuracy for at, _, accuracy in run["curve"] if at >= step)


@pytest.mark.parametrize("combination", [
    pytest.param(("towers", "ratio", 2), id="towers-ratio-2", marks=pytest.mark.extended),  # ~30 s; .ci/run runs it
    pytest.param(("mirrored", "ratio", 3), id="mirrored-ratio-3", marks=pytest.mark.slow),
])
def test_a_wrongly_scaled_loss_is_flagged_by_time_to_accuracy(combination, keras3):
    # A training change that halves the accuracy while keeping samples/s is flagged.
    # The bug is planted in the Keras 3 adapter (harness.parallel.adapters.keras3): Keras 3 only.
    code = _PLANTED.format(root=str(ROOT), combination=combination)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    base, rerun, bug = json.loads(done.stdout.strip().splitlines()[-1])
    assert base["reached"] and base["steps"] <= base["goal"]["budget"] / 2, base  # comfortably within the budget
    # Unchanged code: the same steps and accuracy (the same weights, data and float work), no verdict. Its
    # seconds are not judged here: a timing on a shared CPU (the bug's below moves them by far more than noise).
    assert rerun["steps"] == base["steps"]
    for name, unit, key in ((STEPS, "steps", "steps_figure"), (FINAL, "accuracy", "final_accuracy")):
        assert judge(name, unit, base[key], rerun[key], factor=1.1)[0] is Verdict.SAME, (name, base, rerun)
    # The bug: each step as fast (the emulated devices' speed: samples/s kept; a loose bound, the host may be
    # busy), the held-out accuracy at the correct run's steps under half of the correct one ...
    assert bug["seconds_run"] / bug["steps_run"] == pytest.approx(base["seconds_run"] / base["steps_run"], rel=0.25)
    assert _accuracy_at(bug, base["steps"]) < base["final_accuracy"] / 2, bug["curve"]
    # ... and the time-to-accuracy figures say so.
    assert judge(STEPS, "steps", base["steps_figure"], bug["steps_figure"], factor=1.1)[0] is Verdict.WORSE
    assert judge(SECONDS, "s", base["seconds_figure"], bug["seconds_figure"], factor=1.1)[0] is Verdict.WORSE
