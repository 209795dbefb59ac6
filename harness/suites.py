"""asv suites of a project's own workloads: what the ``benchmarks/`` of a repository that adopted harness subclass.

``harness init`` writes, in the repository's ``benchmarks/`` package, one thin subclass per suite::

    from harness import suites

    class Throughput(suites.Throughput): pass
    class StepTime(suites.StepTime): pass
    ...

A subclass finds its project from the file it is defined in (``harness.project.load_project`` of
that file: the nearest ``harness.toml``, or ``pyproject.toml`` with ``[tool.harness]``, at or above
it) when the class is created, and takes its asv ``params`` from it: parameter ``workload`` is the
configured workloads' names, ``method`` is ``single`` and the configured parallel methods. A
project that cannot be found or a bad configuration raises harness' one-line error there, so asv's
discovery shows it. asv discovers only classes bound in the benchmark module itself; the module
``harness.suites`` that ``from harness import suites`` binds is skipped, and so are these base
classes (only a subclass has a project).

The suites (units in brackets):

- ``Throughput.track_samples_per_second[workload, method, split]`` (samples/s): ``harness run``'s
  figure, ``harness.bench.runner.run_one``'s median window; ``split`` is ``even``, and ``ratio`` (the
  configured ``ratios``) where the project has ratios; ``single`` runs one device, the whole batch.
- ``StepTime.time_train_step[workload, method]`` (seconds): one ``train_on_batch`` of a prepared batch
  of the workload's ``batch-size`` (global; split by the project's split for a parallel method).
- ``PeakMemory.peakmem_train_step[workload, method]`` (bytes): the process' peak RSS after building the
  model and training a step.
- ``Fidelity.track_max_deviation[workload, method]`` (deviation) and ``track_floor_multiple`` (x rounding
  floor): ``harness.equivalence.compare_training`` of ``check-samples`` samples in batches of
  ``check-batch-size`` with a float64 reference, as ``harness check`` measures; the parallel methods
  only. A figure is recorded whatever the verdict (a FAIL is printed on stderr).
- ``TimeToAccuracy.track_seconds_to_goal`` (s) and ``track_steps_to_goal`` (steps) ``[workload,
  method]``: ``harness.bench.convergence.train_to_accuracy`` for a workload that is a
  ``harness.Workload`` with ``validation_data`` and a ``goal``; other workloads are skipped.

The devices: the machine's GPUs where it has at least ``devices`` of them, else ``devices`` logical
CPU devices (``harness.use_logical_devices``), laid out once per benchmark process (asv's
``launch_method: spawn`` runs one per parameter combination) before the workload is looked up. No
emulation: on CPU every figure is the model's real compute.

Figures keep their history across harness releases (an explicit asv ``version``): a change here
that alters what a figure measures bumps ``VERSION``. Changing a workload's batch or the split in
the configuration does not; give the subclass a ``version`` of its own then. A subclass may also
set ``timeout``, ``repeat`` and the suites' other knobs (``window_seconds``, ``budget``, ...).

Importing this module and discovering the suites imports no TensorFlow (asv imports every suite
to discover it); setups and bodies do.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from harness.errors import HarnessError, InvalidValue
from harness.project import Project, load_project
from harness.split import split_batch

__all__ = ["VERSION", "SINGLE", "SPLITS", "Throughput", "StepTime", "PeakMemory", "Fidelity", "TimeToAccuracy",
           "project_of", "project_devices", "run_config", "prepared_step"]

VERSION = "harness.suites 1"  # every suite's asv version: bump where a change alters what a figure measures
SINGLE = "single"  # the one-device method every suite but Fidelity measures beside the project's methods
SPLITS = ("even", "ratio")  # Throughput's splits: equal shares, and the project's ratios (where it has them)


def _unit(unit: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Gives a benchmark function asv's ``unit``."""
    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        setattr(func, "unit", unit)  # noqa: B010  a function attribute asv reads; mypy would refuse func.unit
        return func
    return mark


def project_of(cls: type) -> Project:
    """The project of a suite class: ``load_project`` of the file of the module that defines it (or of the working
    directory for a module without a file)."""
    module = sys.modules.get(cls.__module__)
    start = getattr(module, "__file__", None) or os.getcwd()
    return load_project(start)


def _in_context(err: HarnessError, prefix: str) -> HarnessError:
    """``err`` again, of its own type, its message after ``prefix`` (as it is where its type takes more arguments)."""
    try:
        return type(err)(f"{prefix}: {err}")
    except TypeError:
        return err


