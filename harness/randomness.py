"""Which layers of a model draw random numbers in training, and a switch that runs them as at inference.

Keras-generation neutral (Keras 3's ``keras.random.SeedGenerator``, tf_keras' ``_random_generator``), and imports
no TensorFlow: the JAX towers (``harness.parallel.jax``) name their random layers with it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from importlib import metadata

__all__ = ["random_layers", "randomness_off"]


# A layer's amount of randomness: all of those it has at 0 (Dropout(0.0), an LSTM without dropout, GaussianNoise(0)), it
# draws nothing, whatever generator it holds (tf_keras' LSTM and Attention always hold one; the zoo sets rate = 0).
_RANDOM_AMOUNTS = ("rate", "dropout", "recurrent_dropout", "stddev")


def random_layers(model) -> tuple[str, ...]:
    """The class names of the layers of ``model`` that draw random numbers in training (Dropout, SpatialDropout*,
    AlphaDropout, GaussianNoise, GaussianDropout, the Random* augmentation layers, a custom layer drawing from a
    seed generator): in model order, each once, nested models and layers included; ``()`` where none does.

    A layer draws when it holds a generator of its own (Keras 3: a ``keras.random.SeedGenerator``; Keras 2: the
    ``_random_generator`` of tf_keras' ``BaseRandomLayer``, the base of its Dropout family, GaussianNoise and
    Random* layers, RNNs and attention) and not every amount of randomness it has (``rate``, ``dropout``,
    ``recurrent_dropout``, ``stddev``) is 0. A recurrent layer whose cell draws is named, not the cell.
    """
    return tuple(dict.fromkeys(type(layer).__name__ for layer in _drawing_layers(model) if layer is not None))


@contextlib.contextmanager
def randomness_off(model) -> Iterator[tuple[str, ...]]:
    """Inside the block, the random layers of ``model`` (``random_layers``) run as at inference, in training too:
    each one's ``call`` gets ``training=False``. Yields their class names.

    The switch is made on their classes (each class's ``call`` wrapped, put back on exit), not on the instances:
    so it reaches every copy of the model made or traced inside the block (mirrored's clone, the float64 and
    rounding floor models), which are new instances of the same classes. A model traced inside the block keeps
    the switch in its trace: train it inside the block only. A layer whose ``call`` takes no ``training`` cannot
    be switched and keeps drawing (named all the same).
    """
    classes = list(dict.fromkeys(type(layer) for layer in _drawing_layers(model, cells=True) if layer is not None))
    saved: list[tuple[type, object]] = []
    try:
        for cls in classes:
            call = cls.call
            if "training" not in inspect.signature(call).parameters:
                continue
            saved.append((cls, cls.__dict__.get("call", _MISSING)))
            cls.call = _at_inference(call)
        yield random_layers(model)
    finally:
        for cls, own in reversed(saved):
            if own is _MISSING:
                del cls.call
            else:
                cls.call = own


_MISSING = object()


def _at_inference(call):
    """``call`` with ``training=False`` however it is called; its signature kept (Keras reads it: Keras 3 through
    ``inspect.signature``, which follows ``__wrapped__``; tf_keras through ``getfullargspec``, which reads
    ``__signature__``), so a layer built inside the block gets the same arguments (``mask``) as outside."""
    signature = inspect.signature(call)

    @functools.wraps(call)
    def at_inference(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["training"] = False
        return call(*bound.args, **bound.kwargs)

    at_inference.__signature__ = signature
    return at_inference


def _drawing_layers(model, *, cells: bool = False) -> list:
    """The layers of ``model`` (itself first, then every nested one, depth first in model order: ``_walk``) that
    draw in training. A recurrent layer whose ``cell`` draws stands for it
    (Keras 3's LSTM draws its dropout masks through its cell's generator, in its own ``call``); ``cells``: the
    cell too."""
    found: list = []
    for layer in _walk(model, set()):
        cell = getattr(layer, "cell", None)
        if _draws(layer) or (cell is not None and _draws(cell)):
            found.append(layer)
    cells_of = {id(getattr(layer, "cell", None)) for layer in found}
    return [layer for layer in found if cells or id(layer) not in cells_of]


def _walk(layer, seen: set) -> Iterator:
    """``layer``, then each layer inside it depth first, each once (Keras' own ``_flatten_layers(recursive=True)``
    lists a nested model's layers after its siblings, last first, on Keras 3)."""
    if id(layer) in seen:
        return
    seen.add(id(layer))
    yield layer
    children = layer._flatten_layers(include_self=False, recursive=False) if hasattr(layer, "_flatten_layers") else ()
    for child in children:
        yield from _walk(child, seen)


def _draws(layer) -> bool:
    """Whether ``layer`` holds a random generator of its own and some amount of randomness not 0."""
    generator = getattr(layer, "_random_generator", None) is not None or bool(getattr(layer, "_seed_generators", ()))
    if not generator:
        seed_generator = _seed_generator_class()
        generator = seed_generator is not None and any(
            isinstance(value, seed_generator) for value in vars(layer).values())
    if not generator:
        return False
    amounts = []
    for name in _RANDOM_AMOUNTS:
        try:
            value = getattr(layer, name, None)
        except Exception:  # noqa: BLE001  a property of a layer not built yet
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            amounts.append(value)
    return not amounts or any(value != 0 for value in amounts)


@functools.cache
def _seed_generator_class() -> type | None:
    """Keras 3's ``keras.random.SeedGenerator``; None where the ``keras`` package is not Keras 3 (read from its
    version: importing TensorFlow's Keras 2 to find out would import TensorFlow)."""
    try:
        major = int(metadata.version("keras").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None
    if major < 3:
        return None
    import keras as keras3

    return keras3.random.SeedGenerator
