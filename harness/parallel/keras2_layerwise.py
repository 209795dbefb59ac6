"""Keras 2 towers layer by layer: whole-batch BatchNormalization across towers.

The Keras 2 twin of ``harness.parallel.layerwise``. A Functional (or built
Sequential) Keras 2 model is walked node by node, as its own
``_run_internal_graph`` does, once per tower: a BatchNormalization layer sees
every tower's input before any tower goes on, normalises each with the
moments of the whole batch (``global_moments``: two-pass, weighted by true
sample counts) and moves its averages once per step. Every other layer runs
once per tower on that tower's device, in a call context that carries
``training`` as a model call would. The BatchNormalization step itself is
``keras2_batchnorm.batchnorm_towers``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import tensorflow as tf

from harness.parallel.keras2_batchnorm import batchnorm_refusal, batchnorm_towers, is_batchnorm

__all__ = ["graph_of", "has_batchnorm", "own_losses", "penalties", "add_all", "run_towers"]


def graph_of(model):
    """The Functional graph of a Keras 2 Functional or built Sequential model, else None."""
    if getattr(model, "_is_graph_network", False) and hasattr(model, "_nodes_by_depth"):
        return model
    return None


def has_batchnorm(model) -> bool:
    return any(is_batchnorm(layer) for layer in model._flatten_layers(include_self=False))


def _enter_call(model, inputs, training):
    """A call context as ``model(inputs, training=...)`` opens (tf_keras and Keras 2.15 spell it apart)."""
    from importlib import import_module

    utils = import_module(f"{type(model).__module__.split('.')[0]}.src.engine.base_layer_utils")
    context = utils.call_context()
    if "call_context_args" in inspect.signature(context.enter).parameters:
        return context.enter(layer=model, inputs=inputs, build_graph=True, call_context_args={"training": training})
    return context.enter(layer=model, inputs=inputs, build_graph=True, training=training)


def own_losses(layer) -> list:
    """The losses ``layer`` and its sublayers added in their last call in this thread (activity
    regularisers, ``add_loss``); inside ``tf.function`` Keras 2 keeps them thread-local, per replica."""
    return [loss for sub in layer._flatten_layers() for loss in sub._eager_losses]


def penalties(model) -> list:
    """Weight regularisation: a function of the weights only, counted once per step (not once per device)."""
    return [loss() for layer in model._flatten_layers() for loss in layer._callable_losses]


def add_all(values) -> tf.Tensor:
    """The float32 sum of a (nested) list of losses; 0 for none."""
    values = [tf.cast(v, tf.float32) for v in tf.nest.flatten(values)]
    return tf.add_n(values) if values else tf.zeros((), tf.float32)


def run_towers(model, parts: list, devices: Sequence[str], merge_device: str, training: bool):
    """Runs ``model`` on each tower's inputs, BatchNormalization synchronised across towers.

    Returns:
        ``(outputs, losses)``: per tower, its output structure and the list of
        losses its layers added (each as Keras 2 computes it on that slice).
    """
    graph = graph_of(model)
    if graph is None:
        raise ValueError(
            f"model {model.name!r} ({type(model).__name__}) is not a functional graph; whole-batch "
            "BatchNormalization across towers needs a Functional or Sequential model (or sync_batchnorm=False)"
        )
    towers = range(len(devices))
    losses: list[list] = [[] for _ in towers]
    values: list[dict] = [{} for _ in towers]
    for i, part in enumerate(parts):
        for ref, tensor in zip(graph.inputs, graph._flatten_to_reference_inputs(part)):
            tensor = graph._conform_to_reference_input(tensor, ref_input=ref)
            values[i][str(id(ref))] = [tensor] * graph._tensor_usage_count[str(id(ref))]
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        for node in graph._nodes_by_depth[depth]:
            if node.is_input or any(t not in values[0] for t in node.flat_input_ids):
                continue
            filled = [node.map_arguments(v) for v in values]
            outputs = _run_node(graph, node.layer, filled, devices, merge_device, training, losses)
            for v, out in zip(values, outputs):
                for ref_id, tensor in zip(node.flat_output_ids, tf.nest.flatten(out)):
                    v[ref_id] = [tensor] * graph._tensor_usage_count[ref_id]
    results = [tf.nest.pack_sequence_as(graph._nested_outputs, [v[str(id(ref))].pop() for ref in graph.outputs])
               for v in values]
    return results, losses


def _run_node(graph, op, filled, devices, merge_device, training, losses):
    if training and is_batchnorm(op) and op.trainable and batchnorm_refusal(op) is None:
        return batchnorm_towers(op, [args[0] for args, _ in filled], devices, merge_device)
    if training and graph_of(op) is not None and has_batchnorm(op):
        outputs, inner = run_towers(op, [args[0] for args, _ in filled], devices, merge_device, training)
        for mine, theirs in zip(losses, inner):
            mine.extend(theirs)
        return outputs
    outputs = []
    for i, (device, (args, kwargs)) in enumerate(zip(devices, filled)):
        op._clear_losses()  # in the call context below the op does not clear them itself
        with tf.device(device), _enter_call(graph, args, training):
            outputs.append(op(*args, **kwargs))
        losses[i].extend(own_losses(op))
    return outputs
