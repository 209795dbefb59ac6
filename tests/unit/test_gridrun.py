"""harness.bench.gridrun: a benchmark grid's profiles, splits and run configs (no TensorFlow).

The pinned batches are the ones the asv suites measured before this module existed (the ci and
smoke grids of benchmarks/common.py): a change to any of them starts a new asv history.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.bench import gridrun
from harness.bench.tuning.solver import StepModel, predict
from harness.bench.tuning.splits import TUNED_MARGIN

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"fixed_s": 0.002, "per_sample_s": 0.001, "ceiling": 400},
        {"fixed_s": 0.004, "per_sample_s": 0.002, "ceiling": None},
        {"fixed_s": 0.001, "per_sample_s": 0.003, "ceiling": 150},
        {"fixed_s": 0.0, "per_sample_s": 0.001, "ceiling": 2000}]  # profiled GPUs, made up


@pytest.fixture
def grids(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import common

    return common.GRIDS


def test_emulated_devices_are_profiled_from_their_spec(grids):
    profiles = gridrun.device_profiles(grids["ci"])  # 2000::5, 1000::10, 500::20
    assert profiles == {"source": "emulated", "workloads": {"mnist_maxing": [
        {"fixed_s": 0.005, "per_sample_s": 1 / 2000, "ceiling": None},
        {"fixed_s": 0.01, "per_sample_s": 1 / 1000, "ceiling": None},
        {"fixed_s": 0.02, "per_sample_s": 1 / 500, "ceiling": None}]}}
    assert gridrun.convergence_profiles(grids["ci"]) == profiles
    assert [d.rate for d in gridrun.emulated(grids["ci"], 2)] == [2000.0, 1000.0]
    assert gridrun.emulated(grids["full"], 2) is None


@pytest.mark.parametrize(("grid", "split", "count", "batches"), [
    ("ci", "even", 1, (120,)), ("ci", "even", 3, (120, 120, 120)),
    ("ci", "ratio", 2, (160, 80)), ("ci", "ratio", 3, (206, 103, 51)),
    ("ci", "tuned", 1, (120,)), ("ci", "tuned", 2, (163, 77)), ("ci", "tuned", 3, (213, 101, 46)),
    ("smoke", "tuned", 2, (161, 79)), ("smoke", "tuned", 3, (207, 103, 50)),
])
def test_the_grids_splits_are_the_ones_asv_measured(grids, grid, split, count, batches):
    profiles = gridrun.device_profiles(grids[grid])
    assert gridrun.split_batches(grids[grid], profiles, "mnist_maxing", split, count) == batches


def test_the_tuned_split_counts_the_fixed_cost_the_ratio_split_ignores(grids):
    ci = grids["ci"]
    profiles = gridrun.device_profiles(ci)
    ratio, tuned = (gridrun.split_batches(ci, profiles, "mnist_maxing", s, 3) for s in ("ratio", "tuned"))
    models = [StepModel(r["fixed_s"], r["per_sample_s"]) for r in profiles["workloads"]["mnist_maxing"]]
    assert predict(models, tuned).samples_per_second > predict(models, ratio).samples_per_second * 1.05


def test_convergence_splits_keep_one_global_batch(grids):
    ci = grids["ci"]
    profiles = gridrun.convergence_profiles(ci)
    assert gridrun.convergence_batches(ci, profiles, "mnist_maxing", "even", 3) == (40, 40, 40)
    assert gridrun.convergence_batches(ci, profiles, "mnist_maxing", "ratio", 2) == (80, 40)
    assert gridrun.convergence_batches(ci, profiles, "mnist_maxing", "ratio", 3) == (69, 34, 17)
    with pytest.raises(ValueError, match="a convergence split is even or ratio; got split='tuned'"):
        gridrun.convergence_batches(ci, profiles, "mnist_maxing", "tuned", 2)
    with pytest.raises(NotImplementedError, match="no device profile of 'gru_stack'"):
        gridrun.convergence_batches(ci, profiles, "gru_stack", "even", 2)
    assert gridrun.convergence_goal(ci, "mnist_maxing").target == 0.9


def test_profiled_ceilings_bound_every_split(grids):
    full = grids["full"]  # 694 a device
    profiles = {"source": "profiled", "workloads": {"mnist_maxing": ROWS}}
    assert gridrun.split_batches(full, profiles, "mnist_maxing", "tuned", 3) == (380, 1560, 142)
    assert gridrun.split_batches(full, profiles, "mnist_maxing", "tuned", 4) == (380, 750, 142, 1504)
    assert 380 == int(400 * (1 - TUNED_MARGIN)) and 142 == int(150 * (1 - TUNED_MARGIN))
    with pytest.raises(NotImplementedError, match=r"^ratio split \[925, 463\] exceeds memory ceilings \(device, "
                                                  r"batch, ceiling\): \[\(0, 925, 400\)\]$"):
        gridrun.split_batches(full, profiles, "mnist_maxing", "ratio", 2)
    with pytest.raises(NotImplementedError, match=r"global batch 694 exceeds the devices' memory together"):
        gridrun.split_batches(full, profiles, "mnist_maxing", "tuned", 1)
    with pytest.raises(NotImplementedError, match="^no GPU$"):
        gridrun.split_batches(full, {"error": "no GPU"}, "mnist_maxing", "even", 2)


def test_without_the_splits_module_the_same_arithmetic_runs_here(grids, monkeypatch):
    # An older commit's harness has no harness.bench.tuning.splits: the fallback gives the same batches.
    full = grids["full"]
    profiles = {"source": "profiled", "workloads": {w: ROWS for w in full.workloads}}
    cases = [(w, s, n) for w in full.workloads for s in ("even", "ratio", "tuned") for n in full.device_counts]

    def outcomes():
        out = []
        for case in cases:
            try:
                out.append(gridrun.split_batches(full, profiles, *case))
            except NotImplementedError:
                out.append(None)
        return out

    shared = outcomes()
    monkeypatch.setitem(sys.modules, "harness.bench.tuning.splits", None)  # its import fails
    assert outcomes() == shared and shared.count(None) < len(cases)
    with pytest.raises(NotImplementedError, match=r"global batch 694 exceeds the devices' usable memory \[380\]"):
        gridrun.split_batches(full, profiles, "mnist_maxing", "tuned", 1)


def test_a_machine_without_gpus_cannot_profile_the_full_grid(grids, monkeypatch):
    def no_gpus(grid):
        raise NotImplementedError("the full grid runs on GPUs; TensorFlow sees none here")

    monkeypatch.setattr(gridrun, "_create_layout", no_gpus)
    monkeypatch.setattr(gridrun, "_LAYOUT", [])
    assert gridrun.device_profiles(grids["full"]) == {"error": "the full grid runs on GPUs; TensorFlow sees none here"}
    assert gridrun.tune_record(grids["full"]) == {"error": "the full grid runs on GPUs; TensorFlow sees none here"}
    with pytest.raises(NotImplementedError, match="sees none here"):
        gridrun.use_devices(grids["full"], 1)


def test_a_combination_takes_the_first_devices_of_one_layout(grids, monkeypatch):
    monkeypatch.setattr(gridrun, "_LAYOUT", ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"])  # as if created
    ci = grids["ci"]
    profiles = gridrun.device_profiles(ci)
    config = gridrun.run_config(ci, profiles, "mnist_maxing", "mirrored", "tuned", 2)
    assert (config.method, config.devices, config.batches) == ("mirrored", ("/device:CPU:0", "/device:CPU:1"),
                                                               (163, 77))
    assert [d.rate for d in config.emulate] == [2000.0, 1000.0]
    assert (config.size, config.seconds, config.windows, config.warmup_steps) == ("tiny", 0.25, 3, 2)
    with pytest.raises(NotImplementedError, match="4 devices asked; this machine has 3"):
        gridrun.run_config(ci, profiles, "mnist_maxing", "mirrored", "even", 4)
    converge = gridrun.convergence_config(ci, gridrun.convergence_profiles(ci), "mnist_maxing", "towers", "ratio", 3)
    assert (converge.batches, converge.size, len(converge.emulate)) == ((69, 34, 17), "tiny", 3)


def test_a_tuned_split_that_leaves_devices_out_runs_without_them(grids, monkeypatch):
    monkeypatch.setattr(gridrun, "_LAYOUT", ["/device:GPU:0", "/device:GPU:1"])
    slow = {"fixed_s": 0.5, "per_sample_s": 0.1, "ceiling": None}  # far slower than the other: left out
    fast = {"fixed_s": 0.0, "per_sample_s": 1e-5, "ceiling": None}
    profiles = {"source": "profiled", "workloads": {"mnist_maxing": [slow, fast]}}
    config = gridrun.run_config(grids["full"], profiles, "mnist_maxing", "mirrored", "tuned", 2)
    assert (config.method, config.devices, config.batches, config.emulate) == ("single", ("/device:GPU:1",),
                                                                               (1388,), None)


def test_emulated_profiles_and_splits_import_no_tensorflow():
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks import common\n"
            "from harness.bench import gridrun\n"
            "grid = common.GRIDS['ci']\n"
            "gridrun.split_batches(grid, gridrun.device_profiles(grid), 'mnist_maxing', 'tuned', 3)\n"
            "gridrun.convergence_batches(grid, gridrun.convergence_profiles(grid), 'mnist_maxing', 'ratio', 3)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'asv', 'asv_runner')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_the_module_imports_only_the_standard_library_at_module_level():
    # benchmarks/common.py loads this file by path on an older commit's harness: nothing newer may load with it.
    code = ("import sys\nimport harness.bench\nbefore = set(sys.modules)\nimport harness.bench.gridrun\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('harness')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "['harness.bench.gridrun']"


@pytest.mark.parametrize("without_splits_module", [False, True])
def test_an_unknown_split_is_refused(grids, monkeypatch, without_splits_module):
    if without_splits_module:
        monkeypatch.setitem(sys.modules, "harness.bench.tuning.splits", None)
    profiles = gridrun.device_profiles(grids["ci"])
    with pytest.raises(ValueError, match="split must be one of even, ratio, tuned; got 'uneven'"):
        gridrun.split_batches(grids["ci"], profiles, "mnist_maxing", "uneven", 2)
