"""Keras 2 models (tf_keras, or TF 2.15's keras): both methods, emulated devices, ratios="auto"; exact.

Runs where a Keras 2 module is installed (the dev env's tf-keras; the matrix's `legacy` and `tf215`
envs); skipped, with that reason, elsewhere (the plugin's `keras2` fixture). Every training case
compares with the single-device step on the whole batch, partial last batches included (61 samples
at batch 20: a last batch of 1, smaller than the device count, runs the single-device step; 65: a
last batch of 5 split over 4 devices). Emulation only adds delays and a re-split only changes the
next step's slices, so the emulated and rebalanced cases are exact too.
"""

import numpy as np
import pytest

import harness
from harness.compat import Keras2NotSupported
from harness.parallel.rebalance import is_rebalance, rebalance_class

METHODS = ["towers", "mirrored"]


def _dense(k):
    hidden = k.layers.Dense(8, activation="relu", kernel_regularizer=k.regularizers.L2(0.01))
    return k.Sequential([k.Input((6,)), hidden, k.layers.Dense(3)])


def _two_input(k):
    a, b = k.Input((5,), name="a"), k.Input((3,), name="b")
    h = k.layers.Concatenate()([k.layers.Dense(6, activation="tanh")(a), b])
    return k.Model([a, b], k.layers.Dense(3, kernel_regularizer=k.regularizers.L2(0.02))(h))


def _gru(k):
    return k.Sequential([k.Input((5, 4)), k.layers.GRU(8), k.layers.Dense(3)])


def _dense_bn(k):
    return k.Sequential([k.Input((6,)), k.layers.Dense(8), k.layers.BatchNormalization(momentum=0.5),
                         k.layers.Activation("relu"), k.layers.Dense(3)])


def _conv_bn(k):
    # Rank-4 input: the template's BatchNormalization runs the fused kernel (Bessel-corrected moving variance).
    return k.Sequential([k.Input((6, 6, 2)), k.layers.Conv2D(4, 3), k.layers.BatchNormalization(momentum=0.5),
                         k.layers.Flatten(), k.layers.Dense(3)])


def _nested_bn(k):
    inner = k.Sequential([k.Input((8,)), k.layers.Dense(8), k.layers.BatchNormalization(momentum=0.5)])
    x = k.Input((6,))
    return k.Model(x, k.layers.Dense(3)(inner(k.layers.Dense(8)(x))))


def _activity(k):
    hidden = k.layers.Dense(8, activation="relu", activity_regularizer=k.regularizers.L2(0.1))
    return k.Sequential([k.Input((6,)), hidden, k.layers.Dense(3, activity_regularizer="l1")])


BUILDERS = {"dense": _dense, "two_input": _two_input, "gru": _gru, "dense_bn": _dense_bn, "conv_bn": _conv_bn,
            "nested_bn": _nested_bn, "activity": _activity}


def _data(name, n=61):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    if name == "two_input":
        return [rng.normal(size=(n, 5)).astype("float32"), rng.normal(size=(n, 3)).astype("float32")], y
    if name == "gru":
        return rng.normal(size=(n, 5, 4)).astype("float32"), y
    if name == "conv_bn":
        return (2 * rng.normal(size=(n, 6, 6, 2)) + 1).astype("float32"), y
    return (3 * rng.normal(size=(n, 6)) + 1).astype("float32"), y  # off-centre: BatchNormalization has work


def _compare(k, devices, method, name, ratios, n=61, **kwargs):
    x, y = _data(name, n)
    return harness.compare_training(
        lambda: BUILDERS[name](k), x, y, devices=devices[: len(ratios)], ratios=ratios, method=method,
        batch_size=20, epochs=2, optimizer=lambda: k.optimizers.SGD(0.05, momentum=0.5),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"], **kwargs)


def _assert_exact(report, steps=8):
    assert report.steps == steps
    assert report.max_deviation <= 1e-6, report.table()
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)
    np.testing.assert_allclose(report.metrics_parallel["accuracy"], report.metrics_single["accuracy"], atol=1e-6)


@pytest.mark.parametrize("ratios", [[3, 2, 1], [1, 3], [1, 1, 1, 1]], ids=["3:2:1", "1:3", "even4"])
@pytest.mark.parametrize("name", ["dense", "two_input", "gru"])
@pytest.mark.parametrize("method", METHODS)
def test_step_equals_single_device(logical_devices, keras2, method, name, ratios):
    # Dense+L2: penalties would count once per device; two_input: sample weights over uneven slices.
    weights = np.random.default_rng(1).uniform(0.5, 2.0, 61).astype("float32") if name == "two_input" else None
    _assert_exact(_compare(keras2, logical_devices, method, name, ratios, sample_weight=weights))


