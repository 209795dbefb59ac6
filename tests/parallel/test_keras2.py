"""Keras 2 models (tf_keras under TF_USE_LEGACY_KERAS=1, or TF 2.15's keras): towers, exact.

Runs where a Keras 2 module is installed (the matrix's `legacy` and `tf215` envs); skipped, with
that reason, elsewhere. What is not built for Keras 2 yet is refused by name.
"""

import numpy as np
import pytest

import harness
from harness.compat import Keras2NotSupported, keras_flavour


def _keras2():
    flavour = keras_flavour()
    if flavour.major == 2 and flavour.package == "keras":
        import keras

        return keras
    return pytest.importorskip("tf_keras", reason="no Keras 2 here (the matrix's legacy and tf215 envs have one)")


@pytest.fixture(scope="module")
def k():
    return _keras2()


def _dense(k):
    hidden = k.layers.Dense(8, activation="relu", kernel_regularizer=k.regularizers.L2(0.01))
    return k.Sequential([k.Input((6,)), hidden, k.layers.Dense(3)])


def _two_input(k):
    a, b = k.Input((5,), name="a"), k.Input((3,), name="b")
    h = k.layers.Concatenate()([k.layers.Dense(6, activation="tanh")(a), b])
    return k.Model([a, b], k.layers.Dense(3, kernel_regularizer=k.regularizers.L2(0.02))(h))


def _gru(k):
    return k.Sequential([k.Input((5, 4)), k.layers.GRU(8), k.layers.Dense(3)])


def _data(name, n=61):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    if name == "two_input":
        return [rng.normal(size=(n, 5)).astype("float32"), rng.normal(size=(n, 3)).astype("float32")], y
    if name == "gru":
        return rng.normal(size=(n, 5, 4)).astype("float32"), y
    return rng.normal(size=(n, 6)).astype("float32"), y


BUILDERS = {"dense": _dense, "two_input": _two_input, "gru": _gru}


@pytest.mark.parametrize("ratios", [[3, 2, 1], [1, 3], [1, 1, 1, 1]], ids=["3:2:1", "1:3", "even4"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_keras2_towers_step_equals_single_device(logical_devices, k, name, ratios):
    # 61 samples at batch 20: the last batch (1 sample) is smaller than the device count
    x, y = _data(name)
    weights = np.random.default_rng(1).uniform(0.5, 2.0, len(y)).astype("float32") if name == "two_input" else None
    report = harness.compare_training(
        lambda: BUILDERS[name](k), x, y, devices=logical_devices[: len(ratios)], ratios=ratios, method="towers",
        batch_size=20, epochs=2, optimizer=lambda: k.optimizers.SGD(0.05, momentum=0.5),
        loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"], sample_weight=weights)
    assert report.steps == 8
    assert report.max_deviation <= 1e-6, report.worst(5)
    np.testing.assert_allclose(report.loss_parallel, report.loss_single, atol=1e-6)
    np.testing.assert_allclose(report.metrics_parallel["accuracy"], report.metrics_single["accuracy"], atol=1e-6)


def test_keras2_towers_save_writes_the_template(logical_devices, k, tmp_path):
    x, y = _data("dense", 30)
    template = _dense(k)
    parallel = harness.parallelize(template, logical_devices[:2], ratios=[2, 1], method="towers")
    parallel.compile(optimizer="sgd", loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)
    parallel.save(tmp_path / "model.h5")
    loaded = k.models.load_model(tmp_path / "model.h5", compile=False)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(parallel.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-5)


def test_what_is_not_built_for_keras2_is_refused_by_name(logical_devices, k):
    with pytest.raises(Keras2NotSupported, match="method='mirrored' \\(only 'towers' is built for Keras 2\\)"):
        harness.parallelize(_dense(k), logical_devices[:2], method="mirrored")
    bn = k.Sequential([k.Input((4,)), k.layers.Dense(4), k.layers.BatchNormalization(name="bn"), k.layers.Dense(1)])
    with pytest.raises(Keras2NotSupported, match="bn \\(BatchNormalization: whole-batch statistics"):
        harness.parallelize(bn, logical_devices[:2], method="towers")
    act = k.Sequential([k.Input((4,)), k.layers.Dense(4, activity_regularizer="l2", name="act")])
    with pytest.raises(Keras2NotSupported, match="act \\(activity_regularizer"):
        harness.parallelize(act, logical_devices[:2], method="towers")
    with pytest.raises(ValueError, match="jit_compile=True"):
        harness.parallelize(_dense(k), logical_devices[:2], method="towers").compile(
            optimizer="sgd", loss="mse", jit_compile=True)
