"""The exactness contract: a parallel step equals the single-device step on the whole batch.

Written once for both Keras generations (the ``any_keras`` fixture: Keras 3, and Keras 2 where
installed). Matrix: methods x {even, 3:2, 1:3, 5:3:2} x {Dense, CNN with BN, GRU, two-input with
sample weights and L2}. 61 samples at batch 20 end on a batch of 1, smaller than the device count,
so every case also covers the partial last batch. Then BatchNormalization in several forms (fused,
nested, a last batch of 5 over 4 devices), activity regularisers, mixed precision, subclassed models,
re-splits between steps and ``ratios="auto"``.
"""

import numpy as np
import pytest
from keras_models import (
    METHODS,
    assert_exact,
    compare,
    fixed_loss_scale,
    is_keras2,
)

import harness
from harness.bench.workloads import small

SPLITS = {"even": [1, 1, 1], "3:2": [3, 2], "1:3": [1, 3], "5:3:2": [5, 3, 2]}


def _momentum_sgd(k):
    return lambda: k.optimizers.SGD(learning_rate=0.01, momentum=0.5)  # optimizer state is compared too


@pytest.mark.parametrize("model", small.EQUIVALENCE_MODELS)
@pytest.mark.parametrize("split", [pytest.param(s, marks=pytest.mark.extended) if s in ("3:2", "1:3") else s
                                   for s in SPLITS])  # even and 5:3:2 in the quick loop, the two-device splits extended
@pytest.mark.parametrize("method", METHODS)
def test_parallel_step_equals_single_device(logical_devices, any_keras, method, split, model, shared_runs):
    # two_input: L2 penalties would count once per device; sample weights over uneven slices.
    # The cases of one model share its single-device run and each method's traced parallel model (shared_runs).
    k, ratios = any_keras, SPLITS[split]
    x, y, sample_weight = small.make_data(model, 61)
    report = harness.assert_equivalent(
        lambda: small.build(model, keras=k), x, y, devices=logical_devices[: len(ratios)], ratios=ratios,
        method=method, batch_size=20, epochs=2, optimizer=_momentum_sgd(k), loss=small.loss(k),
        metrics=["accuracy"], sample_weight=sample_weight, tol=1e-6, single_runs=shared_runs(k.__name__, model),
    )
    assert report.steps == 8
    assert report.metrics_parallel["accuracy"] == pytest.approx(report.metrics_single["accuracy"], abs=1e-6)


