"""The exactness contract: a parallel step equals the single-device step on the whole batch.

Matrix: methods x {even, 3:2, 1:3, 5:3:2} x {Dense, CNN with BN, GRU, two-input with
sample weights and L2}. 61 samples at batch 20 end on a batch of 1, smaller than the
device count, so every case also covers the partial last batch.
"""

import keras
import pytest

import harness
from harness.parallel.rebalance import Rebalance
from harness.workloads import small

LOSS = small.loss()

SPLITS = {"even": [1, 1, 1], "3:2": [3, 2], "1:3": [1, 3], "5:3:2": [5, 3, 2]}


def _momentum_sgd():
    return keras.optimizers.SGD(learning_rate=0.01, momentum=0.5)  # optimizer state is compared too


@pytest.mark.parametrize("model", small.EQUIVALENCE_MODELS)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_parallel_step_equals_single_device(logical_devices, method, split, model):
    ratios = SPLITS[split]
    x, y, sample_weight = small.make_data(model, 61)
    report = harness.assert_equivalent(
        lambda: small.build(model), x, y, devices=logical_devices[: len(ratios)], ratios=ratios, method=method,
        batch_size=20, epochs=2, optimizer=_momentum_sgd, loss=LOSS,
        metrics=["accuracy"], sample_weight=sample_weight, tol=1e-6,
    )
    assert report.steps == 8
    assert report.metrics_parallel["accuracy"] == pytest.approx(report.metrics_single["accuracy"], abs=1e-6)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_batchnorm_moving_averages_are_whole_batch(logical_devices, method):
    x, y, _ = small.make_data("cnn_bn", 40)
    report = harness.assert_equivalent(
        lambda: small.build("cnn_bn"), x, y, devices=logical_devices[:2], ratios=[1, 3], method=method,
        batch_size=40, optimizer="sgd", loss=LOSS,
    )
    moving = [d for d in report.diffs if "moving" in d.name]
    assert moving and max(d.deviation for d in moving) < 1e-6


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_per_device_batchnorm_is_not_exact(logical_devices, method):
    # The guard must see the difference when statistics stay per device.
    x, y, _ = small.make_data("cnn_bn", 40)
    with pytest.raises(AssertionError, match="moving_"):
        harness.assert_equivalent(
            lambda: small.build("cnn_bn"), x, y, devices=logical_devices[:2], ratios=[1, 3], method=method,
            batch_size=40, optimizer="sgd", loss=LOSS, sync_batchnorm=False,
        )


class _Resplit(keras.callbacks.Callback):
    """Sets the next ratios of ``schedule`` before every step (a rebalancer that re-splits at will)."""

    def __init__(self, schedule):
        super().__init__()
        self.schedule, self.step, self.seen = schedule, 0, []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(self.model.set_ratios(self.schedule[self.step % len(self.schedule)]))
        self.step += 1


@pytest.mark.parametrize("model", ["dense", "cnn_bn"])
@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_changing_ratios_mid_training_stays_exact(logical_devices, method, model):
    # Issue 4 (Rebalance): a re-split between steps must leave every step the single-device step.
    x, y, sample_weight = small.make_data(model, 61)
    resplit = _Resplit([[5, 3, 2], [1, 1, 8], [1, 3, 1], [1000, 1, 1]])
    report = harness.assert_equivalent(
        lambda: small.build(model), x, y, devices=logical_devices[:3], ratios=[1, 1, 1], method=method,
        batch_size=20, epochs=2, optimizer=_momentum_sgd, loss=LOSS, sample_weight=sample_weight, tol=1e-6,
        callbacks=[resplit],
    )
    assert report.steps == 8 and len(set(resplit.seen)) == 4


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_rebalance_on_timed_devices_stays_exact(logical_devices, method):
    # Timing is added after the first fit built the step function: Rebalance rebuilds it with timed devices.
    x, y, _ = small.make_data("dense", 64)
    rebalance = Rebalance(every=2, tolerance=0.0, warmup=1)
    report = harness.assert_equivalent(
        lambda: small.build("dense"), x, y, devices=logical_devices[:2], ratios=[1, 1], method=method,
        batch_size=8, epochs=3, optimizer=_momentum_sgd, loss=LOSS, tol=1e-6, callbacks=[rebalance],
    )
    assert report.steps == 24 and len(rebalance.history) >= 5
    for entry in rebalance.history:
        assert entry["batch"] == 8 and sum(entry["batches"]) == 8
        assert sum(entry["samples"]) == 8 * entry["steps"][0]


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_auto_ratios_are_exact(logical_devices, method):
    x, y, _ = small.make_data("dense", 64)
    report = harness.assert_equivalent(
        lambda: small.build("dense"), x, y, devices=logical_devices[:2], ratios="auto", method=method,
        batch_size=8, epochs=3, optimizer=_momentum_sgd, loss=LOSS, tol=1e-6,
    )
    assert report.steps == 24 and len(report.ratios) == 2
