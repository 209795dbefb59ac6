"""Whole-batch BatchNormalization statistics across devices, in both Keras generations.

Keras' own ``synchronized=True`` computes ``E[x^2] - E[x]^2``, which is not the
two-pass moments a single device uses, so the parallel model would drift.
Here the mean is combined first, then the squared deviations from it, both
weighted by true sample counts, so empty or uneven slices are exact
(``collective.global_moments``). Mirrored replicas get it from a synchronised
layer (each adapter's ``SyncBatchNormalization``); towers from
``batchnorm_towers``, one layer's training call over all towers at once.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from harness.errors import NotSupported
from harness.parallel.collective import global_moments

__all__ = ["batchnorm_towers"]


def batchnorm_towers(adapter, layer, xs: list, devices, merge_device, all_reduce=None, rows=None) -> list:
    """``layer``'s training call over all towers with the whole batch's moments; one output per tower.

    ``all_reduce`` sums one tensor per tower into the total, returned per tower
    (``collective.global_moments``); default: the towers' sum on ``merge_device``.
    ``rows``: per tower, how many of its first rows are the batch's (the statistics'); the
    rest is a borrowed row an empty tower carries (``multiworker``), normalised but not counted.
    """
    if any(adapter.get_mask(x) is not None for x in xs):
        raise NotSupported(
            "masked-batchnorm",
            f"masked inputs to BatchNormalization layer {layer.name!r} are not synchronised across towers; "
            "use sync_batchnorm=False or method='mirrored'"
        )
    xs, axes = adapter.bn_prepare(layer, xs)

    def towers_sum(values):
        with tf.device(merge_device):
            total = tf.add_n(values)
        return [total] * len(values)

    all_reduce = towers_sum if all_reduce is None else all_reduce
    counted = xs if rows is None else [x[:r] for x, r in zip(xs, rows)]
    means, variances = global_moments(counted, axes, all_reduce, devices)
    with tf.device(merge_device) if merge_device else contextlib.nullcontext():
        # Samples per channel (Keras 2's Bessel correction); summed as floats: collectives across workers
        # take no int32. Exact below 2**24.
        count = all_reduce([tf.cast(tf.size(x), tf.float32) for x in counted])[0] / tf.cast(
            tf.maximum(1, tf.size(means[0])), tf.float32)
    adapter.bn_update(layer, means[0], variances[0], count)
    outputs = []
    for device, x, mean, variance in zip(devices, xs, means, variances):
        with tf.device(device):
            outputs.append(adapter.bn_normalize(layer, x, mean, variance))
    return outputs
