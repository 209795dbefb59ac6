"""The regression suite on Keras 2 models: tf_keras (with or without TF_USE_LEGACY_KERAS=1), TF 2.15's keras.

The same guards as the Keras 3 files beside this one, each naming what it guards, run on models
built with the environment's Keras 2 module (the plugin's `keras2` fixture: the dev env's tf-keras,
the matrix's `legacy` and `tf215` envs); skipped, with that reason, where there is none. Guards:
TF 2.16 swapping tf.keras from Keras 2 to Keras 3, and seed 001's version sensitivity ("it worked
on 1.9, crashed on 1.10"). The step watchdog's Keras 2 case is in test_watchdog.py.
"""

import numpy as np
import pytest

import harness
from harness.workloads import small

METHODS = ["towers", "mirrored"]


@pytest.fixture(scope="module")
def k(keras2):
    return keras2


def _build(k, name):
    return lambda: small.build(name, keras=k)


@pytest.mark.parametrize("method", METHODS)
def test_partial_last_batch_with_batchnorm_stays_finite_and_exact(logical_devices, k, method):
    # keras-team/keras#11858, tensorflow/tensorflow#24320: 41 samples at batch 20 end on a batch of 1
    # over 4 replicas at 4:3:2:1; the BatchNorm moving averages must stay those of one device.
    x, y, _ = small.make_data("cnn_bn", 41)
    report = harness.assert_equivalent(
        _build(k, "cnn_bn"), x, y, devices=logical_devices[:4], ratios=[4, 3, 2, 1], method=method,
        batch_size=20, epochs=2, optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k), tol=1e-6)
    assert all(np.isfinite(report.loss_parallel))
    assert all(np.isfinite(d.max_abs_diff) for d in report.diffs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model", ["dense", "cnn_bn"])
def test_last_batch_smaller_than_the_device_count(logical_devices, k, method, model):
    # tensorflow/tensorflow#41657: a final batch of 2 samples over 4 devices (even split).
    x, y, _ = small.make_data(model, 14)
    harness.assert_equivalent(
        _build(k, model), x, y, devices=logical_devices[:4], method=method, batch_size=12, epochs=1,
        optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k), tol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_replica_count_does_not_change_the_step(logical_devices, k, method):
    # 1, 2, 3 and 4 replicas at one global batch; L2 penalties (once per step) and sample weights.
    x, y, sample_weight = small.make_data("two_input", 48)
    deviations = {}
    for replicas in (1, 2, 3, 4):
        report = harness.compare_training(
            _build(k, "two_input"), x, y, devices=logical_devices[:replicas], method=method, batch_size=24,
            epochs=2, optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k), sample_weight=sample_weight)
        deviations[replicas] = report.max_deviation
    assert max(deviations.values()) <= 1e-6, deviations


def test_no_nan_over_hundreds_of_uneven_mirrored_steps(logical_devices, k):
    # tensorflow/tensorflow#87432, #41657: 300 MirroredStrategy steps at 5:3:2:1, batch 7 (replicas
    # often get no sample), BatchNorm throughout.
    x, y, _ = small.make_data("cnn_bn", 103)
    report = harness.compare_training(
        _build(k, "cnn_bn"), x, y, devices=logical_devices[:4], ratios=[5, 3, 2, 1], method="mirrored",
        batch_size=7, epochs=20, optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k))
    assert report.steps == 300
    assert all(np.isfinite(report.loss_parallel)) and all(np.isfinite(report.loss_single))
    assert report.max_deviation <= 1e-4, report.worst(5)


@pytest.mark.parametrize("method", METHODS)
def test_save_then_load_gives_the_single_device_model(logical_devices, k, tmp_path, method):
    # keras-team/keras#9548, #8764, #8123: a parallel model that cannot be saved or loaded.
    x, y, _ = small.make_data("cnn_bn", 40)
    template = small.build("cnn_bn", keras=k)
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[3, 2, 1], method=method)
    parallel.compile(optimizer="sgd", loss=small.loss(k))
    checkpoint = k.callbacks.ModelCheckpoint(str(tmp_path / "epoch{epoch}.keras"))
    parallel.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[checkpoint])
    for path in (tmp_path / "epoch2.keras", tmp_path / "model.keras"):
        if not path.exists():
            parallel.save(path)
        loaded = k.models.load_model(path, compile=False)
        assert [w.shape for w in loaded.weights] == [w.shape for w in template.weights]
        np.testing.assert_allclose(loaded.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-5)


