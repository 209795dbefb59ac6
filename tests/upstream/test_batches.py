"""Partial, tiny and unevenly split batches: finite, exact, independent of the replica count.

Guards: BatchNormalization turning weights NaN when the last batch does not fill every replica
(keras-team/keras#11858, tensorflow/tensorflow#24320 with multi_gpu_model); empty replica slices
injecting NaN into the loss (tensorflow/tensorflow#41657, #36224); batches that do not divide evenly
across devices, on which seed 002's ``make_parallel`` fails (as seed 004 reports; docs/background.md).
On Keras 3 and Keras 2 models (the ``any_keras`` fixture; Keras 2 where installed).
"""

import numpy as np
import pytest

import harness
from harness.bench.workloads import small

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


@pytest.mark.keras2_extended  # Keras 2's uneven slices: this module's partial and smaller-than-devices last batches
@pytest.mark.covered_by("tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact"
                        "[keras2-towers]",
                        "tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact"
                        "[keras2-mirrored]",
                        "tests/upstream/test_batches.py::test_last_batch_smaller_than_the_device_count[keras2-dense-towers]",
                        "tests/upstream/test_batches.py::test_last_batch_smaller_than_the_device_count[keras2-dense-mirrored]")
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


@pytest.mark.keras2_extended  # Keras 2's BN over uneven replicas: the partial last batch's
@pytest.mark.covered_by("tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact"
                        "[keras2-towers]",
                        "tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact"
                        "[keras2-mirrored]")
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


# -- the single-device path only where a batch can be smaller than the device count -------------

@pytest.mark.parametrize(("samples", "batch_size", "validation_split", "smallest"), [
    (45, 10, 0.0, 5), (40, 10, 0.0, 10), (7, None, 0.0, 7), (100, None, 0.0, 4), (3, 10, 0.0, 3),
    # 50 samples, 0.2 held out: 40 train at batch 10, or 39/41 where a Keras rounds otherwise
    (50, 10, 0.2, 1),
])
def test_the_smallest_batch_of_a_fit_on_arrays(samples, batch_size, validation_split, smallest):
    from harness.parallel.slicing import smallest_fit_batch

    x = np.zeros((samples, 3), "float32")
    assert smallest_fit_batch(x, batch_size, validation_split) == smallest
    assert smallest_fit_batch({"a": x, "b": x[:, :1]}, batch_size, validation_split) == smallest
    assert smallest_fit_batch([x, x], batch_size, validation_split) == smallest


def test_the_smallest_batch_is_unknown_unless_fit_gets_arrays_or_fixed_batches():
    import tensorflow as tf

    from harness.parallel.slicing import smallest_fit_batch

    x = np.zeros((45, 3), "float32")
    assert smallest_fit_batch(tf.constant(x), 10) == 5
    assert smallest_fit_batch(tf.data.Dataset.from_tensor_slices(x).batch(10), 10) is None
    # Batched with drop_remainder: every batch has the static size, whatever steps_per_epoch says.
    fixed = tf.data.Dataset.from_tensor_slices((x, x[:, 0])).batch(10, drop_remainder=True).repeat()
    assert smallest_fit_batch(fixed, None, steps_per_epoch=10**9) == 10
    assert smallest_fit_batch(tf.data.Dataset.from_tensor_slices(x).batch(2, drop_remainder=True)) == 2
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]] * 5)).batch(2, drop_remainder=True)
    assert smallest_fit_batch(ragged) is None  # not a dense tensor: left to the run-time branch
    assert smallest_fit_batch(x, 10, steps_per_epoch=3) is None
    assert smallest_fit_batch([[1.0, 2.0], [3.0, 4.0]], 10) is None  # Python lists: left to Keras
    assert smallest_fit_batch(None, 10) is None


def _trainer(k, devices, ratios, method):
    """``(parallel, trained)``: harness' model of a dense model and ``trained(steps)``, which runs ``steps(model)``
    on it and on a single-device copy from the same weights, then returns their largest weight difference."""
    reference = small.build("dense", keras=k)
    template = small.build("dense", keras=k)
    template.set_weights(reference.get_weights())
    parallel = harness.parallelize(template, devices, ratios=ratios, method=method)
    for model in (reference, parallel):
        model.compile(optimizer=k.optimizers.SGD(0.05), loss=small.loss(k))

    def trained(steps):
        for model in (reference, parallel):
            steps(model)
        parallel.sync_to_template()
        return max(float(np.max(np.abs(a - b))) for a, b in zip(reference.get_weights(), template.get_weights()))

    return parallel, trained


