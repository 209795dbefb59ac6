"""The rounding floor's sub-batches order on Keras 3's JAX backend (``harness.equivalence.floorjax``).

The fourth order of the floor (each batch's gradient summed from sub-batches of the split's sizes) runs on JAX as on
TensorFlow, so both backends are judged by the same four orders. Every test runs in a JAX process of its own
(tests/onjax/jax_process.py: ``KERAS_BACKEND=jax``, 3 CPU devices, any attempt to import TensorFlow failing it). The
order is measured beside the row orders, equals the whole batch's step in float64, and widens on a planted defect.
"""

from __future__ import annotations

import json

import pytest
from jax_process import run_jax

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

# The models and a single-device training run with (sub=True) and without the sub-batches order, from the same
# weights: Keras' own fit, one device. ``FLOAT64`` first in the code: 64-bit JAX and Keras' float64 policy.
_MODELS = """
import json, sys
import harness
devices = harness.use_jax_cpu_devices(3)
import jax, jax.numpy as jnp
if FLOAT64:
    jax.config.update("jax_enable_x64", True)
import keras, numpy as np
if FLOAT64:
    keras.config.set_floatx("float64"); keras.config.set_dtype_policy("float64")
from harness.compat import set_random_seed
from harness.equivalence.floor import sub_batch_steps
set_random_seed(0)
rng = np.random.default_rng(0)
N = ROWS  # batch 10; 23: a last batch of 3, a row per sub-batch (a second trace per fit: the extended tests')
FLOAT = "float64" if FLOAT64 else "float32"

def dense():  # sigmoid, not tanh: Keras 3.15's ops.tanh returns float32 of a float64 input on JAX
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="sigmoid",
                             activity_regularizer="l2", kernel_regularizer="l2"), keras.layers.Dense(3)])

def cnn_bn():
    return keras.Sequential([keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, use_bias=False),
                             keras.layers.BatchNormalization(), keras.layers.ReLU(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])

def masked():  # the Masking layer's mask reaches the loss (a loss per time step)
    inputs = keras.Input((5, 3))
    h = keras.layers.GRU(6, return_sequences=True)(keras.layers.Masking(0.0)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(h))

def embedding():
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 5)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(h))

BUILDS = dict(dense=dense, cnn_bn=cnn_bn, masked=masked, embedding=embedding)
DATA = dict(
    dense=(rng.normal(size=(N, 6)), rng.integers(0, 3, N)),
    cnn_bn=(rng.normal(size=(N, 8, 8, 2)), rng.integers(0, 3, N)),
    masked=(np.where(rng.random((N, 5, 1)) < 0.3, 0.0, rng.normal(size=(N, 5, 3))), rng.integers(0, 3, (N, 5))),
    embedding=(rng.integers(0, 30, (N, 7)), rng.integers(0, 3, N)),
)
DATA = {k: (x.astype("int32" if k == "embedding" else FLOAT), y) for k, (x, y) in DATA.items()}

def trained(name, weights, sub, rows=None, epochs=2):
    model = BUILDS[name]()
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if sub:
        assert sub_batch_steps(model, [5, 3, 2], 10) is None
    x, y = DATA[name]
    if rows is not None:
        x, y = x[rows], y[rows]
    history = model.fit(x, y, batch_size=10, epochs=epochs, shuffle=False, verbose=0).history["loss"]
    return [np.asarray(w) for w in model.get_weights()], history

def distance(a, b):
    return max(float(np.max(np.abs(u - v)) / max(1.0, float(np.max(np.abs(u))))) for u, v in zip(a, b))

def reversed_rows():  # harness.equivalence.floor's "reversed" order
    from harness.equivalence.floor import batch_order
    return batch_order("reversed", N, 10)
"""


def _run(code: str, float64: bool = False, rows: int = 20) -> dict:
    done = run_jax(f"FLOAT64 = {float64}\nROWS = {rows}\n" + _MODELS + code)
    return json.loads(done.stdout.strip().splitlines()[-1])


