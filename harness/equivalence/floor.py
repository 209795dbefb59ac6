"""The rounding floor: single-device runs in the compared runs' own precision that differ from the single-device
run only in the order of their sums (``FLOOR_ORDERS``).

Three reorder each batch's rows (reversed, a fixed permutation, a rotation): every batch reduction adds in
another order. The fourth keeps the rows and sums each batch's gradient from sub-batches of the split's own
sizes, as a split does: Keras' own training step, one forward pass over the whole batch and the loss of the
whole batch, but the model's backward pass run once per sub-batch (the cotangents of the other rows set to 0)
and the sub-batches' gradients added in their order. The backward pass is linear in the cotangents, so the sum
is the batch's gradient for any model, batch-dependent layers included; only its rounding differs, and it
differs as a split's does (each device's partial sums rounded in the model's precision before they are added).
Where reordering rows changes nothing (float16 products summed in a float32 accumulator under mixed_float16 on
a CPU) this is the order that measures the rounding a split brings.

What it shares with harness' parallel code, and why a defect there cannot widen the floor it is judged against:
the sub-batches' sizes come from ``harness.split.split_batch`` in Python (a table, one row per batch size; the
towers' in-graph ``slicing.split_sizes`` is not called), and a size table that does not sum to a batch's rows stops
the run. The loss, its scaling and the optimizer step are Keras' own. What it takes from the parallel adapter is
the generation's private accessors alone: which step methods a model defines (``own_steps``), and the logits and
mask Keras keeps on an output (``get_logits``/``set_logits``, ``get_mask``/``set_mask``), carried from the inner
call's outputs to the ones returned. An accessor that lost them would change the floor run's loss, not only its
rounding; with one sub-batch the order is Keras' own step bit for bit on a softmax output and a masked one, and
tests/parallel/test_floor.py holds it so (a planted accessor that drops the logits or the mask fails there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# name -> what differs from the single-device run
FLOOR_ORDERS = {
    "reversed": "each batch's rows reversed",
    "permuted": "each batch's rows in a fixed random permutation",
    "rotated": "each batch's rows rotated by half the batch",
    "sub-batches": "each batch's gradient summed from sub-batches of the split's sizes",
}
_PERMUTATION_SEED = 20261128


def batch_order(name: str, n: int, batch_size: int) -> np.ndarray:
    """The sample order of the row-order ``name`` (``reversed``, ``permuted``, ``rotated``): each batch of
    ``batch_size`` (the last one partial) reordered in itself."""
    rng = np.random.default_rng(_PERMUTATION_SEED)
    parts = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, min(start + batch_size, n))
        if name == "reversed":
            rows = rows[::-1]
        elif name == "permuted":
            rows = rows[rng.permutation(len(rows))]
        elif name == "rotated":
            rows = np.roll(rows, len(rows) // 2)
        else:
            raise ValueError(f"no row order {name!r}")
        parts.append(rows)
    return np.concatenate(parts)


def sub_batch_steps(model, ratios: Sequence[float], batch_size: int) -> str | None:
    """Makes ``model`` (compiled, one device) sum each batch's gradient from sub-batches of the sizes a split by
    ``ratios`` gives (``harness.split.split_batch``; ``batch_size``: the largest batch it trains on): its call's
    backward pass runs once per sub-batch. Keras' own training step does the rest
    (loss, loss scaling, the optimizer, the metrics). None, or why this model cannot (its own training step:
    what it calls is its own). On Keras 3's JAX backend the same order is built on ``jax.vjp`` (``floorjax``);
    elsewhere on TensorFlow's tapes."""
    from harness.compat import is_keras2_model, on_jax_backend

    if not is_keras2_model(model) and on_jax_backend():
        from harness.equivalence.floorjax import sub_batch_steps_jax

        return sub_batch_steps_jax(model, ratios)
    from harness.parallel.adapters import adapter_for

    adapter = adapter_for(model)
    own = adapter.own_steps(model)
    if own:
        return f"the model's own {', '.join(own)}"
    model.call = _partitioned(model.call, adapter, _sizes_table(batch_size, ratios))
    return None


def _sizes_table(batch_size: int, ratios: Sequence[float]) -> np.ndarray:
    """Row ``n`` (0 to ``batch_size``): ``harness.split``'s sizes of a batch of ``n`` rows split by ``ratios``."""
    from harness.split import split_batch

    return np.array([split_batch(n, ratios) for n in range(batch_size + 1)], dtype=np.int32)


