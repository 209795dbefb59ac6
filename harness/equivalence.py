"""Trains one model on one device and in parallel, from the same start, and compares.

Used by ``assert_equivalent`` (pytest), ``harness check`` (CLI) and the
benchmarks' fidelity tracks, so "equivalent" means the same thing everywhere.

Two criteria:

- **exact**: every weight, optimizer variable and epoch loss of the parallel run
  within ``tol`` (default 1e-6) of the single-device float32 run.
- **as accurate as one device** (``reference="float64"``): float32 rounding alone can
  put a correct parallel step 1e-5 from the single-device float32 step on a real CNN
  (BatchNormalization, depthwise convolutions), and training amplifies it. Two
  measurements tell that rounding from a bug: the model's **rounding floor**, the
  rounding this model shows on one device, and a parallel run in float64 beside a
  single-device one in float64, where rounding is a billion times smaller. The floor
  is the larger of two measured distances of the single-device run: from a second
  single-device run that differs from it only in summation order (each batch's rows
  reversed: the same batches, the same mathematics), and from the single-device run
  in float64. The parallel run passes when the float64 pair agree (``FLOAT64_TOL``)
  and its own distance from the single-device run is at most ``FLOOR_FACTOR`` times
  the floor. A mixed-precision model's runs are all in its policy, the floor's too
  (there the order alone may change nothing: float16 products add up exactly in a
  float32 accumulator, and the distance from float64 is the floor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.compat import new_optimizer, releasing_traced_graphs
from harness.errors import InvalidValue, Refused

__all__ = ["WeightDiff", "EquivalenceReport", "compare_training", "assert_equivalent", "relative_deviation",
           "REFERENCES", "VERDICTS", "FLOOR_FACTOR", "FLOAT64_TOL"]

REFERENCES = ("float64",)  # the accepted values of ``reference`` besides None
VERDICTS = ("exact", "as accurate as one device", "FAIL")  # ``EquivalenceReport.verdict``
FLOAT64_TOL = 1e-9  # the parallel float64 run vs the single-device float64 run: rounding of float64 only
# The parallel float32 run's distance from the single-device run, at most this many times the rounding floor
# (two single-device runs in different summation orders). docs/design.md, "Float32 fidelity", has the measurements.
FLOOR_FACTOR = 8.0
FLOOR_ORDER = "each batch's rows reversed"  # how the floor's second single-device run differs from the first


@dataclass(frozen=True)
class WeightDiff:
    """How far one variable of the parallel run is from the single-device run."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    scale: float

    @property
    def deviation(self) -> float:
        """``max |Δw| / max(1, max |w|)``: absolute for small weights, relative for large."""
        return self.max_abs_diff / self.scale


