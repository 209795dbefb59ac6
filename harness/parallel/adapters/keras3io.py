"""A Keras 3 model's compile arguments and its inputs and outputs, read without TensorFlow.

A user's model on Keras' JAX backend (``harness check --model MODULE:ATTR --backend jax``) is read here instead
of by ``Keras3Adapter``, which imports TensorFlow: the two functions have the adapter's signatures
(``Adapter.compile_args``, ``Adapter.io_description``) and its results, for ``harness.bench.workloads.user`` and
``harness.bench.workloads.infer``; ``Keras3Adapter.compile_args`` is this module's. Keras' public API throughout
(``Model.input``/``output``/``layers``, ``Sequential.inputs``/``outputs``, ``Operation.input``/``output``,
``keras.tree``) but one private attribute:
the compile call's own arguments (``_compile_config``, Keras 3.0-3.15, as ``Keras3Adapter.compile_args`` reads
them: ``get_compile_config`` gives them serialised).
"""

from __future__ import annotations

from typing import Any

__all__ = ["compile_args", "io_description"]


def compile_args(model) -> dict | None:
    """What ``model`` was compiled with: ``optimizer`` (the model's own object), ``loss``, ``loss_weights``,
    ``metrics``, ``weighted_metrics``; None where it was not compiled."""
    config = getattr(model, "_compile_config", None)  # Keras 3.0-3.15: Trainer.compile's arguments
    if not getattr(model, "compiled", False) or config is None:
        return None
    given = config.config
    return {"optimizer": model.optimizer, "loss": model.loss, "loss_weights": given.get("loss_weights"),
            "metrics": given.get("metrics"), "weighted_metrics": given.get("weighted_metrics")}


def io_description(model) -> dict | None:
    """A Functional or built Sequential model's inputs and outputs (``Adapter.io_description``'s form: names,
    shapes with the batch axis, dtype names, the input and output trees, the ``input_dim`` of the first Embedding
    each input reaches through integer tensors); None for a model without a graph (subclassed)."""
    import keras

    inputs, outputs = _structures(model)
    if inputs is None:
        return None
    flat_in, flat_out = keras.tree.flatten(inputs), keras.tree.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])
    names = names if len(names) == len(flat_out) else [_name(t) for t in flat_out]
    return {"inputs": [(_name(t), tuple(t.shape), _dtype(t)) for t in flat_in],
            "outputs": [(name, tuple(t.shape), _dtype(t)) for name, t in zip(names, flat_out)],
            "input_tree": keras.tree.pack_sequence_as(inputs, list(range(len(flat_in)))),
            "output_tree": keras.tree.pack_sequence_as(outputs, list(range(len(flat_out)))),
            "embeddings": [_embedding_dim(model, t) for t in flat_in]}


def _structures(model) -> tuple[Any, Any]:
    """The (nested) input and output KerasTensors of a Functional or built Sequential model; (None, None) where it
    has none (a subclassed model, a Sequential never built)."""
    import keras

    if not isinstance(model, keras.Model):
        return None, None
    try:
        if isinstance(model, keras.Sequential):  # its graph's tensors (input/output are its own calls' in a graph)
            inputs, outputs = (t[0] if len(t) == 1 else t for t in (model.inputs, model.outputs))
        else:
            inputs, outputs = model.input, model.output
    except (AttributeError, ValueError, TypeError):  # never built, or never called on symbolic inputs: no graph
        return None, None
    if not keras.tree.flatten(inputs) or not all(isinstance(t, keras.KerasTensor)
                                                 for t in keras.tree.flatten([inputs, outputs])):
        return None, None
    return inputs, outputs


def _embedding_dim(model, ref) -> int | None:
    """The ``input_dim`` of the first Embedding that input ``ref`` of ``model`` reaches through integer tensors
    (nested single-input models included), or None."""
    import keras

    reached = {id(ref)}
    for layer in model.layers:  # a Functional's layers come in the order of its graph
        try:
            ins, outs = keras.tree.flatten(layer.input), keras.tree.flatten(layer.output)
        except (AttributeError, ValueError):  # an input layer, or a layer this graph never called
            continue
        if not reached.intersection(map(id, ins)):
            continue
        if isinstance(layer, keras.layers.Embedding):
            return int(layer.input_dim)
        if isinstance(layer, keras.Model):
            inner, _ = _structures(layer)
            inner_inputs = keras.tree.flatten(inner) if inner is not None else []
            if len(inner_inputs) == 1:
                dim = _embedding_dim(layer, inner_inputs[0])
                if dim is not None:
                    return dim
        reached.update(id(t) for t in outs if _dtype(t).startswith(("int", "uint")))
    return None


def _name(t) -> str:
    return str(getattr(t, "name", "") or "").split(":")[0]


def _dtype(t) -> str:
    return str(getattr(t.dtype, "name", t.dtype))
