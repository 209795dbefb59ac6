"""benchmarks/common.py: the grid choice, skipped combinations, and the library on old commits' harness.

What a combination runs (profiles, splits, run configs) is tested with harness.bench.gridrun
(tests/unit/test_gridrun.py)."""

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
    # asv imports every suite to discover benchmarks; TF belongs in setup and bodies only. Nor NumPy: every
    # combination's process imports the suites (~110 processes in a --quick run of the ci grid, most of them
    # reading a figure from a setup_cache), and NumPy was 0.12 s of each one's 0.27 s.
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            + "".join(f"import benchmarks.{name}\n" for name in SUITES)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'numpy')))")
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
    # The same devices at 15% of the speed: a busy 2-core machine must not be host-bound in a smoke run.
    assert parse_emulate(smoke.emulate) == tuple(EmulatedDevice(d.rate * 0.15, d.max_batch, d.overhead_ms)
                                                 for d in parse_emulate(ci.emulate))


def test_a_slow_host_slows_the_smoke_grid_and_nothing_else(common, monkeypatch):
    # tests/ci/test_asv_suite.py passes the rate its calibration of the host allows: each set of emulated devices
    # keeps its ratios, batches and overheads, its fastest device at that rate; the overlap's link slows alike.
    from harness.emulate import parse_emulate, parse_link

    smoke = common.GRIDS["smoke"]
    monkeypatch.setenv(common.GRID_VARIABLE, "smoke")
    monkeypatch.setenv(common.SMOKE_MAX_RATE_VARIABLE, "250")
    slowed = common.current_grid()
    for name in ("emulate", "tune_emulate"):
        before, after = parse_emulate(getattr(smoke, name)), parse_emulate(getattr(slowed, name))
        factor = 250 / max(d.rate for d in before)
        assert [d.rate for d in after] == pytest.approx([d.rate * factor for d in before]), name
        assert [(d.max_batch, d.overhead_ms) for d in after] == [(d.max_batch, d.overhead_ms) for d in before], name
    factor = 250 / max(d.rate for d in parse_emulate(smoke.emulate))
    assert parse_link(slowed.overlap_link).gb_per_s == pytest.approx(parse_link(smoke.overlap_link).gb_per_s * factor,
                                                                 rel=1e-5)
    assert (slowed.batch_per_device, slowed.seconds, slowed.tune_options) == (smoke.batch_per_device, smoke.seconds,
                                                                               smoke.tune_options)
    monkeypatch.setenv(common.SMOKE_MAX_RATE_VARIABLE, "100000")  # a fast host: the grid as it is
    assert common.current_grid() == smoke
    monkeypatch.setenv(common.SMOKE_MAX_RATE_VARIABLE, "250")
    monkeypatch.setenv(common.GRID_VARIABLE, "ci")  # the ci grid's history must not move with the host
    with pytest.raises(ValueError, match="slows the smoke grid only .*HARNESS_BENCH_GRID='ci'"):
        common.current_grid()
    monkeypatch.setenv(common.GRID_VARIABLE, "smoke")
    for bad in ("fast", "0", "-250", "inf", "nan"):
        monkeypatch.setenv(common.SMOKE_MAX_RATE_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"HARNESS_BENCH_SMOKE_MAX_RATE must be a rate .*got {bad!r}"):
            common.current_grid()


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


# One process: every ci combination's RunConfig (or skip) through the installed harness.bench.gridrun, then as on
# an older commit whose harness lacks that module and harness.bench.tuning.splits: common.gridrun() loads this
# checkout's copy by path and the split falls back to its own arithmetic. Both create the same device layout.
_OLD_COMMIT = """
import itertools, json, sys
sys.path.insert(0, {root!r})
from benchmarks import common

def table():
    grid, lib = common.current_grid(), common.gridrun()
    out = {{"module": lib.__name__}}
    profiles = lib.device_profiles(grid)
    for w, m, s, n in itertools.product(grid.workloads, common.METHODS, common.SPLITS, grid.device_counts):
        try:
            common.check_combination(m, s, n)
            c = lib.run_config(grid, profiles, w, m, s, n)
            out[f"{{w}}/{{m}}/{{s}}/{{n}}"] = [c.method, c.devices, c.batches, repr(c.emulate), c.seconds, c.windows]
        except NotImplementedError as err:
            out[f"{{w}}/{{m}}/{{s}}/{{n}}"] = "skipped"
    convergence = lib.convergence_profiles(grid)
    out["convergence"] = lib.convergence_config(grid, convergence, "mnist_maxing", "towers", "ratio", 3).batches
    return out

today = table()
sys.modules["harness.bench.gridrun"] = None  # an older commit's harness: neither module imports
sys.modules["harness.bench.tuning.splits"] = None
older = table()
print(json.dumps([today, older]))
"""


