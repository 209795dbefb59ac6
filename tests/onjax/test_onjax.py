"""Keras 3 on JAX: ``harness.parallelize`` over 3 JAX CPU devices at ratios [5, 3, 2], judged as on TensorFlow.

Every case runs in a JAX process of its own (tests/onjax/jax_process.py: ``KERAS_BACKEND=jax``, 3 CPU devices, any
attempt to import TensorFlow failing the test). The cases are the TensorFlow suite's models (tests/onjax/jax_cases.py),
each judged by ``compare_training`` with the float64 reference (``jax_enable_x64``) and the rounding floor, and held
to its pinned outcome (``PINS``): exact, as accurate as one device, or refused with a reason id. A FAIL is never
pinned. The verdicts are shown failing on planted defects of the JAX towers.
"""

from __future__ import annotations

import json

import pytest
from jax_process import ROOT, run_jax, run_jax_script

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

CASES = ROOT / "tests" / "onjax" / "jax_cases.py"

# Each case's outcome on 3 JAX CPU devices at [5, 3, 2], tol 1e-6 (jax 0.10.2, Keras 3.15.1, at 137df77+).
PINS = {
    "dense": "exact",
    "cnn_bn": "exact",  # whole-batch BatchNormalization statistics over uneven shards (segments)
    "gru": "exact",
    "two_input": "exact",  # sample weights, two inputs, weight regularisers
    "dense_l2": "exact",
    "dense_bn": "exact",
    "nested_bn": "exact",
    "activity": "exact",  # activity regularisers: each device's losses weighted by its rows
    "embedding": "exact",
    "two_outputs": "exact",
    "masked_sequence": "exact",  # the Masking layer's mask merged with the outputs (FAIL, 9.8e-3, before it was)
    "softmax": "exact",
    "subclassed": "exact",
    "dropout": "exact",  # with Dropout and GaussianNoise off; named, and different with them on
    "mixed_float16": "as accurate as one device",  # float16 rounding: within the floor of one device
    "cnn_bn_mixed_float16": "as accurate as one device",  # BatchNormalization under mixed_float16: float32 moments
}
QUICK = ["cnn_bn"]  # its own test, then the rest (dense: the API test and the planted defect below train it)


def _outcome(row: dict) -> str:
    return f"refused: {row['refused']}" if "refused" in row else row["verdict"]


def _judged(cases, *extra):
    *rows, env = run_jax_script(CASES, *cases, *extra, timeout=900)
    assert not env["tensorflow_imported"] and env["keras_backend"] == "jax" and len(env["devices"]) == 3, env
    return {row["case"]: row for row in rows}


def _check_pins(rows: dict) -> None:
    for name, row in rows.items():
        assert _outcome(row) == PINS[name], f"{name}: {json.dumps(row)}"
        if row.get("reference_exact") is not None:  # run where float32 differs beyond tol
            assert row["reference_exact"] < 1e-12, row  # in float64 the split is the single-device step
    if "dropout" in rows:
        assert rows["dropout"]["random_layers"] == ["Dropout", "GaussianNoise"]
        assert rows["dropout"]["with_randomness"] > 1e-3  # each device draws its own numbers: named, not failed


# Quick tests elsewhere take these paths: BatchNormalization's cut and combination exact in float64 at 7:2:1, the
# zoo's pins judged by compare_training on JAX, a user's models through harness check on JAX and a planted model
# failing there.
_QUICK_PATHS = ("tests/onjax/test_batchnorm_jax.py::"
                "test_a_shared_batchnorm_in_a_nested_model_equals_one_device_with_a_one_row_shard",
                "tests/onjax/test_zoo_jax.py::test_a_sample_meets_its_pins_and_a_planted_pin_fails",
                "tests/onjax/test_user_model_jax.py::test_a_planted_batch_mixing_layer_exits_1")


@pytest.mark.extended  # 26 s idle
@pytest.mark.covered_by(*_QUICK_PATHS)
def test_the_check_models_meet_their_pins_on_three_jax_devices():
    _check_pins(_judged(QUICK))


