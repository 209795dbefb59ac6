"""XLA: parallel models never compile the split step with XLA, and say so when asked to.

Guards: keras-team/keras#19005 (jit_compile under tf.distribute: "Trying to access resource ...
located in device CPU:1 from device CPU:0"), #18145 and #20763 (MirroredStrategy with XLA failing
on multiple GPUs). Found here: Keras 3's jit_compile="auto" turns XLA on wherever a GPU is visible,
and the towers split then fails ("Input 1 to node `cond/split` with op SplitV must be a
compile-time constant"), so "auto" must mean off for a parallel model. On and off run on Keras 3
and Keras 2 models (``any_keras``); "auto" is Keras 3's alone (Keras 2 has none).
"""

import pytest

import harness
from harness.bench.workloads import small


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_without_xla_the_step_is_exact(logical_devices, any_keras, method):
    k = any_keras
    x, y, _ = small.make_data("dense", 37)
    harness.assert_equivalent(
        lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:2], ratios=[3, 2], method=method,
        batch_size=16, epochs=2, optimizer="sgd", loss=small.loss(k), tol=1e-6, jit_compile=False)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_jit_compile_true_is_refused_with_the_reason(logical_devices, any_keras, method):
    k = any_keras
    parallel = harness.parallelize(small.build("dense", keras=k), logical_devices[:2], ratios=[3, 2], method=method)
    with pytest.raises(ValueError, match="cannot be compiled with jit_compile=True: the ratio split's sizes"):
        parallel.compile(optimizer="sgd", loss=small.loss(k), jit_compile=True)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_auto_means_no_xla_even_where_keras_would_choose_it(logical_devices, keras3, method, monkeypatch):
    # Keras 3 only (jit_compile="auto"). What Keras decides on a GPU box, forced here: a plain model gets
    # XLA, the parallel one does not.
    keras, loss = keras3, small.loss(keras3)
    monkeypatch.setattr(keras.Model, "_resolve_auto_jit_compile", lambda self: True)
    plain = small.build("dense", keras=keras)
    plain.compile(optimizer="sgd", loss=loss)
    assert plain.jit_compile is True  # the bad case the guard exists for
    parallel = harness.parallelize(small.build("dense", keras=keras), logical_devices[:2], ratios=[3, 2],
                                   method=method)
    parallel.compile(optimizer="sgd", loss=loss)
    assert parallel.jit_compile is False
    x, y, _ = small.make_data("dense", 21)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)  # partial last batch of 5: runs