def _partitioned(call, adapter, table: np.ndarray):
    """``call`` whose backward pass is the sum, in sub-batch order, of one backward pass per sub-batch (the
    cotangents of the other rows 0; the sizes of a batch of ``n`` rows: ``table[n]``): the same gradient, rounded
    as a split rounds it."""
    import tensorflow as tf

    def partitioned(inputs, *args, **kwargs):
        flat_in = tf.nest.flatten(inputs)
        made: dict[str, Any] = {}

        @tf.custom_gradient
        def forward(*flat):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch([t for t in flat if t.dtype.is_floating])
                out = call(tf.nest.pack_sequence_as(inputs, list(flat)), *args, **kwargs)
            outs = tf.nest.flatten(out)
            # Keras keeps a softmax output's logits on it (its cross-entropy reads them) and masks: returned
            # beside the outputs, attached again outside.
            logits = [adapter.get_logits(o) for o in outs]
            made.update(out=out, outs=outs, logits=logits)
            results = outs + [t for t in logits if t is not None]

            def grad(*upstream, variables=None):
                n = tf.shape(results[0])[0]
                sizes = tf.gather(tf.constant(table), n)
                # A batch beyond the table (tf.gather gives 0s there on a GPU) must not drop rows silently.
                with tf.control_dependencies([tf.debugging.assert_equal(
                        tf.reduce_sum(sizes), n, message="the sub-batches order's sizes do not cover the batch")]):
                    sizes = tf.identity(sizes)
                ends = tf.cumsum(sizes)
                rows = tf.range(n)
                sources = list(flat) + list(variables or ())
                total: list[Any] = [None] * len(sources)
                for i in range(table.shape[1]):
                    inside = tf.logical_and(rows >= ends[i] - sizes[i], rows < ends[i])
                    pairs = [(r, u * tf.reshape(tf.cast(inside, u.dtype), [-1] + [1] * (u.shape.rank - 1)))
                             for r, u in zip(results, upstream) if u is not None]
                    grads = tape.gradient([p[0] for p in pairs], sources, output_gradients=[p[1] for p in pairs],
                                          unconnected_gradients=tf.UnconnectedGradients.NONE)
                    total = [_add(t, g) for t, g in zip(total, grads)]
                return total[:len(flat)], total[len(flat):]

            return results, grad

        results = forward(*flat_in)
        outs = list(results[:len(made["outs"])])
        kept = iter(results[len(made["outs"]):])
        for i, (inner, logits) in enumerate(zip(made["outs"], made["logits"])):
            if logits is not None:
                adapter.set_logits(outs[i], next(kept))
            mask = adapter.get_mask(inner)
            if mask is not None:
                adapter.set_mask(outs[i], mask)
        return tf.nest.pack_sequence_as(made["out"], outs)

    return partitioned
def _add(total, grad):
    """``total + grad`` in order, the sparse gradients (``IndexedSlices``: an embedding's rows) kept as one device's
    step would have them: Keras 3's optimizers step each row of a sparse gradient (Adam squares each one), so the
    rows matter, not only their sum (docs/design.md, "Sparse gradients under Keras 3's optimizers"). A lookup of
    the batch's own ids (tokens) gives each sub-batch its own rows, concatenated as one device's gradient lists
    them; a lookup that does not depend on the batch (position ids broadcast to it) gives every sub-batch the
    same rows, which one device sums over the batch first: those are summed row by row."""
    import tensorflow as tf

    if grad is None:
        return total
    if total is None:
        return grad
    if not (isinstance(total, tf.IndexedSlices) and isinstance(grad, tf.IndexedSlices)):
        return tf.convert_to_tensor(total) + tf.convert_to_tensor(grad)
    same_size = tf.equal(tf.size(total.indices), tf.size(grad.indices))
    same = tf.cond(same_size, lambda: tf.reduce_all(tf.equal(total.indices, tf.reshape(grad.indices, tf.shape(
        total.indices)))), lambda: tf.constant(False))

    def summed():
        return total.values + tf.reshape(grad.values, tf.shape(total.values)), total.indices

    def concatenated():
        return tf.concat([total.values, grad.values], 0), tf.concat([total.indices, grad.indices], 0)

    values, indices = tf.cond(same, summed, concatenated)
    return tf.IndexedSlices(values, indices, total.dense_shape)