@pytest.mark.parametrize(("name", "ratios", "n", "batch_size"), [
    pytest.param("cnn_bn", [1, 3], 40, 40, marks=pytest.mark.extended),  # one whole batch per epoch
    ("dense_bn", [4, 3, 2, 1], 65, 20),  # last batch of 5 over 4 devices: slices 2, 1, 1, 1
    pytest.param("dense_bn", [1, 3], 61, 20, marks=pytest.mark.extended),  # last batch of 1: the single-device step
    ("conv_bn", [4, 3, 2, 1], 65, 20),  # Keras 2's fused kernel: off by 1e-3 and more without the n/(n-1) correction
    ("nested_bn", [3, 2, 1], 61, 20),  # the BatchNormalization of a nested model is synchronised too
])
@pytest.mark.parametrize("method", METHODS)
def test_batchnorm_moving_averages_are_whole_batch(logical_devices, any_keras, method, name, ratios, n, batch_size):
    report = compare(any_keras, logical_devices, method, name, ratios, n=n, batch_size=batch_size)
    assert_exact(report, steps=2 * -(-n // batch_size))  # moving mean and variance included (model weights)
    moving = [d for d in report.diffs if "moving_variance" in d.name]
    assert moving and max(d.deviation for d in moving) < 1e-6


def _keras2_mirrored_extended(test: str) -> list:
    """``method``'s cases: both quick on Keras 3; on Keras 2 towers quick, mirrored extended (``keras2_extended``),
    its path the Keras 2 towers case's (``covered_by``)."""
    towers = f"tests/parallel/test_equivalence.py::{test}[keras2-towers]"
    return ["towers", pytest.param("mirrored", marks=[pytest.mark.keras2_extended, pytest.mark.covered_by(towers)])]


@pytest.mark.parametrize("method", _keras2_mirrored_extended("test_per_device_batchnorm_is_not_exact"))
def test_per_device_batchnorm_is_not_exact(logical_devices, any_keras, method):
    # The control: sync_batchnorm=False keeps per-device statistics, so the comparisons above can fail.
    k = any_keras
    x, y, _ = small.make_data("cnn_bn", 40)
    with pytest.raises(AssertionError, match="moving_"):
        harness.assert_equivalent(
            lambda: small.build("cnn_bn", keras=k), x, y, devices=logical_devices[:2], ratios=[1, 3], method=method,
            batch_size=40, optimizer="sgd", loss=small.loss(k), sync_batchnorm=False,
        )
    report = compare(k, logical_devices, method, "dense_bn", [3, 1], sync_batchnorm=False)
    assert report.max_deviation > 1e-3


@pytest.mark.parametrize("method", METHODS)
def test_activity_regularisers_are_exact(logical_devices, any_keras, method):
    # Keras 2 and Keras 3.14+ divide an activity regulariser by the slice's batch size, Keras 3.0-3.13 do
    # not: summed where they are means, 4:3:2:1 splits doubled the epoch loss (Keras 3.15).
    assert_exact(compare(any_keras, logical_devices, method, "activity", [4, 3, 2, 1], n=65))


@pytest.mark.parametrize("method", METHODS)
def test_mixed_precision(logical_devices, any_keras, method):
    # The single-device step of the last batch (1 sample) must unscale the LossScaleOptimizer's
    # gradients: without it the weights end 1e3 away. A fixed loss scale: a dynamic one skips a step
    # when a float16 gradient overflows, and a device's partial gradient overflows where the whole
    # batch's does not (or the reverse).
    k = any_keras
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        report = compare(k, logical_devices, method, "dense_l2", [3, 2, 1], metrics=None,
                         optimizer=lambda: fixed_loss_scale(k, k.optimizers.SGD(0.05)))
    finally:
        k.mixed_precision.set_global_policy("float32")
    assert report.max_deviation <= 1e-3, report.table()  # float16 rounding: 4e-5 (tf-keras), 2e-4 (2.15)


def _subclassed_with_batchnorm(k):
    class Net(k.Model):
        def __init__(self, **kwargs):
            super().__init__(**{"name": "net", **kwargs})
            self.dense, self.norm = k.layers.Dense(4), k.layers.BatchNormalization()

        def call(self, x, training=None):
            return self.norm(self.dense(x), training=training)

    net = Net()
    net(np.zeros((2, 3), "float32"))
    return net


def test_subclassed_models_need_sync_off_for_towers_and_are_cloned_for_mirrored(logical_devices, any_keras):
    # Towers sync BatchNormalization by walking a graph, which a subclassed model has not; mirrored rebuilds
    # the model from its config (tf_keras' clone_model takes graph models only) and synchronises its layers.
    from harness.compat import Keras2NotSupported

    k, devices = any_keras, logical_devices[:2]
    # The refusal is spelled per generation: Keras 2's adapter names the layer before towers would.
    error, refused = (Keras2NotSupported, "net \\(a subclassed model with BatchNormalization") if is_keras2(k) else \
        (ValueError, "needs a Functional or Sequential model .* got a subclassed Net")
    with pytest.raises(error, match=refused):
        harness.parallelize(_subclassed_with_batchnorm(k), devices, method="towers")
    harness.parallelize(_subclassed_with_batchnorm(k), devices, method="towers", sync_batchnorm=False)
    rng = np.random.default_rng(0)
    x, y = (3 * rng.normal(size=(45, 3)) + 1).astype("float32"), rng.normal(size=(45, 4)).astype("float32")
    report = harness.compare_training(lambda: _subclassed_with_batchnorm(k), x, y, devices=devices,
                                      ratios=[1, 3], method="mirrored", batch_size=20, epochs=2, loss="mse",
                                      optimizer=lambda: k.optimizers.SGD(0.05, momentum=0.5))
    assert report.is_equivalent(1e-6), report.table()


def _resplit(k, schedule):
    """A callback that sets the next ratios of ``schedule`` before every step (a rebalancer that re-splits at will)."""

    class Resplit(k.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step, self.seen = 0, []

        def on_train_batch_begin(self, batch, logs=None):
            self.seen.append(self.model.set_ratios(schedule[self.step % len(schedule)]))
            self.step += 1

    return Resplit()


@pytest.mark.extended
@pytest.mark.parametrize("model", ["dense", "cnn_bn"])
@pytest.mark.parametrize("method", METHODS)
def test_changing_ratios_mid_training_stays_exact(logical_devices, any_keras, method, model):
    # Rebalance: a re-split between steps must leave every step the single-device step.
    k = any_keras
    x, y, sample_weight = small.make_data(model, 61)
    resplit = _resplit(k, [[5, 3, 2], [1, 1, 8], [1, 3, 1], [1000, 1, 1]])
    report = harness.assert_equivalent(
        lambda: small.build(model, keras=k), x, y, devices=logical_devices[:3], ratios=[1, 1, 1], method=method,
        batch_size=20, epochs=2, optimizer=_momentum_sgd(k), loss=small.loss(k), sample_weight=sample_weight,
        tol=1e-6, callbacks=[resplit],
    )
    assert report.steps == 8 and len(set(resplit.seen)) == 4


@pytest.mark.parametrize("ratios", [[1, 1], "auto"], ids=["fixed", "auto"])
@pytest.mark.parametrize("method", METHODS)
def test_a_users_rebalance_on_timed_devices_stays_exact(logical_devices, any_keras, method, ratios):
    # fixed: timing is added after the first fit built the step function: Rebalance rebuilds it with timed
    # devices. auto: the user's Rebalance replaces the built-in one.
    from harness.parallel.rebalance import rebalance_class

    k, made = any_keras, []

    def parallelize(template, devices, ratios):  # compare_training's hook: keeps the parallel model
        made.append(harness.parallelize(template, devices, ratios=ratios, method=method))
        return made[-1]

    x, y, _ = small.make_data("dense", 64)
    rebalance = rebalance_class(k)(every=2, tolerance=0.0, warmup=1)
    report = harness.assert_equivalent(
        lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:2], ratios=ratios, method=parallelize,
        batch_size=8, epochs=3, optimizer=_momentum_sgd(k), loss=small.loss(k), tol=1e-6, callbacks=[rebalance],
    )
    assert report.steps == 24 and len(rebalance.history) >= 5
    for entry in rebalance.history:
        assert entry["batch"] == 8 and sum(entry["batches"]) == 8
        assert sum(entry["samples"]) == 8 * entry["steps"][0]
    (parallel,) = made
    assert parallel.rebalancer is None or not parallel.rebalancer.history  # the user's ran, no built-in one


@pytest.mark.parametrize("method", METHODS)
def test_auto_ratios_are_exact(logical_devices, any_keras, method):
    k = any_keras
    x, y, _ = small.make_data("dense", 64)
    report = harness.assert_equivalent(
        lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:2], ratios="auto", method=method,
        batch_size=8, epochs=3, optimizer=_momentum_sgd(k), loss=small.loss(k), tol=1e-6,
    )
    assert report.steps == 24 and len(report.ratios) == 2


def test_the_seed_alone_fixes_the_start_whatever_seeded_keras_before(logical_devices, any_keras):
    """``compare_training(seed=...)`` seeds through ``harness.compat.set_random_seed``. Keras 2 keeps a
    seed generator of its own: after a caller's ``utils.set_random_seed``, seeding TF alone built other
    initial weights (a later conformance test started from them and ended 3.9e-6 off, rounding judged
    against 1e-6)."""
    from harness.compat import set_random_seed

    k = any_keras

    def start():
        set_random_seed(0)
        return k.Sequential([k.Input((4,)), k.layers.Dense(3)]).get_weights()[0]

    first = start()
    k.utils.set_random_seed(7)
    k.layers.Dense(5)(np.zeros((1, 2), "float32"))
    np.testing.assert_array_equal(start(), first)


def test_compared_models_leave_no_graph_behind(logical_devices, any_keras):
    """Keras' optimizers register a ``tf.custom_gradient`` in TF's global registry in every traced train
    step, holding the step's graph for the life of the process (0.5 GB per zoo model). A plain ``fit``
    leaves such names behind; ``compare_training`` (its single, parallel and float64 runs) does not."""
    from tensorflow.python.framework import ops

    from harness.compat import releasing_traced_graphs

    k = any_keras
    x, y, _ = small.make_data("dense", 24)

    def names():
        return {n for n in ops._gradient_registry._registry if n.startswith("CustomGradient-")}

    def plain_fit():
        model = small.build("dense", keras=k)
        model.compile(optimizer=_momentum_sgd(k)(), loss=small.loss(k))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)

    before = names()
    plain_fit()
    assert names() - before, "a traced Keras train step no longer registers a custom gradient: drop the release"
    before = names()
    with releasing_traced_graphs():
        plain_fit()
    harness.compare_training(lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:2], ratios=[1, 2],
                             method="mirrored", batch_size=8, epochs=1, optimizer=_momentum_sgd(k), loss=small.loss(k),
                             reference="float64")
    assert names() == before


