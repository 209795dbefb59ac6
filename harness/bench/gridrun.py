"""A benchmark grid's combinations made runnable: devices, device profiles, splits, ``RunConfig``s.

The asv suites (benchmarks/) hold the grids (``benchmarks/common.py``: ``BenchGrid``) and
the parameters; this module turns one combination of a grid (workload, method, split,
device count) into what harness runs. A grid is any object with the ``Grid`` fields.

- Devices: each process creates the grid's whole layout once (all its emulated devices,
  or all GPUs) and a combination takes the first N of it (``use_devices``).
- Profiles: each device's step-time model and memory ceiling; emulated devices are known
  exactly, real GPUs are profiled (``device_profiles``).
- Splits: ``harness.bench.tuning.splits.split_batches`` over the profiles, a split beyond
  a device's memory ceiling refused (``split_batches``).

A combination this machine cannot run raises ``NotImplementedError`` (asv records it as
skipped). Which combinations mean nothing is the suites' call
(``benchmarks/common.py: check_combination``); the functions here take them as given.

Old commits: the gate and bisect run this checkout's benchmarks/ against an older commit's
harness, which may lack this module. ``benchmarks/common.py: gridrun`` then loads this file
from the checkout by its path, so there is one copy of this logic for every commit. Hence
this module imports nothing but the standard library at module level (no TensorFlow, no
asv), and inside its functions only harness APIs as old as the suites; the one newer API,
``harness.bench.tuning.splits``, it uses where present, and where it is not, does the same
arithmetic (``_older_split``: the only copy of that fallback). tests/unit/test_bench_suites.py
resolves every ci combination both ways, in one process, and finds the same ``RunConfig``s.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["Grid", "use_devices", "all_devices", "emulated", "device_profiles", "convergence_profiles",
           "split_batches", "convergence_batches", "run_config", "run", "convergence_config", "prepared_step",
           "host_bound_steps", "fidelity_report", "tune_record", "convergence_goal"]

_OLDER_MARGIN = 0.05  # harness.bench.tuning.splits.TUNED_MARGIN, for older commits' harness without that module


class Grid(Protocol):
    """What this module reads of a grid (``benchmarks/common.py: BenchGrid`` documents each field)."""

    name: str
    workloads: tuple[str, ...]
    size: str
    device_counts: tuple[int, ...]
    batch_per_device: Mapping[str, int]  # per-device batch of each workload (global: this x devices)
    emulate: str | None  # the emulated devices of the layout; None: the machine's GPUs
    seconds: float
    windows: int
    warmup_steps: int
    fidelity_steps: int
    fidelity_ratios: tuple[float, ...]
    tune_model: str
    tune_emulate: str | None
    tune_options: Mapping[str, Any]
    convergence_workloads: tuple[str, ...]
    convergence_size: str
    convergence_batch: Mapping[str, int]  # global batch of each workload
    convergence_goals: Mapping[str, Mapping[str, Any]]  # harness.bench.convergence.Goal's fields


_LAYOUT: list[str] = []  # this process's devices, created once (TensorFlow fixes them per process)


def use_devices(grid: Grid, count: int) -> list[str]:
    """The first ``count`` devices of the grid's layout, creating the layout on first use.

    Raises:
        NotImplementedError: the machine has fewer devices (no GPU for the full grid, 3 asked of 2).
    """
    layout = all_devices(grid)
    if count > len(layout):
        raise NotImplementedError(f"{count} devices asked; this machine has {len(layout)}: {layout}")
    return layout[:count]


def all_devices(grid: Grid) -> list[str]:
    """Every device of the grid's layout, created on first use.

    Raises:
        NotImplementedError: the grid needs GPUs and there are none.
    """
    if not _LAYOUT:
        _LAYOUT.extend(_create_layout(grid))
    return list(_LAYOUT)


def _create_layout(grid: Grid) -> list[str]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ log out of asv's output
    from harness import emulate
    from harness.devices import use_logical_devices

    if grid.emulate is not None:
        n = len(emulate.parse_emulate(grid.emulate))
        # The emulated devices sleep on inter-op threads (a commit before staging: one each, and two more).
        threads = getattr(emulate, "inter_op_threads", lambda count: count + 2)(n)
        return use_logical_devices(n, inter_op_threads=threads)
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if not gpus:
        raise NotImplementedError(f"the {grid.name} grid runs on GPUs; TensorFlow sees none here")
    return gpus


def emulated(grid: Grid, count: int):
    """The first ``count`` emulated devices of the grid (``EmulatedDevice``s), or None on real devices."""
    from harness.emulate import parse_emulate

    return None if grid.emulate is None else parse_emulate(grid.emulate)[:count]


def device_profiles(grid: Grid) -> dict:
    """Each device's step-time model and memory ceiling per workload, for the ratio and tuned splits.

    Emulated devices are known exactly: ``t(b) = overhead + b / rate``, ceiling
    MAXBATCH (nothing is measured, so every process agrees). Real GPUs are profiled
    alone (the suites do it once per asv run, in ``setup_cache``): ``harness.bench.tuning``'s
    ceiling search and step-time fit, up to the largest global batch of the grid.

    Returns:
        ``{"source", "workloads": {name: [{"fixed_s", "per_sample_s", "ceiling"}, ...]}}``,
        or ``{"error": why}`` when the machine cannot run the grid (asv's cache must not be None).
    """
    return _profiles(grid, grid.workloads, grid.size, grid.batch_per_device)


def convergence_profiles(grid: Grid) -> dict:
    """``device_profiles`` of the convergence workloads at the convergence size and batches (what their ratio
    splits are cut by); emulated grids need no profiling, real GPUs are profiled on the tiny models."""
    return _profiles(grid, grid.convergence_workloads, grid.convergence_size, grid.convergence_batch)


def _profiles(grid: Grid, names: Sequence[str], size: str, batch: Mapping[str, int]) -> dict:
    from harness.emulate import parse_emulate

    if grid.emulate is not None:
        rows = [{"fixed_s": s.overhead_ms / 1000.0, "per_sample_s": 1.0 / s.rate, "ceiling": s.max_batch}
                for s in parse_emulate(grid.emulate)]
        return {"source": "emulated", "workloads": {w: rows for w in names}}
    try:
        devices = all_devices(grid)
    except NotImplementedError as err:
        return {"error": str(err)}
    from harness.bench import workloads
    from harness.bench.tuning.probe import release_probes
    from harness.bench.tuning.tuner import profile_devices

    out = {}
    for name in names:
        limit = batch[name] * max(grid.device_counts)
        probes, _ = profile_devices(workloads.get(name), size, devices, [None] * len(devices), limit=limit)
        out[name] = [{"fixed_s": fit.model.fixed_s, "per_sample_s": fit.model.per_sample_s,
                      "ceiling": probe.ceiling if probe.stopped_by == "oom" else None} for probe, fit in probes]
        release_probes(probe for probe, _ in probes)
    return {"source": "profiled", "workloads": out}


def split_batches(grid: Grid, profiles: dict, workload: str, split: str, count: int) -> tuple[int, ...]:
    """Per-device batches of the grid's global batch (its per-device batch x ``count``) over ``count`` devices.

    ``even``: equal shares. ``ratio``: shares in proportion to each device's
    samples/s alone at the even share (what ``harness compare`` measures first;
    here from the step-time models). ``tuned``: ``harness.bench.tuning.solver.solve_split``
    on the same models, within the ceilings less ``TUNED_MARGIN`` (a device may get 0).

    Raises:
        NotImplementedError: the split exceeds a device's memory ceiling, or the machine was not profiled.
    """
    rows = _rows(profiles, workload, count)
    share = grid.batch_per_device[workload]
    return _within_ceilings(split, _split(split, share * count, rows, share), rows)


def convergence_batches(grid: Grid, profiles: dict, workload: str, split: str, count: int) -> tuple[int, ...]:
    """Per-device batches of the grid's convergence batch for ``workload``: the same global batch on any ``count``.

    ``even`` or ``ratio``, as ``split_batches`` (``profiles``: ``convergence_profiles``).

    Raises:
        NotImplementedError: the split exceeds a device's memory ceiling, or the machine was not profiled.
        ValueError: a split other than even and ratio.
    """
    rows = _rows(profiles, workload, count)
    batch = grid.convergence_batch[workload]
    if split not in ("even", "ratio"):
        raise ValueError(f"a convergence split is even or ratio; got split={split!r}")
    return _within_ceilings(split, _split(split, batch, rows, batch / count), rows)


def _rows(profiles: dict, workload: str, count: int) -> list[dict]:
    if "error" in profiles:
        raise NotImplementedError(profiles["error"])
    if workload not in profiles["workloads"]:
        raise NotImplementedError(f"no device profile of {workload!r}; profiled: {sorted(profiles['workloads'])}")
    return profiles["workloads"][workload][:count]


def _split(split: str, batch: int, rows: list[dict], share: float) -> tuple[int, ...]:
    """``batch`` split over the profiled devices ``rows`` by ``harness.bench.tuning.splits.split_batches`` (what
    ``harness compare`` and ``harness tune`` split with), ``ratio`` by each device's samples/s at ``share``."""
    from harness.bench.tuning.solver import StepModel

    models = [StepModel(r["fixed_s"], r["per_sample_s"]) for r in rows]
    ratios = [m.samples_per_second(share) for m in models]  # type: ignore[arg-type]  # a convergence share: float
    ceilings = [r["ceiling"] for r in rows]
    try:
        from harness.bench.tuning.splits import split_batches as shared
    except ImportError:  # an older commit's harness
        return _older_split(split, batch, models, ratios, ceilings)
    from harness.errors import Refused

    try:
        return shared(split, batch, len(rows), ratios=ratios, models=models, ceilings=ceilings)
    except Refused as err:
        raise NotImplementedError(str(err)) from None


def _older_split(split: str, batch: int, models: list, ratios: list[float], ceilings: list) -> tuple[int, ...]:
    """``harness.bench.tuning.splits.split_batches``'s arithmetic, for older commits' harness, which lacks it."""
    from harness.bench.tuning.solver import solve_split
    from harness.split import split_batch

    if split == "even":
        return split_batch(batch, [1.0] * len(models))
    if split == "ratio":
        return split_batch(batch, ratios)
    if split != "tuned":
        raise ValueError(f"split must be one of even, ratio, tuned; got {split!r}")
    usable = [batch if c is None else max(1, math.floor(c * (1 - _OLDER_MARGIN))) for c in ceilings]
    if batch > sum(usable):
        raise NotImplementedError(f"global batch {batch} exceeds the devices' usable memory {usable}")
    return tuple(solve_split(models, usable, batch).batches)


def _within_ceilings(split: str, batches, rows) -> tuple[int, ...]:
    """``batches`` as a tuple; raises ``NotImplementedError`` where one exceeds its memory ceiling."""
    over = [(i, b, r["ceiling"]) for i, (b, r) in enumerate(zip(batches, rows))
            if r["ceiling"] is not None and b > r["ceiling"]]
    if over:
        raise NotImplementedError(f"{split} split {list(batches)} exceeds memory ceilings (device, batch, "
                                  f"ceiling): {over}")
    return tuple(batches)


def run_config(grid: Grid, profiles: dict, workload: str, method: str, split: str, count: int):
    """The ``harness.bench.runner.RunConfig`` of one throughput combination; creates the devices.

    A tuned split that leaves a device out runs without it (on one device: ``single``),
    as ``harness compare`` does.

    Raises:
        NotImplementedError: a combination this machine cannot run.
    """
    from harness.bench.runner import RunConfig

    batches = split_batches(grid, profiles, workload, split, count)
    specs = emulated(grid, count)
    names = use_devices(grid, count)
    used = [i for i, b in enumerate(batches) if b > 0]
    if len(used) == 1 < count:  # the tuned split left all but one device out
        method = "single"
    return RunConfig(workload, grid.size, method, tuple(names[i] for i in used), tuple(batches[i] for i in used),
                     seconds=grid.seconds, windows=grid.windows, warmup_steps=grid.warmup_steps,
                     emulate=None if specs is None else tuple(specs[i] for i in used))


def overlap_configs(grid: Grid, profiles: dict, workload: str, method: str, count: int) -> tuple:
    """``(with, without)``: the even split's ``RunConfig`` with the overlap (``harness.parallel.staging``) and without
    it; on an emulated grid each device gets the grid's ``overlap_link`` (real devices have their own).

    Raises:
        NotImplementedError: this harness has no overlap (a commit before it), or the combination cannot run here.
    """
    from dataclasses import replace

    from harness.emulate import parse_link

    config = run_config(grid, profiles, workload, method, "even", count)
    if not hasattr(config, "overlap"):
        raise NotImplementedError("this commit's harness has no overlap (harness.parallel.staging)")
    link = getattr(grid, "overlap_link", None)
    if config.emulate is not None and link is not None:
        config = replace(config, emulate=tuple(replace(e, link=parse_link(link)) for e in config.emulate))
    return config, replace(config, overlap=False)


def run(config) -> dict:
    """``harness.bench.runner.run_one(config)`` without its input-pipeline check (the suites read samples/s only),
    where the installed harness has that option (an older commit's always checks)."""
    import inspect

    from harness.bench.runner import run_one

    if "check_input" in inspect.signature(run_one).parameters:
        return run_one(config, check_input=False)
    return run_one(config)


def convergence_config(grid: Grid, profiles: dict, workload: str, method: str, split: str, count: int):
    """The ``harness.bench.runner.RunConfig`` one time-to-accuracy combination trains; creates the devices.

    Raises:
        NotImplementedError: a combination this machine cannot run.
    """
    from harness.bench.runner import RunConfig

    batches = convergence_batches(grid, profiles, workload, split, count)
    specs = emulated(grid, count)
    names = use_devices(grid, count)
    return RunConfig(workload, grid.convergence_size, method, tuple(names), batches,
                     emulate=None if specs is None else tuple(specs))


def convergence_goal(grid: Grid, workload: str):
    """The ``harness.bench.convergence.Goal`` of ``workload`` on ``grid``."""
    from harness.bench.convergence import Goal

    return Goal(**grid.convergence_goals[workload])


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
        emulator = getattr(model, "emulator", None)
        with emulator.untimed() if emulator is not None else contextlib.nullcontext():  # nothing times them
            for _ in range(config.warmup_steps):
                model.train_on_batch(x, y)
        _PREPARED[config] = (model, x, y)
    return _PREPARED[config]


def host_bound_steps(config, model, x, y, steps: int = 3) -> list[dict]:
    """Times ``steps`` more steps of a prepared model: its emulated devices that were host-bound.

    For ``time_`` benchmarks, whose timed body cannot look at the emulator: the
    check runs in ``setup`` on the same model and batch.

    Returns:
        ``harness.bench.runner.host_bound``'s entries (``{"device", "emulated_rate", "host_rate",
        "late_share"}``); empty on real devices and when none was host-bound.
    """
    if config.emulate is None or model.emulator is None:
        return []
    began = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return model.emulator.host_bound_between(began, time.perf_counter())


def fidelity_report(grid: Grid, workload: str, method: str, devices: Sequence[str]):
    """``harness.equivalence.compare_training`` of ``workload`` on ``devices`` with the grid's uneven split.

    Both runs start from the same weights and train ``grid.fidelity_steps``
    steps of the grid's global batch with the workload's own optimizer and loss.
    """
    from harness.bench import workloads
    from harness.equivalence import compare_training

    spec = workloads.get(workload)
    batch = grid.batch_per_device[workload] * len(devices)
    x, y = spec.make_data(grid.size, batch * grid.fidelity_steps, seed=0)
    return compare_training(lambda: spec.build(grid.size, seed=0), x, y, devices=list(devices),
                            ratios=list(grid.fidelity_ratios[:len(devices)]), method=method, batch_size=batch,
                            optimizer=spec.optimizer, loss=spec.loss(), seed=0)


def tune_record(grid: Grid) -> dict:
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
