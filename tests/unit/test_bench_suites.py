"""The asv suites' fixtures without TensorFlow: grid choice, skipped combinations, splits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("common", "throughput", "fidelity", "tuner", "startup", "multiworker", "convergence")


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import common

    return common


def test_importing_the_suites_imports_no_tensorflow():
    # asv imports every suite to discover benchmarks; TF belongs in setup and bodies only.
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            + "".join(f"import benchmarks.{name}\n" for name in SUITES)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    for grid in ("ci", "smoke", "full"):
        env = {**os.environ, "HARNESS_BENCH_GRID": grid}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                             env=env).stdout
        assert out.strip() == "[]", (grid, out)


def test_discovering_the_suites_needs_no_harness_module_newer_than_the_runner():
    # The gate's and bisect's existing mode run this checkout's benchmarks against older commits' harness
    #: a module-level import of a newer harness module (benchmarks/common.py once imported
    # harness.bench.convergence for its Goal) makes discovery fail on every commit before that module.
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "import harness.bench.runner\n"
            "before = {m for m in sys.modules if m.startswith('harness')}\n"
            + "".join(f"import benchmarks.{name}\n" for name in SUITES)
            + "print(sorted(m for m in sys.modules if m.startswith('harness') and m not in before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]", out


def test_the_grid_comes_from_one_variable(common, monkeypatch):
    monkeypatch.delenv(common.GRID_VARIABLE, raising=False)
    assert common.current_grid().name == "ci"
    monkeypatch.setenv(common.GRID_VARIABLE, "full")
    assert common.current_grid().emulate is None
    monkeypatch.setenv(common.GRID_VARIABLE, "gpu")
    with pytest.raises(ValueError, match="HARNESS_BENCH_GRID must be one of ci, smoke, full; got 'gpu'"):
        common.current_grid()


def test_smoke_keeps_the_ci_parameters(common):
    from harness.emulate import EmulatedDevice, parse_emulate

    ci, smoke = common.GRIDS["ci"], common.GRIDS["smoke"]
    for name in ("workloads", "size", "device_counts", "batch_per_device", "fidelity_workloads",
                 "fidelity_device_counts"):
        assert getattr(ci, name) == getattr(smoke, name), name
    # The same devices at a quarter of the speed: a busy 2-core machine must not be host-bound in a smoke run.
    assert parse_emulate(smoke.emulate) == tuple(EmulatedDevice(d.rate / 4, d.max_batch, d.overhead_ms)
                                                 for d in parse_emulate(ci.emulate))


def test_host_bound_figures_are_skipped_with_the_reason(common, capsys):
    common.refuse_host_bound([], "towers with batches [60, 60]")  # nothing host-bound: nothing happens
    entry = {"device": "/device:CPU:0", "emulated_rate": 40000.0, "host_rate": 9000.0, "late_share": 1.0}
    with pytest.raises(NotImplementedError) as info:  # asv's SkipNotImplemented is one: asv records a skip
        common.refuse_host_bound([entry], "towers with batches [60, 60]")
    assert "towers with batches [60, 60]: host-bound: /device:CPU:0 emulates 40000 samples/s" in str(info.value)
    assert "harness benchmark skipped: towers with batches [60, 60]: host-bound" in capsys.readouterr().err


@pytest.mark.parametrize(("method", "split", "count", "why"), [
    ("single", "even", 2, "method 'single' runs on one device; got devices=2"),
    ("towers", "ratio", 1, "one device has only the even split; got split='ratio'"),
    ("mirrored", "tuned", 1, "one device has only the even split; got split='tuned'"),
    ("towers", "even", 1, "method 'towers' on one device is the 'single' combination; got devices=1"),
    ("keras", "ratio", 2, "method 'keras' (stock MirroredStrategy) splits evenly; got split='ratio'"),
])
def test_meaningless_combinations_are_skipped(common, method, split, count, why):
    with pytest.raises(NotImplementedError, match=why.replace("(", r"\(").replace(")", r"\)")):
        common.check_combination(method, split, count)


@pytest.mark.parametrize(("method", "split", "count"), [("single", "even", 1), ("towers", "even", 2),
                                                         ("mirrored", "tuned", 3), ("keras", "even", 1),
                                                         ("keras", "even", 3)])
def test_meaningful_combinations_run(common, method, split, count):
    common.check_combination(method, split, count)


def test_ci_splits_come_from_the_emulated_devices(common):
    from harness.bench.tuning.solver import StepModel, predict

    grid = common.GRIDS["ci"]
    profiles = common.device_profiles(grid)
    assert profiles["source"] == "emulated"
    even = common.split_batches(grid, profiles, "mnist_maxing", "even", 3)
    ratio = common.split_batches(grid, profiles, "mnist_maxing", "ratio", 3)
    tuned = common.split_batches(grid, profiles, "mnist_maxing", "tuned", 3)
    assert even == (120, 120, 120) and sum(ratio) == sum(tuned) == 360
    assert ratio[0] > ratio[1] > ratio[2]
    # The emulated devices have a fixed cost per step, which the ratio split ignores and the tuner does not.
    models = [StepModel(r["fixed_s"], r["per_sample_s"]) for r in profiles["workloads"]["mnist_maxing"]]
    assert predict(models, tuned).samples_per_second > predict(models, ratio).samples_per_second * 1.05
    assert common.split_batches(grid, profiles, "mnist_maxing", "even", 1) == (120,)


def test_device_profiles_of_emulated_devices_import_no_tensorflow():
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks import common\n"
            "grid = common.GRIDS['ci']\n"
            "p = common.device_profiles(grid)\n"
            "common.split_batches(grid, p, 'mnist_maxing', 'tuned', 3)\n"
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "False"


def test_a_split_beyond_a_memory_ceiling_is_skipped(common):
    grid = common.GRIDS["ci"]
    rows = [{"fixed_s": 0.0, "per_sample_s": 1e-3, "ceiling": 100}, {"fixed_s": 0.0, "per_sample_s": 1e-3,
                                                                       "ceiling": 200}]
    profiles = {"source": "profiled", "workloads": {"mnist_maxing": rows}}
    with pytest.raises(NotImplementedError, match=r"even split \[120, 120\] exceeds memory ceilings"):
        common.split_batches(grid, profiles, "mnist_maxing", "even", 2)
    assert common.split_batches(grid, profiles, "mnist_maxing", "tuned", 2)[0] <= 95  # 5% margin
    with pytest.raises(NotImplementedError, match="no GPU"):
        common.split_batches(grid, {"error": "no GPU"}, "mnist_maxing", "even", 2)


def test_asv_config_pins_tensorflow_and_keeps_output_in_dot_asv():
    conf = json.loads((ROOT / "asv.conf.json").read_text())  # strict JSON: no comments
    assert conf["matrix"]["req"]["tensorflow-cpu"] == ["2.21.0"]
    assert conf["launch_method"] == "spawn" and conf["benchmark_dir"] == "benchmarks"
    assert all(conf[key].startswith(".asv/") for key in ("results_dir", "html_dir", "env_dir"))
    assert ".asv/" in (ROOT / ".gitignore").read_text().split()
