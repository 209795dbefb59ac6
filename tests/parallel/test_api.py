"""parallelize / multi_gpu_model behave like Keras models; bad input is named and rejected.

Tests that take ``any_keras`` run on Keras 3 and on Keras 2 (where installed); the rest build
models with the ``keras`` package, whichever generation it is. Keras 2 refusals of their own take
``keras2``.
"""

import numpy as np
import pytest
from keras_models import METHODS, build, data, dense_bn, is_keras2
from tf_zygote import ENV, python

import harness
from harness.bench.workloads import small
from harness.parallel import slicing
from harness.split import shares


def _dense(k=None):
    return small.build("dense", keras=k)


def _data(n=50):
    x, y, _ = small.make_data("dense", n)
    return x, y


@pytest.mark.parametrize("method", METHODS)
def test_save_writes_the_template_with_equal_predictions(logical_devices, tmp_path, any_keras, method):
    k = any_keras
    x, y = data("dense_bn", 50)
    template = dense_bn(k)
    before = template.get_weights()
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[5, 3, 2], method=method)
    parallel.compile(optimizer="adam", loss=small.loss(k), metrics=["accuracy"])
    parallel.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x[:10], y[:10]))
    assert not np.allclose(before[0], template.get_weights()[0])  # the template holds the trained weights
    path = tmp_path / "model.keras"
    parallel.save(path)
    loaded = k.models.load_model(path)
    assert type(loaded).__name__ == "Sequential"
    assert type(loaded.layers[1]) is k.layers.BatchNormalization  # the plain template, not a synchronised clone
    np.testing.assert_allclose(loaded.predict(x, verbose=0), parallel.predict(x, batch_size=7, verbose=0), atol=1e-5)
    np.testing.assert_allclose(template.predict(x, verbose=0), loaded.predict(x, verbose=0), atol=0)


