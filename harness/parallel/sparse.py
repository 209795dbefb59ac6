"""Sparse (``IndexedSlices``) gradients shaped as the single-device step shapes them.

Keras 3's optimizers update from an ``IndexedSlices`` gradient without summing
repeated rows first: Adam squares each occurrence (``ops.square`` keeps the
slices) and adds the squares, where true Adam squares their sum (checked on
Keras 3.15; Keras 2's optimizers sum repeated rows first, so there the shape
does not matter). The result of a step therefore depends on how the gradient's
rows are laid out, not only on its dense value:

- a gather of the batch's own rows (an Embedding of the tokens) gives one
  gradient row per token; the devices' slices, concatenated in batch order,
  give the same rows as the whole batch;
- a gather that does not depend on the batch (an Embedding of
  ``arange(sequence_length)``, learned positions) gives one block of rows with
  the batch summed into it on one device, but one block *per device* in
  parallel: ``k`` equal blocks of indices.

``merge_repeated_blocks`` sums such ``k`` equal blocks into one, which is the
single-device layout; it leaves every other gradient alone. Two row gathers of
equal-sized slices whose indices are equal token by token would be summed too
(the single device keeps them apart): with Keras 3 and a non-linear optimizer
such a step differs from one device by Adam's sum-of-squares quirk above.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["merge_repeated_blocks", "merge_all", "reduce_sparse_in_replica"]


def merge_repeated_blocks(grad, parts: int):
    """``grad`` with ``parts`` equal blocks of indices summed into one block; any other gradient as it is."""
    if not isinstance(grad, tf.IndexedSlices) or parts < 2:
        return grad
    indices, values = grad.indices, grad.values
    n = tf.shape(indices)[0]
    block = n // parts

    def equal_blocks():
        blocks = tf.reshape(indices, [parts, -1])
        return tf.reduce_all(tf.equal(blocks, blocks[:1]))

    repeated = tf.cond(tf.logical_and(n > 0, tf.equal(n % parts, 0)), equal_blocks, lambda: tf.constant(False))

    def summed():
        shape = tf.concat([[parts, block], tf.shape(values)[1:]], axis=0)
        return indices[:block], tf.reduce_sum(tf.reshape(values, shape), axis=0)

    indices, values = tf.cond(repeated, summed, lambda: (indices, values))
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def merge_all(grads, parts: int) -> list:
    """``merge_repeated_blocks`` over a list of gradients (None kept)."""
    return [None if g is None else merge_repeated_blocks(g, parts) for g in grads]


def reduce_sparse_in_replica(ctx, grads) -> list:
    """Inside a replica: each sparse gradient summed over the replicas (rows concatenated in replica order,
    repeated blocks merged) on replica 0, and an empty one on the others, so that the optimizer's own
    sum over replicas hands the variable exactly those rows. Dense gradients and None are returned as they are.
    """
    replicas = ctx.num_replicas_in_sync
    out = []
    for g in grads:
        if not isinstance(g, tf.IndexedSlices) or replicas < 2:
            out.append(g)
            continue
        whole = merge_repeated_blocks(ctx.all_reduce(tf.distribute.ReduceOp.SUM, g), replicas)
        rows = tf.shape(whole.indices)[0]
        keep = tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), rows, tf.zeros_like(rows))
        out.append(tf.IndexedSlices(whole.values[:keep], whole.indices[:keep], whole.dense_shape))
    return out
