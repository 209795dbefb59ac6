"""parallelize / multi_gpu_model behave like Keras models; bad input is named and rejected."""

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import harness
from harness.parallel import slicing
from harness.split import shares
from harness.workloads import small

LOSS = small.loss()


def _dense():
    return small.build("dense")


def _data(n=50):
    x, y, _ = small.make_data("dense", n)
    return x, y


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_save_writes_a_plain_model_with_equal_predictions(logical_devices, tmp_path, method):
    x, y = _data()
    template = _dense()
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[5, 3, 2], method=method)
    parallel.compile(optimizer="adam", loss=LOSS, metrics=["accuracy"])
    parallel.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x[:10], y[:10]))
    path = tmp_path / "model.keras"
    parallel.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded).__name__ == "Sequential"
    np.testing.assert_allclose(loaded.predict(x, verbose=0), parallel.predict(x, batch_size=7, verbose=0), atol=1e-5)
    np.testing.assert_allclose(template.predict(x, verbose=0), loaded.predict(x, verbose=0), atol=0)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_evaluate_matches_single_device(logical_devices, method):
    x, y = _data(45)
    single = _dense()
    single.compile(loss=LOSS, metrics=["accuracy"])
    parallel = harness.parallelize(single, logical_devices[:2], ratios=[1, 3], method=method)
    parallel.compile(loss=LOSS, metrics=["accuracy"])
    expected = single.evaluate(x, y, batch_size=16, verbose=0)
    np.testing.assert_allclose(parallel.evaluate(x, y, batch_size=16, verbose=0), expected, rtol=1e-6)


def test_multi_gpu_model_drop_in_on_logical_cpus(logical_devices):
    x, y = _data()
    parallel = harness.multi_gpu_model(_dense(), gpus=[0, 1], ratios=[3, 2])
    assert parallel.method == "towers" and parallel.merge_device == "/device:CPU:0"
    parallel.compile(optimizer="sgd", loss=LOSS)
    history = parallel.fit(x, y, batch_size=10, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_in_graph_split_matches_split_batch(logical_devices):
    for ratios in ([768, 560], [3, 2], [5, 3, 2], [1000, 1, 1], [1, 1, 1, 1], [0.3, 0.7]):
        sizes = tf.function(lambda n, r=ratios: slicing.split_sizes(n, r))
        for n in range(0, 130):
            assert tuple(sizes(tf.constant(n)).numpy()) == harness.split_batch(n, ratios), (n, ratios)


def test_in_graph_split_follows_set_ratios_without_retracing(logical_devices):
    parallel = harness.parallelize(_dense(), logical_devices[:3], method="towers")
    sizes = tf.function(lambda n: slicing.split_sizes(n, parallel._shares_ref.value))
    for ratios in ([768, 560, 1], [5, 3, 2], [1000, 1, 1], [0.3, 0.7, 0.01], [1, 1, 1]):
        assert parallel.set_ratios(ratios) == tuple(float(r) for r in ratios) == parallel.ratios
        for n in range(0, 130):
            assert tuple(sizes(tf.constant(n)).numpy()) == harness.split_batch(n, ratios), (n, ratios)
    assert sizes.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_the_split_variable_is_no_weight(logical_devices, method):
    template = _dense()
    parallel = harness.parallelize(template, logical_devices[:2], ratios="auto", method=method)
    assert len(parallel.weights) == len(template.weights)
    assert [w.shape for w in parallel.get_weights()] == [w.shape for w in template.get_weights()]


def test_set_ratios_rejects_bad_ratios_and_keeps_the_split(logical_devices):
    parallel = harness.parallelize(_dense(), logical_devices[:2], ratios=[3, 2], method="towers")
    with pytest.raises(ValueError, match=r"2 devices\); got 3"):
        parallel.set_ratios([1, 2, 3])
    with pytest.raises(ValueError, match=r"ratios=\[1, 0\]"):
        parallel.set_ratios([1, 0])
    assert parallel.ratios == (3.0, 2.0)
    assert tuple(parallel._shares_ref.value.numpy()) == shares([3, 2])


def test_rebalance_refuses_a_plain_keras_model(logical_devices):
    from harness.parallel.rebalance import Rebalance

    x, y = _data()
    model = _dense()
    model.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(TypeError, match="made by harness.parallelize.*got Sequential"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[Rebalance()])
    with pytest.raises(ValueError, match="every must be an int >= 1; got every=0"):
        Rebalance(every=0)
    with pytest.raises(ValueError, match="tolerance=-0.1"):
        Rebalance(tolerance=-0.1)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"devices": 2, "ratios": [3, 0]}, ValueError, "ratios=[3, 0]"),
        ({"devices": 2, "ratios": [1, float("nan")]}, ValueError, "positive finite"),
        ({"devices": 2, "ratios": [1, 2, 3]}, ValueError, "2 devices); got 3"),
        ({"devices": ["/cpu:0", "/cpu:9"]}, ValueError, "unknown device '/cpu:9'"),
        ({"devices": ["/cpu:0", "gpu0"]}, ValueError, "malformed device name 'gpu0'"),
        ({"devices": ["/cpu:0", "/cpu:0"]}, ValueError, "must not repeat"),
        ({"devices": 9}, ValueError, "devices=9"),
        ({"devices": 2, "method": "ring"}, ValueError, "method='ring'"),
        ({"devices": 2, "ratios": "fast"}, ValueError, "None (even) or 'auto'; got ratios='fast'"),
        ({"devices": "cpu"}, TypeError, "devices='cpu'"),
    ],
)
def test_bad_arguments_are_named(logical_devices, kwargs, error, fragment):
    with pytest.raises(error) as info:
        harness.parallelize(_dense(), **kwargs)
    assert fragment in str(info.value)


def test_multi_gpu_model_rejects_more_gpus_than_present(logical_devices):
    with pytest.raises(ValueError, match="devices=5 asks for 5"):
        harness.multi_gpu_model(_dense(), gpus=5)


def test_unbuilt_model_and_non_model(logical_devices):
    with pytest.raises(ValueError, match="not built"):
        harness.parallelize(keras.Sequential([keras.layers.Dense(1)]), 2)
    with pytest.raises(TypeError, match="keras.Model"):
        harness.parallelize("model", 2)


def test_bad_training_arguments(logical_devices):
    x, y = _data()
    with pytest.raises(ValueError, match=r"len\(x\)=50, len\(y\)=49"):
        harness.compare_training(_dense, x, y[:-1], devices=logical_devices[:2])
    with pytest.raises(ValueError, match="batch_size=0"):
        harness.compare_training(_dense, x, y, devices=logical_devices[:2], batch_size=0)


def test_sum_reduced_loss_is_refused_by_mirrored(logical_devices):
    parallel = harness.parallelize(_dense(), 2, method="mirrored")
    with pytest.raises(ValueError, match="reduction='sum'"):
        parallel.compile(loss=keras.losses.MeanSquaredError(reduction="sum"))


def test_logical_devices_after_tf_start_is_a_clear_error():
    code = (
        "import tensorflow as tf, harness\n"
        "tf.constant(1.0)\n"
        "try:\n"
        "    harness.use_logical_devices(3)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ERR TensorFlow is already initialised with 1 logical CPU" in out.stdout, out.stderr[-2000:]
