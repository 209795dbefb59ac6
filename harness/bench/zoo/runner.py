"""Conformance: each zoo model x method x split through ``compare_training``, one row per case.

A row's status is the verdict of ``compare_training(reference="float64")``: ``exact`` (within
``tol`` of one device) or ``as accurate as one device`` (the parallel model in float64 equals one
device in float64, and the float32 run is within a few times the model's own rounding floor; see
``harness.equivalence``). Or ``refused: <reason id>: <message>``: harness raised its
``harness.errors.Refused``, deciding not to support the case. Or ``FAIL: <reason>``: drift, any
other error (its traceback kept in the row: never a refusal), or an outcome other than the case's
pin (``harness.bench.zoo.outcomes``: an exact case that turned as accurate or was refused, a
refusal for another reason, a model that must be refused trained anyway).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness.bench.zoo.catalog import ON_JAX, keras_module, select
from harness.bench.zoo.entry import ZooEntry, is_keras3
from harness.equivalence import VERDICTS
from harness.errors import InvalidValue, Refused, Unavailable
from harness.parallel import METHODS as PARALLEL_METHODS

__all__ = ["ZooRow", "SPLITS", "METHODS", "KINDS", "run_zoo", "run_optimizer_axis", "run_case", "status_of_error",
           "kind_of", "count", "methods_of", "splits_of", "ALL_SPLITS"]

SPLITS: dict[str, tuple[int, ...]] = {"even": (1, 1), "3:2": (3, 2), "5:3:2": (5, 3, 2)}
# On JAX also 7:2:1: at the zoo's batch of 10 one device holds a single row (BatchNormalization's statistics over a
# one-row shard), and the last, partial batch leaves a device none.
_JAX_SPLITS: dict[str, tuple[int, ...]] = {**SPLITS, "7:2:1": (7, 2, 1)}
ALL_SPLITS = _JAX_SPLITS  # every split some backend's zoo runs
METHODS = PARALLEL_METHODS
_JAX_METHODS = ("towers",)  # on Keras' JAX backend; mirrored is TensorFlow's MirroredStrategy


def splits_of(keras: str) -> dict[str, tuple[int, ...]]:
    """The splits the zoo checks on ``keras``: even, 3:2 and 5:3:2; on JAX 7:2:1 too."""
    return _JAX_SPLITS if keras == ON_JAX else SPLITS


def methods_of(keras: str) -> tuple[str, ...]:
    """The methods the zoo checks on ``keras``: towers and mirrored on TensorFlow, towers on JAX (``ON_JAX``)."""
    return _JAX_METHODS if keras == ON_JAX else METHODS


@dataclass(frozen=True)
class ZooRow:
    """One conformance case: a model on one Keras, one method, one split."""

    model: str
    keras: str  # "3" or "2" (on TensorFlow), or "jax" (Keras 3 on JAX)
    method: str
    split: str  # a key of splits_of(keras)
    status: str  # a verdict ("exact", "as accurate as one device"), "refused: <reason id>: ...", "FAIL: ..."
    max_deviation: float | None = None  # worst weight/optimizer-state deviation from one device
    loss_deviation: float | None = None  # worst per-epoch loss deviation from one device
    reference_single: float | None = None  # one float32 device's distance from float64
    reference_parallel: float | None = None  # the parallel run's distance from float64
    reference_exact: float | None = None  # the parallel model in float64 vs one device in float64 (not run if exact)
    seconds: float = 0.0
    optimizer: str = ""  # the optimizer axis' "optimizer/option" (``harness.bench.zoo.optimizers``); "" elsewhere
    floor: float | None = None  # the rounding floor: one device vs one device in the other summation orders
    expected: str = "exact"  # the case's pinned outcome (``harness.bench.zoo.outcomes``)
    traceback: str = ""  # an error's whole traceback, where the case raised something other than a refusal
    floor_multiple: float | None = None  # the parallel run's distance from one device in multiples of the floor

    @property
    def failed(self) -> bool:
        return kind_of(self.status) == "FAIL"


def run_zoo(
    names: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    splits: Sequence[str] | None = None,
    keras: str = "3",
    fast_only: bool = False,
    reference: str | None = "float64",
    progress: Callable[[ZooRow, int, int], None] | None = None,
    devices: Sequence[str] | None = None,
    tol: float = 1e-6,
) -> list[ZooRow]:
    """Checks zoo models against one device: every model x method x split, on Keras ``keras``.

    Args:
        names: zoo entries (default all that apply to ``keras``).
        methods: ``"towers"``, ``"mirrored"`` (default ``methods_of(keras)``: both on TensorFlow, towers on JAX).
        splits: keys of ``splits_of(keras)`` (default all): even on 2 devices, 3:2, and 5:3:2 on 3; on JAX 7:2:1.
        keras: ``"3"`` (``keras``) or ``"2"`` (``tf_keras``, or TF 2.15's ``keras``) on TensorFlow; ``"jax"``:
            Keras 3 on its JAX backend (``KERAS_BACKEND=jax``; no TensorFlow).
        fast_only: only the entries of the fast subset.
        reference: ``"float64"`` to judge drift against a float64 run; None for the 1e-6 rule alone.
        progress: called after each case with ``(row, cases done, cases in all)``.
        devices: at least as many devices as the largest split (default: the first 3 GPUs, or
            logical CPUs without GPUs; ``harness.use_logical_devices(3)`` must have run then; on JAX its devices:
            ``harness.use_jax_cpu_devices(3)``).
        tol: what counts as exact.

    Returns:
        One ``ZooRow`` per case, in catalog order.

    Raises:
        ValueError: unknown names, methods or splits (mirrored on JAX); a Keras generation not installed, or Keras
            on another backend than ``keras`` says; too few devices.

    Example:
        >>> harness.use_logical_devices(3)
        >>> rows = run_zoo(["subclassed_mlp"], splits=["5:3:2"])
        >>> print(text_table(rows))
    """
    entries = select(names, keras, fast_only)
    splits = list(splits_of(keras)) if splits is None else list(splits)
    methods = methods_of(keras) if methods is None else methods
    _check(methods, splits, keras)
    k = keras_module(keras)
    return _run([(e, "", reference) for e in entries], k, keras, methods, splits,
                _devices(devices, _needed(splits), keras), tol, progress)


def run_optimizer_axis(
    models: Sequence[str] | None = None,
    optimizers: Sequence[str] | None = None,
    options: Sequence[str] | None = None,
    methods: Sequence[str] = METHODS,
    splits: Sequence[str] = ("3:2",),
    keras: str = "3",
    fast_only: bool = False,
    reference: str | None = "float64",
    progress: Callable[[ZooRow, int, int], None] | None = None,
    devices: Sequence[str] | None = None,
    tol: float = 1e-6,
) -> list[ZooRow]:
    """Checks the optimizer axis (``harness.bench.zoo.optimizers``) against one device: every axis model x
    optimizer x option that Keras ``keras`` has, x method x split; each row's ``optimizer`` names its
    ``optimizer/option``. Arguments as ``run_zoo``'s; ``models``, ``optimizers`` and ``options`` default to all.

    Raises:
        ValueError: unknown names, methods or splits; a Keras generation not installed; too few devices;
            ``keras="jax"`` (the axis runs on TensorFlow).

    Example:
        >>> rows = run_optimizer_axis(["causal_lm"], ["adam"], ["global_clipnorm"], splits=["5:3:2"])
    """
    from harness.bench.zoo import optimizers as axis

    if keras == ON_JAX:
        raise InvalidValue(f"the optimizer axis runs on TensorFlow (keras '3' or '2'); got keras={keras!r}")
    splits = list(splits)
    _check(methods, splits, keras)
    k = keras_module(keras)
    found = axis.cases(k, models, optimizers, options, fast_only)
    return _run([(case.entry, case.label, reference if case.float64 else None) for case in found], k, keras,
                methods, splits, _devices(devices, _needed(splits), keras), tol, progress)


def _check(methods: Sequence[str], splits: Sequence[str], keras: str) -> None:
    allowed = methods_of(keras)
    bad = [m for m in methods if m not in allowed] + [s for s in splits if s not in splits_of(keras)]
    if bad:
        raise InvalidValue(f"unknown methods or splits {bad}; methods {list(allowed)} (on keras {keras!r}), splits "
                           f"{list(splits_of(keras))}")


def _needed(splits: Sequence[str]) -> int:
    return max((len(ALL_SPLITS[s]) for s in splits), default=1)


def _run(entries: Sequence[tuple[ZooEntry, str, str | None]], k, keras: str, methods: Sequence[str],
         splits: Sequence[str], devices: list[str], tol: float,
         progress: Callable[[ZooRow, int, int], None] | None) -> list[ZooRow]:
    """Each ``(entry, optimizer label, reference)`` x method x split, one row each, in order."""
    from harness.bench.zoo import outcomes

    pins, multiples = outcomes.load(), outcomes.load_multiples()
    total = len(entries) * len(methods) * len(splits)
    rows: list[ZooRow] = []
    for entry, label, reference in entries:
        kept: dict = {}  # the model's single-device runs and traced parallel models, shared by its cases
        for method in methods:
            for split in splits:
                key = (entry.name, keras, method, split, label)
                row = run_case(entry, k, keras, method, split, devices, reference=reference, tol=tol,
                               single_runs=kept, expected=outcomes.pinned(key, pins),
                               pinned_multiple=multiples.get(key))
                rows.append(dataclasses.replace(row, optimizer=label) if label else row)
                if progress is not None:
                    progress(rows[-1], len(rows), total)
    return rows


def _devices(devices: Sequence[str] | None, needed: int, keras: str) -> list[str]:
    if keras == ON_JAX:  # JAX's devices by harness' names (cpu:0, gpu:1), TensorFlow not imported
        from harness.parallel.jax import device_name, resolve_jax_devices

        names = [device_name(d) for d in resolve_jax_devices(needed if devices is None else list(devices))]
    else:
        from harness.devices import resolve_devices

        names = resolve_devices(needed if devices is None else list(devices))
    if len(names) < needed:
        raise Unavailable(f"the splits need {needed} devices; got {len(names)}: {names}")
    return names


def run_case(entry: ZooEntry, k, keras: str, method: str, split: str, devices: Sequence[str],
             reference: str | None = "float64", tol: float = 1e-6, single_runs: dict | None = None,
             expected: str | None = None, pinned_multiple: float | None = None) -> ZooRow:
    """One conformance case: ``entry`` on Keras module ``k``, ``method``, split ``split``; never raises.

    ``single_runs``: a dict shared by the cases of one model (``compare_training``'s): its
    single-device runs are trained by the first case and reused by the others, and so is the
    parallel model of each method and device count (``set_ratios`` between splits: no retrace).
    ``expected``: the case's pinned outcome (default: its pin in ``harness.bench.zoo.outcomes``); a row
    that does not meet it is a FAIL. ``pinned_multiple``: the floor multiple an "as accurate" pin records (default:
    the case's in ``harness.bench.zoo.outcomes``); a row more than ``MULTIPLE_SLACK`` times it is a FAIL.
    """
    from harness.bench.zoo import outcomes

    if expected is None:
        key = (entry.name, keras, method, split, "")
        expected = outcomes.pinned(key, outcomes.load())
        pinned_multiple = outcomes.load_multiples().get(key)
    start = time.perf_counter()
    try:
        with _full_tracebacks(k):
            report = _compare(entry, k, method, ALL_SPLITS[split], devices, reference, single_runs, tol)
    except Exception as err:  # noqa: BLE001 - every error becomes the row's status
        status = outcomes.judged(status_of_error(err), expected)
        trace = "" if isinstance(err, Refused) else "".join(traceback.format_exception(err))
        return ZooRow(entry.name, keras, method, split, status, seconds=time.perf_counter() - start,
                      expected=expected, traceback=trace)
    seconds = time.perf_counter() - start
    multiple = None if report.floor is None else report.floor_multiple()
    status = outcomes.judged(_verdict(report, tol), expected, multiple, pinned_multiple)
    return ZooRow(entry.name, keras, method, split, status, max_deviation=report.max_deviation,
                  loss_deviation=report.max_loss_deviation,
                  reference_single=report.reference_single, reference_parallel=report.reference_parallel,
                  reference_exact=report.reference_exact, seconds=seconds, floor=report.floor, expected=expected,
                  floor_multiple=multiple)


def _compare(entry: ZooEntry, k, method: str, ratios: tuple[int, ...], devices: Sequence[str],
             reference: str | None, single_runs: dict | None, tol: float):
    from harness.equivalence import compare_training

    x, y, sample_weight = entry.data()
    kwargs: dict[str, Any] = {}
    if entry.loss_weights is not None:
        kwargs["loss_weights"] = entry.loss_weights  # compare_training must pass them to compile
    return compare_training(
        lambda: entry.build(k), x, y, devices=list(devices[: len(ratios)]), ratios=list(ratios), method=method,
        batch_size=entry.batch_size, epochs=entry.epochs, optimizer=lambda: entry.optimizer(k), loss=entry.loss(k),
        metrics=entry.metrics(k) if entry.metrics else None, sample_weight=sample_weight,
        class_weight=entry.class_weight, reference=reference, single_runs=single_runs,
        validation_data=(x, y) if entry.validation else None,
        skip_float64_parallel_within=tol, **kwargs,
    )


def _verdict(report, tol: float) -> str:
    verdict = str(report.verdict(tol))
    if not verdict.startswith("FAIL"):
        return verdict
    figures = f"max deviation {_e(report.max_deviation)}, loss deviation {_e(report.max_loss_deviation)}"
    return f"FAIL: beyond tol {tol:g} ({figures}): {report.why_not()}"


def _e(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def status_of_error(err: BaseException) -> str:
    """``refused: <reason id>: <message>`` for ``harness.errors.Refused`` alone (harness deciding not to support
    something); ``FAIL: <type>: <message>`` for anything else, harness' other errors included."""
    line = _message(err)
    if isinstance(err, Refused):
        return f"refused: {err.reason}: {line}"
    return f"FAIL: {type(err).__name__}: {line}"


def _message(err: BaseException, limit: int = 300) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    line = lines[0]
    if line == "in user code:":  # autograph: the frames first, the error last
        line = lines[-1]
    elif line.endswith("error:"):  # TensorFlow's "Graph execution error:": the first root error is further down
        line = next((text for text in lines if text.startswith("(0) ")), lines[-1])
    line = re.sub(r"\s*\(defined @ [^)]*\)", "", re.sub(r"\s+", " ", line))  # TF's variable creation sites
    return line if len(line) <= limit else line[: limit - 3] + "..."


@contextlib.contextmanager
def _full_tracebacks(k) -> Iterator[None]:
    # Keras and TensorFlow drop their own frames from tracebacks; an error raised inside Keras would
    # then seem to come from harness's call into it. Whole tracebacks tell who raised. (On JAX there is no
    # TensorFlow to ask: Keras' filter alone.)
    restore = []
    if not (is_keras3(k) and k.backend.backend() == "jax"):
        import tensorflow as tf

        if tf.debugging.is_traceback_filtering_enabled():
            tf.debugging.disable_traceback_filtering()
            restore.append(tf.debugging.enable_traceback_filtering)
    if is_keras3(k) and k.config.is_traceback_filtering_enabled():
        k.config.disable_traceback_filtering()
        restore.append(k.config.enable_traceback_filtering)
    try:
        yield
    finally:
        for enable in restore:
            enable()


KINDS = tuple(v for v in VERDICTS if v != "FAIL") + ("refused", "FAIL")  # what a status can be


def kind_of(status: str) -> str:
    """The kind (one of ``KINDS``) of a row's status; anything unknown is a FAIL."""
    if status in VERDICTS:
        return status
    return "refused" if status.startswith("refused: ") else "FAIL"


def count(rows: Sequence[ZooRow]) -> dict[str, int]:
    """Rows per kind of status, every kind in ``KINDS`` present."""
    kinds = dict.fromkeys(KINDS, 0)
    for row in rows:
        kinds[kind_of(row.status)] += 1
    return kinds


def finite(value: float | None) -> float | None:
    """``value``, or None where it is missing or not finite (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None
