"""Seed 000's "GPU maxing" MNIST model: far more layers than MNIST needs, to keep a GPU busy.

Seed 000 is the public ratio-split repository this project started from (docs/background.md).
``full`` is the seed's graph layer for layer (convolutions of 32-256 filters at
28x28, four of 512 at 14x14, five Dense(2048) and a Dense(1024); 78,923,530
parameters), about 4 GFLOP forward and 12 GFLOP per training sample: at batch
~1024 it keeps a GPU busy. The seed's 1080 / 1080 Ti figures (875 and 1345
samples/s) were measured on this model. ``tiny`` keeps the shape (conv stack,
pool, conv stack, pool, Dense stack) at CPU scale.

Data: 28x28x1 images in [0, 1], each a fixed low-resolution class template plus
noise ("digits" a model can learn), with one-hot labels: the seed trains with
Adam and categorical crossentropy on one-hot targets.
"""

from __future__ import annotations

import numpy as np

from harness.bench.workloads import synthetic

NAME = "mnist_maxing"
LABELS = synthetic.Labels.ONE_HOT
CLASSES = 10
INPUT_SHAPES = {"full": (28, 28, 1), "tiny": (28, 28, 1)}
OUTPUT_SHAPES = {"full": (CLASSES,), "tiny": (CLASSES,)}

# (filters of the convolutions before the first pool, after it, Dense widths)
_LAYERS = {
    "full": ((32, 64, 128, 256), (512, 512, 512, 512), (2048, 2048, 2048, 2048, 2048, 1024)),
    "tiny": ((4,), (8, 8, 8), (32, 32, 32)),  # 10-16 ms a step at batch 256 on 2 CPU cores
}
_BLOCK = 4  # 7x7 templates upsampled to 28x28
_NOISE = 0.3


def build(size: str, keras):
    """A new, built, uncompiled model for ``size`` whose output is 10 logits."""
    first, second, dense = _LAYERS[size]
    inputs = keras.Input(INPUT_SHAPES[size])
    h = inputs
    for filters in first:
        h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    for filters in second:
        h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    for units in dense:
        h = keras.layers.Dense(units, activation="relu")(h)
    # The seed ends in softmax; logits here, with the loss applying it (from_logits=True).
    outputs = keras.layers.Dense(CLASSES)(h)
    return keras.Model(inputs, outputs, name=f"{NAME}_{size}")


def loss(keras):
    """Categorical crossentropy on logits, as the seed (which used a softmax layer)."""
    return keras.losses.CategoricalCrossentropy(from_logits=True)


def optimizer(keras):
    """Adam with Keras' defaults, as the seed."""
    return keras.optimizers.Adam()


def make_data(size: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: float32 images ``(samples, 28, 28, 1)`` and one-hot float32 labels ``(samples, 10)``."""
    rng = synthetic.sample_rng(seed)
    samples = synthetic.check_samples(samples)
    templates = synthetic.low_res_templates(synthetic.task_rng(NAME, size), CLASSES, INPUT_SHAPES[size], _BLOCK)
    labels = rng.integers(0, CLASSES, size=samples)
    x = synthetic.upsample(templates[labels], _BLOCK)
    x += _NOISE * rng.standard_normal(x.shape, dtype=np.float32)
    np.clip(x, 0.0, 1.0, out=x)
    return x, synthetic.one_hot(labels, CLASSES)