def _key(project: Project, key: str) -> str:
    """A configuration key as ``harness.project`` names it in its errors (``tool.harness.`` in pyproject.toml)."""
    return f"tool.harness.{key}" if project.source.name == "pyproject.toml" else key


class _Suite:
    """What every suite shares: the project (set on each subclass), its params, timeout and version."""

    harness_project: ClassVar[Project | None] = None  # the subclass' project; None on harness' own classes
    params: ClassVar[list] = []
    param_names: ClassVar[list[str]] = []
    skip_params: ClassVar[list[tuple]] = []  # combinations asv skips without running setup
    timeout: ClassVar[float] = 600.0  # seconds per benchmark process
    version: ClassVar[str] = VERSION

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:  # harness' own suites: no project
            return
        own_timeout = "timeout" in cls.__dict__
        try:
            project = project_of(cls)
            cls.check_project(project)
        except HarnessError as err:
            raise _in_context(err, f"asv suite {cls.__module__}.{cls.__qualname__} (harness.suites)") from None
        cls.harness_project = project
        cls.params, cls.param_names = cls.suite_params(project)
        cls.skip_params = cls.skipped(project)
        if not own_timeout:
            cls.timeout = cls.suite_timeout(project)

    @classmethod
    def suite_params(cls, project: Project) -> tuple[list, list[str]]:
        """``(params, param_names)`` of this suite for ``project``."""
        return [[w.name for w in project.workloads], [SINGLE, *project.methods]], ["workload", "method"]

    @classmethod
    def skipped(cls, project: Project) -> list[tuple]:
        """Parameter combinations that mean nothing (asv skips them before ``setup``)."""
        return []

    @classmethod
    def suite_timeout(cls, project: Project) -> float:
        """Seconds a benchmark process of this suite may take (asv's ``timeout``)."""
        return float(cls.timeout)

    @classmethod
    def check_project(cls, project: Project) -> None:
        """Raises ``InvalidValue`` (naming the file and key) for a configuration this suite cannot run."""

    @classmethod
    def project(cls) -> Project:
        if cls.harness_project is None:
            raise InvalidValue(f"{cls.__qualname__} is harness' own base suite: subclass it in a benchmark module "
                               "(harness init writes one) to benchmark a project's workloads")
        return cls.harness_project


def _check_batches(project: Project) -> None:
    """Raises ``InvalidValue`` where a workload's ``batch-size`` leaves a device without samples."""
    for entry in project.workloads:
        for ratios in {project.split(), (1.0,) * project.devices}:
            shares = split_batch(entry.batch_size, ratios)
            if min(shares) < 1:
                key = _key(project, f"workloads.{entry.name}.batch-size")
                raise InvalidValue(f"{project.source}: {key}: {entry.batch_size} leaves a device without samples "
                                   f"when split by {list(ratios)} ({list(shares)}); give at least one sample a "
                                   "device")


# -- the devices, the configurations, the prepared steps (one benchmark process) -----------------------------------

_LAYOUT: list[str] = []  # this process's devices: TensorFlow fixes them once per process


def project_devices(project: Project) -> list[str]:
    """The project's ``devices`` devices, laid out on first use: the first GPUs where the machine has enough, else
    as many logical CPU devices. Call it before looking a workload up (its module may run TensorFlow ops)."""
    if not _LAYOUT:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ log out of asv's output
        import tensorflow as tf

        from harness.devices import use_logical_devices

        if len(tf.config.list_physical_devices("GPU")) >= project.devices:
            _LAYOUT.extend(d.name for d in tf.config.list_logical_devices("GPU")[:project.devices])
        else:
            _LAYOUT.extend(use_logical_devices(project.devices))
    if len(_LAYOUT) < project.devices:
        raise NotImplementedError(f"{project.devices} devices asked; this process has {_LAYOUT}")
    return _LAYOUT[:project.devices]


def _references(project: Project, name: str) -> tuple[str, str | None]:
    """The workload's model and data references, a relative file path made absolute from the project's root (asv
    runs each benchmark in a temporary folder; ``harness check`` runs from the root)."""
    from harness.bench.workloads.references import parse_reference

    entry = project.workload(name)

    def absolute(text: str | None, option: str) -> str | None:
        if text is None:
            return None
        ref = parse_reference(text, option)
        path = os.path.expanduser(ref.target)
        return text if not ref.is_file or os.path.isabs(path) else f"{project.root / path}:{ref.attr}"

    model = absolute(entry.model, "model")
    assert model is not None
    return model, absolute(entry.data, "data")


