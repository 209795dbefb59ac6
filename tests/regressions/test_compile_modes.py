"""XLA: parallel models never compile the split step with XLA, and say so when asked to.

Guards: keras-team/keras#19005 (jit_compile under tf.distribute: "Trying to access resource ...
located in device CPU:1 from device CPU:0"), #18145 and #20763 (MirroredStrategy with XLA failing
on multiple GPUs). Found here: Keras 3's jit_compile="auto" turns XLA on wherever a GPU is visible,
and the towers split then fails ("Input 1 to node `cond/split` with op SplitV must be a
compile-time constant"), so "auto" must mean off for a parallel model.
"""

import keras
import pytest

import harness
from harness.workloads import small

LOSS = small.loss()


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_without_xla_the_step_is_exact(logical_devices, method):
    x, y, _ = small.make_data("dense", 37)
    harness.assert_equivalent(
        lambda: small.build("dense"), x, y, devices=logical_devices[:2], ratios=[3, 2], method=method,
        batch_size=16, epochs=2, optimizer="sgd", loss=LOSS, tol=1e-6, jit_compile=False)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_jit_compile_true_is_refused_with_the_reason(logical_devices, method):
    parallel = harness.parallelize(small.build("dense"), logical_devices[:2], ratios=[3, 2], method=method)
    with pytest.raises(ValueError, match="cannot be compiled with jit_compile=True: the ratio split's sizes"):
        parallel.compile(optimizer="sgd", loss=LOSS, jit_compile=True)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_auto_means_no_xla_even_where_keras_would_choose_it(logical_devices, method, monkeypatch):
    # What Keras decides on a GPU box, forced here: a plain model gets XLA, the parallel one does not.
    monkeypatch.setattr(keras.Model, "_resolve_auto_jit_compile", lambda self: True)
    plain = small.build("dense")
    plain.compile(optimizer="sgd", loss=LOSS)
    assert plain.jit_compile is True  # the bad case the guard exists for
    parallel = harness.parallelize(small.build("dense"), logical_devices[:2], ratios=[3, 2], method=method)
    parallel.compile(optimizer="sgd", loss=LOSS)
    assert parallel.jit_compile is False
    x, y, _ = small.make_data("dense", 21)
    parallel.fit(x, y, batch_size=8, epochs=1, verbose=0)  # partial last batch of 5: runs
