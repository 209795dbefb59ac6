"""Mirrored replicas compute their own rows' loss where it decomposes, and gather where it does not.

Gathering every replica's predictions into the whole batch costs an
all-reduce of the whole batch's outputs per replica; a Keras built-in loss
reduced over its values is instead computed per slice and weighted n_i/N. The
choice is made per model (``Mirrored.gather_reason``); a loss that mixes the
samples of a batch must keep the gather, or training drifts (the bad case).
"""

import numpy as np
import pytest

import harness
from harness import assert_equivalent


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x[:, :3] @ rng.normal(size=(3, 3))).astype("float32")


def _dense(k):
    def build():
        k.utils.set_random_seed(0)
        return k.Sequential([k.Input((6,)), k.layers.Dense(16, activation="tanh"), k.layers.Dense(3)])
    return build


def _centred_error(y_true, y_pred):
    """Mixes the samples of a batch: each prediction is compared after removing the batch's mean."""
    import tensorflow as tf

    centred = y_pred - tf.reduce_mean(y_pred, axis=0, keepdims=True)
    return tf.reduce_mean(tf.square(y_true - centred), axis=-1)


def _reason(k, devices, loss):
    parallel = harness.parallelize(_dense(k)(), devices[:2], ratios=[3, 1], method="mirrored")
    parallel.compile(optimizer="sgd", loss=loss)
    return parallel.gather_reason


def test_built_in_losses_decompose_custom_ones_gather(logical_devices, any_keras):
    k = any_keras
    assert _reason(k, logical_devices, "mse") is None
    assert _reason(k, logical_devices, k.losses.MeanAbsoluteError()) is None
    assert "not a Keras built-in" in _reason(k, logical_devices, _centred_error)
    assert "ignores a class" in _reason(k, logical_devices, k.losses.SparseCategoricalCrossentropy(ignore_class=0))


@pytest.mark.keras2_extended  # Keras 2's gather
@pytest.mark.covered_by("tests/parallel/test_local_loss.py::test_a_loss_mixing_samples_needs_the_gather[keras2]")
def test_a_masked_output_gathers(logical_devices, any_keras):
    k = any_keras
    k.utils.set_random_seed(0)
    model = k.Sequential([k.Input((5,)), k.layers.Embedding(9, 4, mask_zero=True),
                          k.layers.LSTM(4, return_sequences=True), k.layers.Dense(2)])
    parallel = harness.parallelize(model, logical_devices[:2], ratios=[3, 1], method="mirrored")
    parallel.compile(optimizer="sgd", loss="mse")
    assert parallel.gather_reason is None  # the loss alone decomposes; the mask is seen in the step
    x = np.random.default_rng(0).integers(0, 9, size=(16, 5))
    parallel.fit(x, np.zeros((16, 5, 2), "float32"), batch_size=8, verbose=0)
    assert "mask" in parallel.gather_reason


@pytest.mark.parametrize("case", ["sample_weight", "class_weight"])
def test_the_local_loss_is_exact_with_weights(logical_devices, any_keras, case):
    k = any_keras
    x, y = _data()
    rng = np.random.default_rng(1)
    if case == "sample_weight":
        kwargs = {"sample_weight": rng.uniform(0.1, 3.0, size=len(x)).astype("float32")}
        loss = "mse"
    else:
        y = rng.integers(0, 3, size=len(x))
        kwargs = {"class_weight": {0: 0.5, 1: 2.0, 2: 1.0}}
        loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert_equivalent(_dense(k), x, y, devices=logical_devices[:3], ratios=[5, 2, 1], loss=loss, batch_size=28,
                      epochs=2, optimizer="adam", **kwargs)


def test_a_loss_mixing_samples_needs_the_gather(logical_devices, any_keras, monkeypatch):
    k = any_keras
    x, y = _data()
    run = dict(devices=logical_devices[:2], ratios=[3, 1], loss=_centred_error, batch_size=32, epochs=2)
    assert_equivalent(_dense(k), x, y, **run)  # gathered: exact
    # The bad case: the same loss taken per slice, as if it decomposed.
    from harness.parallel.adapters.base import Adapter

    monkeypatch.setattr(Adapter, "loss_gather_reason", lambda self, model: None)
    with pytest.raises(AssertionError):
        assert_equivalent(_dense(k), x, y, **run)
