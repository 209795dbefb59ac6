"""GRU and LSTM stacks learn as well in parallel as on one device.

Guards: seed 001 (docs/background.md; a 4 x GRU(512) model's accuracy halved on 2 GPUs with
multi_gpu_model: 0.51 -> 0.21 at batch 128); recurrent state or masks split wrongly across
replicas. On Keras 3 and Keras 2 models (the ``any_keras`` fixture; Keras 2 where installed).
"""

import numpy as np
import pytest

import harness
from harness.bench.workloads import small


def _data(samples=384, steps=8, seed=3):
    # learnable: the class is the sign of the running sum of feature 0 at the last step
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, steps, 3)).astype("float32")
    y = (x[:, :, 0].sum(axis=1) > 0).astype("int32")
    return x, y


def _stack(k, cell):
    layer = getattr(k.layers, cell)

    def build():
        return k.Sequential([k.Input((8, 3)), layer(16, return_sequences=True), layer(16), k.layers.Dense(2)])
    return build


@pytest.mark.keras2_extended  # Keras 2's recurrent stacks: 10-23 s a case
@pytest.mark.covered_by("tests/upstream/test_recurrent.py::test_a_keras2_gru_steps_as_one_device")
@pytest.mark.parametrize("method", ["towers", "mirrored"])
@pytest.mark.parametrize("cell", [pytest.param("GRU", id="gru", marks=[  # Keras 3's GRU: the equivalence grid's
    pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_equivalence.py::test_parallel_step_equals_single_device[keras3-towers-5:3:2-gru]",
        "tests/parallel/test_equivalence.py::test_parallel_step_equals_single_device[keras3-mirrored-5:3:2-gru]")]),
                                  pytest.param("LSTM", id="lstm")])
def test_recurrent_stack_reaches_the_single_device_accuracy(logical_devices, any_keras, method, cell):
    k = any_keras
    x, y = _data()
    report = harness.compare_training(
        _stack(k, cell), x, y, devices=logical_devices[:2], ratios=[3, 2], method=method, batch_size=32, epochs=4,
        optimizer=lambda: k.optimizers.Adam(0.01),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    single, parallel = report.metrics_single["accuracy"][-1], report.metrics_parallel["accuracy"][-1]
    assert single > 0.8, f"the task is not learnt even on one device (accuracy {single:.3f})"
    assert parallel == pytest.approx(single, abs=0.01)
    assert report.max_deviation <= 1e-4, report.worst(5)


def test_a_keras2_gru_steps_as_one_device(logical_devices, keras2):
    """Keras 2's recurrent path in the quick loop (on Keras 2 the stacks above and the equivalence grid's GRU cases
    are extended): the grid's GRU model at 3:2, towers, a whole batch and a partial one, exact to one device."""
    k = keras2
    x, y, _ = small.make_data("gru", 25)
    harness.assert_equivalent(lambda: small.build("gru", keras=k), x, y, devices=logical_devices[:2], ratios=[3, 2],
                              method="towers", batch_size=20, optimizer=lambda: k.optimizers.SGD(0.1, momentum=0.5),
                              loss=small.loss(k), tol=1e-6)