_QUICK = """
import harness.equivalence.floorjax as floorjax

start = BUILDS["dense"]().get_weights()
plain, _ = trained("dense", start, sub=False)
out = {"sub-batches": distance(plain, trained("dense", start, sub=True)[0]),
       "reversed": distance(plain, trained("dense", start, sub=False, rows=reversed_rows())[0])}

whole = floorjax._summed_pullbacks

def dropping_the_last(pull, y_ct, losses_ct, rows, ratios, forward):
    # Planted defect of the floor itself: the last sub-batch's gradient left out of the sum.
    calls = []
    def pulled(cotangents):
        calls.append(1)
        grads = pull(cotangents)
        return jax.tree_util.tree_map(jnp.zeros_like, grads) if len(calls) == len(ratios) else grads
    return whole(pulled, y_ct, losses_ct, rows, ratios, forward)

floorjax._summed_pullbacks = dropping_the_last
out["planted"] = distance(plain, trained("dense", start, sub=True)[0])
floorjax._summed_pullbacks = whole

class OwnStep(keras.Model):
    def train_step(self, state, data):
        return super().train_step(state, data)

inputs = keras.Input((6,))
own = OwnStep(inputs, keras.layers.Dense(3)(inputs))
own.compile(optimizer="sgd", loss="mse")
out["own_step"] = sub_batch_steps(own, [5, 3, 2], 10)
print(json.dumps(out))
"""


def test_the_sub_batches_order_runs_on_jax_beside_the_row_orders_and_widens_on_a_dropped_gradient():
    # float32, SGD with momentum, 4 steps: the sub-batches' order moves the weights about as far as reversing each
    # batch's rows does (measured: 6.0e-8 and 3.0e-8; a float32 ulp at these weights is 6e-8). Planted defect of the
    # floor itself, one sub-batch's gradient dropped (a fifth of each batch's rows): the order's distance grows to the
    # gradient's size (measured 3.1e-2), so the check that it stays with the row orders can fail. A model with a
    # training step of its own is not measured, by name, as on TensorFlow.
    out = _run(_QUICK)
    assert 0 < out["sub-batches"] < 1e-6, out  # 0: the order would not have been applied
    assert out["sub-batches"] <= 8 * max(out["reversed"], 1.2e-7), out
    assert out["planted"] > 1e-3, out
    assert out["own_step"] == "the model's own train_step", out


_EXACT = """
out = {}
for name in NAMES:
    start = BUILDS[name]().get_weights()
    plain, plain_loss = trained(name, start, sub=False)
    sub, sub_loss = trained(name, start, sub=True)
    out[name] = {"weights": distance(plain, sub), "loss": max(abs(a - b) for a, b in zip(plain_loss, sub_loss)),
                 "moved": distance(plain, start)}
print(json.dumps(out))
"""


def test_a_sub_batches_step_is_the_whole_batch_step_in_float64():
    # The backward pass is linear in the cotangents: the sub-batches' sum is the batch's gradient. In float64 the
    # trained weights equal the plain step's within float64 rounding (measured: 5.6e-17 after 4 steps), the forward
    # pass' activity regulariser (weighted by each sub-batch's share) and the kernel regulariser (once) included.
    out = _run("NAMES = ['dense']\n" + _EXACT, float64=True)["dense"]
    assert out["moved"] > 1e-2, out  # it trained
    assert out["weights"] < 1e-12 and out["loss"] < 1e-12, out


# Keras' type promotion keeps float64 on JAX for the rest of the process, as compare_training's float64 runs do.
_TRUE_FLOAT64 = """
from harness.parallel.adapters.jaxtrainer import float64_promoted
_promoted = float64_promoted()  # held: a context left unreferenced is closed, and restores Keras' table
_promoted.__enter__()
"""


@pytest.mark.extended
def test_the_sum_is_the_batch_gradient_for_masks_embeddings_and_batchnorm():
    # 23 rows, batch 10: a last batch of 3, one row per sub-batch. Masked: the Masking layer's mask reaches the
    # per-step loss (a lost mask changes the loss at once). Embedding: on JAX the lookup's gradient is a dense array
    # (jnp.take's transpose, a scatter-add into zeros) and Keras 3's JAX optimizers step dense arrays only: nothing
    # sparse to keep apart. BatchNormalization in training (whole-batch statistics): Keras 3.15 computes it in float32
    # on JAX whatever its input (BatchNormalization.call: backend.result_type(inputs.dtype, "float32"), and
    # result_type maps float64 to float32 on every backend but TensorFlow), and so does ops.tanh (the GRU's): so that
    # the float64 runs are float64, this process keeps float64 as compare_training's float64 runs do
    # (float64_promoted; measured without it: BatchNormalization 8.6e-8, float32's rounding; with it: 1.9e-16).
    # Measured: masked 5.6e-17, embedding 6.9e-18.
    out = _run(_TRUE_FLOAT64 + "NAMES = ['masked', 'embedding', 'cnn_bn']\n" + _EXACT + """
model = embedding()
grads = jax.grad(lambda t: model.stateless_call(t, [], DATA['embedding'][0])[0].sum())(
    [v.value for v in model.trainable_variables])
print(json.dumps({**out, "embedding_grad": [type(grads[0]).__name__, list(grads[0].shape)]}))
""", float64=True, rows=23)
    for name in ("masked", "embedding", "cnn_bn"):
        assert out[name]["moved"] > 1e-2 and out[name]["weights"] < 1e-12 and out[name]["loss"] < 1e-12, out
    assert out["embedding_grad"] == ["ArrayImpl", [30, 5]], out


