"""``compare_training`` and ``assert_equivalent``: one model trained on one device and in parallel, from the same
start, compared (the criteria: ``harness.equivalence``).

The float32 runs are trained here; the float64 reference and the rounding floor (``reference="float64"``) are
``harness.equivalence.reference``'s, the report ``harness.equivalence.report``'s.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from harness.compat import releasing_traced_graphs
from harness.equivalence.reference import float64_model, with_reference
from harness.equivalence.report import RANDOMNESS, REFERENCES, EquivalenceReport, _diff_variables
from harness.equivalence.runs import _Comparison, _keep, _Run, _slots_built, _Traced
from harness.errors import InvalidValue

__all__ = ["compare_training", "assert_equivalent"]


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
    validation_data=None,
    randomness: str = "both",
) -> EquivalenceReport:
    """Trains ``build_model()`` on one device and with ``parallelize``; compares weights.

    Both runs start from the same initial weights, see the same batches in the
    same order (no shuffling) and use fresh copies of ``optimizer``.

    A model with training-time randomness (``harness.randomness.random_layers``: Dropout, GaussianNoise, the Random*
    augmentation layers, any layer drawing from a seed generator) cannot equal one device: each device draws its
    own numbers for its rows. It is compared twice (``randomness="both"``): as it is, float32 only (the float64
    reference would only measure the draws again), and with those layers as at inference in training, in every
    run (``harness.randomness.randomness_off``), with ``reference``. The second decides: the report returned is its,
    naming the layers (``random_layers``) and carrying the first (``with_randomness``).

    Args:
        build_model: returns a new, built Keras model (called twice; four times with ``reference``; twice
            as often for a model with random layers compared both ways).
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
        validation_data: as for ``fit`` (``(x, y)``): every run evaluates it after each epoch, and its
            ``val_`` losses and metrics are compared as the training ones (a model's own ``test_step``).
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
            rounding floor (``floor``, ``floor_loss``): the largest of the single-device
            run's distances from ``build_model()`` trained on one device again, in the
            float32 runs' precision (its policy), from the same weights, on the same
            batches in each other summation order of ``FLOOR_ORDERS`` (``floor_orders``);
            the float64 distance is reported beside it (``reference_single``).
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
            and so are the rounding floor's runs (``reference_exact``, ``floor`` and ``floor_loss`` stay None;
            ``verdict`` at that tolerance is "exact" without them).
        randomness: what a model with random layers is compared as: ``"both"`` (as it is and with them off in
            training; the latter decides), ``"off"`` (with them off only) or ``"as-is"`` (as it is only: it
            differs by its draws). A model without random layers is compared once whatever this says
            (``random_layers`` empty).

    Returns:
        An ``EquivalenceReport`` covering every weight and optimizer variable.

    Raises:
        ValueError: ``batch_size``/``epochs`` not positive, x and y differ in length,
            ``reference`` not None or ``"float64"``, ``randomness`` not one of ``RANDOMNESS``, or
            (``reference="float64"``)
            ``build_model()`` builds variables that stay in a lower precision
            under the float64 policy (a layer with variables given its own
            ``dtype``; Keras 3 layers without variables, such as the mixed
            precision pattern ``Activation("softmax", dtype="float32")``, are
            made float64; Keras 2 ones are refused too), or a Keras 3 ``Loss``
            that cannot be re-created in float64.
    """
    _check_arguments(batch_size, epochs, reference, randomness)
    n = _length(x)
    if y is not None and _length(y) != n:
        raise InvalidValue(f"x and y must have the same number of samples; got len(x)={n}, len(y)={_length(y)}")
    options = dict(devices=devices, ratios=ratios, method=method, batch_size=batch_size, epochs=epochs,
                   optimizer=optimizer, loss=loss, metrics=metrics, sample_weight=sample_weight,
                   class_weight=class_weight, sync_batchnorm=sync_batchnorm, seed=seed, loss_weights=loss_weights,
                   callbacks=callbacks, jit_compile=jit_compile, validation_data=validation_data)
    kept = single_runs if single_runs is not None else {}
    return _compare(build_model, x, y, n, kept, options, reference=reference, randomness=randomness,
                    skip_within=skip_float64_parallel_within, keep=single_runs is not None)


_OFF = "randomness off"  # where ``single_runs`` keeps the runs with the random layers off (a dict like it)


def _compare(build_model, x, y, n: int, kept: dict, options: dict, *, reference: str | None, randomness: str,
             skip_within: float | None, keep: bool) -> EquivalenceReport:
    """``compare_training`` of checked arguments (``options``: its keyword arguments but these); ``kept``: its
    ``single_runs`` (``keep``: the caller's, serving later calls) or a dict of this call's."""
    from harness.compat import is_keras2_model, keras_module_of, on_jax_backend, set_random_seed
    from harness.randomness import random_layers, randomness_off

    devices, ratios, method = options["devices"], options["ratios"], options["method"]
    sync_batchnorm, batch_size, callbacks = options["sync_batchnorm"], options["batch_size"], options["callbacks"]
    set_random_seed(options["seed"])
    single: Any = None if "single" in kept else build_model()  # Keras models: TensorFlow and Keras are untyped
    initial_weights = kept["initial"] if single is None else kept.setdefault("initial", single.get_weights())
    if single is not None:
        # Kept by an earlier call whose single-device run never trained (its method was refused): this model
        # starts where every other run of the comparison does, whatever build_model() drew this time.
        single.set_weights(initial_weights)
    # A parallel model of harness's own is kept for later calls over these devices (its trace too).
    # (Not on JAX: a kept model's optimizer state is restored from a TensorFlow checkpoint.)
    shared = None if callable(method) or not keep or on_jax_backend() else (method, tuple(devices),
                                                                            bool(sync_batchnorm))
    wrap = _wrapper(method, sync_batchnorm)
    key = shared and ("parallel", *shared)
    traced = _Traced.take(kept, key, initial_weights, ratios)
    if traced is None:
        template: Any = build_model()  # a Keras model: untyped
        template.set_weights(initial_weights)
        parallel = wrap(template, devices, ratios)
    else:
        template, parallel = traced.template, traced.parallel
    drawing = random_layers(template)
    both = bool(drawing) and randomness == "both"
    if drawing and randomness == "off":
        switch: Any = randomness_off(template)
    else:
        switch = contextlib.nullcontext()
    run = _Comparison(
        build_model=build_model, initial_weights=initial_weights, keras=keras_module_of(template),
        keras2=is_keras2_model(template), x=x, y=y, samples=n,
        fit_args=dict(batch_size=batch_size, epochs=options["epochs"], shuffle=False, verbose=0,
                      sample_weight=options["sample_weight"], class_weight=options["class_weight"],
                      validation_data=options["validation_data"]),
        optimizer=options["optimizer"], loss=options["loss"], loss_weights=options["loss_weights"],
        metrics=options["metrics"], jit_compile=options["jit_compile"], wrap=wrap, devices=devices, ratios=ratios,
        callbacks=callbacks, kept=kept, shared=shared,
    )
    # With random layers compared twice, the run as the model is needs no float64 reference: its draws differ.
    reference_here = None if both else reference
    with switch:
        # Built (and checked) before any training, so that a model that cannot be float64 fails at once.
        float64 = float64_model(run) if reference_here is not None else None

        if "single" not in kept:
            history = _slots_built(run.compiled(single)).fit(x, y, **run.fit_args).history
            kept["single"] = _Run(_keep(single.weights), _keep(single.optimizer.variables), history)
        one = kept["single"]
        if traced is None:
            # A model's own steps may step optimizers of its own (a GAN's two), which a kept model's restore would
            # not reset: not kept.
            traced = _Traced.of(template, run.compiled(parallel),
                                None if getattr(parallel, "own_steps", ()) else shared)
        history_parallel = parallel.fit(x, y, callbacks=callbacks, **run.fit_args).history
        traced.keep(kept, key)  # trained to the end: reusable
        report = _report(getattr(method, "__name__", "custom") if callable(method) else method, one, template,
                         parallel, history_parallel, devices, ratios, batch_size,
                         steps=options["epochs"] * math.ceil(n / batch_size))
        if reference_here is not None:
            report = with_reference(report, run, float64, one, template, parallel, reference=reference_here,
                                    skip_within=skip_within)
    report = replace(report, random_layers=drawing, randomness_off=bool(drawing) and randomness == "off")
    if not both:
        return report
    # The same comparison with the random layers off in training, in runs of their own (a trace keeps the switch).
    off = _compare(build_model, x, y, n, kept.setdefault(_OFF, {"initial": initial_weights}), options,
                   reference=reference, randomness="off", skip_within=skip_within, keep=keep)
    return replace(off, with_randomness=report)


def _check_arguments(batch_size, epochs, reference, randomness) -> None:
    if randomness not in RANDOMNESS:
        raise InvalidValue(f"randomness must be one of {list(RANDOMNESS)}; got randomness={randomness!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InvalidValue(f"batch_size must be a positive int; got batch_size={batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0:
        raise InvalidValue(f"epochs must be a positive int; got epochs={epochs!r}")
    if reference is not None and (not isinstance(reference, str) or reference not in REFERENCES):
        raise InvalidValue(f"reference must be None or one of {list(REFERENCES)}; got reference={reference!r}")


def _length(data) -> int:
    from harness.compat import first_leaf

    return len(first_leaf(data))


def _wrapper(method, sync_batchnorm: bool) -> Callable[[Any, Any, Any], Any]:
    """``(template, devices, ratios) -> parallel model``: ``method`` itself where it is a callable (a user's own
    wrapper), else ``parallelize`` with that method."""
    from harness.parallel import parallelize

    if callable(method):
        return method
    method_name = method
    return lambda t, d, r: parallelize(t, d, ratios=r, method=method_name, sync_batchnorm=sync_batchnorm)


def _report(method: str, one: _Run, template, parallel, history: dict, devices, ratios, batch_size: int, *,
            steps: int) -> EquivalenceReport:
    """The float32 runs compared: the single-device run ``one`` and the trained parallel model (``template``,
    ``parallel``; ``history``: its ``fit`` history)."""
    diffs = _diff_variables(one.weights, template.weights, "")
    diffs += _diff_variables(one.optimizer, parallel.optimizer.variables, "optimizer/")
    metric_keys = [k for k in one.history if k != "loss"]
    return EquivalenceReport(
        method=method,
        devices=tuple(getattr(parallel, "devices", devices)),
        ratios=tuple(getattr(parallel, "ratios", ratios or ())),
        batch_size=batch_size,
        steps=steps,
        diffs=tuple(diffs),
        loss_single=tuple(one.history["loss"]),
        loss_parallel=tuple(history["loss"]),
        metrics_single={k: one.history[k] for k in metric_keys},
        metrics_parallel={k: history.get(k) for k in metric_keys},
    )


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