@dataclass(frozen=True)
class EquivalenceReport:
    """The outcome of ``compare_training``."""

    method: str
    devices: tuple[str, ...]
    ratios: tuple[float, ...]
    batch_size: int
    steps: int
    diffs: tuple[WeightDiff, ...]
    loss_single: tuple[float, ...]
    loss_parallel: tuple[float, ...]
    metrics_single: dict = field(default_factory=dict)
    metrics_parallel: dict = field(default_factory=dict)
    # reference="float64": the distances of each float32 run from a float64 run on one device,
    # measured like ``WeightDiff.deviation`` (max |Δw| / max(1, max |w_float64|)) over every weight
    # and, where the float64 run's optimizer has the same variables, every optimizer variable.
    reference: str | None = None
    reference_single: float | None = None
    reference_parallel: float | None = None
    reference_diffs_single: tuple[WeightDiff, ...] = ()  # per variable, single-device run vs float64
    reference_diffs_parallel: tuple[WeightDiff, ...] = ()  # per variable (same order), parallel run vs float64
    loss_reference: tuple[float, ...] = ()  # the float64 run's loss per epoch
    reference_exact: float | None = None  # the parallel float64 run's distance from the single-device float64 run
    # The rounding floor: the larger of the single-device run's distances from a second single-device run in
    # another summation order (FLOOR_ORDER; ``floor_order``) and from the single-device float64 run; weights
    # and optimizer variables as ``max_deviation``, the per-epoch loss as ``max_loss_deviation``. None where not
    # measured (no reference, or the float32 runs were exact).
    floor: float | None = None
    floor_loss: float | None = None
    floor_order: float | None = None  # weights and optimizer variables: the single-device runs' distance

    @property
    def max_deviation(self) -> float:
        """The worst ``WeightDiff.deviation`` (weights and optimizer state); NaN if any is NaN."""
        return _max_deviation(self.diffs)

    @property
    def max_loss_deviation(self) -> float:
        return _max_rel(self.loss_single, self.loss_parallel)

    def worst(self, limit: int = 10) -> list[WeightDiff]:
        return sorted(self.diffs, key=lambda d: -np.nan_to_num(d.deviation, nan=np.inf))[:limit]

    def is_equivalent(self, tol: float) -> bool:
        deviations = [self.max_deviation, self.max_loss_deviation]
        return all(not math.isnan(v) and v <= tol for v in deviations)

    def as_accurate(self, factor: float = 2.0, slack: float = 1e-7) -> bool:
        """Whether the parallel run is as accurate as one device, judged against the float64 run.

        True when ``reference_parallel <= factor * reference_single + slack``; a NaN
        distance fails. Only weights and optimizer variables count (see
        ``compare_training``), not the per-epoch loss.

        Raises:
            ValueError: the report has no reference (``compare_training(..., reference="float64")``
                makes one), or ``factor``/``slack`` is negative or not finite.
        """
        _check_number("factor", factor, positive=True)
        _check_number("slack", slack)
        if self.reference is None or self.reference_single is None or self.reference_parallel is None:
            raise InvalidValue("as_accurate() needs a float64 reference: this report has none; run "
                             "compare_training(..., reference='float64')")
        single, parallel = self.reference_single, self.reference_parallel
        if math.isnan(single) or math.isnan(parallel):
            return False
        return parallel <= factor * single + slack

    def within_floor(self, factor: float = FLOOR_FACTOR) -> bool:
        """Whether the parallel run is no farther from the single-device run than ``factor`` times the rounding
        floor: weights and optimizer variables against ``floor``, the per-epoch loss against ``floor_loss``.

        Raises:
            ValueError: no floor was measured (``compare_training(..., reference="float64")`` measures it where
                the float32 runs are not exact), or ``factor`` negative or not finite.
        """
        _check_number("factor", factor, positive=True)
        if self.floor is None or self.floor_loss is None:
            raise InvalidValue("within_floor() needs the rounding floor: this report has none; run "
                             "compare_training(..., reference='float64')")
        pairs = ((self.max_deviation, self.floor), (self.max_loss_deviation, self.floor_loss))
        return all(not math.isnan(run) and not math.isnan(floor) and run <= factor * floor for run, floor in pairs)

    def why_not(self) -> str:
        """Why a report that is not exact is not as accurate as one device either, in words (its FAIL reason);
        ``"as accurate as one device"`` where it is."""
        return self._rounding_failure() or "as accurate as one device"

    def _rounding_failure(self) -> str | None:
        """The reason the difference from one device is not float32 rounding, or None where it is: the one rule
        ``verdict`` applies and ``why_not`` words."""
        if self.reference is None:
            return "no float64 reference to tell rounding from drift"
        if self.reference_exact is None:
            return "the parallel float64 run was not trained"
        if not self.reference_exact <= FLOAT64_TOL:
            return (f"not exact in float64 either (parallel vs one device, both float64: {self.reference_exact:.3e} "
                    f"> {FLOAT64_TOL:g}): a bug in the mathematics, not rounding")
        if self.floor is None or self.floor_loss is None:
            return "no rounding floor was measured"
        if self.within_floor():
            return None
        return (f"{self.floor_multiple():.3g} x this model's rounding floor on one device (weights {self.floor:.3e}, "
                f"loss {self.floor_loss:.3e}), more than {FLOOR_FACTOR:g} x, though exact in float64: a defect of "
                f"low-precision arithmetic, or rounding this model amplifies beyond what one device shows")

    def floor_multiple(self) -> float:
        """The parallel run's distance from the single-device run in multiples of the rounding floor (the worse of
        weights and loss); inf where the floor is 0 and the distance is not, NaN without a floor."""
        if self.floor is None or self.floor_loss is None:
            return math.nan
        return _worst(_multiple(self.max_deviation, self.floor), _multiple(self.max_loss_deviation, self.floor_loss))

    def verdict(self, tol: float = 1e-6) -> str:
        """``"exact"``, ``"as accurate as one device"`` or ``"FAIL"``.

        ``"exact"``: ``is_equivalent(tol)``. Otherwise, with a float64 reference, two
        measurements must both pass: the parallel model trained in float64 equals the single
        device in float64 (``reference_exact <= FLOAT64_TOL``; there rounding is a billion
        times smaller, so what remains is a bug in the mathematics), and the parallel float32
        run is within ``FLOOR_FACTOR`` times this model's rounding floor of the single-device
        run (``within_floor``; a defect of float32 or float16 arithmetic alone, which float64
        cannot see, lands far beyond it). Then ``"as accurate as one device"``. Reports without
        a reference are exact or FAIL.

        Raises:
            ValueError: ``tol`` negative or not finite.
        """
        _check_number("tol", tol)
        if self.is_equivalent(tol):
            return "exact"
        return "FAIL" if self._rounding_failure() else "as accurate as one device"

    def worst_against_reference(self, limit: int = 10) -> list[tuple[WeightDiff, WeightDiff]]:
        """``(single vs float64, parallel vs float64)`` of the variables the parallel run has farthest from it."""
        pairs = list(zip(self.reference_diffs_single, self.reference_diffs_parallel))
        return sorted(pairs, key=lambda p: -np.nan_to_num(p[1].deviation, nan=np.inf))[:limit]

    def table(self, limit: int = 10) -> str:
        """A fixed-width table of the worst-differing variables, for failure messages.

        With a reference, a second table shows the variables the parallel run has
        farthest from the float64 run, each with the single-device run's distance.
        """
        rows = [f"{'variable':<48} {'shape':<16} {'max |dw|':>11} {'deviation':>11}"]
        for d in self.worst(limit):
            rows.append(f"{d.name[:48]:<48} {str(d.shape)[:16]:<16} {d.max_abs_diff:>11.3e} {d.deviation:>11.3e}")
        rows.append(
            f"loss per epoch: single {list(_round(self.loss_single))} vs parallel {list(_round(self.loss_parallel))}"
        )
        if self.reference is not None:
            rows.append(f"distance from the {self.reference} run on one device: {self._reference_figures()}")
            rows.append(f"{'variable (farthest from ' + self.reference + ')':<48} {'shape':<16} "
                        f"{'single':>11} {'parallel':>11}")
            for single, parallel in self.worst_against_reference(limit):
                rows.append(f"{parallel.name[:48]:<48} {str(parallel.shape)[:16]:<16} "
                            f"{single.deviation:>11.3e} {parallel.deviation:>11.3e}")
            rows.append(f"{self.reference} loss per epoch: {list(_round(self.loss_reference))}")
        return "\n".join(rows)

    def summary(self) -> str:
        text = (
            f"{self.method} on {len(self.devices)} devices, ratios {list(self.ratios)}, batch {self.batch_size}, "
            f"{self.steps} steps: max weight deviation {self.max_deviation:.3e}, "
            f"max loss deviation {self.max_loss_deviation:.3e}"
        )
        if self.reference is not None:
            text += f"; distance from {self.reference}: {self._reference_figures()}"
        return text

    def _reference_figures(self) -> str:
        single, parallel = _or_nan(self.reference_single), _or_nan(self.reference_parallel)
        text = f"single {single:.3e}, parallel {parallel:.3e}"
        if self.reference_exact is not None:
            text += f"; parallel in {self.reference} vs one device in {self.reference}: {self.reference_exact:.3e}"
        if self.floor is not None and self.floor_loss is not None:
            within = self.within_floor()
            order = "-" if self.floor_order is None else f"{self.floor_order:.3e}"
            text += (f"; rounding floor {self.floor:.3e}, loss {self.floor_loss:.3e} (one device vs one device "
                     f"with {FLOOR_ORDER}: {order}): parallel at {self.floor_multiple():.3g} x it "
                     f"({'<=' if within else '>'} {FLOOR_FACTOR:g} x)")
        return text


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _worst(*values: float) -> float:
    """The largest of ``values``; NaN where any is (``max`` would drop a NaN that is not first)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _multiple(run: float, floor: float) -> float:
    if math.isnan(run) or math.isnan(floor):
        return math.nan
    if floor == 0:
        return 0.0 if run == 0 else math.inf
    return run / floor


def _check_number(name: str, value, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        wanted = "a positive" if positive else "a non-negative"
        raise InvalidValue(f"{name} must be {wanted} finite number; got {name}={value!r}")


def _max_deviation(diffs: Sequence[WeightDiff]) -> float:
    values = [d.deviation for d in diffs]
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


def _round(values):
    return (float(f"{v:.6g}") for v in values)


def _max_rel(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return math.inf
    diffs = [abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b)]
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


def relative_deviation(reference: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """``(max |a - b|, max(1, max |a|))`` of two arrays."""
    reference = np.asarray(reference, dtype=np.float64)
    other = np.asarray(other, dtype=np.float64)
    diff = float(np.max(np.abs(reference - other))) if reference.size else 0.0
    scale = max(1.0, float(np.max(np.abs(reference)))) if reference.size else 1.0
    return diff, scale


def _length(data) -> int:
    import tensorflow as tf  # tf.nest: the same on Keras 2 and 3

    return len(tf.nest.flatten(data)[0])


def _fresh_metrics(metrics, keras):
    """Metric objects copied per model: one instance compiled into two models shares its state."""

    def fresh(metric):
        if isinstance(metric, keras.metrics.Metric):
            return metric.__class__.from_config(metric.get_config())
        return metric

    if isinstance(metrics, dict):
        return {k: _fresh_metrics(v, keras) for k, v in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [fresh(m) if not isinstance(m, (list, tuple, dict)) else _fresh_metrics(m, keras) for m in metrics]
    return fresh(metrics)


def _jit_argument(jit_compile, keras) -> dict:
    # Keras 2 spells "let Keras decide" as None; Keras 3 as "auto".
    if jit_compile == "auto" and not hasattr(keras, "ops"):
        return {"jit_compile": None}
    return {"jit_compile": jit_compile}


@releasing_traced_graphs()  # a CI suite compares many models in one process
def compare_training(
    build_model: Callable[[], object],
    x,
    y,
    *,
    devices,
    ratios: Sequence[float] | None = None,
    method: str | Callable[[Any, Any, Any], Any] = "mirrored",
    batch_size: int = 32,
    epochs: int = 1,
    optimizer="sgd",
    loss="mse",
    metrics=None,
    sample_weight=None,
    class_weight=None,
    sync_batchnorm: bool = True,
    seed: int = 0,
    loss_weights=None,
    callbacks=None,
    jit_compile="auto",
    reference: str | None = None,
    single_runs: dict | None = None,
    skip_float64_parallel_within: float | None = None,
) -> EquivalenceReport:
    """Trains ``build_model()`` on one device and with ``parallelize``; compares weights.

    Both runs start from the same initial weights, see the same batches in the
    same order (no shuffling) and use fresh copies of ``optimizer``.

    Args:
        build_model: returns a new, built Keras model (called twice; four times with ``reference``).
        x: training inputs (arrays or nested structures of arrays).
        y: training targets (arrays or nested structures of arrays).
        devices: as for ``parallelize``.
        ratios: as for ``parallelize``.
        method: as for ``parallelize``; may also be a callable ``(template, devices, ratios) -> model`` to
            check a parallel wrapper of your own. Its model must leave the
            trained weights in ``template``.
        sync_batchnorm: as for ``parallelize``.
        batch_size: global batch size; a partial last batch is included.
        epochs: passes over the data.
        optimizer: a name, an optimizer (copied via its config) or a factory.
        loss: as for ``compile``.
        loss_weights: as for ``compile``.
        metrics: as for ``compile``.
        sample_weight: as for ``fit``.
        class_weight: as for ``fit``.
        seed: seeds Keras before building the models.
        callbacks: Keras callbacks for the parallel run only, e.g. one that
            calls ``self.model.set_ratios(...)`` between steps.
        jit_compile: passed to ``compile`` of both models (XLA on or off).
        reference: None, or ``"float64"``: also train a float64 copy of the model
            on one device and report each float32 run's distance from it
            (``reference_single``, ``reference_parallel``; see
            ``EquivalenceReport.as_accurate``), and train the parallel model in
            float64 too, reporting its distance from the single-device float64
            run (``reference_exact``; see ``EquivalenceReport.verdict``). The copy is ``build_model()``
            called under the float64 dtype policy and floatx (Keras 3:
            ``keras.config``; Keras 2: ``mixed_precision.set_global_policy``
            and ``backend.set_floatx``; the previous ones are restored, mixed
            precision policies included), given the single-device run's initial
            weights, and trained with the same batches, a fresh copy of
            ``optimizer``, ``loss`` (Keras 3 ``Loss`` objects are re-created from
            their config so that they compute in float64), ``metrics``,
            ``sample_weight`` and ``class_weight``. Float inputs, targets and
            sample weights are cast to float64; integer ones (token ids, class
            labels) are not. Compared with it: every model weight (trainable or
            not, e.g. BatchNormalization's moving statistics) and, where its
            optimizer has as many variables of the same shapes as the float32
            runs' (not so under a ``LossScaleOptimizer``), every optimizer
            variable; each by ``max |Δ| / max(1, max |float64 value|)``. And the
            rounding floor (``floor``, ``floor_loss``): the larger of the single-device
            run's distances from the float64 run and from ``build_model()`` trained on
            one device once more, in float32 (its policy), from the same weights, on the
            same batches with each batch's rows reversed (``floor_order``).
        single_runs: a dict, empty at first, passed again to calls that train the same model on the same
            data with the same options and differ only in ``devices``, ``ratios`` or ``method`` (the
            zoo's cases of one model): the single-device runs (float32, and float64 with
            ``reference``) are trained by the first call, kept in it and reused by the others. So is
            the parallel model of each method and device list (not a ``method`` callable's): built,
            compiled and traced by the first call for those devices, then restored to the initial
            weights and optimizer state and split by ``set_ratios``, which needs no retrace (the
            parallel float64 model too).
        skip_float64_parallel_within: with ``reference``, a tolerance: where the float32 runs already
            agree within it (``is_equivalent``), the parallel float64 run is skipped
            and so is the rounding floor's run (``reference_exact``, ``floor`` and ``floor_loss`` stay None;
            ``verdict`` at that tolerance is "exact" without them).

    Returns:
        An ``EquivalenceReport`` covering every weight and optimizer variable.

    Raises:
        ValueError: ``batch_size``/``epochs`` not positive, x and y differ in length,
            ``reference`` not None or ``"float64"``, or (``reference="float64"``)
            ``build_model()`` builds variables that stay in a lower precision
            under the float64 policy (a layer with variables given its own
            ``dtype``; Keras 3 layers without variables, such as the mixed
            precision pattern ``Activation("softmax", dtype="float32")``, are
            made float64; Keras 2 ones are refused too), or a Keras 3 ``Loss``
            that cannot be re-created in float64.
    """
    from harness.compat import is_keras2_model, keras_module_of, set_random_seed
    from harness.parallel import parallelize

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InvalidValue(f"batch_size must be a positive int; got batch_size={batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0:
        raise InvalidValue(f"epochs must be a positive int; got epochs={epochs!r}")
    if reference is not None and (not isinstance(reference, str) or reference not in REFERENCES):
        raise InvalidValue(f"reference must be None or one of {list(REFERENCES)}; got reference={reference!r}")
    n = _length(x)
    if y is not None and _length(y) != n:
        raise InvalidValue(f"x and y must have the same number of samples; got len(x)={n}, len(y)={_length(y)}")

    kept = single_runs if single_runs is not None else {}
    set_random_seed(seed)
    single: Any = None if "single" in kept else build_model()  # Keras models: TensorFlow and Keras are untyped
    initial_weights = kept["initial"] if single is None else kept.setdefault("initial", single.get_weights())
    # A parallel model of harness's own is kept for later calls over these devices (its trace too).
    shared = None if callable(method) or single_runs is None else (method, tuple(devices), bool(sync_batchnorm))
    wrap: Callable[[Any, Any, Any], Any]  # (template, devices, ratios) -> parallel model
    if callable(method):  # a user's own wrapper
        wrap = method
    else:
        method_name = method
        wrap = lambda t, d, r: parallelize(t, d, ratios=r, method=method_name, sync_batchnorm=sync_batchnorm)  # noqa: E731

    def made():
        template = build_model()
        template.set_weights(initial_weights)
        return template, wrap(template, devices, ratios)

    key = shared and ("parallel", *shared)
    traced = _Traced.take(kept, key, initial_weights, ratios)
    template, parallel = made() if traced is None else (traced.template, traced.parallel)
    keras = keras_module_of(template)  # Keras 3, or Keras 2 (tf_keras / TF <= 2.15)
    method = getattr(method, "__name__", "custom") if callable(method) else method
    keras2 = is_keras2_model(template)
    # Built (and checked) before any training, so that a model that cannot be float64 fails at once.
    # The parallel model in float64 (where float32 rounding hides a difference, float64's does not)
    # only where it is trained.
    float64 = None
    if reference is not None and "float64" not in kept:
        float64 = _build_float64(build_model, initial_weights, keras, keras2)

    fit_args = dict(
        batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
        sample_weight=sample_weight, class_weight=class_weight,
    )
    def compiled(model):
        model.compile(optimizer=new_optimizer(optimizer, keras), loss=loss, loss_weights=loss_weights,
                      metrics=_fresh_metrics(metrics, keras), **_jit_argument(jit_compile, keras))
        return model

    if "single" not in kept:
        history = _slots_built(compiled(single)).fit(x, y, **fit_args).history
        kept["single"] = _Run(_keep(single.weights), _keep(single.optimizer.variables), history)
    one = kept["single"]
    if traced is None:
        traced = _Traced.of(template, compiled(parallel), shared)
    histories = [one.history, parallel.fit(x, y, callbacks=callbacks, **fit_args).history]
    traced.keep(kept, key)  # trained to the end: reusable

    diffs = _diff_variables(one.weights, template.weights, "")
    diffs += _diff_variables(one.optimizer, parallel.optimizer.variables, "optimizer/")
    steps = epochs * math.ceil(n / batch_size)
    metric_keys = [k for k in histories[0] if k != "loss"]
    report = EquivalenceReport(
        method=method,
        devices=tuple(getattr(parallel, "devices", devices)),
        ratios=tuple(getattr(parallel, "ratios", ratios or ())),
        batch_size=batch_size,
        steps=steps,
        diffs=tuple(diffs),
        loss_single=tuple(histories[0]["loss"]),
        loss_parallel=tuple(histories[1]["loss"]),
        metrics_single={k: histories[0][k] for k in metric_keys},
        metrics_parallel={k: histories[1].get(k) for k in metric_keys},
    )
    if reference is None:
        return report
    in_float64 = dict(keras=keras, keras2=keras2)
    compile64 = dict(in_float64, optimizer=optimizer, loss=loss, loss_weights=loss_weights, metrics=metrics,
                     jit_compile=jit_compile)
    if "float64" not in kept:
        assert float64 is not None  # built above: reference is set and no float64 run was kept
        _compile_float64(float64, **compile64, slots_first=True)
        history64 = {"loss": list(_fit_float64(float64, x, y, **in_float64, fit_args=fit_args))}
        kept["float64"] = _Run(_keep(float64.weights), _keep(float64.optimizer.variables), history64)
    exact = kept["float64"]
    reference_exact = floor_order = floor_loss_order = None
    if skip_float64_parallel_within is None or not report.is_equivalent(skip_float64_parallel_within):
        if "floor" not in kept:  # the rounding floor: one device again, in another summation order
            floor_model: Any = build_model()  # a Keras model: untyped
            floor_model.set_weights(initial_weights)
            order = _reversed_batches(n, batch_size)
            floor_args = {**fit_args, "sample_weight": _rows(sample_weight, order)}
            history = _slots_built(compiled(floor_model)).fit(_rows(x, order), _rows(y, order), **floor_args).history
            kept["floor"] = _Run(_keep(floor_model.weights), _keep(floor_model.optimizer.variables), history)
        again = kept["floor"]
        floor_order = _max_deviation(_diff_variables(one.weights, again.weights, "")
                                     + _diff_variables(one.optimizer, again.optimizer, "optimizer/"))
        floor_loss_order = _max_rel(one.history["loss"], again.history["loss"])
        key64 = shared and ("float64", *shared)
        traced64 = _Traced.take(kept, key64, _float64_weights(initial_weights), ratios)
        if traced64 is None:
            with _float64_policy(keras, keras2):
                template64 = _build_float64(build_model, initial_weights, keras, keras2)
                parallel64 = wrap(template64, devices, ratios)
                _compile_float64(parallel64, **compile64)
                traced64 = _Traced.of(template64, parallel64, shared)
        template64, parallel64 = traced64.template, traced64.parallel
        _fit_float64(parallel64, x, y, **in_float64, fit_args=fit_args, callbacks=callbacks)
        traced64.keep(kept, key64)
        exact64 = _diff_variables(exact.weights, template64.weights, "")
        exact64 += _diff_variables(exact.optimizer, parallel64.optimizer.variables, "optimizer/")
        reference_exact = _max_deviation(exact64)
    pairs = [(exact.weights, one.weights, template.weights, "")]
    extra = _leading_extras(exact.optimizer, one.optimizer)
    if extra is not None:  # the optimizer's state too, where the float64 run has it: the floor spans what diffs do
        pairs.append((exact.optimizer, one.optimizer[extra:], parallel.optimizer.variables[extra:], "optimizer/"))
    against_single: list[WeightDiff] = []
    against_parallel: list[WeightDiff] = []
    for in_float64, in_single, in_parallel, prefix in pairs:
        against_single += _diff_against(in_float64, in_single, in_single, prefix)
        against_parallel += _diff_against(in_float64, in_parallel, in_single, prefix)
    reference_single = _max_deviation(against_single)
    floor = floor_loss = None
    if floor_order is not None and floor_loss_order is not None:
        floor = _worst(floor_order, reference_single)
        floor_loss = _worst(floor_loss_order, _max_rel(exact.history["loss"], one.history["loss"]))
    return replace(
        report, reference=reference, reference_single=reference_single,
        reference_parallel=_max_deviation(against_parallel), reference_diffs_single=tuple(against_single),
        reference_diffs_parallel=tuple(against_parallel), loss_reference=tuple(exact.history["loss"]),
        reference_exact=reference_exact, floor=floor, floor_loss=floor_loss, floor_order=floor_order,
    )


@dataclass(frozen=True)
class _Traced:
    """A compiled parallel model (and its template), kept where it may serve other splits over the same devices.

    Its step function is traced once: a later comparison restores the initial weights and the
    optimizer's initial state (every variable it tracks, loss scales included, from a checkpoint
    written before its first step) and sets the split with ``set_ratios``, which needs no
    retrace (what ``harness.Rebalance`` does between steps).
    """

    template: Any
    parallel: Any
    checkpoint: Any = None  # tf.train.Checkpoint of the optimizer; None: not kept for reuse
    path: str = ""  # where its initial state was written
    directory: Any = None  # the TemporaryDirectory holding it (removed with this object)

    @classmethod
    def of(cls, template, parallel, shared) -> _Traced:
        """``parallel`` (compiled, not trained yet), with its optimizer's initial state saved where ``shared``."""
        if not shared:
            return cls(template, parallel)
        import tempfile

        import tensorflow as tf

        parallel.build_optimizer()
        directory = tempfile.TemporaryDirectory(prefix="harness-optimizer-")
        checkpoint = tf.train.Checkpoint(optimizer=parallel.optimizer)
        return cls(template, parallel, checkpoint, checkpoint.write(f"{directory.name}/initial"), directory)

    @staticmethod
    def take(kept: dict, key, initial_weights, ratios) -> _Traced | None:
        """The one ``kept`` under ``key`` (removed until kept again), restored and split by ``ratios``; or None."""
        traced = kept.pop(key, None) if key else None
        if traced is not None:
            traced.restored(initial_weights, ratios)
        return traced

    def keep(self, kept: dict, key) -> None:
        if key and self.checkpoint is not None:
            kept[key] = self

    def restored(self, initial_weights, ratios):
        """The parallel model with the initial weights and optimizer state, split by ``ratios``."""
        self.parallel.set_weights(initial_weights)
        self.parallel.sync_to_template()
        self.checkpoint.read(self.path).assert_existing_objects_matched()
        self.parallel.set_ratios([1] * len(self.parallel.devices) if ratios is None else ratios)
        return self.parallel


