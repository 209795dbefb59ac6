"""Runs a Functional Keras graph on several towers at once, layer by layer.

Towers live in one graph, so a BatchNormalization layer can see every tower's
input before any tower continues: its statistics are those of the whole batch
(weighted by true sample counts) and its moving averages move once per step
(``batchnorm.batchnorm_towers``). Every other layer simply runs once per tower
on that tower's device, as the model's own call would run it (the adapter's
``call_node``). Nested Functional models with BatchNormalization are walked the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from harness.errors import Refused
from harness.parallel.batchnorm import batchnorm_towers

__all__ = ["has_batchnorm", "run_towers"]


def has_batchnorm(adapter, model) -> bool:
    return any(adapter.is_batchnorm(layer) for layer in adapter.sublayers(model))


def run_towers(adapter, model, parts: list, devices: Sequence[str], merge_device: str | None, training: bool,
               all_reduce=None, rows=None):
    """Calls ``model`` on each tower's inputs, syncing BatchNormalization across towers.

    ``all_reduce`` (``batchnorm.batchnorm_towers``): how the towers' statistics are summed
    (default: on ``merge_device``; across workers, over every worker's towers too); ``rows``: each
    tower's rows that count in the statistics (the others are borrowed: ``multiworker``).

    Returns:
        ``(outputs, losses)``: per tower, its output structure and the list of
        call-time losses its layers added (as the model's Keras computes them on
        that tower's slice).
    """
    graph = adapter.graph_of(model)
    if graph is None:
        raise Refused(
            "subclassed-batchnorm",
            f"model {model.name!r} ({type(model).__name__}) is not a functional graph; whole-batch "
            "BatchNormalization across towers needs a Functional or Sequential model "
            "(or use method='mirrored', or sync_batchnorm=False)"
        )
    towers = range(len(devices))
    losses: list[list] = [[] for _ in towers]
    walk = adapter.walk(graph, parts)
    for node, op in walk.nodes():
        filled = [walk.arguments(node, i) for i in towers]
        for i, out in enumerate(_run_node(adapter, graph, op, filled, devices, merge_device, training, losses,
                                            all_reduce, rows)):
            walk.store(node, i, out)
    return [walk.outputs(i) for i in towers], losses


def _run_node(adapter, graph, op, filled, devices, merge_device, training, losses, all_reduce, rows):
    if training and adapter.is_batchnorm(op) and op.trainable and adapter.batchnorm_refusal(op, "towers") is None:
        return batchnorm_towers(adapter, op, [args[0] for args, _ in filled], devices, merge_device, all_reduce,
                                rows)
    if training and adapter.graph_of(op) is not None and has_batchnorm(adapter, op):
        outputs, inner = run_towers(adapter, op, [args[0] for args, _ in filled], devices, merge_device, training,
                                    all_reduce, rows)
        for mine, theirs in zip(losses, inner):
            mine.extend(theirs)
        return outputs
    outputs = []
    for i, (device, (args, kwargs)) in enumerate(zip(devices, filled)):
        with tf.device(device):
            outputs.append(adapter.call_node(graph, op, args, kwargs, training))
        losses[i].extend(adapter.call_losses(op))
    return outputs
