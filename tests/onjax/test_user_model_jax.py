"""A team's own model on Keras 3's JAX backend, end to end: ``harness check --model MODULE:ATTR --backend jax``.

The models live in a package of their own in a folder outside harness' repository (the working directory of the
run, as a team runs ``harness check`` from its repository's root): Keras 3 code, nothing of harness, data as NumPy
arrays (``--data``). Each run is a JAX process with 3 CPU devices and any attempt of harness to import TensorFlow
failing the test (tests/onjax/jax_process.py). The verdict's exit status: 0 equivalent, 1 not (a planted layer
that mixes the batch's rows, written with ``keras.ops`` as tests/parallel/test_user_model.py's TensorFlow test
writes it), 2 a usage error (a bad reference; a tf.data pipeline, which is TensorFlow's, named). What the
TensorFlow adapters read of a model (its inputs, outputs and compile arguments) is read on JAX by
``harness.parallel.adapters.keras3io``, shown on its own last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jax_process import ROOT, jax_env, run_harness_cli, run_jax  # tests/onjax/jax_process.py

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

MODELS = '''
"""A team's models, as it writes them: Keras 3, nothing of harness; their data as NumPy arrays."""
import keras
import numpy as np
from keras import layers


class BatchCentre(layers.Layer):
    """Subtracts the batch's mean feature: each row's output depends on the other rows of its batch."""

    def call(self, x):
        return x - keras.ops.mean(x, axis=0, keepdims=True)


def _mlp(*middle):
    inputs = keras.Input((12,), name="features")
    x = layers.Dense(16, activation="relu")(inputs)
    for layer in middle:
        x = layer(x)
    model = keras.Model(inputs, layers.Dense(3)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def build():
    return _mlp()


def build_mixing():  # a planted batch-mixing layer: not the single device's step on a split batch
    return _mlp(BatchCentre())


def uncompiled():
    return keras.Sequential([keras.Input((12,)), layers.Dense(3)])


def arrays(batch_size):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * batch_size, 12)).astype("float32")
    return x, rng.integers(0, 3, size=(4 * batch_size,))


def pipeline(batch_size):  # what works on TensorFlow, refused on JAX by name
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(arrays(batch_size)).batch(batch_size)
'''

CONVNET = '''
"""A team's convnet with BatchNormalization: Conv -> BN -> ReLU blocks around a residual add, BN after a Dense."""
import keras
import numpy as np
from keras import layers


def _block(x, width):
    return layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(x)))


def build():
    inputs = keras.Input((8, 8, 3))
    x = _block(inputs, 6)
    x = layers.Add()([x, _block(x, 6)])
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.ReLU()(layers.BatchNormalization()(layers.Dense(12, use_bias=False)(x)))
    model = keras.Model(inputs, layers.Dense(4)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def arrays(batch_size):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4 * batch_size, 8, 8, 3)).astype("float32")
    return x, rng.integers(0, 4, size=(4 * batch_size,))
