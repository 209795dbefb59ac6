"""Small models built with a given Keras module ``k``, for the tests written once for both generations.

``k`` is what the ``any_keras`` fixture gives: Keras 3's ``keras``, or a Keras 2 module (``tf_keras``,
TF 2.15's ``keras``). Beside ``harness.bench.workloads.small``'s models (which take ``keras=k`` too) these
cover BatchNormalization in several forms, activity regularisers and a weight penalty. Every case
compares with the single-device step on the whole batch, partial last batches included (61 samples at
batch 20: a last batch of 1, smaller than the device count, runs the single-device step; 65: a last
batch of 5 split over 4 devices).
"""

from __future__ import annotations

import numpy as np

import harness
from harness.bench.workloads import small

METHODS = ["towers", "mirrored"]


def is_keras2(k) -> bool:
    """True for a Keras 2 module (what the ``any_keras`` fixture's ``keras2`` param gives)."""
    return int(k.__version__.split(".")[0]) == 2


def dense_l2(k):
    hidden = k.layers.Dense(8, activation="relu", kernel_regularizer=k.regularizers.L2(0.01))
    return k.Sequential([k.Input((6,)), hidden, k.layers.Dense(3)])


def dense_bn(k):
    return k.Sequential([k.Input((6,)), k.layers.Dense(8), k.layers.BatchNormalization(momentum=0.5),
                         k.layers.Activation("relu"), k.layers.Dense(3)])


def conv_bn(k):
    # Rank-4 input: Keras 2's BatchNormalization runs the fused kernel (Bessel-corrected moving variance).
    return k.Sequential([k.Input((6, 6, 2)), k.layers.Conv2D(4, 3), k.layers.BatchNormalization(momentum=0.5),
                         k.layers.Flatten(), k.layers.Dense(3)])


def nested_bn(k):
    inner = k.Sequential([k.Input((8,)), k.layers.Dense(8), k.layers.BatchNormalization(momentum=0.5)])
    x = k.Input((6,))
    return k.Model(x, k.layers.Dense(3)(inner(k.layers.Dense(8)(x))))


def activity(k):
    hidden = k.layers.Dense(8, activation="relu", activity_regularizer=k.regularizers.L2(0.1))
    return k.Sequential([k.Input((6,)), hidden, k.layers.Dense(3, activity_regularizer="l1")])


BUILDERS = {"dense_l2": dense_l2, "dense_bn": dense_bn, "conv_bn": conv_bn, "nested_bn": nested_bn,
            "activity": activity}


def build(k, name: str):
    """A new model ``name`` of ``BUILDERS`` or of ``harness.bench.workloads.small``, built with ``k``."""
    return BUILDERS[name](k) if name in BUILDERS else small.build(name, keras=k)


def data(name: str, n: int = 61):
    """``(x, y)`` for model ``name``: 3 classes; ``small``'s models get ``small.make_data``'s."""
    if name not in BUILDERS:
        x, y, _ = small.make_data(name, n)
        return x, y
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    if name == "conv_bn":
        return (2 * rng.normal(size=(n, 6, 6, 2)) + 1).astype("float32"), y
    return (3 * rng.normal(size=(n, 6)) + 1).astype("float32"), y  # off-centre: BatchNormalization has work


def momentum_sgd(k):
    return k.optimizers.SGD(0.05, momentum=0.5)  # momentum: the optimizer state is compared too


def compare(k, devices, method, name, ratios, n=61, batch_size=20, **kwargs):
    """``harness.compare_training`` of model ``name`` over ``devices[:len(ratios)]``, 2 epochs."""
    x, y = data(name, n)
    options = {"optimizer": lambda: momentum_sgd(k), "metrics": ["accuracy"], **kwargs}
    return harness.compare_training(
        lambda: build(k, name), x, y, devices=devices[: len(ratios)], ratios=ratios, method=method,
        batch_size=batch_size, epochs=2, loss=small.loss(k), **options)


def compare_emulated(k, devices, method, name, n, batch_size, ratios, emulate=None, epochs=2, optimizer=None,
                     callbacks=None):
    """``compare_training`` of model ``name`` parallelised with ``emulate``; returns ``(report, parallel)``."""
    made = []

    def parallelize(template, devs, ratios):  # compare_training's hook for options it does not pass on
        made.append(harness.parallelize(template, devs, ratios=ratios, method=method, emulate=emulate))
        return made[0]

    x, y = data(name, n)
    report = harness.compare_training(
        lambda: build(k, name), x, y, devices=devices, ratios=ratios, method=parallelize, batch_size=batch_size,
        epochs=epochs, optimizer=optimizer or (lambda: momentum_sgd(k)), loss=small.loss(k), callbacks=callbacks)
    return report, made[0]


def assert_exact(report, steps=8):
    """The same weights, optimizer state, epoch losses and accuracy as one device, within 1e-6."""
    assert report.steps == steps
    assert report.max_deviation <= 1e-6, report.table()
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)
    if "accuracy" in report.metrics_single:
        np.testing.assert_allclose(report.metrics_parallel["accuracy"], report.metrics_single["accuracy"], atol=1e-6)


def fixed_loss_scale(k, optimizer, scale=1024):
    """``optimizer`` in a LossScaleOptimizer whose scale stays ``scale``.

    Keras 2: ``dynamic=False``. Keras 3 has no fixed scale: it halves the scale on a non-finite
    gradient and grows it after ``dynamic_growth_steps`` finite ones; these tests take far fewer steps
    and their small models do not overflow at 1024, so the scale stays.
    """
    if is_keras2(k):
        return k.mixed_precision.LossScaleOptimizer(optimizer, dynamic=False, initial_scale=scale)
    return k.optimizers.LossScaleOptimizer(optimizer, initial_scale=scale, dynamic_growth_steps=10**6)
