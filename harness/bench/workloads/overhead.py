"""Three small models whose step is mostly overhead: where a parallel method's fixed costs show.

These models measure the mirrored method, stock ``MirroredStrategy`` fit and towers
on these shapes (2 logical CPUs, batch 256): an MLP with a small head, the same
MLP with a wide head (a large gradient to sum), and a per-timestep tagger
whose predictions are as large as its inputs (what a whole-batch gather moves).
Each is sparse classification on logits; ``full`` and ``tiny`` are the same
model (they are CPU-sized already).

Data: normal inputs labelled by a fixed random linear teacher (argmax over the
classes, per timestep for the tagger): learnable by the first layer alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.bench.workloads import synthetic

LABELS = synthetic.Labels.SPARSE


@dataclass(frozen=True)
class Variant:
    """One overhead model: ``Workload`` reads the same names from it as from a workload module."""

    name: str
    input_shape: tuple[int, ...]
    hidden: tuple[int, ...]
    classes: int
    LABELS = LABELS

    @property
    def INPUT_SHAPES(self) -> dict:  # noqa: N802  (the workload module interface)
        return {"full": self.input_shape, "tiny": self.input_shape}

    @property
    def OUTPUT_SHAPES(self) -> dict:  # noqa: N802
        return {size: (*shape[:-1], self.classes) for size, shape in self.INPUT_SHAPES.items()}

    def build(self, size: str, keras):
        """A new, built, uncompiled model whose outputs are logits (per timestep for a sequence input)."""
        inputs = keras.Input(self.INPUT_SHAPES[size])
        h = inputs
        for units in self.hidden:
            h = keras.layers.Dense(units, activation="relu")(h)
        return keras.Model(inputs, keras.layers.Dense(self.classes)(h), name=f"{self.name}_{size}")

    def loss(self, keras):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def optimizer(self, keras):
        return keras.optimizers.Adam(learning_rate=1e-3)

    def make_data(self, size: str, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)``: float32 normal inputs and int32 class labels (one per timestep for a sequence)."""
        rng = synthetic.sample_rng(seed)
        samples = synthetic.check_samples(samples)
        shape = self.INPUT_SHAPES[size]
        teacher = synthetic.task_rng(self.name, size).standard_normal((shape[-1], self.classes)).astype(np.float32)
        x = rng.standard_normal((samples, *shape), dtype=np.float32)
        return x, np.argmax(x @ teacher, axis=-1).astype(np.int32)


mlp_head10 = Variant("mlp_head10", (64,), (512, 512), 10)
mlp_head8192 = Variant("mlp_head8192", (64,), (512, 512), 8192)
tagger1024 = Variant("tagger1024", (32, 32), (128,), 1024)
