"""Seed 002's wide MLP: Dense(4000, tanh) on 8000 inputs, then 2000, 500, 300 (relu) and 1.

Seed 002 is kuza55's public ``make_parallel`` post (docs/background.md). Exactly 41,157,101
parameters in ``full`` (the seed's own figure, and a test's):
a model whose step is dominated by a few huge matrix products and whose gradient
all-reduce moves ~165 MB, which the seed found to be the size at which several
GPUs start to pay. ``tiny`` is the same five-layer shape on 256 inputs.

Data: uniform inputs in [0, 1) as the seed's ``np.random.rand``, but labelled by
a fixed random hyperplane through the centre (the seed's labels were coin
flips, which no model can learn), for binary crossentropy on one logit.
"""

from __future__ import annotations

import numpy as np

from harness.bench.workloads import synthetic

NAME = "wide_mlp"
LABELS = synthetic.Labels.BINARY
INPUT_SHAPES = {"full": (8000,), "tiny": (256,)}
OUTPUT_SHAPES = {"full": (1,), "tiny": (1,)}

# Widths of the hidden layers; the first is tanh, the rest relu, as the seed.
_HIDDEN = {"full": (4000, 2000, 500, 300), "tiny": (128, 64, 16, 8)}


def build(size: str, keras):
    """A new, built, uncompiled model for ``size`` whose output is one logit."""
    first, *rest = _HIDDEN[size]
    inputs = keras.Input(INPUT_SHAPES[size])
    h = keras.layers.Dense(first, activation="tanh")(inputs)
    for units in rest:
        h = keras.layers.Dense(units, activation="relu")(h)
    # The seed ends in sigmoid; a logit here, with the loss applying it.
    outputs = keras.layers.Dense(1)(h)
    return keras.Model(inputs, outputs, name=f"{NAME}_{size}")


def loss(keras):
    """Binary crossentropy on a logit, as the seed (which used a sigmoid layer)."""
    return keras.losses.BinaryCrossentropy(from_logits=True)


def optimizer(keras):
    """Adam at learning rate 1e-4, as the seed."""
    return keras.optimizers.Adam(learning_rate=1e-4)


def make_data(size: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: float32 inputs ``(samples, features)`` in [0, 1) and float32 0/1 labels ``(samples, 1)``."""
    rng = synthetic.sample_rng(seed)
    samples = synthetic.check_samples(samples)
    (features,) = INPUT_SHAPES[size]
    normal = synthetic.task_rng(NAME, size).standard_normal(features).astype(np.float32)
    x = rng.random((samples, features), dtype=np.float32)
    y = ((x - 0.5) @ normal > 0).astype(np.float32)
    return x, y[:, None]
