"""Metrics across replicas are whole-batch means, not sums or one replica's value.

Guards: keras-team/keras#21054 (stateful metrics aggregated wrongly under a distribution
strategy), #21467 (metrics going NaN under MirroredStrategy), #15509 (loss reported from the first
replica only), LucaCappelletti94/extra_keras_metrics#11 (accuracy above 1 from summed replicas).
On Keras 3 and Keras 2 models (the ``any_keras`` fixture; Keras 2 where installed).
"""

import numpy as np
import pytest

import harness
from harness.bench.workloads import small


def _count_samples(k):
    """A metric of Keras module ``k`` that counts the samples it sees: a sum over replicas must equal the
    global batch, no more."""

    class CountSamples(k.metrics.Metric):
        def __init__(self, name="count", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_weight(name="total", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            import tensorflow as tf  # both generations on TensorFlow (Keras 2 has no keras.ops)

            self.total.assign_add(tf.cast(tf.shape(y_pred)[0], "float32"))

        def result(self):
            return self.total

        def reset_state(self):
            self.total.assign(0.0)

    return CountSamples()


def _compiled(k, model):
    model.compile(optimizer="sgd", loss=small.loss(k),
                  metrics=["accuracy", k.metrics.SparseCategoricalCrossentropy(from_logits=True), _count_samples(k)])
    return model


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_evaluate_reports_whole_batch_means_and_counts_every_sample_once(logical_devices, any_keras, method):
    k = any_keras
    x, y, _ = small.make_data("dense", 50)
    template = small.build("dense", keras=k)
    single = _compiled(k, small.build("dense", keras=k))
    single.set_weights(template.get_weights())
    parallel = _compiled(k, harness.parallelize(template, logical_devices[:4], ratios=[4, 3, 2, 1], method=method))
    want = single.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    got = parallel.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert got["count"] == pytest.approx(50.0)  # not 4 x 50, not 50 / 4
    assert 0.0 <= got["accuracy"] <= 1.0
    for key in ("loss", "accuracy", "sparse_categorical_crossentropy"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_fit_history_metrics_equal_the_single_device_run(logical_devices, any_keras, method):
    k = any_keras
    x, y, _ = small.make_data("dense", 50)
    report = harness.compare_training(
        lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:3], ratios=[3, 2, 1], method=method,
        batch_size=16, epochs=2, optimizer="sgd", loss=small.loss(k), metrics=["accuracy", _count_samples(k)])
    assert report.metrics_parallel["count"] == pytest.approx(report.metrics_single["count"])
    assert report.metrics_single["count"] == pytest.approx([50.0, 50.0])  # each sample once per epoch
    np.testing.assert_allclose(report.metrics_parallel["accuracy"], report.metrics_single["accuracy"], atol=1e-6)
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)