@dataclass(frozen=True)
class _Kept:
    """A trained variable's name and value, kept after its model is gone."""

    path: str
    value: np.ndarray

    def __array__(self, dtype=None, copy=None):
        return self.value if dtype is None else self.value.astype(dtype)


@dataclass(frozen=True)
class _Run:
    """A single-device run as ``compare_training`` compares it: weights, optimizer variables, history."""

    weights: list
    optimizer: list
    history: dict


def _keep(variables) -> list[_Kept]:
    # .numpy(): np.array(variable) warns on NumPy 2 (Keras 3 variables' __array__ takes no copy=).
    return [_Kept(_variable_name(v), np.array(v.numpy())) for v in variables]


def _diff_variables(reference, other, prefix: str) -> list[WeightDiff]:
    if len(reference) != len(other):
        raise AssertionError(
            f"{prefix or 'model '}variables differ in number: single {len(reference)} vs parallel {len(other)}"
        )
    diffs = []
    for ref, var in zip(reference, other):
        a, b = np.asarray(ref), np.asarray(var)
        if a.shape != b.shape:
            raise AssertionError(f"{prefix}{_variable_name(ref)}: shape {a.shape} (single) vs {b.shape} (parallel)")
        diff, scale = relative_deviation(a, b)
        diffs.append(WeightDiff(prefix + _variable_name(ref), tuple(a.shape), diff, scale))
    return diffs


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or variable.name  # Keras 3 variables have a path, tf.Variables a name


