"""BatchNormalization over uneven shards on 3 JAX CPU devices, run in a JAX process by test_batchnorm_jax.py.

``python tests/onjax/batchnorm_cases.py CASE... [--ratios 7:2:1 ...] [--plant NAME]`` trains each case's model on one
device and with ``harness.parallelize`` (method towers) from the same weights on the same batches, in float32 and in
float64 (``jax_enable_x64``, Keras' float64 promotion kept: ``float64_promoted``), and prints one JSON line: per
case and split, the largest weight deviation (``float32``, ``float64``), the largest moving-statistics deviation and
the step count. 23 samples at batch 10: the last batch of 3 rows leaves a device with none at 7:2:1, and batch 10 at
7:2:1 gives a device one row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import harness

DEVICES = harness.use_jax_cpu_devices(3)

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from harness.compat import set_random_seed  # noqa: E402
from harness.parallel.adapters.jaxtrainer import float64_promoted  # noqa: E402

L = keras.layers


def resnet_block(channels_first=False):
    """Conv -> BN -> ReLU -> Conv -> BN(center=False) + skip -> ReLU -> GAP -> Dense -> BN(scale=False) -> Dense."""
    shape, axis = ((3, 8, 8), 1) if channels_first else ((8, 8, 3), -1)
    fmt = "channels_first" if channels_first else "channels_last"
    i = keras.Input(shape)
    h = L.Conv2D(6, 3, padding="same", data_format=fmt)(i)
    h = L.ReLU()(L.BatchNormalization(axis=axis)(h))
    s = L.Conv2D(6, 3, padding="same", data_format=fmt)(h)
    s = L.BatchNormalization(axis=axis, center=False)(s)
    h = L.ReLU()(L.Add()([h, s]))
    h = L.GlobalAveragePooling2D(data_format=fmt)(h)
    h = L.BatchNormalization(scale=False)(L.Dense(8)(h))
    return keras.Model(i, L.Dense(4)(h))


def nested():
    """A BatchNormalization inside a nested model called twice (shared: its statistics asked for twice a step)."""
    inner = keras.Sequential([keras.Input((6,)), L.Dense(6), L.BatchNormalization(), L.ReLU()], name="inner")
    i = keras.Input((12,))
    a, b = inner(L.Dense(6)(i)), inner(L.Dense(6)(i))
    return keras.Model(i, L.Dense(4)(L.Concatenate()([a, b])))


def masked():
    """BatchNormalization over a masked sequence (Masking -> Dense -> BN -> LSTM): the unmasked steps' statistics."""
    i = keras.Input((5, 4))
    h = L.Dense(6)(L.Masking()(i))
    h = L.BatchNormalization()(h)
    return keras.Model(i, L.Dense(4)(L.LSTM(5)(h)))


def frozen_base():
    """Transfer learning: a frozen base with BatchNormalization (trainable=False, called with training=False) under a
    trainable head: its BatchNormalization runs in inference mode, nothing to share."""
    base = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(6, 3), L.BatchNormalization(), L.ReLU(),
                             L.GlobalAveragePooling2D()], name="base")
    base.trainable = False
    i = keras.Input((8, 8, 3))
    h = base(i, training=False)
    return keras.Model(i, L.Dense(4)(L.Dense(8, activation="relu")(h)))


def renorm():
    return keras.Sequential([keras.Input((12,)), L.Dense(8), L.BatchNormalization(renorm=True), L.ReLU(), L.Dense(4)])


def raw_features():
    """BatchNormalization as the first layer, on features far from 0 (prices, timestamps): mean 1000, spread 1."""
    return keras.Sequential([keras.Input((12,)), L.BatchNormalization(), L.Dense(8, activation="relu"), L.Dense(4)])


MODELS = {"resnet_block": resnet_block, "raw_features": raw_features, "channels_first": lambda: resnet_block(True),
          "nested": nested, "masked": masked, "frozen_base": frozen_base, "renorm": renorm}