def test_an_older_commits_harness_runs_this_checkouts_gridrun(tmp_path):
    env = {**os.environ, "HARNESS_BENCH_GRID": "ci", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", _OLD_COMMIT.format(root=str(ROOT))], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    today, older = json.loads(done.stdout.strip().splitlines()[-1])
    assert today.pop("module") == "harness.bench.gridrun"
    assert older.pop("module") == "benchmarks._gridrun_of_this_checkout"
    assert older == today
    # What the ci grid measured before harness.bench.gridrun existed (benchmarks/common.py then).
    assert today["mnist_maxing/mirrored/tuned/3"][:3] == ["mirrored", ["/device:CPU:0", "/device:CPU:1",
                                                                       "/device:CPU:2"], [213, 101, 46]]
    assert today["mnist_maxing/towers/ratio/2"][2] == [160, 80]
    assert today["mnist_maxing/single/even/1"][:3] == ["single", ["/device:CPU:0"], [120]]
    assert today["mnist_maxing/keras/even/3"][2] == [120, 120, 120]
    assert today["mnist_maxing/single/even/2"] == today["mnist_maxing/keras/tuned/3"] == "skipped"
    assert sum(v != "skipped" for k, v in today.items() if k != "convergence") == 16
    assert today["convergence"] == [69, 34, 17]


def test_without_a_copy_an_older_commit_skips_with_the_reason(common, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "harness.bench.gridrun", None)
    monkeypatch.setattr(common, "__file__", str(tmp_path / "benchmarks" / "common.py"))
    with pytest.raises(NotImplementedError, match=r"this commit's harness predates harness\.bench\.gridrun, and "
                                                  r"this checkout has no .*gridrun\.py"):
        common.gridrun()
    monkeypatch.setattr(common, "__file__", str(ROOT / "benchmarks" / "common.py"))
    assert common.gridrun().__file__ == str(ROOT / "harness" / "bench" / "gridrun.py")


def test_skip_says_why_on_stderr(common, capsys):
    with pytest.raises(NotImplementedError, match="^no GPU memory$"):
        common.skip("no GPU memory")
    assert capsys.readouterr().err == "harness benchmark skipped: no GPU memory\n"


def test_asv_config_pins_tensorflow_and_keeps_output_in_dot_asv():
    conf = json.loads((ROOT / "asv.conf.json").read_text())  # strict JSON: no comments
    assert conf["matrix"]["req"]["tensorflow-cpu"] == ["2.21.0"]
    assert conf["launch_method"] == "spawn" and conf["benchmark_dir"] == "benchmarks"
    assert all(conf[key].startswith(".asv/") for key in ("results_dir", "html_dir", "env_dir"))
    assert ".asv/" in (ROOT / ".gitignore").read_text().split()


def test_one_process_runs_every_combination_and_keeps_each_ones_outcome(common, monkeypatch):
    # The emulated grid's run_one benchmarks read their figures from one setup_cache: a run's result (whose own
    # "error" is None when it completed), a meaningless combination's skip, a raising run's error with its
    # traceback, each where it belongs; one raising run does not take the others along. The runs themselves
    # stand in here (tests/ci/test_asv_suite.py runs the real ones).
    monkeypatch.setenv(common.GRID_VARIABLE, "ci")
    from benchmarks import throughput

    class Runs:
        def run_config(self, grid, profiles, workload, method, split, count):
            return (method, split, count)

        def overlap_configs(self, grid, profiles, workload, method, count):
            return ("staged", method, count), ("unstaged", method, count)

        def run(self, config):
            if config == ("mirrored", "ratio", 2):
                raise ValueError("planted")
            return {"config": {"method": config[0], "batches": [1]}, "status": "complete", "error": None,
                    "summary": {"samples_per_second": {"median": 100.0 * config[-1]}}}

    monkeypatch.setattr(common, "gridrun", Runs)
    monkeypatch.setattr(common, "setup_profiles", lambda: {"profiles": "of the grid"})
    monkeypatch.setattr(common, "refuse_host_bound", lambda entries, what: None)
    cache = throughput.run_every_combination()
    assert cache["profiles"] == {"profiles": "of the grid"}
    bench = throughput.Throughput()
    bench.setup(cache, "mnist_maxing", "towers", "tuned", 3)
    assert bench.track_samples_per_second(cache, "mnist_maxing", "towers", "tuned", 3) == 300.0
    with pytest.raises(NotImplementedError, match="method 'single' runs on one device"):
        bench.setup(cache, "mnist_maxing", "single", "even", 2)
    with pytest.raises(RuntimeError, match=r"mnist_maxing/mirrored/ratio/2: ValueError: planted\n.*Traceback"):
        bench.setup(cache, "mnist_maxing", "mirrored", "ratio", 2)
    bench.setup(cache, "mnist_maxing", "mirrored", "ratio", 3)  # the run after the raising one still ran
    versus = throughput.VersusStock()
    versus.setup(cache, "mnist_maxing", "mirrored", 3)
    assert versus.track_ratio_to_stock(cache, "mnist_maxing", "mirrored", 3) == 1.0
    overlap = throughput.Overlap()
    overlap.setup(cache, "mnist_maxing", "towers", 3)
    assert overlap.track_overlap_gain(cache, "mnist_maxing", "towers", 3) == 1.0
    order = list(cache["runs"])  # the stock baseline between harness' two methods on the same devices
    assert order.index("mnist_maxing/keras/even/3") == order.index("mnist_maxing/towers/even/3") + 1
    assert order.index("mnist_maxing/mirrored/even/3") == order.index("mnist_maxing/keras/even/3") + 1