@pytest.mark.parametrize("method", _keras2_mirrored_extended("test_cases_of_one_model_share_its_traced_parallel_model"))
def test_cases_of_one_model_share_its_traced_parallel_model(logical_devices, any_keras, method, monkeypatch):
    """``compare_training(single_runs=...)`` keeps the parallel model of each method and device list: the
    next split over the same devices restores the initial weights and optimizer state and calls
    ``set_ratios``, with no retrace. Without the optimizer's restore the reused run drifts."""
    from harness.equivalence import _Traced

    k = any_keras
    x, y, _ = small.make_data("cnn_bn", 45)
    kwargs = dict(devices=logical_devices[:2], method=method, batch_size=10, epochs=2, optimizer=_momentum_sgd(k),
                  loss=small.loss(k))
    kept: dict = {}

    def compared(ratios):
        return harness.compare_training(lambda: small.build("cnn_bn", keras=k), x, y, ratios=ratios,
                                        single_runs=kept, **kwargs)

    assert compared([1, 1]).max_deviation <= 1e-6
    (traced,) = [value for key, value in kept.items() if isinstance(key, tuple)]
    function = traced.parallel.train_function
    report = compared([3, 2])
    assert report.ratios == (3.0, 2.0) and report.max_deviation <= 1e-6, report.worst(5)
    assert traced.parallel.train_function is function  # the same traced step

    assert compared([2, 3]).max_deviation <= 1e-6

    def without_optimizer(self, weights, ratios):
        self.parallel.set_weights(weights)
        self.parallel.sync_to_template()
        self.parallel.set_ratios(ratios)
        return self.parallel

    monkeypatch.setattr(_Traced, "restored", without_optimizer)
    assert compared([2, 3]).max_deviation > 1e-4  # the momentum of the last run carried over