def data(name: str, n: int = 23):
    rng = np.random.default_rng(1)
    if name in ("resnet_block", "frozen_base"):
        x = rng.normal(size=(n, 8, 8, 3))
    elif name == "channels_first":
        x = rng.normal(size=(n, 3, 8, 8))
    elif name == "masked":
        x = rng.normal(size=(n, 5, 4))
        x[np.arange(n) % 3 == 0, 3:] = 0.0  # every third sequence padded after 3 steps
    elif name == "raw_features":
        x = 1000.0 + rng.normal(size=(n, 12))
    else:
        x = 3.0 + rng.normal(size=(n, 12))
    return x.astype("float32"), rng.integers(0, 4, size=n)


def train(name: str, ratios, epochs: int):
    """``(weights of the split, of one device, the indices of the moving statistics)`` after ``epochs`` of SGD."""
    set_random_seed(0)
    template = MODELS[name]()
    start = template.get_weights()
    x, y = data(name)

    def fit(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=10, epochs=epochs, verbose=0, shuffle=False)

    one = MODELS[name]()
    one.set_weights(start)
    fit(one)
    fit(harness.parallelize(template, DEVICES, ratios=list(ratios)))
    moving = [i for i, v in enumerate(template.weights) if "moving" in v.path or "renorm" in v.path]
    return template.get_weights(), one.get_weights(), moving


def measure(name: str, ratios, epochs: int = 2, precisions=("float32", "float64")) -> dict:
    row = {"case": name, "ratios": list(ratios)}
    for precision in precisions:
        policy = keras.config.dtype_policy()
        if precision == "float64":
            jax.config.update("jax_enable_x64", True)
            keras.config.set_floatx("float64")
            keras.config.set_dtype_policy("float64")
        try:
            with float64_promoted() if precision == "float64" else contextlib.nullcontext():
                parallel, single, moving = train(name, ratios, epochs)
        finally:
            keras.config.set_floatx("float32")
            keras.config.set_dtype_policy(policy)
            jax.config.update("jax_enable_x64", False)
        diffs = [float(np.max(np.abs(a - b))) for a, b in zip(parallel, single)]
        row[precision] = max(diffs)
        row[f"{precision}_moving"] = max((diffs[i] for i in moving), default=None)
        row[f"{precision}_dtype"] = str(parallel[0].dtype)
    return row


def _plant(name: str) -> None:
    """A defect of the statistics' sharing that the measurements must show."""
    from harness.parallel.jax import segments

    segments._COMBINE.clear()
    if name == "mean-of-means":  # each device's mean and variance averaged (Flax's pmean): wrong for uneven counts
        def mean_of_means(stats, masked):
            means = [m for _, m, _ in stats]
            variances = [m2 / c for c, _, m2 in stats]
            return sum(means) / len(means), sum(variances) / len(variances)
        segments.combine = mean_of_means
    elif name == "no-statistics-gradient":  # the statistics' cotangents never reach the devices' rows
        segments.DeviceRun.add_marker_input_cts = lambda self, j, cts: None
    elif name == "sum-of-squares":  # E[x^2] - E[x]^2 from the devices' sums: cancels where the mean is large
        def sum_of_squares(stats, masked):
            n = sum(c for c, _, _ in stats)
            total = sum(c * m for c, m, _ in stats)
            squares = sum(m2 + c * m * m for c, m, m2 in stats)
            mean = total / n
            return mean, squares / n - mean * mean
        segments.combine = sum_of_squares
    else:
        raise SystemExit(f"no planted defect {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", choices=list(MODELS))
    parser.add_argument("--ratios", nargs="+", default=["5:3:2", "7:2:1"])
    parser.add_argument("--plant")
    parser.add_argument("--epochs", type=int, default=2, help="of 3 steps each (the last of 3 rows)")
    parser.add_argument("--precisions", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    args = parser.parse_args()
    if args.plant:
        _plant(args.plant)
    rows = [measure(name, [float(r) for r in split.split(":")], args.epochs, args.precisions) for name in args.cases
            for split in args.ratios]
    rows.append({"tensorflow_imported": "tensorflow" in sys.modules, "devices": [str(d) for d in DEVICES]})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
