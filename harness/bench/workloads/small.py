"""Small models and learnable synthetic data for equivalence checks.

Each builder returns a new, built model; each data function is deterministic.
They cover what exactness must survive: plain Dense, convolutions with
BatchNormalization, recurrent layers, and a two-input model with weight
regularisation (trained with sample weights).
"""

from __future__ import annotations

import numpy as np

from harness.errors import InvalidValue

__all__ = ["EQUIVALENCE_MODELS", "build", "loss", "make_data"]

EQUIVALENCE_MODELS = ("dense", "cnn_bn", "gru", "two_input")


def _dense(keras):
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)], name="dense"
    )


def _cnn_bn(keras):
    # Convolutions feeding BatchNormalization carry no bias (standard practice): a bias
    # there has a zero gradient in exact arithmetic, and Adam turns its float noise into steps.
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h), name="cnn_bn")


def _gru(keras):
    return keras.Sequential(
        [keras.Input((6, 4)), keras.layers.GRU(16, return_sequences=True), keras.layers.GRU(16), keras.layers.Dense(3)],
        name="gru",
    )


def _two_input(keras):
    l2 = keras.regularizers.L2(1e-3)
    a = keras.Input((12,), name="a")
    b = keras.Input((5,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(16, activation="tanh", kernel_regularizer=l2)(a), b])
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=l2)(h)
    return keras.Model([a, b], keras.layers.Dense(3)(h), name="two_input")


_BUILDERS = {"dense": _dense, "cnn_bn": _cnn_bn, "gru": _gru, "two_input": _two_input}


def build(name: str, keras=None):
    """A new, built instance of the named model.

    Args:
        name: one of ``EQUIVALENCE_MODELS``.
        keras: the Keras module to build with (default ``keras``); ``tf_keras`` builds a Keras 2 model.
    """
    if name not in _BUILDERS:
        raise InvalidValue(f"unknown model {name!r}; choose from {list(_BUILDERS)}")
    return _BUILDERS[name](_module(keras))


def loss(keras=None):
    """The loss these models train with (they output logits for 3 classes), from ``keras`` as ``build``."""
    return _module(keras).losses.SparseCategoricalCrossentropy(from_logits=True)


def _module(keras):
    if keras is None:
        import keras
    return keras


def make_data(name: str, samples: int, seed: int = 0):
    """``(x, y, sample_weight)`` for the named model: 3-class labels a linear rule can learn."""
    if name not in _BUILDERS:
        raise InvalidValue(f"unknown model {name!r}; choose from {list(_BUILDERS)}")
    rng = np.random.default_rng(seed)
    shape_table: dict[str, list[tuple[int, ...]]] = {
        "dense": [(12,)], "cnn_bn": [(8, 8, 1)], "gru": [(6, 4)], "two_input": [(12,), (5,)]
    }
    shapes = shape_table[name]
    xs = [rng.normal(size=(samples, *s)).astype("float32") for s in shapes]
    flat = np.concatenate([x.reshape(samples, -1) for x in xs], axis=1)
    y = np.argmax(flat @ rng.normal(size=(flat.shape[1], 3)), axis=1).astype("int32")
    sample_weight = rng.uniform(0.2, 2.0, size=samples).astype("float32") if name == "two_input" else None
    return (xs if len(xs) > 1 else xs[0]), y, sample_weight
