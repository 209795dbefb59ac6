"""Synthetic batches for a user's model, inferred from its input specs and its compiled loss.

A model given as ``--model MODULE:ATTR`` without ``--data`` trains on batches harness makes up
(docs/user-models.md has the table):

- **inputs**, from the model's ``Input`` specs: a float input gets standard normal noise of its
  shape and dtype; an integer input gets ids in ``[0, input_dim)`` of the first ``Embedding`` it
  reaches through integer tensors. Anything else (an integer input no Embedding reads, a bool or
  string input, a dimension of unknown size other than the batch's) cannot be inferred.
- **labels**, one per output, from the output's shape and the loss compiled for it: sparse
  categorical cross-entropy -> int32 class ids in ``[0, classes)`` (the output's last
  dimension, which the labels drop); categorical losses -> one-hot float32 rows; binary losses
  (cross-entropy, focal, hinge, dice, tversky) -> 0/1 float32 of the output's shape; regression
  losses -> standard normal float32 of the output's shape (its absolute value for the
  logarithmic and Poisson losses, which want labels >= 0). A loss that is not one of Keras' own
  (a function or class of the user's, not derived from a Keras loss) cannot be inferred.

What cannot be inferred raises ``InvalidValue`` naming it and pointing at ``--data``.

The model's Keras is not needed here: the adapters describe the model
(``Adapter.io_description``: names, shapes, dtypes, the Embedding each input reaches) and this
module works on that description, so it imports neither TensorFlow nor Keras and its rules are
tested in milliseconds (tests/unit/test_user_workload.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import InvalidValue

__all__ = ["LOSS_KINDS", "InputSpec", "LabelSpec", "DataPlan", "loss_name", "loss_kind", "plan_data", "pack"]

#: what labels each Keras loss wants, by its snake_case name (functions and classes of both Keras generations)
LOSS_KINDS = {
    "sparse_categorical_crossentropy": "sparse",
    "categorical_crossentropy": "one_hot",
    "categorical_focal_crossentropy": "one_hot",
    "kl_divergence": "one_hot",
    "categorical_hinge": "one_hot",
    "binary_crossentropy": "binary",
    "binary_focal_crossentropy": "binary",
    "hinge": "binary",
    "squared_hinge": "binary",
    "dice": "binary",
    "tversky": "binary",
    "mean_squared_error": "regression",
    "mean_absolute_error": "regression",
    "mean_absolute_percentage_error": "regression",
    "huber": "regression",
    "log_cosh": "regression",
    "cosine_similarity": "regression",
    "mean_squared_logarithmic_error": "positive",
    "poisson": "positive",
}
_ALIASES = {"mse": "mean_squared_error", "mae": "mean_absolute_error", "mape": "mean_absolute_percentage_error",
            "msle": "mean_squared_logarithmic_error", "logcosh": "log_cosh", "kld": "kl_divergence",
            "kullback_leibler_divergence": "kl_divergence", "huber_loss": "huber", "bce": "binary_crossentropy"}
_KERAS_MODULES = ("keras.", "tf_keras.", "tensorflow.")
_WRAPPERS = ("Loss", "LossFunctionWrapper")  # Keras' base classes: above them no class names a loss
_HINT = "pass --data MODULE:ATTR (or file.py:ATTR) with real batches (docs/user-models.md)"


def _snake(name: str) -> str:
    """``SparseCategoricalCrossentropy`` -> ``sparse_categorical_crossentropy``; ``KLDivergence`` -> ``kl_divergence``.
    """
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _is_keras(obj) -> bool:
    return (getattr(obj, "__module__", "") or "").startswith(_KERAS_MODULES)


def loss_name(loss) -> str | None:
    """The snake_case name of a Keras loss (a name, a function or a ``Loss``, a subclass of one included); None
    for a loss that is not Keras' own (a function or class of the user's)."""
    if isinstance(loss, str):
        name = _snake(loss) if any(c.isupper() for c in loss) else loss.lower()
        return _ALIASES.get(name, name)
    if isinstance(loss, type):
        return None
    if callable(loss) and not hasattr(loss, "get_config") and hasattr(loss, "__name__"):  # a loss function
        return _ALIASES.get(loss.__name__, loss.__name__) if _is_keras(loss) else None
    for cls in type(loss).__mro__:  # a Loss object: the first Keras class up its hierarchy, below Keras' bases
        if _is_keras(cls) and cls.__name__ in _WRAPPERS:
            break
        if _is_keras(cls):
            return _ALIASES.get(_snake(cls.__name__), _snake(cls.__name__))
    fn = getattr(loss, "fn", None)  # keras.losses.LossFunctionWrapper(fn): the function decides
    return loss_name(fn) if callable(fn) else None


def loss_kind(loss) -> str | None:
    """``"sparse"``, ``"one_hot"``, ``"binary"``, ``"regression"`` or ``"positive"``: the labels ``loss`` wants
    (``LOSS_KINDS``); None where harness cannot tell."""
    name = loss_name(loss)
    return None if name is None else LOSS_KINDS.get(name)


def _describe(loss) -> str:
    if isinstance(loss, str):
        return repr(loss)
    target = loss if callable(loss) and hasattr(loss, "__name__") else type(loss)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(loss))}"


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape without the batch axis, dtype and, for ids, the Embedding's ``input_dim``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    vocabulary: int | None = None

    @property
    def is_integer(self) -> bool:
        return np.issubdtype(np.dtype(self.dtype), np.integer)

    def text(self) -> str:
        what = f"ids in [0, {self.vocabulary})" if self.is_integer else "standard normal noise"
        return f"input {self.name!r} {self.dtype} {self.shape}: {what}"


@dataclass(frozen=True)
class LabelSpec:
    """The labels of one output: ``kind`` (``LOSS_KINDS``' values), their shape without the batch axis, classes."""

    output: str
    kind: str
    shape: tuple[int, ...]
    classes: int | None = None

    @property
    def dtype(self) -> str:
        return "int32" if self.kind == "sparse" else "float32"

    def text(self) -> str:
        what = {"sparse": f"class ids in [0, {self.classes})", "one_hot": f"one-hot rows of {self.classes} classes",
                "binary": "0/1", "regression": "standard normal noise",
                "positive": "|standard normal noise|"}[self.kind]
        return f"labels of output {self.output!r} {self.dtype} {self.shape}: {what}"


def pack(tree, leaves: Sequence):
    """``tree`` (dicts, lists and tuples whose leaves are flat indices) with each index replaced by ``leaves[index]``;
    lists become tuples (``tf.data`` would stack a list of arrays into one tensor)."""
    if isinstance(tree, dict):
        return {key: pack(value, leaves) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return tuple(pack(value, leaves) for value in tree)
    return leaves[tree]


@dataclass(frozen=True)
class DataPlan:
    """How to make a model's batches: its inputs and labels, flat, and the structures they are packed in."""

    inputs: tuple[InputSpec, ...]
    input_tree: Any
    labels: tuple[LabelSpec, ...]
    label_tree: Any

    def sample_bytes(self) -> int:
        """Bytes of one ``(x, y)`` sample."""
        specs = [(s.shape, s.dtype) for s in self.inputs] + [(s.shape, s.dtype) for s in self.labels]
        return sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in specs)

    def synthesize(self, samples: int, seed: int = 0) -> tuple[Any, Any]:
        """``(x, y)`` of ``samples`` rows, NumPy arrays packed as the model takes them (the same seed, the same arrays).
        """
        rng = np.random.default_rng(seed)
        xs = []
        for spec in self.inputs:
            shape = (samples, *spec.shape)
            if spec.is_integer:
                xs.append(rng.integers(0, spec.vocabulary or 1, size=shape).astype(spec.dtype))
            else:
                xs.append(rng.standard_normal(shape).astype(spec.dtype))
        ys = [_labels(rng, spec, samples) for spec in self.labels]
        return pack(self.input_tree, xs), pack(self.label_tree, ys)

    def text(self) -> list[str]:
        """One line per input and output: what harness makes for it."""
        return [s.text() for s in self.inputs] + [s.text() for s in self.labels]


def _labels(rng: np.random.Generator, spec: LabelSpec, samples: int) -> np.ndarray:
    shape = (samples, *spec.shape)
    if spec.kind == "sparse":
        return rng.integers(0, spec.classes or 1, size=shape).astype(np.int32)
    if spec.kind == "one_hot":
        ids = rng.integers(0, spec.classes or 1, size=shape[:-1])
        return np.eye(spec.classes or 1, dtype=np.float32)[ids]
    if spec.kind == "binary":
        return rng.integers(0, 2, size=shape).astype(np.float32)
    noise = rng.standard_normal(shape).astype(np.float32)
    return np.abs(noise) if spec.kind == "positive" else noise


def plan_data(io: dict | None, loss, where: str) -> DataPlan:
    """The ``DataPlan`` of a model from its description and compiled loss.

    Args:
        io: ``Adapter.io_description(model)``: ``inputs`` and ``outputs`` (``(name, shape, dtype)`` each, the
            batch axis first), ``input_tree`` and ``output_tree`` (the structures, leaves flat indices),
            ``embeddings`` (per input, the ``input_dim`` of the first Embedding it reaches, or None); None for a
            model without a graph (a subclassed model).
        loss: the compiled loss: one for every output, a list (one per output) or a dict by output name.
        where: the model's spec (``"models.py:build"``), for the messages.

    Raises:
        InvalidValue: naming what cannot be inferred, and suggesting ``--data``.
    """
    if io is None:
        raise InvalidValue(f"cannot infer the inputs of the model from {where}: it has no Input specs (a subclassed "
                           f"model, or a Sequential never built); {_HINT}")
    inputs = tuple(_input_spec(name, shape, dtype, vocab, where)
                   for (name, shape, dtype), vocab in zip(io["inputs"], io["embeddings"]))
    outputs = io["outputs"]
    losses = _losses_per_output(loss, [name for name, _, _ in outputs], where)
    labels = tuple(_label_spec(name, shape, item, where) for (name, shape, _), item in zip(outputs, losses))
    return DataPlan(inputs, io["input_tree"], labels, io["output_tree"])


def _known(shape, what: str, where: str) -> tuple[int, ...]:
    rest = tuple(shape)[1:]
    if any(d is None for d in rest):
        raise InvalidValue(f"cannot infer the batches of the model from {where}: {what} has shape {tuple(shape)}, a "
                           f"dimension of unknown size besides the batch's, and harness will not guess it (give the "
                           f"Input a fixed shape, or {_HINT})")
    return tuple(int(d) for d in rest)


def _input_spec(name: str, shape, dtype: str, vocabulary: int | None, where: str) -> InputSpec:
    dtype = "float32" if str(dtype).startswith("bfloat") else str(dtype)  # NumPy has none: Keras casts float32
    spec = InputSpec(name, _known(shape, f"input {name!r}", where), dtype)
    kind = np.dtype(spec.dtype) if spec.dtype not in ("string", "str", "object") else np.dtype(object)
    if np.issubdtype(kind, np.integer):
        if vocabulary is None:
            raise InvalidValue(f"cannot infer the values of integer input {name!r} ({spec.dtype}) of the model from "
                               f"{where}: no Embedding reads it, so its range is unknown; {_HINT}")
        return InputSpec(spec.name, spec.shape, spec.dtype, int(vocabulary))
    if not np.issubdtype(kind, np.floating):
        raise InvalidValue(f"cannot infer the values of input {name!r} ({spec.dtype}) of the model from {where}: "
                           f"harness makes float noise and Embedding ids only; {_HINT}")
    return spec


def _losses_per_output(loss, names: list[str], where: str) -> list:
    if isinstance(loss, dict):
        missing = [n for n in names if n not in loss]
        if missing:
            raise InvalidValue(f"cannot infer the labels of output {missing[0]!r} of the model from {where}: its "
                               f"compiled loss dict has no entry for it (keys {sorted(loss)}); {_HINT}")
        return [loss[n] for n in names]
    if isinstance(loss, (list, tuple)):
        if len(loss) != len(names):
            raise InvalidValue(f"cannot infer the labels of the model from {where}: {len(loss)} compiled losses for "
                               f"{len(names)} outputs {names}; {_HINT}")
        return list(loss)
    return [loss] * len(names)


def _label_spec(output: str, shape, loss, where: str) -> LabelSpec:
    kind = loss_kind(loss)
    if kind is None:
        raise InvalidValue(f"cannot infer the labels of output {output!r} of the model from {where}: its loss "
                           f"{_describe(loss)} is not one of Keras' losses harness knows (docs/user-models.md lists "
                           f"them); {_HINT}")
    known = _known(shape, f"output {output!r}", where)
    if kind in ("sparse", "one_hot") and not known:
        raise InvalidValue(f"cannot infer the labels of output {output!r} of the model from {where}: loss "
                           f"{loss_name(loss)!r} needs a class axis, and the output has shape {tuple(shape)}; {_HINT}")
    if kind == "sparse":
        return LabelSpec(output, kind, known[:-1], known[-1])
    return LabelSpec(output, kind, known, known[-1] if kind == "one_hot" else None)