@pytest.mark.parametrize("model", ["dense", "activity"])
@pytest.mark.parametrize("method", METHODS)
def test_evaluate_and_predict_match_the_template(logical_devices, any_keras, method, model):
    # activity: activity regularisers are part of the evaluated loss
    k = any_keras
    x, y = data(model, 45)
    template = build(k, model)
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[3, 2, 1], method=method)
    loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    parallel.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)
    template.compile(loss=loss, metrics=["accuracy"])
    # 45 at batch 16: the last batch of 13 is split unevenly too
    np.testing.assert_allclose(parallel.evaluate(x, y, batch_size=16, verbose=0),
                               template.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(parallel.predict(x, batch_size=16, verbose=0), template.predict(x, verbose=0),
                               atol=1e-6)


def test_multi_gpu_model_drop_in_on_logical_cpus(logical_devices):
    x, y = _data()
    parallel = harness.multi_gpu_model(_dense(), gpus=[0, 1], ratios=[3, 2])
    assert parallel.method == "towers" and parallel.merge_device == "/device:CPU:0"
    parallel.compile(optimizer="sgd", loss=small.loss())
    history = parallel.fit(x, y, batch_size=10, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_in_graph_split_matches_split_batch(logical_devices):
    import tensorflow as tf

    for ratios in ([768, 560], [3, 2], [5, 3, 2], [1000, 1, 1], [1, 1, 1, 1], [0.3, 0.7]):
        sizes = tf.function(lambda n, r=ratios: slicing.split_sizes(n, r))
        for n in range(0, 130):
            assert tuple(sizes(tf.constant(n)).numpy()) == harness.split_batch(n, ratios), (n, ratios)


def test_in_graph_split_follows_set_ratios_without_retracing(logical_devices):
    import tensorflow as tf

    parallel = harness.parallelize(_dense(), logical_devices[:3], method="towers")
    sizes = tf.function(lambda n: slicing.split_sizes(n, parallel._shares_ref.value))
    for ratios in ([768, 560, 1], [5, 3, 2], [1000, 1, 1], [0.3, 0.7, 0.01], [1, 1, 1]):
        assert parallel.set_ratios(ratios) == tuple(float(r) for r in ratios) == parallel.ratios
        for n in range(0, 130):
            assert tuple(sizes(tf.constant(n)).numpy()) == harness.split_batch(n, ratios), (n, ratios)
    assert sizes.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("method", METHODS)
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


def test_rebalance_refuses_a_plain_keras_model(logical_devices, any_keras):
    from harness.parallel.rebalance import rebalance_class

    k = any_keras
    x, y = _data()
    model = _dense(k)
    model.compile(optimizer="sgd", loss=small.loss(k))
    with pytest.raises(TypeError, match="made by harness.parallelize.*got Sequential"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[rebalance_class(k)()])
    with pytest.raises(ValueError, match="every must be an int >= 1; got every=0"):
        rebalance_class(k)(every=0)
    with pytest.raises(ValueError, match="tolerance=-0.1"):
        rebalance_class(k)(tolerance=-0.1)


def test_a_rebalance_of_another_keras_is_refused_by_name(logical_devices, keras2):
    # Keras 2 only: harness.Rebalance is a callback of the keras package (Keras 3 beside tf_keras). Without the
    # check, tf_keras' fit fails on it with "'Rebalance' object has no attribute '_implements_train_batch_hooks'".
    from harness.parallel.rebalance import rebalance_class

    if rebalance_class(keras2) is harness.Rebalance:
        pytest.skip("TF 2.15: harness.Rebalance is this Keras 2's callback already")
    x, y = _data(16)
    parallel = harness.parallelize(_dense(keras2), logical_devices[:2], method="towers")
    parallel.compile(optimizer="sgd", loss=small.loss(keras2))
    with pytest.raises(TypeError, match=r"needs a tf_keras callback; use .*rebalance_class\(tf_keras\)"):
        parallel.fit(x, y, epochs=1, verbose=0, callbacks=[harness.Rebalance()])


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
    import keras

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


@pytest.mark.parametrize("method", METHODS)
def test_a_sum_reduced_loss_trains_as_on_one_device(logical_devices, any_keras, method):
    # A sum needs no per-replica 1/N: mirrored computes it on the whole batch's predictions (it was refused).
    k = any_keras
    x, labels = _data()
    y = np.eye(3, dtype="float32")[labels]  # one target per output
    harness.assert_equivalent(lambda: _dense(k), x, y, devices=logical_devices[:3], ratios=[5, 3, 2], method=method,
                              batch_size=10, epochs=2, optimizer=lambda: k.optimizers.SGD(0.001),
                              loss=k.losses.MeanSquaredError(reduction="sum"))


@pytest.mark.parametrize("method", METHODS)
def test_batchnorm_that_cannot_be_synchronised_is_refused_by_name(logical_devices, any_keras, method):
    # BatchNormalization(renorm=True): Keras 2 cannot synchronise it under either method; Keras 3's towers
    # trained it 0.14 from one device at 1:3 (silently, before this refusal), while mirrored trains it
    # exactly. A subclass of BatchNormalization under mirrored kept per-replica statistics: 0.84 off.
    from harness.compat import Keras2NotSupported

    k, devices = any_keras, logical_devices[:2]
    error = Keras2NotSupported if is_keras2(k) else ValueError

    def renorm():
        k.utils.set_random_seed(1)
        return k.Sequential([k.Input((4,)), k.layers.Dense(6), k.layers.BatchNormalization(renorm=True, name="rn"),
                             k.layers.Dense(1)])

    class OwnNorm(k.layers.BatchNormalization):
        pass

    def subclass():
        k.utils.set_random_seed(1)
        return k.Sequential([k.Input((4,)), k.layers.Dense(6), OwnNorm(name="own"), k.layers.Dense(1)])

    rng = np.random.default_rng(0)
    x, y = (3 * rng.normal(size=(45, 4)) + 1).astype("float32"), rng.normal(size=(45, 1)).astype("float32")

    def exact(build):
        report = harness.compare_training(build, x, y, devices=devices, ratios=[1, 3], method=method, batch_size=20,
                                          epochs=2, loss="mse", optimizer="sgd")
        assert report.is_equivalent(1e-6), report.table()

    if method == "towers" or is_keras2(k):
        with pytest.raises(error, match="rn \\(BatchNormalization with renorm=True"):
            harness.parallelize(renorm(), devices, method=method)
        with pytest.raises(error, match="rn \\(BatchNormalization with renorm=True"):
            harness.parallelize(renorm(), devices, method=method, emulate="100,50", ratios="auto")
    else:
        exact(renorm)
    if method == "mirrored":
        with pytest.raises(error, match="own \\(OwnNorm: only .*BatchNormalization can be synchronised"):
            harness.parallelize(subclass(), devices, method=method)
    else:
        exact(subclass)  # towers normalise the whole batch in the layer's own call
    harness.parallelize(renorm(), devices, method=method, sync_batchnorm=False)  # per-device statistics: allowed


def test_logical_devices_after_tf_start_is_a_clear_error():
    code = (
        "import tensorflow as tf, harness\n"
        "tf.constant(1.0)\n"
        "try:\n"
        "    harness.use_logical_devices(3)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    out = python(["-c", code], env=ENV, timeout=300)  # forked from a zygote that imported TensorFlow, started nothing
    assert "ERR TensorFlow is already initialised with 1 logical CPU" in out.stdout, out.stderr[-2000:]
