"""Runs a functional Keras graph on several towers at once, layer by layer.

Towers live in one graph, so a BatchNormalization layer can see every tower's
input before any tower continues: its statistics are those of the whole batch
(weighted by true sample counts) and its moving averages move once per step.
Every other layer simply runs once per tower on that tower's device.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf
from keras import ops, tree

from harness.parallel.batchnorm import global_moments, is_batchnorm

__all__ = ["graph_of", "has_batchnorm", "run_towers"]


def graph_of(model):
    """The Functional graph behind a Functional or built Sequential model, else None."""
    if isinstance(model, keras.Sequential):
        model = getattr(model, "_functional", None)
    if model is not None and hasattr(model, "_nodes_by_depth") and hasattr(model, "_run_through_graph"):
        return model
    return None


def has_batchnorm(model) -> bool:
    return any(is_batchnorm(layer) for layer in model._flatten_layers(include_self=False))


def run_towers(model, parts: list, devices: Sequence[str], merge_device: str, training: bool):
    """Calls ``model`` on each tower's inputs, syncing BatchNormalization across towers.

    Returns:
        ``(outputs, losses)``: one output structure per tower, and the losses the
        layers added while running (activity regularisers, ``add_loss``).
    """
    graph = graph_of(model)
    if graph is None:
        raise ValueError(
            f"model {model.name!r} ({type(model).__name__}) is not a functional graph; whole-batch "
            "BatchNormalization across towers needs a Functional or Sequential model "
            "(or use method='mirrored', or sync_batchnorm=False)"
        )
    losses: list = []
    values = [dict() for _ in devices]
    for i, x in enumerate(parts):
        for ref, tensor in zip(graph.inputs, tree.flatten(graph._standardize_inputs(x))):
            values[i][id(ref)] = tensor
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        for node in graph._nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            if any(id(t) not in values[0] for t in node.input_tensors):
                continue
            filled = [node.arguments.fill_in(v) for v in values]
            outputs = _run_node(node.operation, filled, devices, merge_device, training, losses)
            for v, out in zip(values, outputs):
                for ref, tensor in zip(node.outputs, tree.flatten(out)):
                    v[id(ref)] = tensor
    results = [
        tree.pack_sequence_as(graph._outputs_struct, [v[id(ref)] for ref in graph.outputs]) for v in values
    ]
    return [_unpack_singleton(r) for r in results], losses


def _unpack_singleton(x):
    if isinstance(x, (list, tuple)) and len(x) == 1:
        return x[0]
    return x


def _run_node(op, filled, devices, merge_device, training, losses):
    if training and is_batchnorm(op) and op.trainable and not op.renorm:
        return _batchnorm_towers(op, [args[0] for args, _ in filled], devices, merge_device)
    if training and isinstance(op, keras.Model) and graph_of(op) is not None and has_batchnorm(op):
        outputs, inner = run_towers(op, [args[0] for args, _ in filled], devices, merge_device, training)
        losses.extend(inner)
        return outputs
    outputs = []
    for device, (args, kwargs) in zip(devices, filled):
        if training is not None and "training" in getattr(op, "_call_context_args", ()):
            kwargs = {**kwargs, "training": training}
        with tf.device(device):
            outputs.append(op(*args, **kwargs))
        if isinstance(op, keras.layers.Layer):
            losses.extend(op._get_own_losses())
    return outputs


def _batchnorm_towers(layer, xs: list, devices, merge_device) -> list:
    """``BatchNormalization.call(training=True)`` over all towers with whole-batch moments."""
    if any(getattr(x, "_keras_mask", None) is not None for x in xs):
        raise NotImplementedError(
            f"masked inputs to BatchNormalization layer {layer.name!r} are not synchronised across towers; "
            "use sync_batchnorm=False or method='mirrored'"
        )
    compute_dtype = "float64" if xs[0].dtype == tf.float64 else "float32"
    xs = [ops.cast(x, compute_dtype) for x in xs]

    def all_reduce(values):
        with tf.device(merge_device):
            total = tf.add_n(values)
        return [total] * len(values)

    means, variances = global_moments(xs, layer._reduction_axes, all_reduce, devices)
    moving_mean = ops.cast(layer.moving_mean, compute_dtype)
    moving_variance = ops.cast(layer.moving_variance, compute_dtype)
    layer.moving_mean.assign(moving_mean * layer.momentum + means[0] * (1.0 - layer.momentum))
    layer.moving_variance.assign(moving_variance * layer.momentum + variances[0] * (1.0 - layer.momentum))
    gamma = ops.cast(layer.gamma, compute_dtype) if layer.scale else None
    beta = ops.cast(layer.beta, compute_dtype) if layer.center else None
    outputs = []
    for device, x, mean, variance in zip(devices, xs, means, variances):
        with tf.device(device):
            y = ops.batch_normalization(
                x, mean=mean, variance=variance, axis=layer.axis, offset=beta, scale=gamma, epsilon=layer.epsilon
            )
            outputs.append(ops.cast(y, layer.compute_dtype))
    return outputs
