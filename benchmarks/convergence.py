"""Time to accuracy: steps, seconds and final held-out accuracy of training to a fixed target.

A change that keeps samples/s but slows or breaks convergence (seed 001: two GPUs
that train at speed and reach half the accuracy) shows here and not in the
throughput suite. Each combination trains the grid's convergence workload with
``harness.bench.convergence.train_to_accuracy``: the same global batch (whatever the
device count), the same initial weights and the same data for every method and
split, the held-out accuracy evaluated every ``Goal.every`` steps, until it reaches
the grid's target or the step budget runs out. harness' steps are exact, so single,
even and ratio reach the target at the same step (up to float rounding); seconds
differ by the split's speed (on the ci grid: the emulated devices').

A run that misses the target records finite, clearly worse figures, never NaN (asv
would show NaN as skipped and hide the regression): twice the budget in steps,
twice the budget's seconds; its final accuracy is the last evaluation's.

Every combination trains once, in ``setup_cache`` (one TensorFlow process for all of
them; the three ``track_`` benchmarks of a combination read the same run). The
seconds of a run whose emulated devices were host-bound are skipped, with the
reason on stderr; its steps and accuracy still count (they do not depend on speed).
"""

from __future__ import annotations

import itertools

from . import common

GRID = common.current_grid()
PARAMS = [list(GRID.convergence_workloads), ["single", "towers", "mirrored"], ["even", "ratio"],
          list(GRID.convergence_device_counts)]


def _key(workload: str, method: str, split: str, devices: int) -> str:
    return f"{workload}/{method}/{split}/{devices}"


def train_every_combination() -> dict:
    """asv ``setup_cache``: ``{combination key: ConvergenceResult.to_json() | {"skip": why} | {"error": why}}``.

    Meaningless combinations and ones this machine cannot run are recorded as skipped; a run that raises is
    recorded as an error (its benchmarks fail in ``setup``), and the other combinations still train.
    """
    import gc
    import traceback

    from harness.bench.convergence import train_to_accuracy

    grid = common.current_grid()
    gridrun = common.gridrun()
    profiles = gridrun.convergence_profiles(grid)
    out: dict[str, dict] = {}
    for workload, method, split, devices in itertools.product(*PARAMS):
        key = _key(workload, method, split, devices)
        try:
            common.check_combination(method, split, devices)
            config = gridrun.convergence_config(grid, profiles, workload, method, split, devices)
        except NotImplementedError as err:
            out[key] = {"skip": str(err)}
            continue
        try:
            out[key] = train_to_accuracy(config, gridrun.convergence_goal(grid, workload)).to_json()
        except Exception as err:  # noqa: BLE001  # one failing combination must not take the others' figures along
            out[key] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gc.collect()
    return out


train_every_combination.timeout = GRID.convergence_timeout  # type: ignore[attr-defined]  # asv reads it


class Convergence:
    """Steps, seconds and final accuracy of training to the grid's target, per workload, method, split, devices."""

    params = PARAMS
    param_names = ["workload", "method", "split", "devices"]
    timeout = GRID.timeout
    setup_cache = staticmethod(train_every_combination)

    def setup(self, results, workload, method, split, devices):
        common.check_combination(method, split, devices)
        entry = results[_key(workload, method, split, devices)]
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])
        if "error" in entry:
            raise RuntimeError(f"{method} {split} on {devices} device(s): {entry['error']}\n{entry['traceback']}")
        self.result = entry

    def track_steps_to_accuracy(self, results, workload, method, split, devices):
        return self.result["steps_figure"]

    track_steps_to_accuracy.unit = "steps"

    def track_seconds_to_accuracy(self, results, workload, method, split, devices):
        config = self.result["config"]
        common.refuse_host_bound(self.result["host_bound"], f"{config['method']} with batches {config['batches']}")
        return self.result["seconds_figure"]

    track_seconds_to_accuracy.unit = "s"

    def track_final_accuracy(self, results, workload, method, split, devices):
        return self.result["final_accuracy"]

    track_final_accuracy.unit = "accuracy"