@pytest.mark.parametrize(("name", "ratios", "n"), [
    ("dense_bn", [4, 3, 2, 1], 65),  # last batch of 5 over 4 devices: slices 2, 1, 1, 1
    ("dense_bn", [1, 3], 61),  # last batch of 1: the single-device step
    ("conv_bn", [4, 3, 2, 1], 65),  # fused template: off by 1e-3 and more without the n/(n-1) correction
    ("nested_bn", [3, 2, 1], 61),  # the BatchNormalization of a nested model is synchronised too
])
@pytest.mark.parametrize("method", METHODS)
def test_batchnorm_is_the_whole_batch(logical_devices, keras2, method, name, ratios, n):
    report = _compare(keras2, logical_devices, method, name, ratios, n=n)
    _assert_exact(report)  # moving mean and variance included (they are model weights)
    assert any("moving_variance" in d.name for d in report.diffs)


@pytest.mark.parametrize("method", METHODS)
def test_per_device_batchnorm_is_not_exact(logical_devices, keras2, method):
    # The control: sync_batchnorm=False keeps per-device statistics, so the comparison above can fail.
    report = _compare(keras2, logical_devices, method, "dense_bn", [3, 1], sync_batchnorm=False)
    assert report.max_deviation > 1e-3


@pytest.mark.parametrize("method", METHODS)
def test_activity_regularisers_are_exact(logical_devices, keras2, method):
    # Keras 2 divides an activity regulariser by the slice's batch size; without the n_i/N weight
    # uneven splits deviate by 3e-2 and more.
    _assert_exact(_compare(keras2, logical_devices, method, "activity", [4, 3, 2, 1], n=65))


