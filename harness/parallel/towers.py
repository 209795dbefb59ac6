"""Towers: one graph, variables on one device, each device runs its slice.

The Keras 2 ``multi_gpu_model`` / ``make_parallel`` design, done exactly:
slices are cut on the host and only they travel; tower outputs are merged
once, and the loss, metrics and gradients are those of the whole batch.
"""

from __future__ import annotations

import tensorflow as tf

from harness.parallel import layerwise
from harness.parallel.base import Method, ParallelModel, add_all, own_losses

__all__ = ["TowersModel"]


class TowersModel(ParallelModel):
    """A model whose steps run the template once per device on that device's slice."""

    method = Method.TOWERS

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device)
        self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(template)
        if self._layerwise and layerwise.graph_of(template) is None:
            raise ValueError(
                f"method='towers' with sync_batchnorm=True needs a Functional or Sequential model to share "
                f"BatchNormalization statistics; got a subclassed {type(template).__name__}. "
                "Use method='mirrored' or sync_batchnorm=False"
            )
        self._core_model = template
        self.built = True

    def _towers(self, x, training: bool):
        _, _, parts = self._split(x)
        if training and self._layerwise:
            outputs, losses = layerwise.run_towers(self.template, parts, self.devices, self.merge_device, training)
        else:
            outputs, losses = [], []
            for device, part in zip(self.devices, parts):
                with tf.device(device):
                    outputs.append(self.template(part, training=training))
                losses.extend(own_losses(self.template))
        return self._merge(outputs), add_all(losses)

    def _parallel_train(self, x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred, extra = self._towers(x, training=True)
            loss = self._whole_batch_loss(y, y_pred, sample_weight, extra)
            scaled = self.optimizer.scale_loss(loss)
        weights = self.trainable_weights
        self.optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))
        return loss, y_pred

    def _parallel_forward(self, x):
        return self._towers(x, training=False)
