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
"""

from __future__ import annotations

from . import common

GRID = common.current_grid()
PARAMS = [list(GRID.workloads), list(common.METHODS), list(common.SPLITS), list(GRID.device_counts)]
PARAM_NAMES = ["workload", "method", "split", "devices"]
# The step timings and memory peaks follow the samples/s track closely: on the ci grid they keep its
# widest case (the even split of the most devices, and one device), one TensorFlow process each.
STEP_PARAMS = PARAMS if GRID.emulate is None else [
    list(GRID.workloads), list(common.METHODS), ["even"], sorted({1, max(GRID.device_counts)})]


class _Combinations:
    """The throughput grid; ``setup_cache`` gives each device's step-time model (``harness.bench.gridrun``)."""

    params = PARAMS
    param_names = PARAM_NAMES
    timeout = GRID.timeout
    # One function for every class: asv keys the cache by its module and line, so the GPUs are profiled once.
    setup_cache = staticmethod(common.setup_profiles)


class Throughput(_Combinations):
    """Samples/s of ``harness run`` for each combination."""

    def setup(self, profiles, workload, method, split, devices):
        common.check_combination(method, split, devices)
        self.config = common.gridrun().run_config(GRID, profiles, workload, method, split, devices)

    def track_samples_per_second(self, profiles, workload, method, split, devices):
        return _samples_per_second(self.config)

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
    setup_cache = staticmethod(common.setup_profiles)

    def setup(self, profiles, workload, method, devices):
        common.check_combination(method, "even", devices)  # keras on the even split always is one
        gridrun = common.gridrun()
        self.ours = gridrun.run_config(GRID, profiles, workload, method, "even", devices)
        self.stock = gridrun.run_config(GRID, profiles, workload, "keras", "even", devices)

    def track_ratio_to_stock(self, profiles, workload, method, devices):
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
    setup_cache = staticmethod(common.setup_profiles)

    def setup(self, profiles, workload, method, devices):
        self.configs = common.gridrun().overlap_configs(GRID, profiles, workload, method, devices)

    def track_overlap_gain(self, profiles, workload, method, devices):
        staged, unstaged = (_samples_per_second(config) for config in self.configs)
        return staged / unstaged

    track_overlap_gain.unit = "with/without"


def _samples_per_second(config) -> float:
    """The median window's samples/s of ``harness run`` with ``config``; a run that did not complete raises, a
    host-bound one is skipped (its figure is this CPU's, not the emulation's)."""
    from harness.bench.runner import host_bound

    result = common.gridrun().run(config)
    what = f"{config.method} with batches {list(config.batches)}"
    if result["status"] != "complete":
        raise RuntimeError(f"{what}: {result['status']}: {result['error']}")
    common.refuse_host_bound(host_bound(result), what)  # not an emulated figure: skipped, not recorded
    return result["summary"]["samples_per_second"]["median"]
