"""Trains one model on one device and in parallel, from the same start, and compares.

Used by ``assert_equivalent`` (pytest), ``harness check`` (CLI) and the
benchmarks' fidelity tracks, so "equivalent" means the same thing everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["WeightDiff", "EquivalenceReport", "compare_training", "relative_deviation"]


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

    @property
    def max_deviation(self) -> float:
        """The worst ``WeightDiff.deviation`` (weights and optimizer state); NaN if any is NaN."""
        values = [d.deviation for d in self.diffs]
        if any(math.isnan(v) for v in values):
            return math.nan
        return max(values, default=0.0)

    @property
    def max_loss_deviation(self) -> float:
        return _max_rel(self.loss_single, self.loss_parallel)

    def worst(self, limit: int = 10) -> list[WeightDiff]:
        return sorted(self.diffs, key=lambda d: -np.nan_to_num(d.deviation, nan=np.inf))[:limit]

    def is_equivalent(self, tol: float) -> bool:
        deviations = [self.max_deviation, self.max_loss_deviation]
        return all(not math.isnan(v) and v <= tol for v in deviations)

    def table(self, limit: int = 10) -> str:
        """A fixed-width table of the worst-differing variables, for failure messages."""
        rows = [f"{'variable':<48} {'shape':<16} {'max |dw|':>11} {'deviation':>11}"]
        for d in self.worst(limit):
            rows.append(f"{d.name[:48]:<48} {str(d.shape)[:16]:<16} {d.max_abs_diff:>11.3e} {d.deviation:>11.3e}")
        rows.append(
            f"loss per epoch: single {list(_round(self.loss_single))} vs parallel {list(_round(self.loss_parallel))}"
        )
        return "\n".join(rows)

    def summary(self) -> str:
        return (
            f"{self.method} on {len(self.devices)} devices, ratios {list(self.ratios)}, batch {self.batch_size}, "
            f"{self.steps} steps: max weight deviation {self.max_deviation:.3e}, "
            f"max loss deviation {self.max_loss_deviation:.3e}"
        )


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


def _fresh_optimizer(optimizer, keras):
    """A new optimizer of the models' Keras (``keras`` 3 or a Keras 2 module)."""
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer()
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer.__class__.from_config(optimizer.get_config())
    return keras.optimizers.get(optimizer)


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


def compare_training(
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
    metrics=None,
    sample_weight=None,
    class_weight=None,
    sync_batchnorm: bool = True,
    seed: int = 0,
    callbacks=None,
    jit_compile="auto",
) -> EquivalenceReport:
    """Trains ``build_model()`` on one device and with ``parallelize``; compares weights.

    Both runs start from the same initial weights, see the same batches in the
    same order (no shuffling) and use fresh copies of ``optimizer``.

    Args:
        build_model: returns a new, built Keras model (called twice).
        x, y: training data (arrays or nested structures of arrays).
        devices, ratios, method, sync_batchnorm: as for ``parallelize``; ``method``
            may also be a callable ``(template, devices, ratios) -> model`` to
            check a parallel wrapper of your own. Its model must leave the
            trained weights in ``template``.
        batch_size: global batch size; a partial last batch is included.
        epochs: passes over the data.
        optimizer: a name, an optimizer (copied via its config) or a factory.
        loss, metrics, sample_weight, class_weight: as for ``compile``/``fit``.
        seed: seeds Keras before building the models.
        callbacks: Keras callbacks for the parallel run only, e.g. one that
            calls ``self.model.set_ratios(...)`` between steps.
        jit_compile: passed to ``compile`` of both models (XLA on or off).

    Returns:
        An ``EquivalenceReport`` covering every weight and optimizer variable.

    Raises:
        ValueError: ``batch_size``/``epochs`` not positive, or x and y differ in length.
    """
    from harness.compat import keras_module_of, set_random_seed
    from harness.parallel import parallelize

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int; got batch_size={batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0:
        raise ValueError(f"epochs must be a positive int; got epochs={epochs!r}")
    n = _length(x)
    if y is not None and _length(y) != n:
        raise ValueError(f"x and y must have the same number of samples; got len(x)={n}, len(y)={_length(y)}")

    set_random_seed(seed)
    single = build_model()
    keras = keras_module_of(single)  # Keras 3, or Keras 2 (tf_keras / TF <= 2.15)
    template = build_model()
    template.set_weights(single.get_weights())
    if callable(method):  # a user's own parallel wrapper: (template, devices, ratios) -> compilable model
        parallel = method(template, devices, ratios)
        method = getattr(method, "__name__", "custom")
    else:
        parallel = parallelize(template, devices, ratios=ratios, method=method, sync_batchnorm=sync_batchnorm)

    fit_args = dict(
        batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
        sample_weight=sample_weight, class_weight=class_weight,
    )
    histories = []
    for model, extra in ((single, None), (parallel, callbacks)):
        model.compile(optimizer=_fresh_optimizer(optimizer, keras), loss=loss,
                      metrics=_fresh_metrics(metrics, keras), **_jit_argument(jit_compile, keras))
        histories.append(model.fit(x, y, callbacks=extra, **fit_args).history)

    diffs = _diff_variables(single.weights, template.weights, "")
    diffs += _diff_variables(single.optimizer.variables, parallel.optimizer.variables, "optimizer/")
    steps = epochs * math.ceil(n / batch_size)
    metric_keys = [k for k in histories[0] if k != "loss"]
    return EquivalenceReport(
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
