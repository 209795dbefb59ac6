"""Partial, tiny and unevenly split batches: finite, exact, independent of the replica count.

Guards: BatchNormalization turning weights NaN when the last batch does not fill every replica
(keras-team/keras#11858, tensorflow/tensorflow#24320 with multi_gpu_model); empty replica slices
injecting NaN into the loss (tensorflow/tensorflow#41657, #36224); seed 002's uneven split.
On Keras 3 and Keras 2 models (the ``any_keras`` fixture; Keras 2 where installed).
"""

import numpy as np
import pytest

import harness
from harness.workloads import small

METHODS = ["towers", "mirrored"]


@pytest.mark.parametrize("method", METHODS)
def test_partial_last_batch_with_batchnorm_stays_finite_and_exact(logical_devices, any_keras, method):
    # keras-team/keras#11858: 41 samples at batch 20 end on a batch of 1 over 4 replicas, so three
    # replicas get an empty slice; their BatchNorm statistics must not reach the moving averages.
    k = any_keras
    x, y, _ = small.make_data("cnn_bn", 41)
    report = harness.assert_equivalent(
        lambda: small.build("cnn_bn", keras=k), x, y, devices=logical_devices[:4], ratios=[4, 3, 2, 1],
        method=method, batch_size=20, epochs=2, optimizer="sgd", loss=small.loss(k), tol=1e-6)
    assert all(np.isfinite(report.loss_parallel))
    assert all(np.isfinite(d.max_abs_diff) for d in report.diffs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model", ["dense", "cnn_bn"])
def test_last_batch_smaller_than_the_device_count(logical_devices, any_keras, method, model):
    # tensorflow/tensorflow#41657: a final batch of 2 samples over 4 devices (even split).
    k = any_keras
    x, y, _ = small.make_data(model, 14)
    harness.assert_equivalent(
        lambda: small.build(model, keras=k), x, y, devices=logical_devices[:4], method=method,
        batch_size=12, epochs=1, optimizer="sgd", loss=small.loss(k), tol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_replica_count_does_not_change_the_step(logical_devices, any_keras, method):
    # The same global batch on 1, 2, 3 and 4 replicas gives the same weights; the model carries an
    # L2 regulariser (added once per step, not once per replica) and sample weights.
    k = any_keras
    x, y, sample_weight = small.make_data("two_input", 48)
    deviations = {}
    for replicas in (1, 2, 3, 4):
        report = harness.compare_training(
            lambda: small.build("two_input", keras=k), x, y, devices=logical_devices[:replicas],
            method=method, batch_size=24, epochs=2, optimizer="sgd", loss=small.loss(k), sample_weight=sample_weight)
        deviations[replicas] = report.max_deviation
    assert max(deviations.values()) <= 1e-6, deviations


def test_batchnorm_moving_statistics_stay_finite_over_hundreds_of_uneven_steps(logical_devices, any_keras):
    # tensorflow/tensorflow#87432 (NaN loss after tens of distributed steps), #41657 (empty
    # replicas): 300 steps under MirroredStrategy, 4 replicas at 5:3:2:1, batch 7 (replicas often
    # get 0 samples), last batch of 5.
    k = any_keras
    x, y, _ = small.make_data("cnn_bn", 103)
    report = harness.compare_training(
        lambda: small.build("cnn_bn", keras=k), x, y, devices=logical_devices[:4], ratios=[5, 3, 2, 1],
        method="mirrored", batch_size=7, epochs=20, optimizer="sgd", loss=small.loss(k))
    assert report.steps == 300
    assert all(np.isfinite(report.loss_parallel)) and all(np.isfinite(report.loss_single))
    assert report.max_deviation <= 1e-4, report.worst(5)
