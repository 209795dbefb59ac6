"""Whole-batch BatchNormalization for Keras 2 models, in both methods.

The Keras 2 twin of ``harness.parallel.batchnorm``, on the same two-pass,
count-weighted moments (``collective.global_moments``):

- ``sync_batchnorm_class(k)``: the layer the mirrored model clones
  BatchNormalization into; inside a replica its moments are all-reduced.
- ``batchnorm_towers``: one layer's training call over all towers at once (the
  layer-by-layer towers of ``keras2_layerwise``).

Keras 2's fused kernel (rank-4 inputs, ``layer.fused``) updates the moving
variance with Bessel's correction ``n / (n - 1)`` (n: values per channel) where
the unfused path does not; the single-device template runs that kernel, so both
apply the correction with the whole batch's n. Keras 2's own
``synchronized=True`` computes E[x²]-E[x]², which is not what one device
computes, so it is switched off.
"""

from __future__ import annotations

import tensorflow as tf

from harness.parallel.collective import global_moments, replica_all_reduce

__all__ = ["is_batchnorm", "batchnorm_refusal", "unsyncable_batchnorms", "sync_batchnorm_class", "batchnorm_towers"]


def is_batchnorm(layer) -> bool:
    """A Keras 2 BatchNormalization layer (tf_keras, or TF <= 2.15's keras), by class."""
    return any(cls.__name__ == "BatchNormalizationBase" for cls in type(layer).__mro__)


def batchnorm_refusal(layer) -> str | None:
    """Why a Keras 2 BatchNormalization layer can't get whole-batch statistics here, or None."""
    for attribute, what in (("renorm", "renorm=True"), ("virtual_batch_size", "virtual_batch_size"),
                            ("adjustment", "adjustment")):
        if getattr(layer, attribute, None):
            return f"{layer.name} (BatchNormalization with {what}: not synchronised across towers)"
    return None


def unsyncable_batchnorms(template, exact_class=None) -> list[str]:
    """``"name (why)"`` of each BatchNormalization layer in ``template`` that cannot be synchronised.

    Args:
        template: a Keras 2 model.
        exact_class: only this class can be synchronised (the mirrored clone replaces exactly
            ``k.layers.BatchNormalization``); None accepts subclasses.
    """
    found = []
    for layer in template._flatten_layers(include_self=False):
        if not is_batchnorm(layer):
            continue
        if exact_class is not None and type(layer) is not exact_class:
            found.append(f"{layer.name} ({type(layer).__name__}: only {exact_class.__module__.split('.')[0]}"
                         ".layers.BatchNormalization)")
        elif why := batchnorm_refusal(layer):
            found.append(why)
    return found


def _bessel(n):
    """The fused kernel's ``n / (n - 1)`` (1 for n <= 1)."""
    return tf.where(n > 1, n / tf.maximum(n - 1, 1), tf.ones_like(n))


# -- mirrored: a synchronised layer --------------------------------------------------------
_CLASSES: dict = {}


def sync_batchnorm_class(k):
    """``SyncBatchNormalization`` for Keras module ``k`` (one per module and process)."""
    if k in _CLASSES:
        return _CLASSES[k]

    class SyncBatchNormalization(k.layers.BatchNormalization):
        """BatchNormalization whose training statistics are the whole batch's, over all replicas.

        Outside a replica context (or with a mask) it is the unfused Keras layer.
        With ``bessel_moving_variance`` the moving variance is updated with the
        unbiased variance, as the fused kernel of the template's layer does.
        """

        def __init__(self, *args, bessel_moving_variance: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.bessel_moving_variance = bessel_moving_variance

        @classmethod
        def like(cls, layer):
            """The synchronised, unfused twin of ``layer`` (a built ``BatchNormalization``)."""
            config = {**layer.get_config(), "synchronized": False}  # Keras' own sync is E[x²]-E[x]²
            return cls(**config, fused=False, bessel_moving_variance=bool(layer.fused))

        def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
            ctx = tf.distribute.get_replica_context()
            local = mask is not None or ctx is None or ctx.num_replicas_in_sync == 1
            if local:
                mean, variance = super()._moments(inputs, reduction_axes, keep_dims, mask=mask)
            else:
                means, variances = global_moments([inputs], reduction_axes, replica_all_reduce)
                mean, variance = means[0], variances[0]
                for axis in sorted(reduction_axes) if keep_dims else []:
                    mean, variance = tf.expand_dims(mean, axis), tf.expand_dims(variance, axis)
            if self.bessel_moving_variance:  # samples per channel, over all replicas
                count = tf.cast(tf.size(inputs) // tf.maximum(1, tf.size(self.moving_mean)), inputs.dtype)
                # Per replica thread, for the moving-variance update of this call.
                self._thread_local.batch_count = count if local else ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
            return mean, variance

        def _assign_moving_average(self, variable, value, momentum, inputs_size):
            if self.bessel_moving_variance and variable is self.moving_variance:
                n = self._thread_local.batch_count
                value = value * _bessel(n)
            return super()._assign_moving_average(variable, value, momentum, inputs_size)

    _CLASSES[k] = SyncBatchNormalization
    return SyncBatchNormalization


# -- towers: one layer over all towers -------------------------------------------------------
def batchnorm_towers(layer, xs: list, devices, merge_device) -> list:
    """Keras 2 ``BatchNormalization.call(training=True)`` over all towers with whole-batch moments."""
    if any(getattr(x, "_keras_mask", None) is not None for x in xs):
        raise NotImplementedError(
            f"masked inputs to BatchNormalization layer {layer.name!r} are not synchronised across towers; "
            "use sync_batchnorm=False"
        )
    dtype = layer._param_dtype
    xs = [tf.cast(tf.cast(x, layer.compute_dtype), dtype) for x in xs]
    rank = len(xs[0].shape)
    axes = [i for i in range(rank) if i not in layer.axis]

    def all_reduce(values):
        with tf.device(merge_device):
            total = tf.add_n(values)
        return [total] * len(values)

    means, variances = global_moments(xs, axes, all_reduce, devices)
    moving_variance = variances[0]
    if layer.fused:  # the fused kernel's moving variance carries Bessel's correction
        n = tf.cast(tf.add_n([tf.size(x) for x in xs]) // tf.size(variances[0]), dtype)
        moving_variance = moving_variance * _bessel(n)
    layer._assign_moving_average(layer.moving_mean, means[0], layer.momentum, None)
    layer._assign_moving_average(layer.moving_variance, moving_variance, layer.momentum, None)
    shape = [1] * rank
    for axis in layer.axis:
        shape[axis] = xs[0].shape[axis]

    def broadcast(v):
        return None if v is None else tf.reshape(tf.cast(v, dtype), shape)

    gamma = broadcast(layer.gamma) if layer.scale else None
    beta = broadcast(layer.beta) if layer.center else None
    outputs = []
    for device, x, mean, variance in zip(devices, xs, means, variances):
        with tf.device(device):
            y = tf.nn.batch_normalization(x, broadcast(mean), broadcast(variance), beta, gamma, layer.epsilon)
            outputs.append(tf.cast(y, layer.compute_dtype))
    return outputs
