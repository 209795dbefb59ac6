"""Sparse gradients get the single device's rows, for any lookup shape (docs/design.md, "Sparse gradients").

Keras 3's Adam-family optimizers and ``clipnorm`` act on an ``IndexedSlices`` gradient's rows, so a
parallel step is exact only with one device's rows: one row per looked-up id of each sample where
the ids depend on the batch (tokens; position ids broadcast to the batch's shape), one block summed
over the batch where they do not (``Embedding(range(length))``). Before, a heuristic summed any
equal blocks of indices: broadcast position ids under Adam drifted 1.3e-02 from one device (a
causal language model, ratios 1:3, both methods). The planted defects (every lookup taken for
batch-dependent, or for batch-independent) must fail.
"""

import numpy as np
import pytest

import harness
from harness.parallel import METHODS

V, L, D = 12, 6, 8


def _lookups(k, kind: str, length=L):
    import tensorflow as tf

    class Lookups(k.layers.Layer):
        """Token lookups plus position lookups of one ``kind``."""

        def __init__(self, kind="arange", **kwargs):
            super().__init__(**kwargs)
            self.kind = kind
            self.tokens, self.positions = k.layers.Embedding(V, D), k.layers.Embedding(max(V, L), D)

        def call(self, x):
            ids = tf.range(tf.shape(x)[1])  # the sequence length: the same on every device
            if self.kind == "broadcast":  # one position id per token (GPT-style): batch-dependent
                return self.tokens(x) + self.positions(tf.broadcast_to(ids[None], tf.shape(x)))
            if self.kind == "arange":  # keras-io's TokenAndPositionEmbedding: batch-independent
                return self.tokens(x) + self.positions(ids)[None]
            if self.kind == "shared":  # one table for both kinds of lookup
                return self.tokens(x) + self.tokens(ids)[None]
            if self.kind == "twice":  # two batch-independent lookups of one table
                return self.tokens(x) + self.positions(ids)[None] + 2.0 * self.positions(ids % 3)[None]
            raise ValueError(self.kind)

        def get_config(self):
            return {**super().get_config(), "kind": self.kind}

    return k.Sequential([k.Input((length,), dtype="int32"), Lookups(kind), k.layers.GlobalAveragePooling1D(),
                         k.layers.Dense(3)])


def _compare(k, devices, kind, method, ratios, optimizer=None, length=L):
    rng = np.random.default_rng(0)
    x = rng.integers(0, V, size=(23, L)).astype("int32")  # few ids: repeated within and across devices
    y = rng.integers(0, 3, size=(23,))
    return harness.compare_training(lambda: _lookups(k, kind, length), x, y, devices=devices, ratios=ratios,
                                    method=method, batch_size=8, epochs=2,
                                    optimizer=optimizer or (lambda: k.optimizers.Adam(0.05)),
                                    loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))


CASES = [(kind, method, ratios) for kind in ("broadcast", "arange", "shared") for method in METHODS
         for ratios in ((1, 3), (5, 3, 2))]


@pytest.mark.parametrize(("kind", "method", "ratios"), [  # the 3-device splits extended
    pytest.param(*case, id=f"{case[0]}-{case[1]}-{len(case[2])}",
                 marks=[pytest.mark.extended] if len(case[2]) > 2 else [])
    for case in CASES])
def test_lookups_of_every_shape_under_adam(logical_devices, any_keras, kind, method, ratios):
    report = _compare(any_keras, logical_devices[: len(ratios)], kind, method, list(ratios))
    assert report.is_equivalent(1e-6), report.table()


