"""Sparse (``IndexedSlices``) gradients with the rows the single-device step gives them.

Keras 3's optimizers update from an ``IndexedSlices`` gradient without summing
repeated rows first: Adam, RMSprop, Adagrad and their kin square each row
(``ops.square`` keeps the slices) and add the squares, where a dense gradient
squares their sum; ``clipnorm`` measures the rows, not the dense gradient
(checked on Keras 3.15; Keras 2's optimizers sum repeated rows first). So a
step depends on which rows the gradient has, not only on its dense value, and
the parallel gradient must have the single device's rows: the rule is in
docs/design.md, "Sparse gradients".

Each lookup (a gather) of a variable gives the gradient one *segment* of rows:

- a lookup whose indices depend on the batch (token ids; position ids
  broadcast to the batch's shape) gives one row per id of each sample: the
  devices' segments together are the single device's rows (their order only
  changes the rounding of sums);
- a lookup whose indices do not depend on the batch (``Embedding`` of
  ``arange(length)`` added to every sample) gives one block of rows with the
  whole batch summed into it on one device, but one such block per device in
  parallel: the blocks of each lookup are summed into one.

Which is which is decided when the step is traced, from the graph: a segment
depends on the batch when its indices are computed from the step's input, other
than through the fixed dimensions of its shape (``depends_on_batch``). A
gradient's segments are the inputs of the concatenation TensorFlow aggregates
several lookups with. Where several devices' lookups share one tape (towers),
batch-independent segments can be told apart by lookup only when a variable has
one such lookup per device; otherwise the step is refused, naming the variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from harness.errors import Refused

__all__ = ["Rows", "rows_of", "join", "whole_rows", "all_reduce_rows", "depends_on_batch", "SparseLayoutError"]


class SparseLayoutError(Refused):
    """A sparse gradient whose single-device rows harness cannot reproduce (harness' own refusal; its
    ``reason`` is ``"sparse-layout"``)."""


class Rows(NamedTuple):
    """A sparse gradient split by kind of lookup: ``values``/``indices`` are the batch-dependent rows
    (None where every lookup is batch-independent), ``blocks`` one ``(values, indices)`` per
    batch-independent lookup."""

    values: tf.Tensor | None
    indices: tf.Tensor | None
    blocks: tuple[tuple[tf.Tensor, tf.Tensor], ...]
    dense_shape: tf.Tensor


def _segments(grad: tf.IndexedSlices) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """``(values, indices)`` of each lookup in ``grad``: the inputs of TensorFlow's aggregating concatenations
    (``backprop_util.AggregateIndexedSlicesGradients``), nested ones flattened; else the whole gradient."""
    values, indices = grad.values, grad.indices
    if not (tf.is_symbolic_tensor(values) and tf.is_symbolic_tensor(indices)):
        return [(values, indices)]
    if values.op.type == "ConcatV2" and indices.op.type == "ConcatV2":
        value_parts, index_parts = list(values.op.inputs)[:-1], list(indices.op.inputs)[:-1]
        axes = [tf.get_static_value(op.inputs[-1]) for op in (values.op, indices.op)]
        if len(value_parts) == len(index_parts) and axes == [0, 0]:
            out = []
            for v, i in zip(value_parts, index_parts):
                out += _segments(tf.IndexedSlices(v, i, grad.dense_shape))
            return out
    return [(values, indices)]


_SHAPE = "shape"  # a shape vector of a batch-dependent tensor: its first element is the batch size, the rest fixed


def _selected(op, length: int | None) -> set[int] | None:
    """The elements of a shape vector ``op`` picks (a constant ``StridedSlice``, ``GatherV2``, ``Slice`` or an
    output of ``Unpack``), None where that is not known when the step is traced."""
    if op.type == "StridedSlice":
        begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
        if begin is None or end is None or strides is None or len(begin) != 1 or length is None:
            return None
        if op.get_attr("shrink_axis_mask") & 1:
            return {int(begin[0]) % length}
        start = 0 if op.get_attr("begin_mask") & 1 else int(begin[0])
        stop = length if op.get_attr("end_mask") & 1 else int(end[0])
        return set(range(length)[slice(start, stop, int(strides[0]))])
    if op.type == "GatherV2":
        picked = tf.get_static_value(op.inputs[1])
        return None if picked is None or length is None else {int(i) % length for i in picked.reshape(-1)}
    if op.type == "Slice":
        begin, size = (tf.get_static_value(t) for t in op.inputs[1:3])
        if begin is None or size is None or length is None:
            return None
        return set(range(int(begin[0]), length if size[0] < 0 else int(begin[0]) + int(size[0])))
    return None


def _kind(tensor, inputs: list, kinds: list):
    """Whether ``tensor`` varies with the batch (True), not (False), or is ``_SHAPE``, from its op's inputs'."""
    op = tensor.op
    if op.type in ("Shape", "ShapeN"):
        return _SHAPE if kinds[tensor.value_index if op.type == "ShapeN" else 0] else False
    if op.type == "Rank":
        return False
    if _SHAPE in kinds and not any(k is True for k in kinds):
        if op.type in ("Identity", "Cast"):
            return _SHAPE
        if op.type == "Unpack":
            return tensor.value_index == 0
        if kinds[0] == _SHAPE and not any(kinds[1:]):
            length = inputs[0].shape[0] if inputs[0].shape.rank == 1 else None
            picked = _selected(op, length)
            if picked is not None:
                return 0 in picked
    return any(k is True or k == _SHAPE for k in kinds)


def depends_on_batch(tensor: tf.Tensor, sources: Sequence[tf.Tensor]) -> bool:
    """Whether ``tensor`` varies with the batch: computed from ``sources`` (the step's input) other than
    through the fixed dimensions of their shapes (``tf.range(tf.shape(x)[1])``: the sequence length is the
    same on every device). A walk of the traced graph; True when not traced (run eagerly: rows kept as
    they are)."""
    if not tf.is_symbolic_tensor(tensor):
        return True
    if tensor.shape.is_fully_defined():  # a device's slice has a batch size known only when the step runs
        return False
    wanted = {_key(s) for s in sources if tf.is_symbolic_tensor(s)}
    kinds: dict[tuple, object] = {}
    stack = [(tensor, False)]
    while stack:
        t, expanded = stack.pop()
        key = _key(t)
        if key in kinds:
            continue
        if key in wanted or not tf.is_symbolic_tensor(t):  # an eager capture: a constant, a variable's handle
            kinds[key] = key in wanted
            continue
        outer = _captured(t)
        inputs = list(t.op.inputs) if outer is None else [outer]
        if not expanded:
            stack.append((t, True))
            stack.extend((i, False) for i in inputs if _key(i) not in kinds)
            continue
        kinds[key] = kinds[_key(outer)] if outer is not None else _kind(t, inputs, [kinds[_key(i)] for i in inputs])
    return kinds[_key(tensor)] is True


def _key(t) -> tuple:
    """A tensor's identity for the walk: its graph and name. Not ``id(t)``: a tensor object met once may be freed
    and its id taken by another, which the walk would then take for one already seen (and a tensor met again
    through another wrapper object would be walked again)."""
    if tf.is_symbolic_tensor(t):
        return id(t.graph), t.name
    return "eager", id(t)


def _captured(t):
    """The outer tensor a function graph's placeholder ``t`` captures, else None. A step fed by a dataset traces
    its parallel branch in a ``tf.cond`` (``ParallelModel._by_batch_size``), whose graph sees the step's input
    through such a placeholder: the walk goes on outside (before, every lookup of such a step was taken for
    batch-independent)."""
    if t.op.type != "Placeholder":
        return None
    captures = getattr(t.graph, "captures", None) or ()  # FuncGraph (TF 2.12-2.21): [(external, internal), ...]
    return next((external for external, internal in captures if internal is t), None)


def _layout_error(variable, towers: int, found: int) -> SparseLayoutError:
    return SparseLayoutError(
        "sparse-layout",
        f"variable {getattr(variable, 'path', None) or getattr(variable, 'name', variable)!r} is looked up "
        f"{found // towers if towers else found} times per device with indices that do not depend on the batch "
        f"({found} lookups over {towers} devices sharing one gradient tape): harness cannot tell which lookups "
        "to sum into the single device's rows. Give it one such lookup per call, use one device per worker "
        "(method='mirrored'), or an optimizer that sums repeated rows (Keras 2)")


def rows_of(grad, sources: Sequence[tf.Tensor], towers: int = 1, variable=None):
    """``grad`` as ``Rows`` (a sparse gradient) or as it is (dense, None), when the step is traced.

    ``sources``: the step's input tensors; ``towers``: how many devices' lookups the gradient holds
    (one tape over several devices): their batch-independent blocks are summed per lookup.

    Raises:
        SparseLayoutError: several batch-independent lookups per device over several towers.
    """
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    kept: list = []
    blocks: list = []
    for values, indices in _segments(grad):
        (kept if depends_on_batch(indices, sources) else blocks).append((values, indices))
    if towers > 1 and blocks:
        if len(blocks) != towers:
            raise _layout_error(variable, towers, len(blocks))
        blocks = [(tf.add_n([v for v, _ in blocks]), blocks[0][1])]
    values = tf.concat([v for v, _ in kept], 0) if kept else None
    indices = tf.concat([i for _, i in kept], 0) if kept else None
    return Rows(values, indices, tuple(blocks), grad.dense_shape)


def join(parts: Sequence[Rows]) -> tf.IndexedSlices:
    """The single-device rows of several devices' ``Rows`` (one per device, in device order): their
    batch-dependent rows one after another, each batch-independent lookup's blocks summed into one."""
    first = parts[0]
    sites = {len(p.blocks) for p in parts}
    if len(sites) != 1:
        raise SparseLayoutError("sparse-lookups-differ",
                                f"the devices' gradients have different lookups ({sorted(sites)} batch-independent "
                                "ones): they did not trace the same model")
    values = [p.values for p in parts if p.values is not None]
    indices = [p.indices for p in parts if p.indices is not None]
    values += [tf.add_n([p.blocks[s][0] for p in parts]) for s in range(len(first.blocks))]
    indices += [b[1] for b in first.blocks]
    if len(values) == 1:
        return tf.IndexedSlices(values[0], indices[0], first.dense_shape)
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), first.dense_shape)


def whole_rows(grads, sources: Sequence[tf.Tensor], towers: int, variables=None) -> list:
    """Every gradient of one tape over ``towers`` devices with the single device's rows (dense ones, None kept)."""
    variables = variables if variables is not None else [None] * len(grads)
    out = []
    for g, v in zip(grads, variables):
        rows = rows_of(g, sources, towers, v)
        out.append(join([rows]) if isinstance(rows, Rows) else rows)
    return out


def all_reduce_rows(ctx, rows: Rows) -> Rows:
    """Inside a replica: ``rows`` of every replica, in replica order (batch-dependent rows gathered, each
    batch-independent block summed), the same on every replica."""
    values, indices = rows.values, rows.indices
    if values is not None:  # every replica has batch-dependent rows, or none has: the same model traced
        gathered = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.IndexedSlices(values, indices, rows.dense_shape))
        values, indices = gathered.values, gathered.indices
    blocks = tuple((ctx.all_reduce(tf.distribute.ReduceOp.SUM, v), i) for v, i in rows.blocks)
    return Rows(values, indices, blocks, rows.dense_shape)
