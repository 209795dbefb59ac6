"""The runs of one ``compare_training`` call: what they share, what they leave behind, what is kept for the next.

``_Comparison``: the model, its initial weights, the data and how every run is compiled and trained (the
single-device, parallel, float64 and rounding floor runs alike). ``_Run``: a trained single-device run's
variables and history, kept after its model is gone. ``_Traced``: a compiled parallel model kept (in
``single_runs``) for later comparisons over the same devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.compat import new_optimizer
from harness.equivalence.report import _variable_name


@dataclass(frozen=True)
class _Comparison:
    """What every run of one comparison shares: the model and its initial weights, the data, how each run is
    compiled and trained, the parallel wrapper, and ``kept`` (``single_runs``) where runs and traced parallel
    models are kept for later calls (``shared``: the key of this call's parallel models there; None: not kept)."""

    build_model: Callable[[], Any]
    initial_weights: list
    keras: Any  # Keras 3, or Keras 2 (tf_keras / TF <= 2.15)
    keras2: bool
    x: Any
    y: Any
    samples: int  # in x (and y)
    fit_args: dict  # the batch size, epochs (no shuffling), sample and class weights of every run
    optimizer: Any
    loss: Any
    loss_weights: Any
    metrics: Any
    jit_compile: Any
    wrap: Callable[[Any, Any, Any], Any]  # (template, devices, ratios) -> parallel model
    devices: Any
    ratios: Sequence[float] | None
    callbacks: Any  # the parallel runs' only
    kept: dict
    shared: tuple | None

    def compiled(self, model):
        """``model`` compiled as the float32 runs are: fresh copies of the optimizer and of the metrics."""
        model.compile(optimizer=new_optimizer(self.optimizer, self.keras), loss=self.loss,
                      loss_weights=self.loss_weights, metrics=_fresh_metrics(self.metrics, self.keras),
                      **_jit_argument(self.jit_compile, self.keras))
        return model


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


def _slots_built(model):
    """``model`` with its optimizer's slots created: the arithmetic of a stock ``fit`` is the same, its tracing
    half. tf_keras creates them in the first trace of the train step, and the variables created there make
    TF trace it again (Keras 3 builds them before; a no-op there)."""
    from harness.compat import is_keras2_model, on_jax_backend

    if not is_keras2_model(model) and on_jax_backend():  # Keras 3 on JAX: no adapter (they are TensorFlow's)
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        return model
    from harness.parallel.adapters import adapter_for

    adapter_for(model).build_optimizer(model.optimizer, model.trainable_variables)
    return model
