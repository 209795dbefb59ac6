"""What the JAX towers (``harness.parallel.jax``) need from Keras 3's JAX trainer and layers that they keep private.

The one place the JAX path touches private Keras: the trainer's own metric update (the loss tracker and the compiled
metrics, as its ``train_step`` and ``test_step`` run it), the losses a forward pass added, handed to ``compute_loss``
as Keras' own stateless step hands them, the masks Keras keeps beside a JAX array (its losses and metrics read them),
the walk over a model's layers, a BatchNormalization's moments (``_moments``, replaced while the towers trace a
forward pass) and each layer's seed generators (whose ``next`` draws are made per device). Checked on Keras 3.15:
``keras/src/backend/jax/trainer.py`` (``JAXTrainer._update_metrics_variables``, ``Layer._losses_override``),
``keras/src/backend/common/masking.py``, ``Layer._flatten_layers``, ``Layer._seed_generators``,
``keras/src/layers/normalization/batch_normalization.py`` (``_moments``, ``_reduction_axes``). Imports no
TensorFlow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["forward_losses", "get_mask", "set_mask", "sublayers", "update_metrics", "batchnorm_layers",
           "own_moments", "whole_batch_moments", "seed_generators", "drawing_per_device", "float64_promoted",
           "batches_on_host", "wrap_training_forward", "weight_regularisers"]


def sublayers(model) -> list:
    """Every layer inside ``model``, nested models' layers included (``Layer._flatten_layers``)."""
    return list(model._flatten_layers(include_self=False))


@contextlib.contextmanager
def float64_promoted() -> Iterator[None]:
    """Inside the block Keras' type promotion keeps float64 as float64. On JAX it maps it to float32 whether or not
    ``jax_enable_x64`` is on (``BIT64_TO_BIT32_DTYPE``, ``keras/src/backend/common/dtypes.py``, checked on Keras
    3.15), so a BatchNormalization under a float64 policy (``result_type(inputs.dtype, "float32")``) computes its
    statistics in float32: a float64 run that is not."""
    from keras.src.backend.common import dtypes

    table = dtypes.BIT64_TO_BIT32_DTYPE
    saved = table.get("float64", "float64")
    table["float64"] = "float64"
    try:
        yield
    finally:
        table["float64"] = saved


@contextlib.contextmanager
def batches_on_host() -> Iterator[None]:
    """Inside the block Keras' JAX trainer hands each batch to the step as its data adapter gives it (NumPy, on the
    host) instead of sending it whole to JAX's default device first (``_distribute_data`` where no
    ``keras.distribution`` is set: ``train_on_batch``, and ``fit``'s look-ahead on an accelerator; checked on Keras
    3.15): the towers send each slice from the host to its own device."""
    from keras.src.backend.jax import trainer
    from keras.src.distribution import distribution_lib

    plain = trainer._distribute_data

    def as_given(data, layouts=None):
        return data if distribution_lib.distribution() is None else plain(data, layouts)

    trainer._distribute_data = as_given
    try:
        yield
    finally:
        trainer._distribute_data = plain


def get_mask(x):
    """The Keras mask of ``x`` (a ``Masking`` layer's, carried to the outputs), or None."""
    from keras.src.backend.common.masking import get_keras_mask

    return get_keras_mask(x)


def set_mask(x, mask) -> None:
    """Gives ``x`` the Keras mask ``mask`` (what a loss and a metric of a masked output read)."""
    from keras.src.backend.common.masking import set_keras_mask

    set_keras_mask(x, mask)


def update_metrics(model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight):
    """``(logs, new metrics variables)``: the loss tracker and compiled metrics updated on the whole batch,
    statelessly, as ``JAXTrainer.train_step`` updates them."""
    return model._update_metrics_variables(metrics_variables, unscaled_loss, x, y, y_pred, sample_weight)


@contextlib.contextmanager
def forward_losses(model, losses: list) -> Iterator[None]:
    """Inside the block ``model.losses`` is ``losses`` (where there are any): the losses of the whole batch's
    forward pass, as ``JAXTrainer.compute_loss_and_updates`` makes them available to ``compute_loss``."""
    if not losses:
        yield
        return
    model._losses_override = list(losses)
    try:
        yield
    finally:
        model._losses_override = []


def batchnorm_layers(model) -> list:
    """The BatchNormalization layers (and subclasses) inside ``model``, nested ones included."""
    import keras

    return [layer for layer in sublayers(model) if isinstance(layer, keras.layers.BatchNormalization)]


def own_moments(layer) -> bool:
    """Whether ``layer`` (a BatchNormalization) computes its moments its own way (a subclass's ``_moments``)."""
    import keras

    return type(layer)._moments is not keras.layers.BatchNormalization._moments


@contextlib.contextmanager
def whole_batch_moments(layers: list, moments: Callable) -> Iterator[list]:
    """Inside the block each of ``layers`` (BatchNormalization) computes its training moments as
    ``moments(inputs, mask, reduction axes)``; yields the list of the layers in the order their moments were
    asked for."""
    asked: list = []

    def for_layer(layer):
        def replaced(inputs, mask):
            asked.append(layer)
            return moments(inputs, mask, layer._reduction_axes)
        return replaced

    for layer in layers:
        layer._moments = for_layer(layer)
    try:
        yield asked
    finally:
        for layer in layers:
            del layer._moments


def seed_generators(model) -> list:
    """Every ``keras.random.SeedGenerator`` a layer of ``model`` draws from, each once."""
    import keras

    found: dict[int, object] = {}
    for layer in [model, *sublayers(model)]:
        for value in [*vars(layer).values(), *getattr(layer, "_seed_generators", ())]:
            if isinstance(value, keras.random.SeedGenerator):
                found.setdefault(id(value), value)
    return list(found.values())


@contextlib.contextmanager
def drawing_per_device(generators: list, derive: Callable) -> Iterator[None]:
    """Inside the block every seed drawn from ``generators`` is ``derive(seed)``: the generators' states advance as
    they would (``SeedGenerator.next``), the numbers drawn are the device's own."""
    for generator in generators:
        plain = generator.next
        generator.next = lambda ordered=True, plain=plain: derive(plain(ordered=ordered))
    try:
        yield
    finally:
        for generator in generators:
            del generator.next


# -- the rounding floor's sub-batches order (harness.equivalence.floor) --
def wrap_training_forward(model, wrap: Callable) -> None:
    """Makes ``model``'s training step run its forward pass as ``wrap(model.stateless_call)``, the rest of the step
    its own: ``JAXTrainer.compute_loss_and_updates`` (what ``JAXTrainer.train_step`` differentiates) runs the
    forward pass as ``self.stateless_call(trainable, non_trainable, x, return_losses=True, training=True)``, so an
    attribute of the instance takes its place there; the loss, its scaling, the optimizer step and the metrics stay
    Keras' own. Checked on Keras 3.15 (``keras/src/backend/jax/trainer.py``)."""
    model.stateless_call = wrap(model.stateless_call)


def weight_regularisers(model) -> int:
    """How many of the losses ``model.stateless_call(..., return_losses=True)`` returns are its weights'
    regularisers: they come last, one per trainable weight with a regulariser (``Layer.losses``: the losses the
    call added, then ``Layer._get_regularization_losses``, checked on Keras 3.15)."""
    return sum(1 for variable in model.trainable_weights if variable.regularizer is not None)