def _leading_extras(reference, other) -> int | None:
    """How many leading variables ``other`` has beyond ``reference`` when its others are ``reference``'s, shape for
    shape; None where they are not. Keras 3's LossScaleOptimizer (mixed precision) lists its own variables (its
    iteration, learning rate, step counter and dynamic scale) before its inner optimizer's, which the float64
    run's optimizer has alone; tf_keras' lists the inner optimizer's alone (0 extras)."""
    extra = len(other) - len(reference)
    return extra if extra >= 0 and _same_shapes(reference, other[extra:]) else None


def _same_shapes(reference, other) -> bool:
    return len(reference) == len(other) and all(
        tuple(np.shape(a)) == tuple(np.shape(b)) for a, b in zip(reference, other))


def _diff_against(exact, run, named, prefix: str) -> list[WeightDiff]:
    """``WeightDiff`` of each variable of ``run`` from the float64 run's, scaled by the float64 values."""
    if not _same_shapes(exact, run):
        raise InvalidValue(
            f"build_model() built a float64 model whose {prefix or 'model '}variables differ from the float32 "
            f"model's: {[tuple(np.shape(v)) for v in exact]} vs {[tuple(np.shape(v)) for v in run]}"
        )
    diffs = []
    for ref, var, name in zip(exact, run, named):
        a = np.asarray(ref)
        diff, scale = relative_deviation(a, np.asarray(var))
        diffs.append(WeightDiff(prefix + _variable_name(name), tuple(a.shape), diff, scale))
    return diffs


