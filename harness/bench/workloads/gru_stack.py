"""Seed 001's recurrent model: four stacked GRU(512) and a Dense(128), predicting the next note.

Seed 001 is a public write-up of this model running slower on two GPUs (docs/background.md).
The seed trains on melodies: 50-note windows of MIDI pitches, one-hot over 128,
the first 49 as input and the 50th as a one-hot target, with Adam and
categorical crossentropy. It reported multi-GPU runs *slower* than one GPU for
this model: recurrent steps are many small sequential kernels, the opposite of
seed 000's model, which is why the harness keeps both.

``full`` is the seed's model on the seed's shapes (49 steps x 128 features);
``tiny`` is four GRU(16) on 8 steps, with the same 128-way output.

Data: walks on a fixed random Markov chain over the 128 notes (each note has a
few likely successors), so the next note is learnable from the last one.
"""

from __future__ import annotations

import numpy as np

from harness.bench.workloads import synthetic

NAME = "gru_stack"
LABELS = synthetic.Labels.ONE_HOT
NOTES = 128
INPUT_SHAPES = {"full": (49, NOTES), "tiny": (8, NOTES)}
OUTPUT_SHAPES = {"full": (NOTES,), "tiny": (NOTES,)}

_UNITS = {"full": (512, 512, 512, 512), "tiny": (16, 16, 16, 16)}
_SUCCESSORS = 4


def build(size: str, keras):
    """A new, built, uncompiled model for ``size`` whose output is 128 logits."""
    units = _UNITS[size]
    inputs = keras.Input(INPUT_SHAPES[size])
    h = inputs
    for i, n in enumerate(units):
        h = keras.layers.GRU(n, return_sequences=i < len(units) - 1)(h)
    # The seed ends in Dense(128, softmax); logits here, with the loss applying it.
    outputs = keras.layers.Dense(NOTES)(h)
    return keras.Model(inputs, outputs, name=f"{NAME}_{size}")


def loss(keras):
    """Categorical crossentropy on logits, as the seed (which used a softmax layer)."""
    return keras.losses.CategoricalCrossentropy(from_logits=True)


def optimizer(keras):
    """Adam with Keras' defaults, as the seed."""
    return keras.optimizers.Adam()


def make_data(size: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: one-hot float32 sequences ``(samples, steps, 128)`` and one-hot next notes ``(samples, 128)``."""
    rng = synthetic.sample_rng(seed)
    samples = synthetic.check_samples(samples)
    chain = synthetic.markov_chain(synthetic.task_rng(NAME, size), NOTES, _SUCCESSORS)
    steps = INPUT_SHAPES[size][0]
    notes = synthetic.walk(rng, chain, samples, steps + 1)
    return synthetic.one_hot(notes[:, :-1], NOTES), synthetic.one_hot(notes[:, -1], NOTES)
