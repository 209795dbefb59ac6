"""Keras 3 on JAX: one training step of harness' towers (even and ratio splits) beside Keras' own DataParallel.

The model is the one the JAX step-cost goal is set on (docs/jax.md): a 64-W-W-10 MLP under Adam, width 256 and
batch 384, on 3 JAX CPU devices of this host (``--xla_force_host_platform_device_count``), so ``towers-even`` over
``dataparallel`` is the step-cost ratio the goal names, and ``single`` over ``keras`` harness' cost on one device.
The devices share the host's cores: these are dispatch and overhead figures, not speed-ups.

Each benchmark process (asv's ``launch_method`` is ``spawn``: a fresh interpreter each) sets ``KERAS_BACKEND=jax``
and the device count before it imports JAX or Keras, and imports no TensorFlow. Where JAX is not installed (the asv
environments of asv.conf.json install ``[bench]``, not ``[jax]``), or Keras was already imported on another backend,
``setup`` raises ``NotImplementedError`` and asv shows ``n/a``. On a commit before Keras' DataParallel rows (0ec19cc)
the configurations still run: nothing here imports harness' JAX benchmark code.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from . import common

GRID = common.current_grid()
DEVICES = 3
WIDTH, BATCH = 256, 384
# configuration: (what trains, the split of the batch over the devices)
CONFIGURATIONS = {
    "keras": ("plain Keras on the first device", None),
    "single": ("harness on the first device", None),
    "dataparallel": ("keras.distribution.DataParallel, even shards", None),
    "towers-even": ("harness towers", (1, 1, 1)),
    "towers-ratio": ("harness towers", (5, 3, 2)),
}


def _start_jax() -> None:
    """``KERAS_BACKEND=jax`` and 3 CPU devices, before JAX and Keras start; NotImplementedError where they cannot."""
    if importlib.util.find_spec("jax") is None:
        raise NotImplementedError("JAX is not installed here (harness' [jax] extra)")
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != "jax":
        raise NotImplementedError(f"Keras already runs on {keras.backend.backend()} in this process")
    if "jax" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "jax"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip()


class JaxTrainStep:
    """Wall time of one ``train_on_batch`` of the MLP on a prepared batch (it returns NumPy: the host waits)."""

    params = [list(CONFIGURATIONS)]
    param_names = ["configuration"]
    number = 1
    repeat = GRID.repeat
    rounds = GRID.rounds
    warmup_time = 0  # setup ran the warm-up steps
    timeout = GRID.timeout

    def setup(self, configuration):
        _start_jax()
        import jax
        import keras
        import numpy as np

        devices = jax.devices("cpu")
        if len(devices) < DEVICES:
            raise NotImplementedError(f"JAX started with {len(devices)} CPU device(s) before this benchmark; it "
                                      f"needs {DEVICES}")
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((BATCH, 64)).astype("float32")
        self.y = rng.integers(0, 10, BATCH)
        # No keras.utils.set_random_seed: it imports TensorFlow where installed; the weights' values do not change a
        # step's time.
        if configuration == "dataparallel":
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices[:DEVICES]))
        layers = keras.layers
        model = keras.Sequential([keras.Input((64,)), layers.Dense(WIDTH, activation="relu"),
                                  layers.Dense(WIDTH, activation="relu"), layers.Dense(10)])
        if configuration in ("single", "towers-even", "towers-ratio"):
            import harness

            ratios = CONFIGURATIONS[configuration][1]
            model = harness.parallelize(model, devices[:DEVICES] if ratios else devices[:1],
                                        ratios=list(ratios) if ratios else None, method="towers")
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(5):  # traced and warm
            model.train_on_batch(self.x, self.y)
        self.model = model

    def time_train_step(self, configuration):
        self.model.train_on_batch(self.x, self.y)

    def teardown(self, configuration):
        if configuration == "dataparallel":
            import keras

            keras.distribution.set_distribution(None)
