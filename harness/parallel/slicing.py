"""In-graph batch splitting: the rule of ``harness.split`` on a run-time batch size.

Keras traces one step function for every batch size (the partial last batch
included), so the per-device sizes are computed from the dynamic batch size
with TensorFlow ops. ``tests/parallel/test_api.py`` checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from harness.errors import InvalidValue
from harness.split import shares

__all__ = ["batch_size_of", "split_sizes", "split_structure", "concat_structures", "restore_static_shape",
           "smallest_fit_batch"]

KERAS_DEFAULT_BATCH = 32  # what fit takes for arrays without batch_size (Keras 3 and tf_keras)


def batch_size_of(x) -> tf.Tensor:
    """The dynamic batch size (int32 scalar) of the first tensor in ``x``."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first, out_type=tf.int32)[0]


def static_batch_size_of(x) -> int | None:
    """The batch size of the first tensor in ``x`` where its shape fixes it (a trace for that size only), else
    None."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    shape = getattr(first, "shape", None)
    if shape is None or shape.rank is None or shape.rank == 0:
        return None
    return tf.compat.dimension_value(shape[0])


def smallest_fit_batch(x, batch_size=None, validation_split=0.0, steps_per_epoch=None) -> int | None:
    """The smallest training batch ``fit(x, batch_size=..., validation_split=...)`` will cut, or None.

    A ``tf.data.Dataset`` whose elements have a static batch dimension (batched with
    ``drop_remainder=True``) gives that size, every batch of it. Otherwise None where it cannot be
    known before the fit: ``x`` is not arrays (another dataset, a generator, a ``PyDataset``, ragged
    or sparse tensors) or ``steps_per_epoch`` is set. With arrays of ``n`` samples, fit trains on
    the first ``floor(n * (1 - validation_split))`` (Keras 3 and tf_keras both) in batches of
    ``batch_size`` and one partial batch of the rest; the neighbours of that count are taken too,
    so that a rounding difference between versions cannot hide a smaller batch.
    """
    if isinstance(x, tf.data.Dataset):
        specs = tf.nest.flatten(x.element_spec)
        if not specs or not all(isinstance(spec, tf.TensorSpec) for spec in specs):
            return None
        sizes = {spec.shape[0] if spec.shape.rank else None for spec in specs}
        return sizes.pop() if len(sizes) == 1 and None not in sizes else None
    leaves = tf.nest.flatten(x)
    if steps_per_epoch is not None or not leaves or not all(
            type(leaf) is np.ndarray or isinstance(leaf, tf.Tensor) for leaf in leaves):
        return None
    shape = tuple(leaves[0].shape)
    if not shape or shape[0] is None:
        return None
    n = int(shape[0])
    size = KERAS_DEFAULT_BATCH if batch_size is None else int(batch_size)
    split = float(validation_split or 0.0)
    counts = {n} if not split else {int(np.floor(n * (1.0 - split))) + d for d in (-1, 0, 1)}
    batches = [c % size or size for c in counts if c > 0]
    return min(batches) if batches else None


def split_sizes(batch_size: tf.Tensor, ratios: Sequence[float] | tf.Variable) -> tf.Tensor:
    """Per-device sizes (int32 vector) for a run-time ``batch_size``; see ``harness.split``.

    Args:
        batch_size: the dynamic batch size (int32 scalar).
        ratios: one ratio per device, or a float64 vector *of shares*
            (``harness.split.shares(ratios)``, e.g. a ``tf.Variable`` that
            ``ParallelModel.set_ratios`` assigns: the split changes without a retrace).
    """
    if isinstance(ratios, (tf.Variable, tf.Tensor)):
        weights = tf.convert_to_tensor(ratios)
        if weights.dtype != tf.float64 or weights.shape.rank != 1 or weights.shape[0] is None:
            raise InvalidValue(f"split_sizes wants a float64 vector of shares of static length; got {weights!r}")
    else:
        weights = tf.constant(shares(ratios), tf.float64)
    k = int(weights.shape[0])
    # One multiplication by host-computed shares, exactly as ``split_batch`` does.
    exact = tf.cast(batch_size, tf.float64) * weights
    floors = tf.floor(exact)
    sizes = tf.cast(floors, tf.int32)
    left = batch_size - tf.reduce_sum(sizes)
    order = tf.argsort(-(exact - floors), stable=True)
    rank = tf.scatter_nd(order[:, None], tf.range(k), [k])
    sizes += tf.cast(rank < left, tf.int32)
    for _ in range(k - 1):  # at most k-1 moves fill every empty device
        sizes = _fill_one_empty(sizes, batch_size >= k)
    return sizes


def _fill_one_empty(sizes: tf.Tensor, allowed: tf.Tensor) -> tf.Tensor:
    k = sizes.shape[0]
    index = tf.range(k)
    empty = tf.equal(sizes, 0)
    first_empty = tf.argmax(tf.cast(empty, tf.int32), output_type=tf.int32)
    # Largest share, lowest index on ties: a key that is unique per device.
    donor = tf.argmax(sizes * (k + 1) + (k - index), output_type=tf.int32)
    move = tf.logical_and(allowed, tf.reduce_any(empty))
    delta = tf.one_hot(first_empty, k, dtype=tf.int32) - tf.one_hot(donor, k, dtype=tf.int32)
    return sizes + tf.where(move, delta, tf.zeros_like(delta))


def split_structure(x, sizes: tf.Tensor, count: int) -> list:
    """Splits every tensor of a nested structure along axis 0 into ``count`` parts."""
    if x is None:
        return [None] * count
    parts = [tf.split(t, sizes, num=count, axis=0) if t is not None else [None] * count for t in tf.nest.flatten(x)]
    return [tf.nest.pack_sequence_as(x, [p[i] for p in parts]) for i in range(count)]


def restore_static_shape(t: tf.Tensor) -> tf.Tensor:
    """Reshapes ``t`` to its static non-batch shape (no-op for correct tensors).

    Some TF kernels (CPU Conv2D) return wrongly shaped tensors for an empty
    batch; an empty device slice must still concatenate with the others.
    """
    rest = t.shape[1:]
    if rest.is_fully_defined():
        return tf.reshape(t, [-1, *rest])
    return t


def concat_structures(parts: list):
    """Concatenates a list of equally nested structures along axis 0."""
    flat = [tf.nest.flatten(p) for p in parts]
    joined = [tf.concat([restore_static_shape(t) for t in ts], axis=0) for ts in zip(*flat)]
    return tf.nest.pack_sequence_as(parts[0], joined)
