"""Shared fixtures of the asv suites: the grid, the devices, the splits and prepared training steps.

Append, never change: a benchmark's history compares only while what it
measures stays the same. Adding a grid, a workload or a helper is fine;
changing the ci grid's emulated devices, batches or timings starts a new
history (say so in the commit, and give the affected benchmarks a ``version``).

The grid comes from one environment variable, ``HARNESS_BENCH_GRID``:

- ``ci`` (default): tiny workloads on emulated devices (logical CPUs that work
  at set speeds), a few minutes on 2 CPU cores. Figures are emulated.
- ``smoke``: the ci parameters with the shortest timings and slower emulated
  devices; the CI test uses it to prove every benchmark runs. Its figures mean nothing.
- ``full``: the seed-sized workloads on the machine's real GPUs.

asv 0.6.6 with ``launch_method: spawn`` runs every parameter combination of a
benchmark in a process of its own (``asv.runner._run_benchmark_single_param``),
and TensorFlow fixes its devices once per process. So every process creates the
same layout (all the grid's emulated devices, or all GPUs) and a combination
takes the first N devices of it; one the machine cannot run raises
``NotImplementedError`` in ``setup``, which asv reports as skipped.

Nothing here imports TensorFlow at module level: asv imports every suite to
discover the benchmarks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from harness.bench.runner import METHODS as RUN_METHODS

__all__ = ["GRID_VARIABLE", "BenchGrid", "GRIDS", "current_grid", "check_combination", "use_devices", "all_devices",
           "emulated", "device_profiles", "setup_profiles", "split_batches", "run_config", "prepared_step",
           "fidelity_report", "tune_record", "refuse_host_bound", "check_step_not_host_bound", "skip",
           "convergence_profiles", "convergence_batches", "convergence_goal", "convergence_config"]

GRID_VARIABLE = "HARNESS_BENCH_GRID"
METHODS = RUN_METHODS  # single, the parallel methods, keras (the stock baseline): harness.bench.runner.RunMethod
SPLITS = ("even", "ratio", "tuned")
TUNED_MARGIN = 0.05  # as harness.bench.tuning.splits.TUNED_MARGIN (kept here for older commits, which lack it)


@dataclass(frozen=True)
class BenchGrid:
    """What the suites run: workloads, device counts, batches, timings.

    ``emulate`` lists the emulated devices every process creates (a combination
    with N devices uses the first N); None means the machine's real GPUs.
    """

    name: str
    workloads: tuple[str, ...]
    size: str
    device_counts: tuple[int, ...]
    batch_per_device: Mapping[str, int]  # global batch = this x devices (weak scaling: seed 000, docs/background.md)
    emulate: str | None
    seconds: float  # run_one: seconds per timing window
    windows: int
    warmup_steps: int
    repeat: tuple[int, int, float]  # time_train_step: (min samples, max samples, max seconds)
    rounds: int  # processes per time_ combination (asv's "rounds"); --quick makes it 1
    timeout: float  # seconds per benchmark process
    fidelity_workloads: tuple[str, ...]
    fidelity_device_counts: tuple[int, ...]
    fidelity_steps: int
    fidelity_ratios: tuple[float, ...]  # the uneven split (first N)
    tune_model: str
    tune_emulate: str | None  # emulated devices for the tuner; None: all GPUs
    tune_options: Mapping[str, object] = field(default_factory=dict)  # keyword arguments of harness.tune
    setup_timeout: float = 600.0  # setup_cache: profiling (full grid) or one tune()
    # Time to accuracy (convergence.py, harness.bench.convergence): every combination trains the same global batch
    # (the same for every device count and split, so their steps compare) from the same weights on the same data.
    convergence_workloads: tuple[str, ...] = ()
    convergence_size: str = "tiny"  # the goals were measured at this size
    convergence_device_counts: tuple[int, ...] = ()
    convergence_batch: Mapping[str, int] = field(default_factory=dict)  # global batch per workload
    # per workload: harness.bench.convergence.Goal's fields (target accuracy, step budget, ...); plain values, so
    # discovering the suite imports nothing newer than harness.bench.runner (see convergence_goal)
    convergence_goals: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    convergence_timeout: float = 600.0  # setup_cache: every combination trained in one process

    def batch(self, workload: str) -> int:
        """Per-device batch of ``workload``."""
        return self.batch_per_device[workload]


_CI = BenchGrid(
    name="ci",
    workloads=("mnist_maxing",),
    size="tiny",
    device_counts=(1, 2, 3),
    batch_per_device={"mnist_maxing": 120},
    # Emulated rates far below the tiny model's real speed on 2 cores (~20k samples/s), so the
    # figures follow the emulation, not the CI machine's load; the fixed cost per step (ms) is
    # why the tuned split differs from the ratio split.
    emulate="2000::5,1000::10,500::20",
    seconds=0.25,
    windows=3,
    warmup_steps=2,
    repeat=(3, 10, 2.0),
    rounds=1,
    timeout=120.0,
    # Not tiny resnet50: its training is chaotic at float level (permuting the rows inside each
    # batch, which changes nothing mathematically, moves its weights 6e-3 after 4 steps on one
    # device), so its deviation measures chaos, not the parallel step.
    fidelity_workloads=("mnist_maxing",),
    fidelity_device_counts=(3,),
    fidelity_steps=4,
    fidelity_ratios=(3.0, 2.0, 1.0),
    tune_model="mnist_maxing",
    tune_emulate="4000:600,2000:300",
    tune_options={"verify_seconds": 0.5, "verify_windows": 2, "compare_even": False, "max_step_s": 0.5},
    setup_timeout=300.0,
    # Measured (benchmarks/README.md, "Time to accuracy"): one device reaches 0.9 at step 59 of 120 (a steep
    # rise from step 55); every split and method reaches it at the same step. Not gru_stack: tiny GRU(16)s
    # under Adam's default rate need ~850 steps to 0.3, minutes per combination here (the full grid has it).
    convergence_workloads=("mnist_maxing",),
    convergence_device_counts=(1, 2, 3),
    convergence_batch={"mnist_maxing": 120},
    convergence_goals={"mnist_maxing": {"target": 0.9, "budget": 120, "every": 1, "held_out": 512}},
    convergence_timeout=600.0,
)

GRIDS: dict[str, BenchGrid] = {
    "ci": _CI,
    # Its emulated rates are a quarter of ci's: a smoke run must not be host-bound (which skips a
    # benchmark) on a busy 2-core machine either, where the host computes ~3000 samples/s per device.
    "smoke": replace(
        _CI, name="smoke", emulate="500::5,250::10,125::20", seconds=0.1, windows=1, repeat=(1, 2, 0.5),
        timeout=90.0, fidelity_steps=2, tune_emulate="1000:160,500:80",
        tune_options={"verify_seconds": 0.2, "verify_windows": 1, "compare_even": False, "max_step_s": 0.4,
                      "tolerance": 0.25},
        # Proves the suite runs, not that it converges: 2 steps never reach the target. Three devices only
        # (setup_cache trains every combination, ~5 s each here, tracing mostly; one device is towers' step too).
        convergence_device_counts=(3,),
        convergence_goals={"mnist_maxing": {"target": 0.9, "budget": 2, "every": 1, "held_out": 256}},
        convergence_timeout=300.0,
    ),
    "full": BenchGrid(
        name="full",
        workloads=("mnist_maxing", "gru_stack", "wide_mlp", "resnet50"),
        size="full",
        device_counts=(1, 2, 3, 4),
        # seed 000: 1388 on two cards; seed 001: 128-1024 (512 here); seed 002: 2048 per GPU; ResNet50: 64.
        batch_per_device={"mnist_maxing": 694, "gru_stack": 512, "wide_mlp": 2048, "resnet50": 64},
        emulate=None,
        seconds=2.0,
        windows=5,
        warmup_steps=3,
        repeat=(10, 50, 10.0),
        rounds=2,
        timeout=1800.0,
        fidelity_workloads=("mnist_maxing", "gru_stack", "wide_mlp", "resnet50"),
        fidelity_device_counts=(2, 3, 4),
        fidelity_steps=5,
        fidelity_ratios=(3.0, 2.0, 1.0, 1.0),
        tune_model="mnist_maxing",
        tune_emulate=None,
        tune_options={},
        setup_timeout=3600.0,
        # The tiny models on the GPUs (no full-size goal is measured yet): ci's goal, and seed 001's GRU, which
        # needs more steps than ci has minutes (one CPU device: 0.3 at step 850 of 2000, single, towers and
        # mirrored alike; 0.5 at ~2000; Bayes-optimal ~0.6).
        convergence_workloads=("mnist_maxing", "gru_stack"),
        convergence_device_counts=(1, 2, 3, 4),
        convergence_batch={"mnist_maxing": 120, "gru_stack": 256},
        convergence_goals={"mnist_maxing": {"target": 0.9, "budget": 120, "every": 1, "held_out": 512},
                           "gru_stack": {"target": 0.3, "budget": 2000, "every": 25, "held_out": 2048}},
        convergence_timeout=3600.0,
    ),
}


def current_grid() -> BenchGrid:
    """The grid ``HARNESS_BENCH_GRID`` names (default ``ci``).

    Raises:
        ValueError: naming the unknown grid and the known ones.
    """
    name = os.environ.get(GRID_VARIABLE, "ci").strip() or "ci"
    if name not in GRIDS:
        raise ValueError(f"{GRID_VARIABLE} must be one of {', '.join(GRIDS)}; got {name!r}")
    return GRIDS[name]


def check_combination(method: str, split: str, count: int) -> None:
    """Raises ``NotImplementedError`` for a combination that means nothing or repeats another (asv skips it).

    harness' parallel methods on one device are the ``single`` combination (the
    same one-device step); the stock ``keras`` baseline splits evenly only.
    """
    if method == "single" and count != 1:
        raise NotImplementedError(f"method 'single' runs on one device; got devices={count}")
    if split != "even" and count == 1:
        raise NotImplementedError(f"one device has only the even split; got split={split!r}")
    if method in ("towers", "mirrored") and count == 1:
        raise NotImplementedError(f"method {method!r} on one device is the 'single' combination; got devices=1")
    if method == "keras" and split != "even":
        raise NotImplementedError(f"method 'keras' (stock MirroredStrategy) splits evenly; got split={split!r}")


_LAYOUT: list[str] = []  # this process's devices, created once (TensorFlow fixes them per process)


def use_devices(grid: BenchGrid, count: int) -> list[str]:
    """The first ``count`` devices of the grid's layout, creating the layout on first use.

    Raises:
        NotImplementedError: the machine has fewer devices (no GPU for the full grid, 3 asked of 2).
    """
    layout = all_devices(grid)
    if count > len(layout):
        raise NotImplementedError(f"{count} devices asked; this machine has {len(layout)}: {layout}")
    return layout[:count]


def all_devices(grid: BenchGrid) -> list[str]:
    """Every device of the grid's layout, created on first use.

    Raises:
        NotImplementedError: the grid needs GPUs and there are none.
    """
    if not _LAYOUT:
        _LAYOUT.extend(_create_layout(grid))
    return list(_LAYOUT)


def _create_layout(grid: BenchGrid) -> list[str]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ log out of asv's output
    from harness.devices import use_logical_devices
    from harness.emulate import parse_emulate

    if grid.emulate is not None:
        n = len(parse_emulate(grid.emulate))
        # Each emulated device sleeps on one inter-op thread: leave two for the real work.
        return use_logical_devices(n, inter_op_threads=n + 2)
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if not gpus:
        raise NotImplementedError(f"the {grid.name} grid runs on GPUs; TensorFlow sees none here")
    return gpus


def emulated(grid: BenchGrid, count: int):
    """The first ``count`` emulated devices of the grid, or None on real devices."""
    from harness.emulate import parse_emulate

    return None if grid.emulate is None else parse_emulate(grid.emulate)[:count]


def device_profiles(grid: BenchGrid) -> dict:
    """Each device's step-time model and memory ceiling per workload, for the ratio and tuned splits.

    Emulated devices are known exactly: ``t(b) = overhead + b / rate``, ceiling
    MAXBATCH (nothing is measured, so every ci process agrees). Real GPUs are
    profiled alone, once per asv run (``setup_cache``): ``harness.bench.tuning``'s
    ceiling search and step-time fit, up to the largest global batch of the grid.

    Returns:
        ``{"source", "workloads": {name: [{"fixed_s", "per_sample_s", "ceiling"}, ...]}}``,
        or ``{"error": why}`` when the machine cannot run the grid (asv's cache must not be None).
    """
    from harness.emulate import parse_emulate

    if grid.emulate is not None:
        rows = [{"fixed_s": s.overhead_ms / 1000.0, "per_sample_s": 1.0 / s.rate, "ceiling": s.max_batch}
                for s in parse_emulate(grid.emulate)]
        return {"source": "emulated", "workloads": {w: rows for w in grid.workloads}}
    try:
        names = all_devices(grid)
    except NotImplementedError as err:
        return {"error": str(err)}
    from harness.bench import workloads
    from harness.bench.tuning.tuner import profile_devices

    out = {}
    for name in grid.workloads:
        limit = grid.batch(name) * max(grid.device_counts)
        probes, _ = profile_devices(workloads.get(name), grid.size, names, [None] * len(names), limit=limit)
        out[name] = [{"fixed_s": fit.model.fixed_s, "per_sample_s": fit.model.per_sample_s,
                      "ceiling": probe.ceiling if probe.stopped_by == "oom" else None} for probe, fit in probes]
        for probe, _ in probes:
            probe.release()
    return {"source": "profiled", "workloads": out}


def setup_profiles() -> dict:
    """asv ``setup_cache`` of the throughput classes: ``device_profiles`` of the current grid.

    One function for every class that uses it: asv keys a cache by the function's
    module and line, so the classes share one run of it (one profiling of the GPUs).
    """
    return device_profiles(current_grid())


def split_batches(grid: BenchGrid, profiles: dict, workload: str, split: str, count: int) -> tuple[int, ...]:
    """Per-device batches of the grid's global batch for ``count`` devices (``_split``).

    ``even``: equal shares. ``ratio``: shares in proportion to each device's
    samples/s alone at the even share (what ``harness compare`` measures first;
    here from the step-time models). ``tuned``: ``harness.bench.tuning.solver.solve_split``
    on the same models, within the ceilings less a 5% margin (a device may get 0).

    Raises:
        NotImplementedError: the split exceeds a device's memory ceiling, or the machine was not profiled.
    """
    if "error" in profiles:
        raise NotImplementedError(profiles["error"])
    rows = profiles["workloads"][workload][:count]
    return _within_ceilings(split, _split(split, grid.batch(workload) * count, rows, grid.batch(workload)), rows)


def _split(split: str, batch: int, rows: list[dict], share: float) -> tuple[int, ...]:
    """``batch`` split over the profiled devices ``rows`` by ``harness.bench.tuning.splits.split_batches`` (the
    function ``harness compare`` and ``harness tune`` split with), ``ratio`` by each device's samples/s at ``share``.

    The gate and bisect run these suites on older commits, whose harness has no ``splits`` module: there the same
    arithmetic runs here (the fallback below).
    """
    from harness.bench.tuning.solver import StepModel, solve_split
    from harness.split import split_batch

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    models = [StepModel(r["fixed_s"], r["per_sample_s"]) for r in rows]
    ratios = [m.samples_per_second(share) for m in models]
    ceilings = [r["ceiling"] for r in rows]
    try:
        from harness.bench.tuning.splits import split_batches as shared
    except ImportError:  # an older commit's harness
        shared = None
    if shared is not None:
        from harness.errors import Refused

        try:
            return shared(split, batch, len(rows), ratios=ratios, models=models, ceilings=ceilings,
                          margin=TUNED_MARGIN)
        except Refused as err:
            raise NotImplementedError(str(err)) from None
    if split == "even":
        return split_batch(batch, [1.0] * len(rows))
    if split == "ratio":
        return split_batch(batch, ratios)
    usable = [batch if c is None else max(1, math.floor(c * (1 - TUNED_MARGIN))) for c in ceilings]
    if batch > sum(usable):
        raise NotImplementedError(f"global batch {batch} exceeds the devices' usable memory {usable}")
    return solve_split(models, usable, batch).batches


def _within_ceilings(split: str, batches, rows) -> tuple[int, ...]:
    """``batches`` as a tuple; raises ``NotImplementedError`` (asv: skipped) where one exceeds its memory ceiling."""
    over = [(i, b, r["ceiling"]) for i, (b, r) in enumerate(zip(batches, rows))
            if r["ceiling"] is not None and b > r["ceiling"]]
    if over:
        raise NotImplementedError(f"{split} split {list(batches)} exceeds memory ceilings (device, batch, "
                                  f"ceiling): {over}")
    return tuple(batches)


def run_config(grid: BenchGrid, profiles: dict, workload: str, method: str, split: str, count: int):
    """The ``harness.bench.runner.RunConfig`` of one combination; creates the devices.

    A tuned split that leaves a device out runs without it (on one device: ``single``),
    as ``harness compare`` does.

    Raises:
        NotImplementedError: a meaningless combination or one this machine cannot run.
    """
    from harness.bench.runner import RunConfig

    check_combination(method, split, count)
    batches = split_batches(grid, profiles, workload, split, count)
    specs = emulated(grid, count)
    names = use_devices(grid, count)
    used = [i for i, b in enumerate(batches) if b > 0]
    if len(used) == 1 < count:  # the tuned split left all but one device out
        method = "single"
    return RunConfig(workload, grid.size, method, tuple(names[i] for i in used), tuple(batches[i] for i in used),
                     seconds=grid.seconds, windows=grid.windows, warmup_steps=grid.warmup_steps,
                     emulate=None if specs is None else tuple(specs[i] for i in used))


_PREPARED: dict = {}  # RunConfig -> (model, x, y): asv re-runs setup before every sample of a time_ benchmark


def prepared_step(config) -> tuple:
    """``(model, x, y)``: ``config``'s model as ``harness run`` builds it, one batch, warm.

    The model is built by ``harness.bench.runner.build_model`` and has trained
    ``config.warmup_steps`` untimed steps on the batch (tracing, allocation).
    Cached per process: asv calls ``setup`` again before each timed sample.
    """
    if config not in _PREPARED:
        import tensorflow as tf

        from harness.bench import workloads
        from harness.bench.runner import build_model

        workload = workloads.get(config.model)
        model = build_model(config, workload)
        x, y = workload.make_data(config.size, config.batch, seed=config.seed)
        x, y = tf.nest.map_structure(tf.constant, x), tf.constant(y)
        for _ in range(config.warmup_steps):
            model.train_on_batch(x, y)
        _PREPARED[config] = (model, x, y)
    return _PREPARED[config]


def fidelity_report(grid: BenchGrid, workload: str, method: str, devices: Sequence[str]):
    """``harness.equivalence.compare_training`` of ``workload`` on ``devices`` with the grid's uneven split.

    Both runs start from the same weights and train ``grid.fidelity_steps``
    steps of the grid's global batch with the workload's own optimizer and loss.
    """
    from harness.bench import workloads
    from harness.equivalence import compare_training

    spec = workloads.get(workload)
    batch = grid.batch(workload) * len(devices)
    x, y = spec.make_data(grid.size, batch * grid.fidelity_steps, seed=0)
    return compare_training(lambda: spec.build(grid.size, seed=0), x, y, devices=list(devices),
                            ratios=list(grid.fidelity_ratios[:len(devices)]), method=method, batch_size=batch,
                            optimizer=spec.optimizer, loss=spec.loss(), seed=0)


def tune_record(grid: BenchGrid) -> dict:
    """One ``harness.tune`` of the grid's tuner case (most samples/s, mirrored), or ``{"error": why}``."""
    from harness.emulate import parse_emulate

    try:
        if grid.tune_emulate is not None:
            specs = parse_emulate(grid.tune_emulate)
            devices = use_devices(grid, len(specs))
        else:
            specs = None
            devices = all_devices(grid)
            if len(devices) < 2:
                raise NotImplementedError(f"tuning a split needs two devices or more; this machine has {devices}")
    except NotImplementedError as err:
        return {"error": str(err)}
    from harness.bench.tuning.tuner import tune

    return tune(grid.tune_model, devices=devices, size=grid.size, emulate=specs, **grid.tune_options)


def refuse_host_bound(entries, what: str) -> None:
    """Skips a benchmark whose emulated devices were host-bound: its figure is this CPU's speed, not the grid's.

    Raised in the timed body (``asv_runner``'s ``SkipNotImplemented``: asv records
    the combination as skipped, n/a) or in ``setup`` (``NotImplementedError``); the
    reason goes to stderr, which ``asv run --show-stderr`` prints.

    Args:
        entries: ``{"device", "emulated_rate", "host_rate", "late_share"}`` dicts
            (``harness.bench.runner.host_bound``); nothing happens when empty.
        what: the configuration, for the message.
    """
    import sys

    from harness.emulate import host_bound_text

    if not entries:
        return
    reason = f"{what}: {host_bound_text(entries)} (harness calibrate: the rates this host sustains)"
    print(f"harness benchmark skipped: {reason}", file=sys.stderr)
    try:
        from asv_runner.benchmarks.mark import SkipNotImplemented
    except ImportError:  # not under asv (a direct call): a plain NotImplementedError says the same
        raise NotImplementedError(reason) from None
    raise SkipNotImplemented(reason)


def check_step_not_host_bound(config, model, x, y, steps: int = 3) -> None:
    """Times ``steps`` more steps of a prepared model; refuses the combination if its emulated devices were host-bound.

    For ``time_`` benchmarks, whose timed body cannot look at the emulator: the
    check runs in ``setup`` on the same model and batch.
    """
    import time

    if config.emulate is None or model.emulator is None:
        return
    began = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    refuse_host_bound(model.emulator.host_bound_between(began, time.perf_counter()),
                      f"{config.method} with batches {list(config.batches)}")


def skip(reason: str) -> None:
    """Skips a benchmark from its timed body (asv records n/a), with the reason on stderr, as ``refuse_host_bound``."""
    import sys

    print(f"harness benchmark skipped: {reason}", file=sys.stderr)
    try:
        from asv_runner.benchmarks.mark import SkipNotImplemented
    except ImportError:  # not under asv (a direct call): a plain NotImplementedError says the same
        raise NotImplementedError(reason) from None
    raise SkipNotImplemented(reason)


def convergence_profiles(grid: BenchGrid) -> dict:
    """``device_profiles`` of the convergence workloads at the convergence size and batches (what their ratio
    splits are cut by); emulated grids need no profiling, real GPUs are profiled on the tiny models."""
    batches = {name: grid.convergence_batch[name] for name in grid.convergence_workloads}
    return device_profiles(replace(grid, workloads=tuple(grid.convergence_workloads), size=grid.convergence_size,
                                   batch_per_device=batches))


def convergence_batches(grid: BenchGrid, profiles: dict, workload: str, split: str, count: int) -> tuple[int, ...]:
    """Per-device batches of the grid's convergence batch for ``workload``: the same global batch on any ``count``.

    ``even``: equal shares. ``ratio``: shares in proportion to each device's
    samples/s alone at the even share, from ``device_profiles`` (as ``split_batches``).

    Raises:
        NotImplementedError: the split exceeds a device's memory ceiling, or the machine was not profiled.
        ValueError: a split other than even and ratio.
    """
    if "error" in profiles:
        raise NotImplementedError(profiles["error"])
    if workload not in profiles["workloads"]:
        raise NotImplementedError(f"no device profile of {workload!r}; profiled: {sorted(profiles['workloads'])}")
    rows = profiles["workloads"][workload][:count]
    batch = grid.convergence_batch[workload]
    if split not in ("even", "ratio"):
        raise ValueError(f"a convergence split is even or ratio; got split={split!r}")
    return _within_ceilings(split, _split(split, batch, rows, batch / count), rows)


def convergence_goal(grid: BenchGrid, workload: str):
    """The ``harness.bench.convergence.Goal`` of ``workload`` on ``grid`` (imported here, not at module level)."""
    from harness.bench.convergence import Goal

    return Goal(**grid.convergence_goals[workload])


def convergence_config(grid: BenchGrid, profiles: dict, workload: str, method: str, split: str, count: int):
    """The ``harness.bench.runner.RunConfig`` one time-to-accuracy combination trains; creates the devices.

    Raises:
        NotImplementedError: a meaningless combination or one this machine cannot run.
    """
    from harness.bench.runner import RunConfig

    check_combination(method, split, count)
    batches = convergence_batches(grid, profiles, workload, split, count)
    specs = emulated(grid, count)
    names = use_devices(grid, count)
    return RunConfig(workload, grid.convergence_size, method, tuple(names), batches,
                     emulate=None if specs is None else tuple(specs))