@pytest.mark.extended
@pytest.mark.slow  # 151 s in .ci/run: slow.yml; the check models' pins run in the extended step
def test_every_case_meets_its_pin_on_three_jax_devices():
    _check_pins(_judged([name for name in PINS if name not in QUICK]))


@pytest.mark.extended  # 19 s idle; a lost gradient fails the quick float64 BatchNormalization case (1e-12)
@pytest.mark.covered_by(*_QUICK_PATHS)
def test_a_dropped_device_gradient_fails():
    # Planted defect: the last device's gradient left out of the sum. The verdict must be FAIL, and in float64 too.
    row = _judged(["dense"], "--plant", "last-device-gradient")["dense"]
    assert row["verdict"] == "FAIL" and row["reference_exact"] > 1e-3, row


@pytest.mark.extended
def test_losses_weighted_evenly_instead_of_by_rows_fail():
    # Planted defect: each device's activity-regulariser losses weighted 1/3 instead of by its share of the rows.
    row = _judged(["activity"], "--plant", "even-shares")["activity"]
    assert row["verdict"] == "FAIL" and row["reference_exact"] > 1e-3, row


_API = """
import json, os, sys, tempfile
import harness
devices = harness.use_jax_cpu_devices(3)
import keras, numpy as np
from harness.errors import Refused, NotSupported

out = {}
from harness.compat import set_random_seed
set_random_seed(0)  # (Keras' own seeding would try TensorFlow)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(23, 4)).astype("float32"), rng.normal(size=(23, 2)).astype("float32")

def build():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])

template = build()
start = template.get_weights()
parallel = harness.parallelize(template, ["cpu:0", "cpu:1", "cpu:2"], ratios=[5, 3, 2])
out["method"] = parallel.method
out["devices"] = list(parallel.devices)
parallel.compile(optimizer="adam", loss="mse", metrics=["mae"])
history = parallel.fit(x, y, batch_size=10, epochs=2, verbose=0, shuffle=False).history  # last batch 3: a row each
one = build(); one.set_weights(start); one.compile(optimizer="adam", loss="mse", metrics=["mae"])
single = one.fit(x, y, batch_size=10, epochs=2, verbose=0, shuffle=False).history
out["fit"] = max(float(np.max(np.abs(a - b))) for a, b in zip(template.get_weights(), one.get_weights()))
out["losses"] = [history["loss"], single["loss"]]
out["evaluate"] = [parallel.evaluate(x, y, batch_size=7, verbose=0), one.evaluate(x, y, batch_size=7, verbose=0)]
out["predict"] = float(np.max(np.abs(parallel.predict(x, batch_size=2, verbose=0) - one.predict(x, verbose=0))))
path = os.path.join(tempfile.mkdtemp(), "model.keras")
parallel.save(path)
out["saved"] = float(np.max(np.abs(keras.saving.load_model(path).predict(x, verbose=0) - one.predict(x, verbose=0))))

def refused(call):
    try:
        call()
    except (Refused, NotSupported) as err:
        return err.reason
    return None

class OwnMoments(keras.layers.BatchNormalization):  # moments of its own: harness shares Keras' own only
    def _moments(self, inputs, mask):
        return super()._moments(inputs, mask)

bn = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), OwnMoments(), keras.layers.Dense(2)])
out["batchnorm"] = refused(lambda: harness.parallelize(bn, devices, ratios=[5, 3, 2]))
out["batchnorm_unsynced"] = refused(lambda: harness.parallelize(bn, devices, sync_batchnorm=False))

class Rematerialised(keras.layers.Layer):  # its BatchNormalization inside jax.checkpoint: the cut cannot reach it
    def __init__(self):
        super().__init__()
        self.norm = keras.layers.BatchNormalization()
    def call(self, x, training=False):
        import jax
        return jax.checkpoint(lambda v: self.norm(v, training=training))(x)

remat = harness.parallelize(keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), Rematerialised(),
                                              keras.layers.Dense(2)]), devices)
remat.compile(optimizer="sgd", loss="mse")
out["batchnorm_in_checkpoint"] = refused(lambda: remat.fit(x, y, batch_size=10, verbose=0))
out["mirrored"] = refused(lambda: harness.parallelize(build(), devices, method="mirrored"))
out["jit"] = refused(lambda: harness.parallelize(build(), devices).compile(optimizer="sgd", loss="mse",
                                                                         jit_compile=True))

class Counter(keras.layers.Layer):  # state a forward pass updates, other than a seed
    def build(self, shape):
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False)
    def call(self, x, training=False):
        if training:
            self.seen.assign(self.seen + 1.0)
        return x

counting = harness.parallelize(keras.Sequential([keras.Input((4,)), Counter(), keras.layers.Dense(2)]), devices)
counting.compile(optimizer="sgd", loss="mse")
out["stateful"] = refused(lambda: counting.fit(x, y, batch_size=10, verbose=0))

class OwnStep(keras.Model):
    def train_step(self, state, data):
        return super().train_step(state, data)

own = OwnStep(*(lambda i: (i, keras.layers.Dense(2)(i)))(keras.Input((4,))))
out["own_step"] = refused(lambda: harness.parallelize(own, devices))
try:
    harness.parallelize(build(), ["cpu:7"])
except ValueError as err:
    out["bad_device"] = str(err)
out["tensorflow"] = "tensorflow" in sys.modules
print(json.dumps(out))
"""