_LOW_FLOATS = ("float16", "bfloat16", "float32")


def _dtype_name(dtype) -> str:
    return str(getattr(dtype, "name", dtype))


@contextmanager
def _float64_policy(keras, keras2: bool) -> Iterator[None]:
    """The global dtype policy and floatx of ``keras`` set to float64; the previous ones restored on exit."""
    if keras2:  # Keras 2: tf_keras, or TF <= 2.15's keras
        policy, floatx = keras.mixed_precision.global_policy(), keras.backend.floatx()
        set_policy, set_floatx = keras.mixed_precision.set_global_policy, keras.backend.set_floatx
    else:
        policy, floatx = keras.config.dtype_policy(), keras.config.floatx()
        set_policy, set_floatx = keras.config.set_dtype_policy, keras.config.set_floatx
    try:
        set_floatx("float64")
        set_policy("float64")
        yield
    finally:
        set_floatx(floatx)
        set_policy(policy)


def _reversed_batches(n: int, batch_size: int) -> np.ndarray:
    """The sample order in which each batch of ``batch_size`` (the last one partial) has its rows reversed."""
    return np.concatenate([np.arange(start, min(start + batch_size, n))[::-1] for start in range(0, n, batch_size)])


def _rows(data, order: np.ndarray):
    """``data`` (None, an array, or a nested structure of arrays) with its samples taken in ``order``."""
    if data is None:
        return None
    import tensorflow as tf

    return tf.nest.map_structure(lambda leaf: np.asarray(leaf)[order], data)


