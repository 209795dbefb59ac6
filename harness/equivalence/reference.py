"""The float64 reference and the rounding floor (``compare_training(..., reference="float64")``).

More runs of the model: on one device in float64 (``build_model()`` under the float64 dtype policy and floatx,
from the float32 run's initial weights, on the same batches cast to float64), in parallel in float64, and on one
device again in the float32 runs' precision in each of the floor's other summation orders (``FLOOR_ORDERS``,
harness.equivalence.floor).
``float64_model`` builds the first before any training, so that a model that cannot be float64 fails at
once; ``with_reference`` trains them and adds what they measure to the float32 runs' report.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from harness.compat import map_structure, new_optimizer, on_jax_backend
from harness.equivalence.floor import FLOOR_ORDERS, batch_order, sub_batch_steps
from harness.equivalence.report import (
    LOSS_RESOLUTION,
    EquivalenceReport,
    FloorOrder,
    WeightDiff,
    _diff_variables,
    _max_deviation,
    _max_rel,
    _variable_name,
    _worst,
    relative_deviation,
)
from harness.equivalence.runs import (
    _Comparison,
    _fresh_metrics,
    _jit_argument,
    _keep,
    _Run,
    _slots_built,
    _Traced,
)
from harness.errors import InvalidValue, Refused


def float64_model(run: _Comparison):
    """The single-device float64 model, built and checked to be float64 throughout, with the initial weights;
    None where ``run.kept`` holds its run already."""
    if "float64" in run.kept:
        return None
    return _build_float64(run.build_model, run.initial_weights, run.keras, run.keras2)


def with_reference(report: EquivalenceReport, run: _Comparison, float64, one: _Run, template, parallel, *,
                   reference: str, skip_within: float | None) -> EquivalenceReport:
    """``report`` with the float64 reference and the rounding floor.

    ``float64``: ``float64_model(run)``; ``one``: the single-device float32 run; ``template`` and ``parallel``:
    the trained parallel float32 model. Where the float32 runs agree within ``skip_within`` (``is_equivalent``),
    the floor's run and the parallel float64 run are skipped (``reference_exact``, ``floor`` and ``floor_loss``
    stay None).
    """
    exact = _single_float64(run, float64)
    reference_exact = None
    orders: tuple = ()
    if skip_within is None or not report.is_equivalent(skip_within):
        orders = tuple(_floor_orders(run, one))
        reference_exact = _parallel_float64(run, exact)
    against_single, against_parallel = _against_float64(exact, one, template, parallel)
    reference_single = _max_deviation(against_single)
    measured = [order for order in orders if order.weights is not None]
    floor = floor_loss = None
    if measured:
        floor = _worst(*(order.weights for order in measured))
        floor_loss = _worst(LOSS_RESOLUTION, *(order.loss for order in measured))
    return replace(
        report, reference=reference, reference_single=reference_single,
        reference_parallel=_max_deviation(against_parallel), reference_diffs_single=tuple(against_single),
        reference_diffs_parallel=tuple(against_parallel), loss_reference=tuple(exact.history["loss"]),
        reference_exact=reference_exact, floor=floor, floor_loss=floor_loss, floor_orders=orders,
    )


def _floor_orders(run: _Comparison, one: _Run) -> Iterator[FloorOrder]:
    """The single-device run's distance from each of the floor's runs (``FLOOR_ORDERS``): weights and optimizer
    variables as ``max_deviation``, the per-epoch loss as ``max_loss_deviation``."""
    for name in FLOOR_ORDERS:
        again, why_not = _floor_run(run, name)
        if again is None:
            yield FloorOrder(name, None, None, why_not)
            continue
        weights = _max_deviation(_diff_variables(one.weights, again.weights, "")
                                 + _diff_variables(one.optimizer, again.optimizer, "optimizer/"))
        yield FloorOrder(name, weights, _max_rel(one.history["loss"], again.history["loss"]))


def _single_float64(run: _Comparison, float64) -> _Run:
    """The single-device float64 run: ``float64`` trained, or the one ``run.kept`` holds."""
    if "float64" not in run.kept:
        assert float64 is not None  # built by float64_model: no float64 run was kept
        _compile_float64(float64, run, slots_first=True)
        history64 = {"loss": list(_fit_float64(float64, run))}
        run.kept["float64"] = _Run(_keep(float64.weights), _keep(float64.optimizer.variables), history64)
    return run.kept["float64"]


def _floor_run(run: _Comparison, name: str) -> tuple[_Run | None, str | None]:
    """The floor's run ``name`` (``FLOOR_ORDERS``): one device again, in the float32 runs' precision, from the
    same weights, on the same batches in another summation order; or the one ``run.kept`` holds. ``(None, why)``
    where this model cannot run in that order."""
    ratios = tuple(run.ratios) if run.ratios is not None else (1.0,) * max(1, len(run.devices))
    key = ("floor", name, ratios) if name == "sub-batches" else ("floor", name)
    if key not in run.kept:
        floor_model: Any = run.build_model()  # a Keras model: untyped
        floor_model.set_weights(run.initial_weights)
        compiled = _slots_built(run.compiled(floor_model))
        x, y, fit_args = run.x, run.y, run.fit_args
        if name == "sub-batches":
            why_not = sub_batch_steps(compiled, ratios, run.fit_args["batch_size"])
            if why_not is not None:
                run.kept[key] = why_not
                return None, why_not
        else:
            order = batch_order(name, run.samples, run.fit_args["batch_size"])
            x, y = _rows(x, order), _rows(y, order)
            fit_args = {**fit_args, "sample_weight": _rows(fit_args["sample_weight"], order)}
        history = compiled.fit(x, y, **fit_args).history
        run.kept[key] = _Run(_keep(floor_model.weights), _keep(floor_model.optimizer.variables), history)
    kept = run.kept[key]
    return (None, kept) if isinstance(kept, str) else (kept, None)


def _parallel_float64(run: _Comparison, exact: _Run) -> float:
    """The parallel model trained in float64 (where float32 rounding hides a difference, float64's does not):
    its distance from the single-device float64 run ``exact`` (``reference_exact``)."""
    key64 = run.shared and ("float64", *run.shared)
    traced64 = _Traced.take(run.kept, key64, _float64_weights(run.initial_weights), run.ratios)
    if traced64 is None:
        with _float64_policy(run.keras, run.keras2):
            template64 = _build_float64(run.build_model, run.initial_weights, run.keras, run.keras2)
            parallel64 = run.wrap(template64, run.devices, run.ratios)
            _compile_float64(parallel64, run)
            traced64 = _Traced.of(template64, parallel64, run.shared)
    template64, parallel64 = traced64.template, traced64.parallel
    _fit_float64(parallel64, run, callbacks=run.callbacks)
    traced64.keep(run.kept, key64)
    exact64 = _diff_variables(exact.weights, template64.weights, "")
    exact64 += _diff_variables(exact.optimizer, parallel64.optimizer.variables, "optimizer/")
    return _max_deviation(exact64)


def _against_float64(exact: _Run, one: _Run, template, parallel) -> tuple[list[WeightDiff], list[WeightDiff]]:
    """Each float32 run's ``WeightDiff`` from the float64 run ``exact``, variable by variable (named as the
    single-device run's): every weight and, where the float64 run's optimizer has the same variables, every
    optimizer variable."""
    pairs = [(exact.weights, one.weights, template.weights, "")]
    extra = _leading_extras(exact.optimizer, one.optimizer)
    if extra is not None:  # the optimizer's state too, where the float64 run has it: the floor spans what diffs do
        pairs.append((exact.optimizer, one.optimizer[extra:], parallel.optimizer.variables[extra:], "optimizer/"))
    against_single: list[WeightDiff] = []
    against_parallel: list[WeightDiff] = []
    for in_float64, in_single, in_parallel, prefix in pairs:
        against_single += _diff_against(in_float64, in_single, in_single, prefix)
        against_parallel += _diff_against(in_float64, in_parallel, in_single, prefix)
    return against_single, against_parallel


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
    x64 = None
    promoted: Any = nullcontext()
    if not keras2 and on_jax_backend():  # JAX keeps 64-bit types off unless asked: float64 would be float32
        import jax

        from harness.parallel.adapters.jaxtrainer import float64_promoted

        x64 = bool(jax.config.read("jax_enable_x64"))
        jax.config.update("jax_enable_x64", True)
        promoted = float64_promoted()  # and Keras' own promotion would make float64 float32 (BatchNormalization)
    try:
        set_floatx("float64")
        set_policy("float64")
        with promoted:
            yield
    finally:
        set_floatx(floatx)
        set_policy(policy)
        if x64 is not None:
            import jax

            jax.config.update("jax_enable_x64", x64)


def _rows(data, order: np.ndarray):
    """``data`` (None, an array, or a nested structure of arrays) with its samples taken in ``order``."""
    return map_structure(lambda leaf: np.asarray(leaf)[order], data)


def _as_float64(data):
    """``data`` with its float arrays (float16, bfloat16, float32) cast to float64; other leaves as they are."""
    def cast(leaf):
        if _dtype_name(getattr(leaf, "dtype", None)) in _LOW_FLOATS:
            return np.asarray(leaf).astype(np.float64)
        return leaf

    return map_structure(cast, data)


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
    with _float64_policy(keras, keras2):  # (JAX: its float64 arrays exist inside it only)
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


def _compile_float64(model, run: _Comparison, *, slots_first: bool = False) -> None:
    """Compiles a float64 model under the float64 policy: Keras 3 fixes the dtype of losses and of the
    optimizer's learning rate when it makes them. ``slots_first``: a single-device model's optimizer
    slots built now (a parallel model builds them itself)."""
    keras, keras2 = run.keras, run.keras2
    with _float64_policy(keras, keras2):
        model.compile(optimizer=new_optimizer(run.optimizer, keras), loss=_float64_loss(run.loss, keras, keras2),
                      loss_weights=run.loss_weights, metrics=_fresh_metrics(run.metrics, keras),
                      **_jit_argument(run.jit_compile, keras))
        if slots_first:
            _slots_built(model)


def _fit_float64(model, run: _Comparison, callbacks=None) -> tuple[float, ...]:
    """Trains a compiled float64 model with the float32 runs' batches, under the float64 policy; returns
    its loss per epoch."""
    with _float64_policy(run.keras, run.keras2):
        # fit_args: the float32 runs' batch size, epochs (no shuffling), sample and class weights
        history = model.fit(_as_float64(run.x), _as_float64(run.y), callbacks=callbacks,
                            **{**run.fit_args, "sample_weight": _as_float64(run.fit_args["sample_weight"]),
                               "validation_data": _as_float64(run.fit_args.get("validation_data"))})
    return tuple(history.history["loss"])
