"""The parallel model both methods share: a Keras model around a template.

A ``ParallelModel`` is compiled, fitted, evaluated and predicted with like any
Keras model. Its steps split each batch by ratios (``slicing``), run the
devices, and compute loss and metrics on the *whole* batch, so a parallel step
equals a single-device step. Saving writes the plain template model.
"""

from __future__ import annotations

import contextlib
from enum import Enum

import keras
import tensorflow as tf
from keras import tree

from harness.parallel import Untracked, slicing
from harness.parallel.common import ParallelCommon

__all__ = ["Method", "ParallelModel"]


class Method(str, Enum):
    """How the batch is spread over devices."""

    TOWERS = "towers"
    MIRRORED = "mirrored"


class ParallelModel(ParallelCommon, keras.Model):
    """Base of the towers and mirrored models; not built directly."""

    method: Method

    def __init__(self, template: keras.Model, devices: list[str], ratios: tuple[float, ...], sync_batchnorm: bool,
                 merge_device: str, emulator=None):
        super().__init__(name=f"{self.method.value}_{template.name}")
        self._template_ref = Untracked(template)
        self._init_common(devices, ratios, merge_device, emulator)
        self.sync_batchnorm = bool(sync_batchnorm)
        # tf.data hands batches over on the host: slice there, ship only the slices.
        self.input_device = "/device:CPU:0"

    # -- the wrapped models -------------------------------------------------
    @property
    def template(self) -> keras.Model:
        """The single-device model passed in; holds the trained weights after ``fit``."""
        return self._template_ref.value

    @property
    def core(self) -> keras.Model:
        """The model whose variables are trained (the template, or its mirrored clone)."""
        return self._core_model

    def call(self, inputs, training=None):
        return self.core(inputs, training=training)

    # -- shared step pieces ---------------------------------------------------
    def _split(self, x):
        """Per-device sizes and slices of ``x``, cut on the host by the current split."""
        with tf.device(self.input_device):
            n = slicing.batch_size_of(x)
            sizes = slicing.split_sizes(n, self._shares_ref.value)
            return n, sizes, slicing.split_structure(x, sizes, len(self.devices))

    def _merge(self, parts):
        with tf.device(self.merge_device):
            return slicing.concat_structures(parts)

    def _report(self, x, y, y_pred, sample_weight, loss):
        """Updates the loss tracker and compiled metrics on the whole batch."""
        self._loss_tracker.update_state(loss, sample_weight=slicing.batch_size_of(x))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _whole_batch_loss(self, y, y_pred, sample_weight, extra, scale=1.0):
        """Compiled loss (times ``scale``) + layer losses + weight penalties, as Keras' ``compute_loss``."""
        with tf.device(self.merge_device):
            main = [] if self._compile_loss is None else [self._compile_loss(y, y_pred, sample_weight) * scale]
            return add_all(main + [extra] + weight_losses(self.core))

    def _by_batch_size(self, x, parallel, single):
        """``parallel()`` unless the batch is smaller than the device count, then ``single()``.

        A batch smaller than the device count leaves some device an empty slice,
        and TF kernels mishandle empty batches (CPU Conv2D returns a wrongly
        shaped tensor, its gradient then fails). Such a batch runs on the merge
        device alone: the single-device step itself, so exact by definition.
        """
        if len(self.devices) == 1:
            return parallel()
        return tf.cond(slicing.batch_size_of(x) >= len(self.devices), parallel, single)

    # In the strategy's scope Keras scales mean losses by 1/replicas; the mirrored model undoes it.
    _in_scope_loss_scale = 1.0

    def _cross_replica(self):
        return contextlib.nullcontext()

    def _single_forward(self, x, training: bool):
        with tf.device(self.merge_device):
            y_pred = self.core(x, training=training)
            return y_pred, add_all(own_losses(self.core))

    def _single_train(self, x, y, sample_weight):
        with self._cross_replica():
            with tf.GradientTape() as tape:
                y_pred, extra = self._single_forward(x, training=True)
                loss = self._whole_batch_loss(y, y_pred, sample_weight, extra, self._in_scope_loss_scale)
                scaled = self.optimizer.scale_loss(loss)
            weights = self.core.trainable_weights
            with tf.device(self.merge_device):
                grads = tape.gradient(scaled, self._local_variables(weights))
            self._apply_whole_gradients(grads, weights)
        return loss, y_pred

    def _local_variables(self, weights):
        """What a forward pass on the merge device read: the variables themselves here."""
        return weights

    def _apply_whole_gradients(self, grads, weights):
        """Applies gradients computed outside any replica."""
        self.optimizer.apply_gradients(zip(grads, weights))

    # -- the Keras steps ----------------------------------------------------------
    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred = self._by_batch_size(
            x, lambda: self._parallel_train(x, y, sample_weight), lambda: self._single_train(x, y, sample_weight)
        )
        return self._report(x, y, y_pred, sample_weight, loss)

    def _forward(self, x):
        return self._by_batch_size(
            x, lambda: self._parallel_forward(x), lambda: self._single_forward(x, training=False)
        )

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, extra = self._forward(x)
        return self._report(x, y, y_pred, sample_weight, self._whole_batch_loss(y, y_pred, sample_weight, extra))

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._forward(x)[0]

    def _parallel_train(self, x, y, sample_weight):
        """One training step over all devices; returns ``(loss, y_pred)``."""
        raise NotImplementedError

    def _parallel_forward(self, x):
        """Inference over all devices; returns ``(y_pred, layer_losses)``."""
        raise NotImplementedError


def own_losses(model: keras.Model) -> list:
    """Losses added during the last call (``add_loss``, activity regularisers).

    Keras 3 activity regularisers are sums over the samples, so the losses of
    the devices' slices add up to the whole batch's.
    """
    return [loss for layer in model._flatten_layers(include_self=True) for loss in layer._get_own_losses()]


def weight_losses(model: keras.Model) -> list:
    """Weight regularisation losses: a function of the weights only, counted once per step."""
    return model._get_regularization_losses()


def add_all(values: list, dtype="float32"):
    values = [tf.cast(v, dtype) for v in tree.flatten(values)]
    return tf.add_n(values) if values else tf.zeros((), dtype)
