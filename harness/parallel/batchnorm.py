"""Whole-batch BatchNormalization statistics across devices.

Keras' own ``synchronized=True`` computes ``E[x^2] - E[x]^2``, which is not the
two-pass ``tf.nn.moments`` a single device uses, so the parallel model would
drift. Here the mean is all-reduced first, then the squared deviations from it,
both weighted by true sample counts, so empty or uneven slices are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

__all__ = ["global_moments", "SyncBatchNormalization", "is_batchnorm"]

AllReduce = Callable[[list[tf.Tensor]], tf.Tensor]


def is_batchnorm(layer) -> bool:
    return isinstance(layer, keras.layers.BatchNormalization)


def global_moments(
    parts: Sequence[tf.Tensor],
    axes: Sequence[int],
    all_reduce: AllReduce,
    devices: Sequence[str | None] | None = None,
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Mean and variance of the concatenation of ``parts`` over ``axes``.

    Args:
        parts: the local tensors (one per tower, or the replica's own one).
        axes: reduction axes (every axis but the channel axis).
        all_reduce: sums one tensor per part into the global total and
            returns it per part (a list of the same length).
        devices: where each part's local reductions run (``None``: anywhere).

    Returns:
        ``(means, variances)``, one per part, channel-shaped.
    """
    devices = list(devices) if devices is not None else [None] * len(parts)
    axes = list(axes)

    def local(fn, *args):
        out = []
        for device, values in zip(devices, zip(*args)):
            with tf.device(device):
                out.append(fn(*values))
        return out

    def local_sum(x):
        # TF's CPU Conv2D returns a wrongly shaped *empty* tensor for an empty batch (its
        # channel count is the input's), and static-shape rewrites keep that from being
        # patched later: flatten to [-1, channels] first, which any empty tensor satisfies.
        rank = len(x.shape)
        keep = [1 if i in axes else d for i, d in enumerate(x.shape)]
        kept = [i for i in range(rank) if i not in axes]
        moved = tf.transpose(x, list(axes) + kept) if kept != list(range(rank - len(kept), rank)) else x
        flat = tf.reshape(moved, [-1, math.prod(keep)])
        return tf.reshape(tf.reduce_sum(flat, axis=0), keep)

    sums = local(local_sum, parts)
    counts = local(lambda x: tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype), parts)
    count = all_reduce(counts)
    means = local(tf.math.divide_no_nan, all_reduce(sums), count)
    squares = local(
        lambda x, m: local_sum(tf.math.squared_difference(x, tf.stop_gradient(m))),
        parts,
        means,
    )
    variances = local(tf.math.divide_no_nan, all_reduce(squares), count)
    means = local(lambda m: tf.squeeze(m, axes), means)
    return means, local(lambda v: tf.squeeze(v, axes), variances)


def _replica_all_reduce(values: list[tf.Tensor]) -> list[tf.Tensor]:
    ctx = tf.distribute.get_replica_context()
    return [ctx.all_reduce(tf.distribute.ReduceOp.SUM, values[0])]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose training statistics span all replicas.

    Used inside ``MirroredStrategy`` replicas; outside a replica context (or
    with masks) it behaves exactly like the Keras layer it replaces.
    """

    def _moments(self, inputs, mask):
        ctx = tf.distribute.get_replica_context()
        if mask is not None or ctx is None or ctx.num_replicas_in_sync == 1:
            return super()._moments(inputs, mask)
        means, variances = global_moments([inputs], self._reduction_axes, _replica_all_reduce)
        return means[0], variances[0]