def _as_float64(data):
    """``data`` with its float arrays (float16, bfloat16, float32) cast to float64; other leaves as they are."""
    if data is None:
        return None
    import tensorflow as tf

    def cast(leaf):
        if _dtype_name(getattr(leaf, "dtype", None)) in _LOW_FLOATS:
            return np.asarray(leaf).astype(np.float64)
        return leaf

    return tf.nest.map_structure(cast, data)


def _float64_loss(loss, keras, keras2: bool):
    """``loss`` with each Keras 3 ``Loss`` object re-created under floatx float64 (they fix their dtype when made).

    Keras 2 losses compute in the predictions' dtype; names and functions are
    wrapped by ``compile`` under the float64 floatx.
    """
    if keras2:
        return loss
    if isinstance(loss, dict):
        return {k: _float64_loss(v, keras, keras2) for k, v in loss.items()}
    if isinstance(loss, (list, tuple)):
        return type(loss)(_float64_loss(v, keras, keras2) for v in loss)
    if not isinstance(loss, keras.losses.Loss):
        return loss
    try:
        copy = loss.__class__.from_config(loss.get_config())
    except Exception as error:  # a custom Loss whose config does not re-create it
        raise Refused(
            "float64-loss",
            f"reference='float64' needs the loss in float64, and {loss!r} computes in {loss.dtype} and could not be "
            f"re-created from its config ({type(error).__name__}: {error}); pass a loss name or function, or give "
            f"the Loss a get_config that from_config accepts"
        ) from error
    if _dtype_name(copy.dtype) != "float64":
        raise Refused("float64-loss", f"reference='float64' needs the loss in float64, and {loss!r} re-created "
                      f"from its config computes in {copy.dtype} (its constructor fixes the dtype)")
    return copy