'''

# 2 full steps and a partial one of 2 rows (split 1/1/0: a device sits the last step out)
SHORT = ["--backend", "jax", "--logical-cpus", "3", "--ratios", "5", "3", "2", "--samples", "42"]


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    """A team's repository outside harness': the package teampkg (models.py, convnet.py)."""
    root = tmp_path_factory.mktemp("team")
    (root / "teampkg").mkdir()
    (root / "teampkg" / "__init__.py").write_text("")
    (root / "teampkg" / "models.py").write_text(textwrap.dedent(MODELS))
    (root / "teampkg" / "convnet.py").write_text(textwrap.dedent(CONVNET))
    return root


def _check(team: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_harness_cli("check", *args, cwd=team, timeout=timeout)


def _rows(done: subprocess.CompletedProcess) -> dict[str, dict]:
    return {row["model"]: row for row in json.loads(done.stdout)["equivalence"]}


def test_a_planted_batch_mixing_layer_exits_1(team):
    done = _check(team, "--model", "teampkg.models:build_mixing", "--data", "teampkg.models:arrays", *SHORT,
                  "--json")
    assert done.returncode == 1, done.stderr[-4000:]
    (row,) = _rows(done).values()
    assert (row["method"], row["verdict"], row["passed"]) == ("towers", "FAIL", False), row
    assert row["max_deviation"] > 1e-4, row


@pytest.mark.extended  # ~60 s on 2 busy cores; the planted batch-mixing layer runs the same path
@pytest.mark.covered_by("tests/onjax/test_user_model_jax.py::test_a_planted_batch_mixing_layer_exits_1")
def test_the_teams_own_models_are_exact_exit_0(team):
    """The MLP with batches made up from its inputs and loss (no --data), and the BatchNormalization convnet with
    its own arrays: BN's statistics are the whole batch's across the uneven shards."""
    done = _check(team, "--model", "teampkg.models:build", *SHORT, "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    row = _rows(done)["teampkg.models:build"]
    assert row["verdict"] == "exact" and row["max_deviation"] <= 1e-6, row
    done = _check(team, "--model", "teampkg.convnet:build", "--data", "teampkg.convnet:arrays", *SHORT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    assert "1 of 1 checks within tol 1e-06" in done.stdout, done.stdout


@pytest.mark.parametrize("args, said", [
    (["--model", "teampkg.models:nothing"], "teampkg.models:nothing"),
    (["--model", "teampkg.models:uncompiled"], "is not compiled"),
    (["--model", "teampkg.models:build", "--methods", "mirrored"], "method='towers' only"),
])
def test_usage_errors_exit_2_in_one_line(team, args, said):
    done = _check(team, *args, *SHORT)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-4000:]
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr[-4000:]


@pytest.mark.extended  # imports TensorFlow (the team's data does) to make a dataset; ~10 s
def test_a_tf_data_pipeline_on_jax_is_named_exit_2(team):
    """On JAX the data must be arrays: the team's dataset is refused naming the reference and the value (its
    module imports TensorFlow, so this run cannot block it: harness itself reads arrays without it)."""
    code = "import sys, runpy; sys.argv = ['harness', *sys.argv[1:]]; runpy.run_module('harness', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code, "check", "--model", "teampkg.models:build", "--data",
                           "teampkg.models:pipeline", *SHORT], env={**jax_env(3), "PYTHONPATH": str(ROOT)},
                          cwd=team, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-4000:]
    line = done.stderr.strip().splitlines()[-1]
    assert "--data 'teampkg.models:pipeline'" in line and "tf.data.Dataset (<" in line, line
    assert "must be NumPy arrays" in line, line


_DESCRIBED = """
import json
import keras
from harness.parallel.adapters import keras3io

ids = keras.Input((6,), dtype="int32", name="ids")
values = keras.Input((3,), name="values")
tower = keras.Sequential([keras.layers.Embedding(77, 4), keras.layers.GlobalAveragePooling1D()])
hidden = keras.layers.Concatenate()([tower(ids), values])
two = keras.Model({"ids": ids, "values": values}, [keras.layers.Dense(4, name="cls")(hidden),
                                                     keras.layers.Dense(2, name="reg")(hidden)])
two.compile(optimizer="adam", loss=["categorical_crossentropy", "mse"], loss_weights=[1.0, 0.5],
            metrics=[["accuracy"], []])
tokens = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(30, 2), keras.layers.Flatten(),
                           keras.layers.Dense(1)])


class Sub(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


sub = Sub()
sub(keras.ops.zeros((2, 3)))
out = {name: keras3io.io_description(m) for name, m in (("two", two), ("tokens", tokens), ("sub", sub))}
given = keras3io.compile_args(two)
out["compiled"] = {"loss": given["loss"], "loss_weights": given["loss_weights"], "metrics": given["metrics"],
                   "optimizer": type(given["optimizer"]).__name__, "uncompiled": keras3io.compile_args(tokens)}
print(json.dumps(out))
"""


def test_a_keras_3_model_is_described_without_tensorflow():
    """harness.parallel.adapters.keras3io: what the TensorFlow adapters read of a user's model (its inputs and outputs
    for the made-up batches, the Embedding an integer input reaches; its compile arguments), read on JAX."""
    out = json.loads(run_jax(_DESCRIBED).stdout.strip().splitlines()[-1])
    two = out["two"]
    assert two["inputs"] == [["ids", [None, 6], "int32"], ["values", [None, 3], "float32"]], two
    assert two["outputs"] == [["cls", [None, 4], "float32"], ["reg", [None, 2], "float32"]], two
    assert two["input_tree"] == {"ids": 0, "values": 1} and two["output_tree"] == [0, 1], two
    assert two["embeddings"] == [77, None], two  # through the nested Sequential
    tokens = out["tokens"]
    assert tokens["input_tree"] == 0 and tokens["embeddings"] == [30] and tokens["inputs"][0][2] == "int32", tokens
    assert out["sub"] is None  # subclassed: no graph to read (the made-up batches need --data)
    assert out["compiled"] == {"loss": ["categorical_crossentropy", "mse"], "loss_weights": [1.0, 0.5],
                               "metrics": [["accuracy"], []], "optimizer": "Adam", "uncompiled": None}