# clipnorm and adagrad extended: quick, global_clipnorm's norm of the rows summed over devices and rmsprop's
# accumulator of squared rows (the same mechanisms)
@pytest.mark.parametrize("optimizer", [
    pytest.param("clipnorm", marks=[pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_sparse.py::test_row_sensitive_settings_on_lookups[global_clipnorm]")]),
    "global_clipnorm",
    pytest.param("adagrad", marks=[pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_sparse.py::test_row_sensitive_settings_on_lookups[rmsprop]")]),
    "rmsprop"])
def test_row_sensitive_settings_on_lookups(logical_devices, keras3, optimizer):
    # RMSprop(centered=True) fails on one device already on repeated rows: tests/upstream/test_optimizers.py.
    k = keras3
    make = {"clipnorm": lambda: k.optimizers.SGD(0.5, clipnorm=0.01),
            "global_clipnorm": lambda: k.optimizers.Adam(0.05, global_clipnorm=0.05),
            "adagrad": lambda: k.optimizers.Adagrad(0.1),
            "rmsprop": lambda: k.optimizers.RMSprop(0.01, momentum=0.5)}[optimizer]
    for kind, method in (("broadcast", "mirrored"), ("arange", "towers")):
        report = _compare(k, logical_devices[:2], kind, method, [1, 3], optimizer=make)
        assert report.is_equivalent(1e-6), (kind, method, report.table())


def test_a_variable_length_sequence_keeps_its_positions_batch_independent(logical_devices, keras3):
    """``range(shape(x)[1])`` of an ``Input((None,))``: the length is known only when the step runs, yet it is
    no function of the batch."""
    report = _compare(keras3, logical_devices[:2], "arange", "towers", [1, 3], length=None)
    assert report.is_equivalent(1e-6), report.table()


def test_two_batch_independent_lookups_of_one_table(logical_devices, keras3):
    """On one tape over several devices (towers) they cannot be told apart: refused, naming the variable;
    mirrored keeps each replica's gradient apart and is exact."""
    from harness.parallel.sparse import SparseLayoutError

    with pytest.raises(SparseLayoutError, match=r"variable '.*embeddings' is looked up 2 times per device"):
        _compare(keras3, logical_devices[:2], "twice", "towers", [1, 3])
    assert _compare(keras3, logical_devices[:2], "twice", "mirrored", [1, 3]).is_equivalent(1e-6)


@pytest.mark.parametrize(("kind", "planted"), [("arange", True), ("broadcast", False)],
                         ids=["all-batch-dependent", "all-batch-independent"])
def test_a_wrong_row_layout_is_caught(logical_devices, keras3, monkeypatch, kind, planted):
    """The planted defects: every lookup taken for batch-dependent (blocks left one per device), or for
    batch-independent (each device's rows summed into one block, which fails where the devices' row counts
    differ). Adam then differs from one device, or the step cannot run."""
    import tensorflow as tf

    from harness.parallel import sparse

    monkeypatch.setattr(sparse, "depends_on_batch", lambda tensor, sources: planted)
    for method in METHODS:
        try:
            report = _compare(keras3, logical_devices[:2], kind, method, [1, 3])
        except tf.errors.InvalidArgumentError as err:
            assert not planted and "must have the same size and shape" in str(err), err
            continue
        assert report.max_deviation > 1e-4, (method, report.table())


def test_depends_on_batch_reads_the_traced_graph(logical_devices):
    import tensorflow as tf

    from harness.parallel.sparse import depends_on_batch

    found = {}

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32)])
    def trace(x):
        shape = tf.shape(x)
        batch, length = tf.unstack(shape)
        cases = {
            "tokens": x, "cast tokens": tf.cast(x, tf.int64) + 1, "range(length)": tf.range(shape[1]),
            "range(shape[-1])": tf.range(tf.shape(x)[-1]), "range(unstacked length)": tf.range(length),
            "range(batch)": tf.range(shape[0]), "range(unstacked batch)": tf.range(batch),
            "broadcast positions": tf.broadcast_to(tf.range(shape[1])[None], shape), "constant": tf.range(5),
            "shape[0:1]": tf.range(tf.reduce_sum(shape[0:1])), "shape[1:]": tf.range(tf.reduce_sum(shape[1:])),
        }
        found.update({name: depends_on_batch(t, [x]) for name, t in cases.items()})
        return x

    trace.get_concrete_function()
    assert found == {"tokens": True, "cast tokens": True, "range(length)": False, "range(shape[-1])": False,
                     "range(unstacked length)": False, "range(batch)": True, "range(unstacked batch)": True,
                     "broadcast positions": True, "constant": False, "shape[0:1]": True, "shape[1:]": False}
    assert depends_on_batch(tf.constant([1, 2]), []) is True  # eager: the rows are kept as they are