def _layers(model) -> Iterator:
    """``model`` and every layer inside it, nested models' layers included."""
    yield model
    for layer in getattr(model, "layers", ()):
        yield from _layers(layer)


def _low_precision(layer) -> bool:
    return type(layer).__name__ != "InputLayer" and (  # an explicit float32 Input only keeps float32 data as it is
        _dtype_name(getattr(layer, "compute_dtype", None)) in _LOW_FLOATS)


def _make_float64(model, keras2: bool) -> None:
    """Makes the float64 reference float64 throughout, or refuses it naming what stays in a lower precision.

    A layer given its own ``dtype`` (the mixed precision pattern
    ``Activation("softmax", dtype="float32")``) keeps it under the float64
    policy. Keras 3 layers without variables of their own get the float64
    policy set (``Layer.dtype_policy``, public); a layer whose variables were
    made in a lower precision, and any such Keras 2 layer, is refused.
    """
    low = []
    for layer in _layers(model):
        if not _low_precision(layer):
            continue
        own = [v for v in getattr(layer, "weights", ()) if _dtype_name(v.dtype) in _LOW_FLOATS]
        if not keras2 and not own and not getattr(layer, "layers", None):
            layer.dtype_policy = "float64"
        else:
            low.append(f"layer {layer.name!r} computes in {_dtype_name(layer.compute_dtype)}")
    low += [f"variable {_variable_name(v)!r} is {_dtype_name(v.dtype)}" for v in model.weights
            if _dtype_name(v.dtype) in _LOW_FLOATS]
    if low:
        raise Refused(
            "float64-low-precision",
            "reference='float64': build_model() under the float64 dtype policy still builds lower precision ("
            f"{'; '.join(low[:8])}{'; ...' if len(low) > 8 else ''}). Build those layers from the global dtype policy "
            "(no dtype= of their own) so that the reference can be float64 throughout"
        )


