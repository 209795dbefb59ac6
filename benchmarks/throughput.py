"""Throughput per workload, method, split and device count: samples/s, step time, memory.

``track_samples_per_second`` is ``harness run``: ``harness.bench.runner.run_one``
with the grid's windows, the median window's samples/s. The step benchmarks
build the model with ``harness.bench.runner.build_model``, as ``run_one`` does, and
time one ``train_on_batch`` of a prepared batch (it returns the loss as NumPy:
the host waits for the device work, so each timed call ends synchronised).

On the ci grid the devices are emulated: every figure is an emulated figure,
and a combination whose emulated devices this host could not slow down to
their rates (host-bound: the figure would be this CPU's speed) is skipped
with the reason on stderr instead of being recorded.

Where the devices are emulated, the ``run_one`` benchmarks (``Throughput``,
``VersusStock``, ``Overlap``) run every combination once, in one TensorFlow
process (``setup_cache``: ``run_every_combination``), and read their figures
from it: an emulated device's figure does not depend on what ran before it in
the process, and a process per combination spent most of its time importing
TensorFlow. On real GPUs each combination keeps its own process (a process
keeps the GPU memory pool its earlier runs left). The step and memory
benchmarks keep their own processes everywhere: their figures are a process'.
"""

from __future__ import annotations

import itertools

from . import common

GRID = common.current_grid()
PARAMS = [list(GRID.workloads), list(common.METHODS), list(common.SPLITS), list(GRID.device_counts)]
PARAM_NAMES = ["workload", "method", "split", "devices"]
# The step timings and memory peaks follow the samples/s track closely: on the ci grid they keep its
# widest case (the even split of the most devices, and one device), one TensorFlow process each.
STEP_PARAMS = PARAMS if GRID.emulate is None else [
    list(GRID.workloads), list(common.METHODS), ["even"], sorted({1, max(GRID.device_counts)})]


def _key(*combination) -> str:
    return "/".join(str(part) for part in combination)


def _runs_in_order():
    """Every ``run_one`` the emulated grid's benchmarks read, as ``(key, kind, workload, method, split, count)``
    (kind ``"run"`` or ``"overlap"``, whose split is None): for each device count, the even split's runs first, the
    stock baseline between harness' two methods (``VersusStock`` compares each with it: measured next to each
    other), then the other splits, then the overlap's pair."""
    workloads, methods, splits, counts = PARAMS
    for workload, count in itertools.product(workloads, counts):
        evens = [m for m in ("single", "towers", "keras", "mirrored") if m in methods]
        for method, split in [(m, "even") for m in evens] + [(m, s) for s in splits if s != "even" for m in methods]:
            yield _key(workload, method, split, count), "run", workload, method, split, count
    for workload, method, count in itertools.product(*Overlap.params):
        yield _key("overlap", workload, method, count), "overlap", workload, method, None, count


