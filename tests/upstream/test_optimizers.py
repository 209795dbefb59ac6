"""Upstream optimizer failures the optimizer axis leaves out, each checked to still fail on one device.

``harness.bench.zoo.optimizers.UPSTREAM`` names the axis cases Keras itself cannot train on one
device; harness cannot be checked against a single-device run that fails. Each test here fails
once Keras fixes its bug: then the case goes back into the axis.
"""

import numpy as np
import pytest


def test_keras3_rmsprop_centered_fails_on_one_device_on_repeated_sparse_rows(logical_devices, keras3):
    """Keras 3.15: RMSprop(centered=True) divides a sparse gradient by a dense denominator through
    ``indexed_slices_union_indices_and_values``, whose ``scatter_nd`` sums the positions of repeated ids,
    then gathers out of range (``indices[3] = 184 is not in [0, 49)``)."""
    import tensorflow as tf

    from harness.bench.zoo.optimizers import UPSTREAM, make_optimizer

    k = keras3
    assert ("causal_lm", "rmsprop_centered") in {(m, o) for m, o, _ in UPSTREAM}
    model = k.Sequential([k.Input((6,), dtype="int32"), k.layers.Embedding(12, 8), k.layers.GlobalAveragePooling1D(),
                          k.layers.Dense(3)])
    model.compile(make_optimizer(k, "rmsprop_centered"), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 12, (23, 6)), rng.integers(0, 3, 23)  # 12 ids in 8 x 6 lookups a batch: repeated
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"is not in \[0, "):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)


def test_keras3_muon_with_a_schedule_fails_in_float64(logical_devices, keras3):
    """Keras 3.15's Muon multiplies its orthogonalised update by the learning rate without a cast: with a schedule
    (a float32 rate) a float64 model fails, so the axis judges muon/schedule by the tolerance alone (NO_FLOAT64)."""
    from harness.bench.zoo.optimizers import NO_FLOAT64, make_optimizer

    k = keras3
    assert ("muon", "schedule") in {(o, p) for o, p, _ in NO_FLOAT64}
    floatx, policy = k.config.floatx(), k.config.dtype_policy().name
    k.config.set_floatx("float64")
    k.config.set_dtype_policy("float64")
    try:
        model = k.Sequential([k.Input((4,)), k.layers.Dense(8), k.layers.Dense(1)])
        model.compile(make_optimizer(k, "muon", "schedule"), "mse")
        x = np.random.default_rng(0).normal(size=(16, 4))
        with pytest.raises(TypeError, match="float64 that does not match type float32"):
            model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    finally:
        k.config.set_floatx(floatx)
        k.config.set_dtype_policy(policy)