@pytest.mark.parametrize("method", METHODS)
def test_set_ratios_mid_fit_stays_exact(logical_devices, keras2, method):
    class Resplit(keras2.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.set_ratios([1, 1, 4] if batch % 2 else [3, 2, 1])

    _assert_exact(_compare(keras2, logical_devices, method, "dense", [3, 2, 1], callbacks=[Resplit()]))


@pytest.mark.parametrize("method", METHODS)
def test_mixed_precision(logical_devices, keras2, method):
    # The single-device step of the last batch (1 sample) must unscale the LossScaleOptimizer's
    # gradients: without it the weights end 1e3 away. A fixed loss scale: a dynamic one skips a step
    # when a float16 gradient overflows, and a device's partial gradient overflows where the whole
    # batch's does not (or the reverse).
    k = keras2
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data("dense")
        report = harness.compare_training(
            lambda: _dense(k), x, y, devices=logical_devices[:3], ratios=[3, 2, 1], method=method,
            batch_size=20, epochs=2, loss=k.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=lambda: k.mixed_precision.LossScaleOptimizer(k.optimizers.SGD(0.05), dynamic=False,
                                                                   initial_scale=1024))
    finally:
        k.mixed_precision.set_global_policy("float32")
    assert report.max_deviation <= 1e-3, report.table()  # float16 rounding: 4e-5 (tf-keras), 2e-4 (2.15)


@pytest.mark.parametrize("method", METHODS)
def test_evaluate_and_predict_match_the_template(logical_devices, keras2, method):
    k = keras2
    x, y = _data("activity", 45)
    template = _activity(k)
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[3, 2, 1], method=method)
    loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    parallel.compile(optimizer="sgd", loss=loss)
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)
    template.compile(loss=loss)
    # 45 at batch 16: the last batch of 13 is split unevenly too; activity losses are part of the loss
    np.testing.assert_allclose(parallel.evaluate(x, y, batch_size=16, verbose=0),
                               template.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(parallel.predict(x, batch_size=16, verbose=0), template.predict(x, verbose=0),
                               atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_save_writes_the_template(logical_devices, keras2, method, tmp_path):
    k = keras2
    x, y = _data("dense_bn", 30)
    template = _dense_bn(k)
    before = template.get_weights()
    parallel = harness.parallelize(template, logical_devices[:2], ratios=[2, 1], method=method)
    parallel.compile(optimizer="sgd", loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert not np.allclose(before[0], template.get_weights()[0])  # the template holds the trained weights
    parallel.save(tmp_path / "model.keras")
    loaded = k.models.load_model(tmp_path / "model.keras", compile=False)
    assert type(loaded.layers[1]) is k.layers.BatchNormalization  # the plain template, not a synchronised clone
    np.testing.assert_allclose(loaded.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_what_cannot_be_exact_is_refused_by_name(logical_devices, keras2, method):
    k, devices = keras2, logical_devices[:2]
    with pytest.raises(ValueError, match="jit_compile=True"):
        harness.parallelize(_dense(k), devices, method=method).compile(optimizer="sgd", loss="mse",
                                                                       jit_compile=True)
    renorm = k.Sequential([k.Input((4,)), k.layers.BatchNormalization(renorm=True, name="rn"), k.layers.Dense(1)])
    with pytest.raises(Keras2NotSupported, match="rn \\(BatchNormalization with renorm=True"):
        harness.parallelize(renorm, devices, method=method)
    with pytest.raises(Keras2NotSupported, match="rn \\(BatchNormalization with renorm=True"):
        harness.parallelize(renorm, devices, method=method, emulate="100,50", ratios="auto")


def test_mirrored_refuses_sum_reduced_losses(logical_devices, keras2):
    with pytest.raises(ValueError, match="reduction='sum'"):
        harness.parallelize(_dense(keras2), logical_devices[:2], method="mirrored").compile(
            optimizer="sgd", loss=keras2.losses.MeanSquaredError(reduction="sum"))


def _subclassed_with_batchnorm(k):
    class Net(k.Model):
        def __init__(self):
            super().__init__(name="net")
            self.dense, self.norm = k.layers.Dense(4), k.layers.BatchNormalization()

        def call(self, x, training=None):
            return self.norm(self.dense(x), training=training)

    net = Net()
    net(np.zeros((2, 3), "float32"))
    return net


def test_subclassed_models_need_sync_off_for_towers_and_are_cloned_for_mirrored(logical_devices, keras2):
    # Towers sync BatchNormalization by walking a graph, which a subclassed model has not; mirrored rebuilds
    # the model from its config (tf_keras' clone_model takes graph models only) and synchronises its layers.
    devices = logical_devices[:2]
    with pytest.raises(Keras2NotSupported, match="net \\(a subclassed model with BatchNormalization"):
        harness.parallelize(_subclassed_with_batchnorm(keras2), devices, method="towers")
    harness.parallelize(_subclassed_with_batchnorm(keras2), devices, method="towers", sync_batchnorm=False)
    rng = np.random.default_rng(0)
    x, y = (3 * rng.normal(size=(45, 3)) + 1).astype("float32"), rng.normal(size=(45, 4)).astype("float32")
    report = harness.compare_training(lambda: _subclassed_with_batchnorm(keras2), x, y, devices=devices,
                                      ratios=[1, 3], method="mirrored", batch_size=20, epochs=2, loss="mse",
                                      optimizer=lambda: keras2.optimizers.SGD(0.05, momentum=0.5))
    assert report.is_equivalent(1e-6), report.table()


# -- emulated devices and ratios="auto" (all figures here are emulated devices', DESIGN.md) ----------
def _compare_emulated(k, devices, method, name, n, batch_size, ratios, emulate=None, epochs=2, optimizer=None,
             callbacks=None):
    """``compare_training`` of a Keras 2 model parallelised with ``emulate``; returns ``(report, parallel)``."""
    made = []

    def parallelize(template, devs, ratios):  # compare_training's hook for options it does not pass on
        made.append(harness.parallelize(template, devs, ratios=ratios, method=method, emulate=emulate))
        return made[0]

    x, y = _data(name, n)
    report = harness.compare_training(
        lambda: BUILDERS[name](k), x, y, devices=devices, ratios=ratios, method=parallelize,
        batch_size=batch_size, epochs=epochs, optimizer=optimizer or (lambda: k.optimizers.SGD(0.05, momentum=0.5)),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), callbacks=callbacks)
    return report, made[0]


@pytest.mark.timing
@pytest.mark.parametrize("method", METHODS)
def test_auto_ratios_converge_to_the_emulated_speeds_and_stay_exact(logical_devices, keras2, method):
    # As the Keras 3 test (test_rebalance.py): 1000 and 400 samples/s, device 1 with 20 ms per step more;
    # equal step times: b0 / 1000 = 20 ms + b1 / 400 with b0 + b1 = 70 -> b0 = 55.7.
    report, parallel = _compare_emulated(keras2, logical_devices[:2], method, "dense", 1400, 70, ratios="auto",
                                emulate="1000,400::20")
    rebalancer = parallel.rebalancer
    assert isinstance(rebalancer, keras2.callbacks.Callback) and is_rebalance(rebalancer)
    assert report.steps == rebalancer.steps == 40
    assert any(entry["resplit"] for entry in rebalancer.history)
    assert rebalancer.history[-1]["batches"] in ([55, 15], [56, 14], [57, 13])
    assert report.max_deviation <= 1e-6, report.table()
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)


@pytest.mark.parametrize("name", ["dense_bn", "activity"])
@pytest.mark.parametrize("method", METHODS)
def test_emulated_devices_stay_exact(logical_devices, keras2, method, name):
    # 61 at batch 20: the last batch of 1 runs the single-device step with the devices' begin ops in place;
    # dense_bn (towers): whole-batch BatchNormalization over gated slices.
    report, parallel = _compare_emulated(keras2, logical_devices[:3], method, name, 61, 20, ratios=[3, 2, 1],
                                emulate="20000,10000,5000")
    assert report.steps == 8 and report.max_deviation <= 1e-6, report.table()
    busy = parallel.emulator.busy_between(0, float("inf"))
    # The two 1-sample batches ran the single-device step: no device's work, nothing logged.
    assert [(busy[d].steps, busy[d].samples) for d in parallel.devices] == [(6, 60), (6, 42), (6, 18)]


@pytest.mark.parametrize("method", METHODS)
def test_time_devices_logs_each_devices_busy_time(logical_devices, keras2, method):
    k, devices = keras2, logical_devices[:2]
    x, y = _data("dense", 96)
    parallel = harness.parallelize(_dense(k), devices, ratios=[3, 1], method=method)
    emulator = parallel.time_devices()
    assert emulator is parallel.emulator and emulator.timed == tuple(devices) and not emulator.devices
    parallel.compile(optimizer="sgd", loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    parallel.fit(x, y, batch_size=16, epochs=2, verbose=0)  # 12 steps of 12 + 4 samples
    busy = emulator.busy_between(0, float("inf"))
    assert [(busy[d].steps, busy[d].samples) for d in devices] == [(12, 144), (12, 48)]
    assert all(busy[d].seconds > 0 for d in devices)


@pytest.mark.timing
@pytest.mark.parametrize("method", METHODS)
def test_emulated_devices_run_at_their_rates(logical_devices, keras2, method):
    k, devices = keras2, logical_devices[:2]
    x, y = _data("dense", 480)
    parallel = harness.parallelize(_dense(k), devices, ratios=[2, 1], method=method, emulate="2000,1000")
    parallel.compile(optimizer="sgd", loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    parallel.fit(x, y, batch_size=60, epochs=1, verbose=0)  # 8 steps of 40 + 20 samples: 20 ms each
    busy = parallel.emulator.busy_between(0, float("inf"))
    assert [busy[d].samples for d in devices] == [320, 160]
    # Busy time is the emulated time when the real work is shorter (a loaded machine adds a little).
    assert [busy[d].rate for d in devices] == pytest.approx([2000, 1000], rel=0.2)


@pytest.mark.parametrize("method", METHODS)
def test_a_users_rebalance_replaces_the_built_in_one(logical_devices, keras2, method):
    rebalance = rebalance_class(keras2)(every=2, tolerance=0.0, warmup=1)
    report, parallel = _compare_emulated(keras2, logical_devices[:2], method, "dense", 64, 8, ratios="auto", epochs=3,
                                callbacks=[rebalance])
    assert report.steps == 24 and report.max_deviation <= 1e-6, report.table()
    assert len(rebalance.history) >= 5 and not parallel.rebalancer.history  # the user's ran, the built-in did not
    assert all(entry["batch"] == 8 and sum(entry["batches"]) == 8 for entry in rebalance.history)


@pytest.mark.parametrize("method", METHODS)
def test_emulated_mixed_precision(logical_devices, keras2, method):
    # The emulated step unscales the LossScaleOptimizer's gradients itself (it does not call minimize).
    k = keras2
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        report, _ = _compare_emulated(
            k, logical_devices[:2], method, "dense", 61, 20, ratios=[3, 1], emulate="20000,10000",
            optimizer=lambda: k.mixed_precision.LossScaleOptimizer(k.optimizers.SGD(0.05), dynamic=False,
                                                                   initial_scale=1024))
    finally:
        k.mixed_precision.set_global_policy("float32")
    assert report.max_deviation <= 1e-3, report.table()  # float16 rounding, as test_mixed_precision


def test_rebalance_refuses_a_plain_keras2_model(logical_devices, keras2):
    x, y = _data("dense", 16)
    model = _dense(keras2)
    model.compile(optimizer="sgd", loss=keras2.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(TypeError, match="made by harness.parallelize.*got Sequential"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[rebalance_class(keras2)()])


def test_a_rebalance_of_another_keras_is_refused_by_name(logical_devices, keras2):
    # Without the check, tf_keras' fit fails on a Keras 3 callback with "'Rebalance' object has no
    # attribute '_implements_train_batch_hooks'".
    if rebalance_class(keras2) is harness.Rebalance:
        pytest.skip("TF 2.15: harness.Rebalance is this Keras 2's callback already")
    x, y = _data("dense", 16)
    parallel = harness.parallelize(_dense(keras2), logical_devices[:2], method="towers")
    parallel.compile(optimizer="sgd", loss=keras2.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(TypeError, match=r"needs a tf_keras callback; use .*rebalance_class\(tf_keras\)"):
        parallel.fit(x, y, epochs=1, verbose=0, callbacks=[harness.Rebalance()])
