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

from harness.parallel import layerwise
from harness.parallel.base import Method, ParallelModel, add_all, add_zero_where_present
from harness.parallel.sparse import merge_all

__all__ = ["Towers", "towers_class"]


class Towers(ParallelModel):
    """A model whose steps run the template once per device on that device's slice."""

    method = Method.TOWERS

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device, emulator=None):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device, emulator)
        a = self._adapter
        self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(a, template)
        if self._layerwise and a.graph_of(template) is None:
            raise ValueError(
                f"method='towers' with sync_batchnorm=True needs a Functional or Sequential model to share "
                f"BatchNormalization statistics; got a subclassed {type(template).__name__}. "
                "Use method='mirrored' or sync_batchnorm=False"
            )
        refused = a.towers_refusal(template) if len(self.devices) > 1 else []
        if refused:
            raise ValueError(f"method='towers' cannot run {'; '.join(refused)}. Use method='mirrored'")
        self._core_model = template  # tracked: its variables are this model's

    def _towers(self, x, training: bool, watch=None):
        """Merged outputs, the call-time losses of the whole batch, and the emulated devices' pending ends.

        With ``watch`` (a training tape's), emulated devices are finished after
        their backward pass instead: their first input is watched, and each
        pending ``(device, token, input)`` is finished on the input's gradient.
        """
        n, sizes, parts = self._split(x)
        parts, tokens = zip(*(self._begin_device(d, part) for d, part in zip(self.devices, parts)))
        pending = []
        if watch is not None:
            for device, part, token in zip(self.devices, parts, tokens):
                leaf = tf.nest.flatten(part)[0]
                if token is not None and leaf.dtype.is_floating:
                    watch(leaf)
                    pending.append((device, token, leaf))
        if training and self._layerwise:
            outputs, losses = layerwise.run_towers(self._adapter, self.template, list(parts), self.devices,
                                                   self.merge_device, training)
        else:
            outputs, losses = [], []
            for device, part in zip(self.devices, parts):
                with tf.device(device):
                    outputs.append(self.template(part, training=training))
                losses.append(self._adapter.call_losses(self.template))
        deferred = {device for device, _, _ in pending}
        outputs = [out if d in deferred else self._end_device(d, out, token)
                   for d, out, token in zip(self.devices, outputs, tokens)]
        with tf.device(self.merge_device):
            shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
            extra = add_all([self._as_share(tower, shares[i]) for i, tower in enumerate(losses)])
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
        grads = merge_all(grads, len(self.devices))  # sparse rows laid out as on one device
        if pending:
            # Each emulated device finishes when its backward pass reaches its input.
            zeros = [self.emulator.finish(device, token, after=y_pred if g is None else g)
                     for (device, token, _), g in zip(pending, input_grads)]
            grads = add_zero_where_present(grads, tf.add_n(zeros))
        a.apply_gradients(self.optimizer, grads, weights)
        return y_pred, extra, compiled

    def _parallel_forward(self, x):
        y_pred, extra, _ = self._towers(x, training=False)
        return y_pred, extra


@functools.cache
def towers_class(adapter):
    """The towers model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("TowersModel", (Towers, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
