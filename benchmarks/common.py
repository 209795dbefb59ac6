"""The asv suites' parameters and skips: the grids, which combinations mean nothing, and the library they run with.

Append, never change: a benchmark's history compares only while what it
measures stays the same. Adding a grid, a workload or a helper is fine;
changing the ci grid's emulated devices, batches or timings starts a new
history (say so in the commit, and give the affected benchmarks a ``version``).

The grid comes from one environment variable, ``HARNESS_BENCH_GRID``:

- ``ci`` (default): tiny workloads on emulated devices (logical CPUs that work
  at set speeds), a few minutes on 2 CPU cores. Figures are emulated.
- ``smoke``: the ci parameters with the shortest timings and slower emulated
  devices; the CI test uses it to prove every benchmark runs. Its figures mean nothing.
  ``HARNESS_BENCH_SMOKE_MAX_RATE`` (samples/s) slows its devices further where
  the host is slow: each set of emulated devices (the grid's, the tuner's) keeps
  its ratios with its fastest device at most that rate (``smoke_on_this_host``).
- ``full``: the seed-sized workloads on the machine's real GPUs.

What a combination runs (devices, profiles, split, ``RunConfig``) is ``harness.bench.gridrun``'s,
through ``gridrun()``. The gate and bisect run these suites on older commits' harness: discovery
imports nothing of harness beyond ``harness.bench.runner`` (and no TensorFlow), and where the
installed harness predates gridrun, ``gridrun()`` loads this checkout's copy of it by its path
(tests/unit/test_bench_suites.py runs both ways). A combination that means nothing or that the
machine cannot run raises ``NotImplementedError`` in ``setup``: asv reports it as skipped.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from harness.bench.runner import METHODS as RUN_METHODS

__all__ = ["GRID_VARIABLE", "SMOKE_MAX_RATE_VARIABLE", "METHODS", "SPLITS", "BenchGrid", "GRIDS", "current_grid",
           "check_combination", "gridrun", "setup_profiles", "skip", "refuse_host_bound", "smoke_on_this_host"]

GRID_VARIABLE = "HARNESS_BENCH_GRID"
SMOKE_MAX_RATE_VARIABLE = "HARNESS_BENCH_SMOKE_MAX_RATE"
METHODS = RUN_METHODS  # single, the parallel methods, keras (the stock baseline): harness.bench.runner.RunMethod
SPLITS = ("even", "ratio", "tuned")
LIBRARY = "harness.bench.gridrun"


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
    # discovering the suite imports nothing newer than harness.bench.runner (gridrun.convergence_goal)
    convergence_goals: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    convergence_timeout: float = 600.0  # setup_cache: every combination trained in one process
    # Overlap (throughput.Overlap): each emulated device's link (harness.emulate.parse_link: GB/s or a preset),
    # slow enough that copying a slice costs about a step of the slowest device; None: real devices' own links.
    overlap_link: str | None = None


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
    # Half this host's speed: its probes time fit's staged steps, whose host work ran at 4600-5100 samples/s
    # for the faster device here (beside the other's profile), late in 11-13% of the steps at 4000.
    tune_emulate="2000:600,1000:300",
    tune_options={"verify_seconds": 0.5, "verify_windows": 2, "compare_even": False, "max_step_s": 0.5},
    setup_timeout=300.0,
    # Measured (benchmarks/README.md, "Time to accuracy"): one device reaches 0.9 at step 59 of 120 (a steep
    # rise from step 55); every split and method reaches it at the same step. Not gru_stack: tiny GRU(16)s
    # under Adam's default rate need ~850 steps to 0.3, minutes per combination here (the full grid has it).
    convergence_workloads=("mnist_maxing",),
    # One device and the most (3): each combination trains ~60 emulated steps after its own trace, 8 s apiece, and
    # two devices add nothing a convergence bug would not show on three (the full grid keeps 1-4).
    convergence_device_counts=(1, 3),
    convergence_batch={"mnist_maxing": 120},
    convergence_goals={"mnist_maxing": {"target": 0.9, "budget": 120, "every": 1, "held_out": 512}},
    convergence_timeout=600.0,
    # A 120-sample slice of mnist_maxing (784 float32 each: 376 kB) takes 0.19 s at 2 MB/s: about the slowest
    # device's step (120 samples at 500/s + 20 ms).
    overlap_link="0.002",
)

GRIDS: dict[str, BenchGrid] = {
    "ci": _CI,
    # Its emulated rates are 15% of ci's: a smoke run must not be host-bound (which skips a benchmark) on a
    # busy 2-core machine either. At a quarter of ci's (500/250/125) the stock baseline's first device was
    # host-bound in .ci/run's extended phase on a slower host (AMD EPYC, no AVX-512: 470 samples/s for 500).
    "smoke": replace(
        _CI, name="smoke", emulate="300::5,150::10,75::20", seconds=0.1, windows=1, repeat=(1, 2, 0.5),
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
    text = os.environ.get(SMOKE_MAX_RATE_VARIABLE, "").strip()
    if not text:
        return GRIDS[name]
    if name != "smoke":
        raise ValueError(f"{SMOKE_MAX_RATE_VARIABLE} slows the smoke grid only (the {name} grid's figures keep their "
                         f"history); got {SMOKE_MAX_RATE_VARIABLE}={text!r} with {GRID_VARIABLE}={name!r}")
    try:
        max_rate = float(text)
    except ValueError:
        max_rate = math.nan
    if not max_rate > 0 or math.isinf(max_rate):
        raise ValueError(f"{SMOKE_MAX_RATE_VARIABLE} must be a rate in samples/s above 0; got {text!r}")
    return smoke_on_this_host(GRIDS[name], max_rate)


# The emulate and link texts are rewritten here, not parsed with harness.emulate: current_grid() runs when asv
# discovers the suites, which imports nothing of harness beyond harness.bench.runner (module docstring). Only the
# leading RATE (and a link's GB_PER_S) is touched; harness.emulate still parses the result, and reports a bad one.
def _slowed(spec: str, factor: float) -> str:
    """``RATE[:MAXBATCH[:OVERHEAD_MS]][@LINK],...`` with every rate times ``factor`` (the rest as it was)."""
    items = []
    for item in spec.split(","):
        body, at, link = item.partition("@")
        rate, colon, rest = body.partition(":")
        items.append(f"{float(rate) * factor:.6g}{colon}{rest}{at}{link}")
    return ",".join(items)


def _slowed_link(link: str, factor: float) -> str:
    """A ``GB_PER_S[/LATENCY_US]`` link with its bandwidth times ``factor``; a preset's name as it is."""
    bandwidth, slash, latency = link.partition("/")
    try:
        return f"{float(bandwidth) * factor:.6g}{slash}{latency}"
    except ValueError:
        return link


