"""What the JAX towers (``harness.parallel.onjax``) need from Keras 3's JAX trainer that it keeps private.

The one place the JAX path touches private Keras: the trainer's own metric update (the loss tracker and the compiled
metrics, as its ``train_step`` and ``test_step`` run it), the losses a forward pass added, handed to ``compute_loss``
as Keras' own stateless step hands them, the masks Keras keeps beside a JAX array (its losses and metrics read them)
and the walk over a model's layers. Checked on Keras 3.15: ``keras/src/backend/jax/trainer.py``
(``JAXTrainer._update_metrics_variables``, ``Layer._losses_override``), ``keras/src/backend/common/masking.py``,
``Layer._flatten_layers``. Imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["forward_losses", "get_mask", "set_mask", "sublayers", "update_metrics"]


def sublayers(model) -> list:
    """Every layer inside ``model``, nested models' layers included (``Layer._flatten_layers``)."""
    return list(model._flatten_layers(include_self=False))


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