def _build_float64(build_model, initial_weights, keras, keras2: bool):
    """``build_model()`` under the float64 policy, checked to be float64 throughout, with ``initial_weights``."""
    with _float64_policy(keras, keras2):
        model = build_model()
    _make_float64(model, keras2)
    weights = model.get_weights()
    if not _same_shapes(weights, initial_weights):
        raise InvalidValue(
            f"build_model() built a float64 model whose weights differ from the float32 model's: "
            f"{[np.shape(w) for w in weights]} vs {[np.shape(w) for w in initial_weights]}"
        )
    model.set_weights(_float64_weights(initial_weights))
    return model


def _float64_weights(weights) -> list:
    """``weights`` with the float16/bfloat16/float32 arrays cast to float64."""
    return [np.asarray(w).astype(np.float64) if _dtype_name(np.asarray(w).dtype) in _LOW_FLOATS else w
            for w in weights]


def _slots_built(model):
    """``model`` with its optimizer's slots created: the arithmetic of a stock ``fit`` is the same, its tracing
    half. tf_keras creates them in the first trace of the train step, and the variables created there make
    TF trace it again (Keras 3 builds them before; a no-op there)."""
    from harness.parallel.adapters import adapter_for

    adapter_for(model).build_optimizer(model.optimizer, model.trainable_variables)
    return model


def _compile_float64(model, *, keras, keras2: bool, optimizer, loss, loss_weights, metrics, jit_compile,
                     slots_first: bool = False) -> None:
    """Compiles a float64 model under the float64 policy: Keras 3 fixes the dtype of losses and of the
    optimizer's learning rate when it makes them. ``slots_first``: a single-device model's optimizer
    slots built now (a parallel model builds them itself)."""
    with _float64_policy(keras, keras2):
        model.compile(optimizer=new_optimizer(optimizer, keras), loss=_float64_loss(loss, keras, keras2),
                      loss_weights=loss_weights, metrics=_fresh_metrics(metrics, keras),
                      **_jit_argument(jit_compile, keras))
        if slots_first:
            _slots_built(model)


def _fit_float64(model, x, y, *, keras, keras2: bool, fit_args: dict, callbacks=None) -> tuple[float, ...]:
    """Trains a compiled float64 model with the float32 runs' batches, under the float64 policy; returns
    its loss per epoch."""
    with _float64_policy(keras, keras2):
        # fit_args: the float32 runs' batch size, epochs (no shuffling), sample and class weights
        history = model.fit(_as_float64(x), _as_float64(y), callbacks=callbacks,
                            **{**fit_args, "sample_weight": _as_float64(fit_args["sample_weight"])})
    return tuple(history.history["loss"])


def assert_equivalent(
    build_model: Callable[[], object],
    x,
    y,
    *,
    devices,
    ratios: Sequence[float] | None = None,
    method: str = "mirrored",
    batch_size: int = 32,
    epochs: int = 1,
    optimizer="sgd",
    loss="mse",
    tol: float = 1e-6,
    reference: str | None = None,
    **kwargs,
):
    """Raises ``AssertionError`` unless parallel training matches single-device training within ``tol``.

    Trains ``build_model()`` once on one device and once with ``parallelize``
    from the same initial weights and batches, then compares every weight,
    every optimizer variable and the per-epoch loss by
    ``max |Δ| / max(1, max |reference|)``.

    With ``reference="float64"`` a parallel run that is not within ``tol`` still
    passes when it is as accurate as one device (``EquivalenceReport.verdict``):
    the parallel model trained in float64 equals one device in float64, and the
    float32 parallel run is within ``FLOOR_FACTOR`` (8) times the model's rounding
    floor of the single-device run (the floor: the rounding one device shows, the
    larger of its distances from a second single-device run with each batch's rows
    reversed and from the float64 run). Float32 rounding alone can put a correct parallel
    step of a real CNN 1e-5 from the single-device step.

    Args:
        build_model: returns a new, built Keras model.
        x: training inputs.
        y: training targets.
        devices: as for ``harness.parallelize``.
        ratios: as for ``harness.parallelize``.
        method: as for ``harness.parallelize``.
        batch_size: the training run's global batch size.
        epochs: the training run's passes over the data.
        optimizer: the training run's optimizer (as for ``harness.compare_training``).
        loss: the training run's loss.
        tol: the largest deviation accepted.
        reference: None, or ``"float64"`` (see above and ``harness.compare_training``).
        **kwargs: passed to ``harness.compare_training`` (``metrics``,
            ``sample_weight``, ``class_weight``, ``sync_batchnorm``, ``seed``).

    Returns:
        The ``EquivalenceReport``.

    Raises:
        AssertionError: with a table of the worst-differing variables (and, with a
            reference, both runs' distances from it and the variables farthest from it).
        ValueError: ``reference`` not None or ``"float64"``.

    Examples:
        >>> assert_equivalent(build, x, y, devices=logical_devices[:2], ratios=[3, 2])
        >>> assert_equivalent(build_cnn, x, y, devices=logical_devices[:2], ratios=[3, 2], reference="float64")
    """
    report = compare_training(
        build_model, x, y, devices=devices, ratios=ratios, method=method, batch_size=batch_size,
        epochs=epochs, optimizer=optimizer, loss=loss, reference=reference, **kwargs,
    )
    if report.verdict(tol) == "FAIL":
        if report.reference is None:
            raise AssertionError(f"parallel training differs from single-device (tol={tol:g}): "
                                 f"{report.summary()}\n{report.table()}")
        raise AssertionError(
            f"parallel training differs from single-device (tol={tol:g}) beyond what rounding explains: "
            f"{report.why_not()}. {report.summary()}\n{report.table()}"
        )
    return report
