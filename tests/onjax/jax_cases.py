"""The equivalence cases of Keras 3 on JAX, run in a JAX process (tests/onjax/jax_process.py) by test_onjax.py.

``python tests/onjax/jax_cases.py CASE...`` judges each case as ``harness check`` does (``compare_training`` with the
float64 reference and the rounding floor, random layers compared both ways) on 3 JAX CPU devices and prints one JSON
line per case: its verdict at tol 1e-6, or the reason id of its refusal (the parallel float64 run and the floor only
where the float32 runs differ by more than tol, as ``harness check`` does). The models are the TensorFlow suite's own
(tests/parallel/keras_models.py, test_conformance.py, harness.bench.workloads.small), built with Keras 3 on JAX.
``--plant NAME`` runs them with a planted defect of the JAX towers (``_plant``); ``--ratios 7:2:1`` another split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "parallel")]

import harness  # noqa: E402

DEVICES = harness.use_jax_cpu_devices(3)

import keras  # noqa: E402
import keras_models  # noqa: E402  tests/parallel/keras_models.py
import test_conformance as conformance  # noqa: E402  tests/parallel/test_conformance.py

from harness.bench.workloads import small  # noqa: E402
from harness.errors import Refused  # noqa: E402

TOL = 1e-6


def _dropout():
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3),
                             keras.layers.GaussianNoise(0.1), keras.layers.Dense(3)])


def _mixed():  # built under the global mixed_float16 policy (judge sets it; float64 is built under float64's)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(3), keras.layers.Activation("linear", dtype="float32")])


def _mixed_bn():  # a convnet with BatchNormalization under mixed_float16 (its statistics computed in float32)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3), keras.layers.BatchNormalization(),
                             keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3),
                             keras.layers.Activation("linear", dtype="float32")])


def _small(name, **extra):
    def case(samples=62):
        x, y, sw = small.make_data(name, samples)
        return dict(build=lambda: small.build(name), x=x, y=y, sample_weight=sw, loss=small.loss(), **extra)
    return case


def _peer(name):
    def case(samples=61):
        x, y = keras_models.data(name, samples)
        return dict(build=lambda: keras_models.build(keras, name), x=x, y=y, loss=small.loss(), metrics=["accuracy"],
                    optimizer=lambda: keras_models.momentum_sgd(keras))
    return case


def _conformance(name):
    def case(samples=45):
        x, y = conformance._data(name, samples)
        return dict(build=lambda: conformance.BUILDERS[name](keras), x=x, y=y, **conformance._loss(keras, name),
                    optimizer=lambda: keras.optimizers.SGD(0.05, momentum=0.5))
    return case


def _own(build, loss="sparse_categorical_crossentropy", optimizer="adam", policy=None, data="dense"):
    def case(samples=62):
        x, y, _ = small.make_data(data, samples)
        return dict(build=build, x=x, y=y, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                    if loss == "logits" else loss, optimizer=optimizer, policy=policy)
    return case


CASES = {
    # harness check's models (harness.bench.workloads.small), at its defaults: 62 samples at batch 20 (last batch 2)
    "dense": _small("dense", optimizer="adam"),
    "cnn_bn": _small("cnn_bn"),
    "gru": _small("gru", optimizer="rmsprop"),
    "two_input": _small("two_input", optimizer="adam"),
    # the TensorFlow suite's BatchNormalization forms, penalties and activity regularisers (keras_models.py)
    "dense_l2": _peer("dense_l2"),
    "dense_bn": _peer("dense_bn"),
    "nested_bn": _peer("nested_bn"),
    "activity": _peer("activity"),
    # models people train that once crashed or drifted on TensorFlow (test_conformance.py)
    "embedding": _conformance("embedding"),
    "two_outputs": _conformance("two_outputs"),
    "masked_sequence": _conformance("masked_sequence"),
    "softmax": _conformance("softmax"),
    "subclassed": _conformance("subclassed"),
    # randomness (judged with it off) and mixed precision (loss scaling; judged against its own floor)
    "dropout": _own(_dropout, loss="logits"),
    "mixed_float16": _own(_mixed, loss="logits", policy="mixed_float16"),
    "cnn_bn_mixed_float16": _own(_mixed_bn, loss="logits", policy="mixed_float16", data="cnn_bn"),
}


def _plant(name: str) -> None:
    """A defect of the JAX towers the verdict must catch."""
    from harness.parallel.jax import towers as onjax

    if name == "last-device-gradient":  # the last device's gradient dropped from the sum
        summed = onjax._summed_apply

        def dropped(optimizer):
            apply = summed(optimizer)
            return lambda opt_vars, grads, own, weights: apply(opt_vars, [*grads[:-1], _zeros(grads[-1])], own,
                                                               weights)

        onjax._summed_apply = dropped
    elif name == "even-shares":  # each device's losses weighted 1/devices instead of by its rows
        merged = onjax.JaxTowers._merged_loss

        def even(self, trainable, outputs, losses, shares, *args, **kwargs):
            shares = [s * 0 + 1.0 / len(shares) for s in shares]
            return merged(self, trainable, outputs, losses, shares, *args, **kwargs)

        onjax.JaxTowers._merged_loss = even
    else:
        raise SystemExit(f"no planted defect {name!r}")


def _zeros(tree):
    import jax

    return jax.tree_util.tree_map(lambda a: a * 0, tree)


def judge(name: str, ratios=(5, 3, 2), batch_size: int = 20) -> dict:
    spec = CASES[name]()
    batch_size = spec.pop("batch_size", batch_size)
    build, x, y = spec.pop("build"), spec.pop("x"), spec.pop("y")
    spec.setdefault("optimizer", "sgd")
    policy = spec.pop("policy", None)
    if policy:
        keras.config.set_dtype_policy(policy)
    try:
        report = harness.compare_training(build, x, y, devices=DEVICES, ratios=list(ratios), method="towers",
                                          batch_size=batch_size, reference="float64",
                                          skip_float64_parallel_within=TOL, **spec)
    except Refused as err:
        return {"case": name, "refused": err.reason, "error": str(err)}
    finally:
        keras.config.set_dtype_policy("float32")
    row = {"case": name, "verdict": report.verdict(TOL), "max_deviation": report.max_deviation,
           "reference_exact": report.reference_exact, "floor": report.floor, "steps": report.steps,
           "random_layers": list(report.random_layers)}
    if report.with_randomness is not None:
        row["with_randomness"] = report.with_randomness.max_deviation
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", choices=list(CASES))
    parser.add_argument("--plant")
    parser.add_argument("--ratios", default="5:3:2", help="the split, e.g. 7:2:1")
    args = parser.parse_args()
    if args.plant:
        _plant(args.plant)
    ratios = tuple(float(r) for r in args.ratios.split(":"))
    rows = [{**judge(name, ratios), "ratios": list(ratios)} for name in args.cases]
    rows.append({"tensorflow_imported": "tensorflow" in sys.modules, "keras_backend": keras.backend.backend(),
                 "devices": [str(d) for d in DEVICES]})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