def _fastest(spec: str) -> float:
    return max(float(item.partition("@")[0].partition(":")[0]) for item in spec.split(","))


def smoke_on_this_host(grid: BenchGrid, max_rate: float) -> BenchGrid:
    """``grid`` with each set of emulated devices (``emulate``, ``tune_emulate``) slowed, ratios kept, until its
    fastest device emulates at most ``max_rate`` samples/s; ``overlap_link`` slowed as ``emulate`` (a slice's copy
    still costs about a step). A set already that slow is kept as it is.

    An emulated figure is only the emulation's while the host computes each slice faster than the emulated device
    (``harness.emulate``); a test on a slow or busy host passes the rate its calibration allows.
    """
    changes: dict[str, object] = {}
    if grid.emulate is not None and _fastest(grid.emulate) > max_rate:
        factor = max_rate / _fastest(grid.emulate)
        changes["emulate"] = _slowed(grid.emulate, factor)
        if grid.overlap_link is not None:
            changes["overlap_link"] = _slowed_link(grid.overlap_link, factor)
    if grid.tune_emulate is not None and _fastest(grid.tune_emulate) > max_rate:
        changes["tune_emulate"] = _slowed(grid.tune_emulate, max_rate / _fastest(grid.tune_emulate))
    return replace(grid, **changes)


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


def gridrun() -> ModuleType:
    """``harness.bench.gridrun``: the installed harness' own or, where that harness predates it (an older commit
    under the gate or bisect), this checkout's copy, loaded by its path (it imports harness only in its functions).

    Raises:
        NotImplementedError: (asv: skipped) the installed harness predates it and this checkout has no copy.
    """
    try:
        return importlib.import_module(LIBRARY)
    except ModuleNotFoundError as err:
        if err.name != LIBRARY:
            raise
    name = "benchmarks._gridrun_of_this_checkout"  # not the installed harness' name: that one is not there
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "harness" / "bench" / "gridrun.py"
        if not path.is_file():
            raise NotImplementedError(f"this commit's harness predates {LIBRARY}, and this checkout has no {path}")
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # not half a module for the next call
            raise
    return sys.modules[name]


def setup_profiles() -> dict:
    """asv ``setup_cache`` of the throughput classes: ``gridrun().device_profiles`` of the current grid.

    One function for every class that uses it: asv keys a cache by the function's
    module and line, so the classes share one run of it (one profiling of the GPUs).
    """
    return gridrun().device_profiles(current_grid())


def skip(reason: str) -> None:
    """Skips a benchmark, from its timed body (asv records n/a) or ``setup``, with the reason on stderr
    (``asv run --show-stderr``): asv_runner's ``SkipNotImplemented``, a ``NotImplementedError``."""
    print(f"harness benchmark skipped: {reason}", file=sys.stderr)
    try:
        from asv_runner.benchmarks.mark import SkipNotImplemented
    except ImportError:  # not under asv (a direct call): a plain NotImplementedError says the same
        raise NotImplementedError(reason) from None
    raise SkipNotImplemented(reason)


def refuse_host_bound(entries, what: str) -> None:
    """Skips (``skip``) a benchmark whose emulated devices were host-bound: its figure is this CPU's, not the grid's.

    Args:
        entries: ``{"device", "emulated_rate", "host_rate", "late_share"}`` dicts
            (``harness.bench.runner.host_bound``, ``gridrun().host_bound_steps``); nothing happens when empty.
        what: the configuration, for the message.
    """
    from harness.emulate import host_bound_text

    if entries:
        skip(f"{what}: {host_bound_text(entries)} (harness calibrate: the rates this host sustains)")