def _workload(project: Project, name: str):
    """``harness.bench.workloads.get`` of workload ``name``; its error names the workload and the configuration."""
    from harness.bench import workloads

    try:
        model, data = _references(project, name)
        return workloads.get(model, data)
    except HarnessError as err:
        hint = (" (asv's benchmark processes import it from the environment asv runs them in: install the project "
                "there, as asv.conf.json's build does, or put its folder on ASV_PYTHONPATH)"
                if "no module named" in str(err) else "")
        raise _in_context(err, f"workload {name!r} of {project.source}{hint}") from err


def _placement(project: Project, method: str, batch: int, ratios=None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Devices and per-device batches of one combination: ``single`` the first device and the whole batch; a
    parallel method every device, ``batch`` split by ``ratios`` (default: the project's split)."""
    devices = project_devices(project)
    if method == SINGLE:
        return (devices[0],), (batch,)
    return tuple(devices), split_batch(batch, project.split() if ratios is None else ratios)


def run_config(project: Project, name: str, method: str, split: str | None = None, **timing):
    """The ``harness.bench.runner.RunConfig`` of workload ``name`` and ``method`` (``split``: ``even``, ``ratio``,
    None for the project's split) at its ``batch-size``; lays the devices out first. ``timing``: RunConfig's
    ``seconds``, ``windows``, ``warmup_steps``.

    Raises:
        NotImplementedError: a split that means nothing here (``single`` has only the whole batch; ``ratio``
            without configured ratios): asv records it as skipped.
    """
    if split not in (None, *SPLITS):
        raise InvalidValue(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    if split == "ratio" and (method == SINGLE or project.ratios is None):
        raise NotImplementedError(f"method {method!r}: one device has only the whole batch" if method == SINGLE
                                  else f"no ratios in {project.source}: only the even split")
    ratios = (1.0,) * project.devices if split == "even" else None
    devices, batches = _placement(project, method, project.workload(name).batch_size, ratios)
    _workload(project, name)  # looked up once per process: its errors name the workload and the configuration
    from harness.bench.runner import RunConfig

    model, data = _references(project, name)
    return RunConfig(model, "tiny", method, devices, batches, data=data, **timing)


_PREPARED: dict = {}  # RunConfig -> (model, x, y): asv runs setup again before each sample of a time_ benchmark


def prepared_step(config) -> tuple:
    """``(model, x, y)``: ``config``'s model as ``harness run`` builds it (``harness.bench.runner.build_model``), one
    batch of ``config.batch`` samples of the workload's data as tensors, and ``config.warmup_steps`` untimed steps
    trained on it (tracing, allocation). Cached per process."""
    if config not in _PREPARED:
        import tensorflow as tf

        from harness.bench import workloads
        from harness.bench.runner import build_model

        workload = workloads.get(config.model, config.data)
        model = build_model(config, workload)
        x, y = workload.make_data(config.size, config.batch, seed=config.seed)
        x, y = (tf.nest.map_structure(tf.constant, part) for part in (x, y))
        for _ in range(config.warmup_steps):
            model.train_on_batch(x, y)
        _PREPARED[config] = (model, x, y)
    return _PREPARED[config]


def _error(err: BaseException) -> dict:
    import traceback

    return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def _cached(results: dict, workload: str, method: str) -> dict:
    """One combination's entry of a ``setup_cache``: raises ``NotImplementedError`` (asv: skipped) for a skip,
    ``RuntimeError`` with the combination's traceback for an error."""
    entry = results.get(f"{workload}/{method}")
    if entry is None:
        raise NotImplementedError(f"no result for {workload}/{method} (not configured when setup_cache ran)")
    if "skip" in entry:
        raise NotImplementedError(entry["skip"])
    if "error" in entry:
        raise RuntimeError(f"{workload} {method}: {entry['error']}\n{entry.get('traceback', '')}")
    return entry


# -- the suites ------------------------------------------------------------------------------------------------------


class Throughput(_Suite):
    """Samples/s of ``harness run`` (``run_one``: ``windows`` windows of ``window_seconds`` after ``warmup_steps``
    steps; the median window) per workload, method and split."""

    window_seconds: ClassVar[float] = 1.0
    windows: ClassVar[int] = 2
    warmup_steps: ClassVar[int] = 1

    @classmethod
    def suite_params(cls, project: Project) -> tuple[list, list[str]]:
        params, names = super().suite_params(project)
        return [*params, list(SPLITS) if project.ratios is not None else ["even"]], [*names, "split"]

    @classmethod
    def skipped(cls, project: Project) -> list[tuple]:
        return [(w.name, SINGLE, "ratio") for w in project.workloads] if project.ratios is not None else []

    @classmethod
    def check_project(cls, project: Project) -> None:
        _check_batches(project)

    def setup(self, workload, method, split):
        self.config = run_config(self.project(), workload, method, split, seconds=self.window_seconds,
                                 windows=self.windows, warmup_steps=self.warmup_steps)

    @_unit("samples/s")
    def track_samples_per_second(self, workload, method, split):
        from harness.bench.runner import run_one

        result = run_one(self.config)
        if result["status"] != "complete":
            raise RuntimeError(f"{workload} {method} with batches {list(self.config.batches)}: {result['status']}: "
                               f"{result['error']}")
        return result["summary"]["samples_per_second"]["median"]


class StepTime(_Suite):
    """Wall time of one ``train_on_batch`` of a prepared batch of the workload's ``batch-size`` (the host waits for
    the step: it returns NumPy), per workload and method; ``warmup_steps`` steps run in ``setup``."""

    number: ClassVar[int] = 1  # a call is a whole step: time each one
    repeat: ClassVar[tuple[int, int, float]] = (10, 50, 5.0)  # asv: (least samples, most samples, seconds)
    warmup_time: ClassVar[float] = 0  # setup ran the warm-up steps
    warmup_steps: ClassVar[int] = 2

    @classmethod
    def check_project(cls, project: Project) -> None:
        _check_batches(project)

    def setup(self, workload, method):
        config = run_config(self.project(), workload, method, warmup_steps=self.warmup_steps)
        self.model, self.x, self.y = prepared_step(config)

    def time_train_step(self, workload, method):
        self.model.train_on_batch(self.x, self.y)


class PeakMemory(_Suite):
    """Peak memory (RSS) of a process that built the workload's model and trained steps of its ``batch-size``, per
    workload and method (TensorFlow itself accounts for much of it)."""

    warmup_steps: ClassVar[int] = 1

    @classmethod
    def check_project(cls, project: Project) -> None:
        _check_batches(project)

    def setup(self, workload, method):
        config = run_config(self.project(), workload, method, warmup_steps=self.warmup_steps)
        self.model, self.x, self.y = prepared_step(config)

    def peakmem_train_step(self, workload, method):
        self.model.train_on_batch(self.x, self.y)


class Fidelity(_Suite):
    """How far parallel training drifts from one device: ``compare_training`` (float64 reference) of the workload's
    ``check-samples`` samples in batches of ``check-batch-size`` on the project's devices and split, per workload
    and parallel method. Every combination trains in ``setup_cache`` (one process; the single-device runs of a
    workload are trained once for all its methods)."""

    combination_timeout: ClassVar[float] = 600.0  # seconds per workload and method in setup_cache

    @classmethod
    def suite_params(cls, project: Project) -> tuple[list, list[str]]:
        return [[w.name for w in project.workloads], list(project.methods)], ["workload", "method"]

    @classmethod
    def suite_timeout(cls, project: Project) -> float:
        return cls.combination_timeout * len(project.workloads) * len(project.methods)

    def setup_cache(self):
        """``{"workload/method": figures | {"error", "traceback"}}`` of every combination."""
        return _fidelity(self.project())

    def setup(self, reports, workload, method):
        self.report = _cached(reports, workload, method)
        if self.report["verdict"] == "FAIL":
            print(f"harness: {workload} {method}: parallel training is NOT the single-device step: "
                  f"{self.report['why']}", file=sys.stderr)

    @_unit("deviation")
    def track_max_deviation(self, reports, workload, method):
        """The worst ``max |dw| / max(1, max |w|)`` over weights and optimizer state."""
        return self.report["max_deviation"]

    @_unit("x rounding floor")
    def track_floor_multiple(self, reports, workload, method):
        """The deviation in multiples of the model's rounding floor (``EquivalenceReport.floor_multiple``); 0 where
        the run is exact (within the workload's ``tol``)."""
        return self.report["floor_multiple"]


def _fidelity(project: Project) -> dict:
    import gc

    from harness.equivalence import compare_training

    devices = project_devices(project)
    out: dict[str, dict] = {}
    for entry in project.workloads:
        try:
            workload = _workload(project, entry.name)
            compiled = workload.compile_args(workload.build("tiny", seed=0))  # the first model: its compile args
            x, y = workload.make_data("tiny", entry.check_samples, seed=0)
        except Exception as err:  # noqa: BLE001  one workload's failure must not take the others' figures along
            out.update({f"{entry.name}/{method}": _error(err) for method in project.methods})
            continue
        single_runs: dict = {}  # the single-device runs, trained once for every method
        for method in project.methods:
            key = f"{entry.name}/{method}"
            try:
                report = compare_training(
                    functools.partial(workload.build, "tiny", 0), x, y, devices=devices,
                    ratios=list(project.split()), method=method, batch_size=entry.check_batch_size,
                    optimizer=workload.optimizer, loss=compiled["loss"], metrics=workload.metrics(),
                    loss_weights=compiled.get("loss_weights"), reference="float64", single_runs=single_runs)
                exact = report.is_equivalent(entry.tol)
                multiple = 0.0 if exact else report.floor_multiple()
                if not math.isfinite(multiple):  # no floor (NaN), or a floor of 0 under a deviation (inf)
                    raise RuntimeError(f"no rounding floor to measure the deviation by: {report.why_not()}")
                out[key] = {"max_deviation": report.max_deviation, "max_loss_deviation": report.max_loss_deviation,
                            "floor_multiple": multiple, "verdict": report.verdict(entry.tol),
                            "why": "" if exact else report.why_not()}
            except Exception as err:  # noqa: BLE001
                out[key] = _error(err)
            gc.collect()
    return out


class TimeToAccuracy(_Suite):
    """Seconds and steps to a workload's accuracy goal (``harness.bench.convergence.train_to_accuracy``) per workload
    and method, the global batch its ``batch-size``, split by the project's split. Only a workload that is a
    ``harness.Workload`` with ``validation_data`` and a ``goal`` has one; the others are skipped. A run that misses
    the goal records twice the budget (finite, never NaN). Every combination trains in ``setup_cache`` (one
    process). ``budget``, ``every`` and ``held_out`` (None: ``train_to_accuracy``'s defaults for a user's goal) set
    the ``Goal``'s step budget, evaluation interval and held-out samples."""

    budget: ClassVar[int | None] = None
    every: ClassVar[int | None] = None
    held_out: ClassVar[int | None] = None
    combination_timeout: ClassVar[float] = 1800.0  # seconds per workload and method in setup_cache

    @classmethod
    def suite_timeout(cls, project: Project) -> float:
        return cls.combination_timeout * len(project.workloads) * (1 + len(project.methods))

    @classmethod
    def check_project(cls, project: Project) -> None:
        _check_batches(project)

    def setup_cache(self):
        """``{"workload/method": figures | {"skip"} | {"error", "traceback"}}`` of every combination."""
        return _train_to_goals(self.project(), self.budget, self.every, self.held_out)

    def setup(self, results, workload, method):
        self.result = _cached(results, workload, method)

    @_unit("s")
    def track_seconds_to_goal(self, results, workload, method):
        return self.result["seconds"]

    @_unit("steps")
    def track_steps_to_goal(self, results, workload, method):
        return self.result["steps"]


def _train_to_goals(project: Project, budget: int | None, every: int | None, held_out: int | None) -> dict:
    import gc

    from harness.bench.convergence import USER_BUDGET, USER_EVERY, Goal, train_to_accuracy

    project_devices(project)
    methods = [SINGLE, *project.methods]
    out: dict[str, dict] = {}
    for entry in project.workloads:
        try:
            workload = _workload(project, entry.name)
        except Exception as err:  # noqa: BLE001  one workload's failure must not take the others' figures along
            out.update({f"{entry.name}/{method}": _error(err) for method in methods})
            continue
        if workload.goal is None:
            why = (f"workload {entry.name!r} ({entry.model}) has no accuracy goal: time to accuracy trains a "
                   "harness.Workload(validation_data=..., goal=...) (docs/user-models.md)")
            out.update({f"{entry.name}/{method}": {"skip": why} for method in methods})
            continue
        goal = None
        if (budget, every, held_out) != (None, None, None):
            goal = Goal(target=workload.goal, budget=budget or USER_BUDGET, every=every or USER_EVERY,
                        **({} if held_out is None else {"held_out": held_out}))
        for method in methods:
            key = f"{entry.name}/{method}"
            try:
                config = run_config(project, entry.name, method)
                result = train_to_accuracy(config, goal)
                out[key] = {"seconds": result.seconds_figure, "steps": result.steps_figure,
                            "reached": result.reached, "final_accuracy": result.final_accuracy}
            except Exception as err:  # noqa: BLE001
                out[key] = _error(err)
            gc.collect()
    return out
