"""Towers: one graph, variables on one device, each device runs its slice.

The Keras 2 ``multi_gpu_model`` / ``make_parallel`` design, done exactly:
slices are cut on the host and only they travel; tower outputs are merged
once (masks and logits too), and the loss, metrics and gradients are those of
the whole batch. With BatchNormalization, the graph runs layer by layer across
the towers (``layerwise``) so its statistics are the whole batch's.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from harness.errors import Refused
from harness.parallel import layerwise
from harness.parallel.base import Method, ParallelModel
from harness.parallel.sparse import whole_rows

__all__ = ["Towers", "towers_class"]


class Towers(ParallelModel):
    """A model whose steps run the template once per device on that device's slice."""

    method = Method.TOWERS

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device, emulator=None):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device, emulator)
        a = self._adapter
        self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(a, template)
        if self._layerwise and a.graph_of(template) is None:
            raise Refused(
                "subclassed-batchnorm",
                f"method='towers' with sync_batchnorm=True needs a Functional or Sequential model to share "
                f"BatchNormalization statistics; got a subclassed {type(template).__name__}. "
                "Use method='mirrored' or sync_batchnorm=False"
            )
        refused = a.towers_refusal(template) if len(self.devices) > 1 else []
        if refused:
            raise Refused("towers-unsupported-layer",
                          f"method='towers' cannot run {'; '.join(refused)}. Use method='mirrored'")
        self._core_model = template  # tracked: its variables are this model's

    def _towers(self, x, training: bool, watch=None):
        """Merged outputs, the call-time losses of the whole batch, and the emulated devices' pending ends
        (``_run_towers``)."""
        n, sizes, parts = self._split(x)
        with tf.device(self.merge_device):
            shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
        outputs, extra, pending = self._run_towers(self.template, self.devices, parts, shares, training, watch,
                                                   self._layerwise, self.merge_device)
        return self._merge(outputs), extra, pending

    def _parallel_train(self, x, y, sample_weight):
        a = self._adapter
        with tf.GradientTape() as tape:
            y_pred, extra, pending = self._towers(x, training=True, watch=tape.watch)
            extra = extra + self._penalties()
            compiled, loss = self._whole_batch_loss(y, y_pred, sample_weight, extra)
            scaled = a.scale_loss(self.optimizer, loss)
        weights = self.core.trainable_weights
        grads = tape.gradient(scaled, weights + [leaf for _, _, leaf in pending])
        grads, input_grads = grads[: len(weights)], grads[len(weights):]
        # Sparse gradients get the single device's rows (each batch-independent lookup's blocks summed).
        grads = whole_rows(grads, tf.nest.flatten(x), len(self.devices), weights)
        # Each emulated device finishes when its backward pass reaches its input.
        grads = self._finish_towers(grads, pending, input_grads, after=y_pred)
        a.apply_gradients(self.optimizer, grads, weights)
        return y_pred, extra, compiled

    def _parallel_forward(self, x):
        y_pred, extra, _ = self._towers(x, training=False)
        return y_pred, extra


@functools.cache
def towers_class(adapter):
    """The towers model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("TowersModel", (Towers, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