@pytest.mark.keras2_extended  # Keras 2's float64 reference, and its shared parallel model in float32
@pytest.mark.covered_by("tests/parallel/test_fidelity.py::test_keras2_gets_a_float64_reference",
                        "tests/parallel/test_equivalence.py::test_cases_of_one_model_share_its_traced_parallel_model"
                        "[keras2-towers]")
def test_the_parallel_float64_model_is_shared_too(logical_devices, any_keras):
    """With ``reference="float64"`` the parallel model in float64 is kept and restored like the float32 one:
    the reused run still equals one device in float64."""
    k = any_keras
    x, y, _ = small.make_data("dense", 45)
    kept: dict = {}
    for ratios in ([1, 1], [3, 2], [1, 4]):
        report = harness.compare_training(
            lambda: small.build("dense", keras=k), x, y, devices=logical_devices[:2], ratios=ratios, method="towers",
            batch_size=10, epochs=2, optimizer=_momentum_sgd(k), loss=small.loss(k), reference="float64",
            single_runs=kept)
        assert report.verdict() == "exact" and report.reference_exact <= 1e-9, (ratios, report.summary())
    assert sorted(key[0] for key in kept if isinstance(key, tuple) and key[0] != "floor") == ["float64", "parallel"]
    # The floor's runs: each row order once for the three splits, the sub-batches' order once per split.
    floors = [key[1:] for key in kept if isinstance(key, tuple) and key[0] == "floor"]
    assert sorted(floors) == sorted([("permuted",), ("reversed",), ("rotated",)]
                                    + [("sub-batches", r) for r in ((1.0, 1.0), (3.0, 2.0), (1.0, 4.0))]), floors


def test_a_refused_first_call_leaves_the_single_run_starting_where_the_others_do(logical_devices, keras3):
    """Shared ``single_runs``: the first call keeps the initial weights and is refused before the single-device
    run trains; the next call builds the single-device model again and must start it from those weights. It did
    not: its single run trained from whatever ``build_model()`` drew the second time (ConvNeXt: the zoo's mirrored
    rows 0.48 from one device after the towers refusal, exact alone). A ``build_model`` that draws new weights
    on each call (no seed of its own) shows it on any model."""
    from harness.errors import Refused

    k = keras3
    x, y, _ = small.make_data("dense", 45)
    draws = iter(range(100))

    def build():
        return k.Sequential([k.Input((x.shape[1],)), k.layers.Dense(
            3, kernel_initializer=k.initializers.RandomNormal(seed=next(draws)))])

    def refused(template, devices, ratios):
        raise Refused("planted", "this method is refused")

    kept: dict = {}
    arguments = dict(devices=logical_devices[:2], ratios=[3, 2], batch_size=10, epochs=2,
                     optimizer=lambda: k.optimizers.SGD(0.1),
                     loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), single_runs=kept)
    with pytest.raises(Refused):
        harness.compare_training(build, x, y, method=refused, **arguments)
    report = harness.compare_training(build, x, y, method="mirrored", **arguments)
    assert report.is_equivalent(1e-6), report.summary()