def _count_samples(k):
    class CountSamples(k.metrics.Metric):
        """Counts the samples it sees: summed over replicas it must equal the global batch."""

        def __init__(self, name="count", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_weight(name="total", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            import tensorflow as tf

            self.total.assign_add(tf.cast(tf.shape(y_pred)[0], "float32"))

        def result(self):
            return self.total

        def reset_state(self):
            self.total.assign(0.0)

    return CountSamples()


@pytest.mark.parametrize("method", METHODS)
def test_metrics_are_whole_batch_means_and_count_each_sample_once(logical_devices, k, method):
    # keras-team/keras#21054, #21467, #15509: metrics summed over replicas, or one replica's value.
    x, y, _ = small.make_data("dense", 50)
    report = harness.compare_training(
        _build(k, "dense"), x, y, devices=logical_devices[:4], ratios=[4, 3, 2, 1], method=method,
        batch_size=16, epochs=2, optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k),
        metrics=["accuracy", _count_samples(k)])
    assert report.metrics_single["count"] == pytest.approx([50.0, 50.0])
    assert report.metrics_parallel["count"] == pytest.approx([50.0, 50.0])  # not 4 x 50
    np.testing.assert_allclose(report.metrics_parallel["accuracy"], report.metrics_single["accuracy"], atol=1e-6)
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)


def _sequence_data(samples=384, steps=8, seed=3):
    rng = np.random.default_rng(seed)  # the class is the sign of feature 0's sum over the steps
    x = rng.normal(size=(samples, steps, 3)).astype("float32")
    return x, (x[:, :, 0].sum(axis=1) > 0).astype("int32")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_recurrent_stack_reaches_the_single_device_accuracy(logical_devices, k, method, cell):
    # seed 001: a GRU stack's accuracy halved on 2 GPUs (0.51 -> 0.21) with Keras 2's multi_gpu_model.
    layer = getattr(k.layers, cell)
    x, y = _sequence_data()
    report = harness.compare_training(
        lambda: k.Sequential([k.Input((8, 3)), layer(16, return_sequences=True), layer(16), k.layers.Dense(2)]),
        x, y, devices=logical_devices[:2], ratios=[3, 2], method=method, batch_size=32, epochs=4,
        optimizer=lambda: k.optimizers.Adam(0.01),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    single, parallel = report.metrics_single["accuracy"][-1], report.metrics_parallel["accuracy"][-1]
    assert single > 0.8, f"the task is not learnt even on one device (accuracy {single:.3f})"
    assert parallel == pytest.approx(single, abs=0.01)
    assert report.max_deviation <= 1e-4, report.worst(5)


@pytest.mark.parametrize("method", METHODS)
def test_jit_compile_off_is_exact_and_on_is_refused(logical_devices, k, method):
    # keras-team/keras#19005, #18145, #20763: XLA and the split step; Keras 2 has no "auto".
    x, y, _ = small.make_data("dense", 37)
    harness.assert_equivalent(
        _build(k, "dense"), x, y, devices=logical_devices[:2], ratios=[3, 2], method=method, batch_size=16,
        epochs=2, optimizer=lambda: k.optimizers.SGD(0.01), loss=small.loss(k), tol=1e-6, jit_compile=False)
    parallel = harness.parallelize(small.build("dense", keras=k), logical_devices[:2], ratios=[3, 2], method=method)
    with pytest.raises(ValueError, match="cannot be compiled with jit_compile=True: the ratio split's sizes"):
        parallel.compile(optimizer="sgd", loss=small.loss(k), jit_compile=True)