# compare_training's report, as harness check reads it: every order measured (none "not run"), on 3 JAX CPU devices
_REPORT = """
def mixed_mlp():  # the mixed-precision guide's model: float16 layers, a float32 head (float64: built under its policy)
    policy = keras.config.dtype_policy().name
    keras.config.set_dtype_policy("mixed_float16" if policy == "float32" else policy)
    try:
        inputs = h = keras.Input((6,))
        for width in (32, 16):
            h = keras.layers.Dense(width, activation="relu")(h)
        return keras.Model(inputs, keras.layers.Activation("linear", dtype="float32")(keras.layers.Dense(3)(h)))
    finally:
        keras.config.set_dtype_policy(policy)

out = {}
for name in NAMES:
    x, y = DATA["dense" if name == "mixed" else name]
    report = harness.compare_training(mixed_mlp if name == "mixed" else BUILDS[name], x, y, devices=devices,
                                      ratios=[5, 3, 2], method="towers", batch_size=10, epochs=EPOCHS,
                                      reference="float64", optimizer=lambda: keras.optimizers.SGD(0.1),
                                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out[name] = {"orders": {o.name: [o.weights, o.why_not] for o in report.floor_orders}, "floor": report.floor,
                 "max_deviation": report.max_deviation, "verdict": report.verdict()}
print(json.dumps(out))
"""


@pytest.mark.extended
def test_compare_training_reports_every_order_for_dense_batchnorm_and_masked_models():
    # Measured (3 JAX CPU devices, [5, 3, 2], 20 rows, batch 10, 2 epochs): every order at float32's rounding, the
    # sub-batches' among them: dense and masked all 3.0e-8; cnn_bn rows 4.5e-8 to 6.0e-8, sub-batches 4.5e-8.
    out = _run("NAMES = ['dense', 'cnn_bn', 'masked']\nEPOCHS = 2\n" + _REPORT)
    for name, row in out.items():
        orders = row["orders"]
        assert list(orders) == ["reversed", "permuted", "rotated", "sub-batches"], row
        assert all(weights is not None and why is None for weights, why in orders.values()), row
        rows = max(orders[o][0] for o in ("reversed", "permuted", "rotated"))
        assert orders["sub-batches"][0] < 1e-6 and orders["sub-batches"][0] <= 8 * max(rows, 1.2e-7), (name, row)
        assert row["verdict"] == "exact", (name, row)


@pytest.mark.extended
def test_under_mixed_float16_the_sub_batches_order_is_measured_with_the_row_orders():
    # On TensorFlow's CPU kernels reordering rows barely moves a mixed_float16 run and the sub-batches' order alone
    # measures a split's rounding (tests/parallel/test_floor.py). Not so on JAX's CPU: reordering rows moves the run
    # too, as far as the sub-batches' order or further (measured, 20 rows, 6 epochs: rows 3.7e-5 to 4.6e-5,
    # sub-batches 2.3e-5), so the TensorFlow claim is not made here. What holds on both: the parallel run lands on the
    # sub-batches' order (measured: 2.27e-5 from one device, the sub-batches' distance to 3 digits).
    out = _run("NAMES = ['mixed']\nEPOCHS = 6\n" + _REPORT)["mixed"]
    orders = {name: weights for name, (weights, _) in out["orders"].items()}
    assert all(w is not None for w in orders.values()), out
    rows = max(orders["reversed"], orders["permuted"], orders["rotated"])
    assert rows > 1e-6 and 1e-6 < orders["sub-batches"] < 4 * rows, out  # float16's rounding, not float32's
    assert abs(out["max_deviation"] - orders["sub-batches"]) <= 1e-3 * orders["sub-batches"], out
    assert out["verdict"] == "as accurate as one device", out
