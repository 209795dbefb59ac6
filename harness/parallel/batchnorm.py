"""Whole-batch BatchNormalization statistics across devices.

Keras' own ``synchronized=True`` computes ``E[x^2] - E[x]^2``, which is not the
two-pass ``tf.nn.moments`` a single device uses, so the parallel model would
drift. Here the mean is all-reduced first, then the squared deviations from it,
both weighted by true sample counts, so empty or uneven slices are exact
(``harness.parallel.collective.global_moments``; the Keras 2 twin of this layer
is in ``keras2_batchnorm``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from harness.parallel.collective import global_moments, replica_all_reduce

__all__ = ["global_moments", "SyncBatchNormalization", "is_batchnorm"]


def is_batchnorm(layer) -> bool:
    return isinstance(layer, keras.layers.BatchNormalization)


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose training statistics span all replicas.

    Used inside ``MirroredStrategy`` replicas; outside a replica context (or
    with masks) it behaves exactly like the Keras layer it replaces.
    """

    def _moments(self, inputs, mask):
        ctx = tf.distribute.get_replica_context()
        if mask is not None or ctx is None or ctx.num_replicas_in_sync == 1:
            return super()._moments(inputs, mask)
        means, variances = global_moments([inputs], self._reduction_axes, replica_all_reduce)
        return means[0], variances[0]