def run_every_combination() -> dict:
    """asv ``setup_cache`` on emulated grids: ``{"profiles": setup_profiles(), "runs": {key: {"result": run_one's
    result, or the overlap's [with, without]} | {"skip": why} | {"raised": why, "traceback": ...}}}``.

    Meaningless combinations and ones this machine cannot run are recorded as skipped; a run that raises is
    recorded as an error (its benchmarks fail in ``setup``), and the other combinations still run.
    """
    import gc
    import sys
    import traceback

    grid = common.current_grid()
    gridrun = common.gridrun()
    profiles = common.setup_profiles()
    runs: dict[str, object] = {}
    for key, kind, workload, method, split, count in _runs_in_order():
        try:
            if kind == "run":
                common.check_combination(method, split, count)
                configs = [gridrun.run_config(grid, profiles, workload, method, split, count)]
            else:
                configs = list(gridrun.overlap_configs(grid, profiles, workload, method, count))
        except NotImplementedError as err:
            runs[key] = {"skip": str(err)}
            continue
        print(f"harness benchmark: running {key}", file=sys.stderr, flush=True)
        try:
            results = [gridrun.run(config) for config in configs]
            runs[key] = {"result": results[0] if kind == "run" else results}
        except Exception as err:  # noqa: BLE001  # one failing combination must not take the others' figures along
            runs[key] = {"raised": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gc.collect()
    return {"profiles": profiles, "runs": runs}


run_every_combination.timeout = 900.0  # type: ignore[attr-defined]  # asv reads it: ~20 runs of seconds each


def _cached(cache, key: str):
    """The cache's result for ``key`` (``run_every_combination``): a skip raises ``NotImplementedError`` (asv:
    skipped), a run that raised ``RuntimeError`` with its traceback. (A run that did not complete is a result:
    ``_samples_per_second`` raises on it.)"""
    entry = cache["runs"][key]
    if "skip" in entry:
        raise NotImplementedError(entry["skip"])
    if "raised" in entry:
        raise RuntimeError(f"{key}: {entry['raised']}\n{entry['traceback']}")
    return entry["result"]


_EMULATED = GRID.emulate is not None
# One process for every run_one benchmark where the devices are emulated; elsewhere the shared profiling.
_RUNS_CACHE = staticmethod(run_every_combination if _EMULATED else common.setup_profiles)


class _Combinations:
    """The throughput grid; ``setup_cache`` gives each device's step-time model (``harness.bench.gridrun``)."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = GRID.timeout
    # One function for every class: asv keys the cache by its module and line, so the GPUs are profiled once.
    setup_cache = staticmethod(common.setup_profiles)


class Throughput(_Combinations):
    """Samples/s of ``harness run`` for each combination."""

    setup_cache = _RUNS_CACHE

    def setup(self, cache, workload, method, split, devices):
        common.check_combination(method, split, devices)
        if _EMULATED:
            self.result = _cached(cache, _key(workload, method, split, devices))
        else:
            self.result = common.gridrun().run_config(GRID, cache, workload, method, split, devices)

    def track_samples_per_second(self, cache, workload, method, split, devices):
        return _samples_per_second(self.result)

    track_samples_per_second.unit = "samples/s"


class TrainStep(_Combinations):
    """Wall time of one training step on a prepared batch (ci grid: even split, one and all devices)."""

    params = STEP_PARAMS

    number = 1  # a call is a whole step (tens of ms to seconds): time each one
    repeat = GRID.repeat
    rounds = GRID.rounds
    warmup_time = 0  # setup already ran the warm-up steps

    def setup(self, profiles, workload, method, split, devices):
        if method == "keras":
            # Stock Keras 3's train_on_batch under a MirroredStrategy distributes each call's batch anew
            # (752 ms a call on the ci grid's 3 devices, against 266 ms a step in fit): not its step time.
            raise NotImplementedError("the stock baseline's steps are timed by fit (Throughput, VersusStock), "
                                      "not train_on_batch")
        common.check_combination(method, split, devices)
        gridrun = common.gridrun()
        config = gridrun.run_config(GRID, profiles, workload, method, split, devices)
        self.model, self.x, self.y = gridrun.prepared_step(config)
        common.refuse_host_bound(gridrun.host_bound_steps(config, self.model, self.x, self.y),
                                 f"{config.method} with batches {list(config.batches)}")

    def time_train_step(self, profiles, workload, method, split, devices):
        self.model.train_on_batch(self.x, self.y)  # returns NumPy: the host has waited for the step


class HostMemory(_Combinations):
    """Peak host memory (RSS) of a process that built the model and trained a step, even split.

    No split axis: the global batch is the same for every split, and measured
    host peaks differed by under 1% between even, ratio and tuned (each
    combination costs a TensorFlow process; ci time is better spent elsewhere).
    TensorFlow itself accounts for most of it (~600 MB on CPU). On emulated grids without the stock
    baseline: its peak is TensorFlow's and Keras' own (617 MB on one device beside ``single``'s 604 MB,
    707 MB on three beside ``mirrored``'s 711 MB, the ci grid on 2 cores), which ``single`` tracks too,
    and each combination costs a TensorFlow process.
    """

    params = [list(GRID.workloads), [m for m in common.METHODS if m != "keras" or GRID.emulate is None],
              STEP_PARAMS[3]]
    param_names = ["workload", "method", "devices"]

    def setup(self, profiles, workload, method, devices):
        common.check_combination(method, "even", devices)
        gridrun = common.gridrun()
        config = gridrun.run_config(GRID, profiles, workload, method, "even", devices)
        self.model, self.x, self.y = gridrun.prepared_step(config)

    def peakmem_train_step(self, profiles, workload, method, devices):
        self.model.train_on_batch(self.x, self.y)


class GpuMemory(_Combinations):
    """Peak GPU memory during one training step (weights included) on the first device used (full grid only)."""

    # Emulated grids have no GPU memory: one combination says so, instead of a process per combination.
    params = PARAMS if GRID.emulate is None else [list(GRID.workloads), ["single"], ["even"], [1]]

    def setup(self, profiles, workload, method, split, devices):
        if GRID.emulate is not None:
            raise NotImplementedError(f"the {GRID.name} grid runs on emulated devices: no GPU memory to measure")
        common.check_combination(method, split, devices)
        gridrun = common.gridrun()
        config = gridrun.run_config(GRID, profiles, workload, method, split, devices)
        self.model, self.x, self.y = gridrun.prepared_step(config)
        self.device = config.devices[0].replace("/device:", "")  # a tuned split may leave GPU:0 out

    def track_peak_gpu_memory_bytes(self, profiles, workload, method, split, devices):
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(self.device)  # the peak restarts from what is held now
        self.model.train_on_batch(self.x, self.y)
        return tf.config.experimental.get_memory_info(self.device)["peak"]

    track_peak_gpu_memory_bytes.unit = "bytes"


class VersusStock:
    """harness over the stock baseline on the same devices and even split, both run in one process.

    ``single`` over plain Keras on one device (the wrapper's overhead); ``towers``
    and ``mirrored`` over Keras ``fit`` under a stock MirroredStrategy (what the
    exact step costs or gains). Measured back to back, so a slower or busier
    machine moves both figures and not their ratio. On the ci grid both run on
    the emulated devices (``harness.bench.stock``): what remains is each side's work
    outside the devices.
    """

    params = [list(GRID.workloads), ["single", "towers", "mirrored"], STEP_PARAMS[3]]
    param_names = ["workload", "method", "devices"]
    timeout = GRID.timeout
    setup_cache = _RUNS_CACHE

    def setup(self, cache, workload, method, devices):
        common.check_combination(method, "even", devices)  # keras on the even split always is one
        if _EMULATED:
            self.ours, self.stock = (_cached(cache, _key(workload, m, "even", devices)) for m in (method, "keras"))
        else:
            gridrun = common.gridrun()
            self.ours = gridrun.run_config(GRID, cache, workload, method, "even", devices)
            self.stock = gridrun.run_config(GRID, cache, workload, "keras", "even", devices)

    def track_ratio_to_stock(self, cache, workload, method, devices):
        return _samples_per_second(self.ours) / _samples_per_second(self.stock)

    track_ratio_to_stock.unit = "harness/stock"


class Overlap:
    """Samples/s with the overlap over without it (``harness.parallel.staging``: each device's next slice copied
    while the step runs), both in one process, on the even split of the most devices.

    On the ci grid each emulated device gets a slow link (``overlap_link``: a slice's copy costs about the
    slowest device's step), so the figure is what hiding the copies gains; on GPUs, what it gains on their own
    links. Skipped on commits before the overlap.
    """

    # Towers only on the emulated grid (mirrored's gain is the same there: 1.953 against 1.957, the ci grid on 2
    # cores); both where the devices are real.
    params = [list(GRID.workloads), ["towers"] if GRID.emulate else ["towers", "mirrored"], [max(GRID.device_counts)]]
    param_names = ["workload", "method", "devices"]
    timeout = GRID.timeout
    setup_cache = _RUNS_CACHE

    def setup(self, cache, workload, method, devices):
        if _EMULATED:
            self.configs = _cached(cache, _key("overlap", workload, method, devices))
        else:
            self.configs = common.gridrun().overlap_configs(GRID, cache, workload, method, devices)

    def track_overlap_gain(self, cache, workload, method, devices):
        staged, unstaged = (_samples_per_second(config) for config in self.configs)
        return staged / unstaged

    track_overlap_gain.unit = "with/without"


def _samples_per_second(run) -> float:
    """The median window's samples/s of ``harness run``: ``run`` is its ``RunConfig`` (run now) or its result (the
    cache's); a run that did not complete raises, a host-bound one is skipped (its figure is this CPU's, not the
    emulation's)."""
    from harness.bench.runner import host_bound

    result = run if isinstance(run, dict) else common.gridrun().run(run)
    config = result["config"]
    what = f"{config['method']} with batches {list(config['batches'])}"
    if result["status"] != "complete":
        raise RuntimeError(f"{what}: {result['status']}: {result['error']}")
    common.refuse_host_bound(host_bound(result), what)  # not an emulated figure: skipped, not recorded
    return result["summary"]["samples_per_second"]["median"]