@pytest.mark.parametrize("method", METHODS)
def test_a_step_traced_for_one_batch_size_traces_that_sizes_path_alone(logical_devices, any_keras, method):
    # train_on_batch traces for its batch's size: a batch that fills the devices traces the parallel step
    # without the single-device branch (a trace of the whole step again, in a tf.cond), one smaller than the
    # device count the single-device step alone. Both stay exact.
    x, y, _ = small.make_data("dense", 7)
    parallel, trained = _trainer(any_keras, logical_devices[:3], [3, 2, 1], method)
    traced = {"single": 0, "parallel": 0}
    for name in traced:
        step = getattr(parallel, f"_{name}_train")
        setattr(parallel, f"_{name}_train", lambda *args, step=step, name=name: traced.update(
            {name: traced[name] + 1}) or step(*args))

    def on_batch(rows):
        return lambda model: model.train_on_batch(x[rows], y[rows])

    assert trained(on_batch(slice(0, 5))) <= 1e-6
    assert traced == {"single": 0, "parallel": 1}
    assert trained(on_batch(slice(5, 7))) <= 1e-6  # 2 rows on 3 devices
    assert traced["single"] >= 1 and trained(on_batch(slice(0, 5))) <= 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_fits_on_datasets_of_other_batch_sizes_run_one_trace(logical_devices, any_keras, method):
    # A dataset batched by a fixed number traces its fit's step; where every batch fills the devices the trace
    # leaves the batch's size out (the step asserts it), so a later fit on a dataset batched by another number
    # runs the same trace (the tuner's even split after its tuned one). Both exact. Planted defect (the size kept
    # in the staged step's signature): 2 traces.
    import tensorflow as tf

    x, y, _ = small.make_data("dense", 48)
    parallel, trained = _trainer(any_keras, logical_devices[:3], [3, 2, 1], method)
    traced = []
    step = parallel._parallel_train
    parallel._parallel_train = lambda *args: traced.append(1) or step(*args)

    def on_dataset(batch):
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
        return lambda model: model.fit(data, epochs=1, verbose=0, shuffle=False)

    assert trained(on_dataset(12)) <= 1e-6
    assert trained(on_dataset(8)) <= 1e-6
    assert trained(on_dataset(16)) <= 1e-6
    assert len(traced) == 1, traced


@pytest.mark.parametrize("method", METHODS)
def test_the_single_device_path_is_traced_only_where_a_batch_can_be_small(logical_devices, any_keras, method):
    # A fit whose batches all fill the devices traces its step without the single-device branch;
    # a later train_on_batch of one sample gets it back, and stays exact.
    x, y, _ = small.make_data("dense", 46)
    parallel, trained = _trainer(any_keras, logical_devices[:2], [3, 2], method)
    traced = []
    single_train = parallel._single_train
    parallel._single_train = lambda *args: traced.append(1) or single_train(*args)
    assert trained(lambda m: m.fit(x[:45], y[:45], batch_size=10, shuffle=False, verbose=0)) <= 1e-6
    assert traced == []  # 45 at batch 10: a last batch of 5, on 2 devices
    assert trained(lambda m: m.train_on_batch(x[45:], y[45:])) <= 1e-6
    assert traced, "a batch of one sample on two devices needs the single-device step"
    assert trained(lambda m: m.fit(x[:41], y[:41], batch_size=10, shuffle=False, verbose=0)) <= 1e-6


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_a_small_batch_where_fit_promised_none_is_an_error_not_drift(logical_devices, any_keras, method):
    # The guard of the branch-free step: were a fit's batch sizes mispredicted, the step stops, and changes
    # nothing: not the weights, not the optimizer's step count (which moved on every such step, and the weights
    # once in CI at e737d0d, while the check ran beside the step instead of before it).
    # A trace that knows its batch size takes that size's branch alone: the first step (2 rows) is traced for 2;
    # the second, of 1 row, makes TensorFlow trace again for any batch size, where the guard applies.
    k = any_keras
    x, y, _ = small.make_data("dense", 3)
    parallel = harness.parallelize(small.build("dense", keras=k), logical_devices[:2], method=method)
    parallel.compile(optimizer=k.optimizers.SGD(0.1, momentum=0.9), loss=small.loss(k))
    parallel.build_optimizer()
    parallel._small_batches_possible = False  # what fit sets when its arrays promise no small batch
    parallel.train_on_batch(x[:2], y[:2])
    parallel.sync_to_template()
    before = parallel.template.get_weights()
    state = [np.array(v) for v in parallel.optimizer.variables]
    with pytest.raises(Exception, match=r"without the single-device path .* device count \(2\)"):
        parallel.train_on_batch(x[2:], y[2:])
    parallel.sync_to_template()
    assert all(np.array_equal(a, b) for a, b in zip(before, parallel.template.get_weights()))
    assert len(state) > 1 and all(np.array_equal(a, np.array(v)) for a, v in zip(state, parallel.optimizer.variables))