def test_fit_evaluate_predict_and_save_equal_one_device_and_refusals_are_named():
    out = json.loads(run_jax(_API).stdout.strip().splitlines()[-1])
    assert out["method"] == "towers" and out["devices"] == ["cpu:0", "cpu:1", "cpu:2"]
    assert out["fit"] < 1e-6 and out["predict"] < 1e-6 and out["saved"] < 1e-6, out
    assert out["losses"][0] == pytest.approx(out["losses"][1], abs=1e-6)
    assert out["evaluate"][0] == pytest.approx(out["evaluate"][1], abs=1e-6)
    assert (out["batchnorm"], out["mirrored"], out["jit"], out["stateful"], out["own_step"]) == (
        "jax-batchnorm", "jax-method", "jax-jit-compile", "jax-stateful-layer", "custom-train-step"), out
    assert out["batchnorm_unsynced"] is None, out  # per-device statistics: nothing to share
    assert out["batchnorm_in_checkpoint"] == "jax-batchnorm", out
    assert "cpu:7" in out["bad_device"] and "cpu:0" in out["bad_device"], out["bad_device"]
    assert out["tensorflow"] is False


_BLOCKED = """
import json, sys
from harness.compat import block_tensorflow
reported = []
blocker = block_tensorflow(lambda name, stack: reported.append(name))
try:
    import tensorflow  # noqa: F401
    imported = True
except ModuleNotFoundError:
    imported = False
from keras.src.utils.module_utils import tensorflow as lazy  # Keras' own probe for an optional TensorFlow
print(json.dumps({"imported": imported, "probe_available": lazy.available, "attempts": blocker.attempts,
                  "own": blocker.own, "reported": reported, "in_modules": "tensorflow" in sys.modules}))
"""


def test_the_tensorflow_blocker_fails_and_names_every_import_and_knows_keras_own_probe():
    # The guard every JAX process of these tests runs under (and wheel-smoke's, device-check's): an import of
    # TensorFlow fails as if it were not installed and is named; Keras' probe is recorded but is not the caller's.
    out = json.loads(run_jax(_BLOCKED, allow_tf=True).stdout.strip().splitlines()[-1])
    assert out["imported"] is False and out["probe_available"] is False and out["in_modules"] is False, out
    assert [a["keras_probe"] for a in out["attempts"]] == [False, True], out["attempts"]
    assert out["attempts"][0]["from"].startswith("<string>:") and out["own"] == out["attempts"][:1]
    assert out["reported"] == ["tensorflow"]
