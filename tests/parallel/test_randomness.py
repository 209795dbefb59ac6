"""Training-time randomness named, not failed blind (docs/concepts/exactness.md, "Randomness").

A layer that draws random numbers in training (Dropout, the Random* augmentation layers) draws them per device,
so no parallel step equals the single-device step. ``compare_training`` names those layers and compares the model
a second time with them off in training (as at inference) in every run; that comparison decides, the first is
reported beside it. A model whose difference is not its randomness (a layer normalising by its batch's own
statistics) still fails. Tiny models, few samples: the point is the mechanism, not the arithmetic.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from tf_process import run_harness

from harness.equivalence import assert_equivalent, compare_training
from harness.randomness import random_layers, randomness_off

N, BATCH = 22, 8  # a partial last batch of 6


def _classifier(k, counter=None):
    """keras-io's image classifier from scratch, at test size: augmentation (RandomFlip, in a nested Sequential as
    keras-io has it), Conv2D, BatchNormalization, Dropout, softmax."""

    def build():
        if counter is not None:
            counter.append(1)
        layers = k.layers
        augment = k.Sequential([layers.RandomFlip("horizontal")], name="augmentation")
        inputs = k.Input((6, 6, 2))
        x = augment(inputs)
        x = layers.Conv2D(4, 3, use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dropout(0.5)(x)
        return k.Model(inputs, layers.Dense(3, activation="softmax")(x))

    return build


def _images(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, 6, 6, 2)).astype("float32"), np.eye(3, dtype="float32")[rng.integers(0, 3, N)]


def _compare(k, devices, method, build, **kwargs):
    x, y = _images()
    return compare_training(build, x, y, devices=devices[:2], ratios=[3, 2], method=method, batch_size=BATCH,
                            loss="categorical_crossentropy", **kwargs)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_a_random_classifier_is_judged_with_its_randomness_off_and_its_random_layers_named(
        logical_devices, keras3, method):
    builds: list = []
    report = _compare(keras3, logical_devices, method, _classifier(keras3, builds))
    assert report.random_layers == ("RandomFlip", "Dropout") and report.randomness_off
    assert report.verdict() == "exact", report.summary()
    drawn = report.with_randomness
    assert drawn is not None and not drawn.randomness_off and drawn.random_layers == ("RandomFlip", "Dropout")
    assert drawn.verdict() == "FAIL" and drawn.max_deviation > 1e-4  # each device draws its own masks and flips
    assert len(builds) == 4  # single-device and parallel, as the model is, then with its randomness off
    note = report.randomness_note()
    assert note.startswith("with randomness off; RandomFlip, Dropout draw per device") and "FAIL" in note
    assert "with randomness off; RandomFlip, Dropout" in report.summary()


def test_the_switch_reaches_every_copy_and_is_put_back(logical_devices, keras3):
    """Class-wide and temporary: a clone made inside the block runs as at inference in training, none after."""
    model = _classifier(keras3)()
    x, _ = _images()
    drawn = model(x, training=True)
    with randomness_off(model) as names:
        clone = keras3.models.clone_model(model)
        clone.set_weights(model.get_weights())
        quiet = [np.asarray(m(x, training=True)) for m in (model, clone)]
    assert names == ("RandomFlip", "Dropout")
    assert np.array_equal(quiet[0], quiet[1])
    assert not np.allclose(np.asarray(model(x, training=True)), quiet[0])  # drawing again once the block ends
    assert not np.allclose(np.asarray(drawn), quiet[0])


def test_random_layers_are_those_that_draw(keras3):
    layers = keras3.layers
    model = keras3.Sequential([keras3.Input((4, 3)), layers.GaussianNoise(0.1), layers.Dropout(0.0),
                               layers.LSTM(2, dropout=0.2), layers.Dense(2), layers.Dropout(0.3)])
    assert random_layers(model) == ("GaussianNoise", "LSTM", "Dropout")  # Dropout(0.0) draws nothing
    plain = keras3.Sequential([keras3.Input((4,)), layers.Dense(2), layers.Dropout(0.0)])
    assert random_layers(plain) == ()


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_batch_centering_still_fails_with_its_randomness_off(logical_devices, keras3, method):
    """A layer subtracting its batch's own mean computes another function of each device's slice: randomness off
    does not rescue it, and the message names the random layer beside the failure."""

    class Center(keras3.layers.Layer):
        def call(self, x):
            return x - keras3.ops.mean(x, axis=0, keepdims=True)

    def build():
        inputs = keras3.Input((5,))
        x = keras3.layers.Dense(4)(Center()(inputs))
        return keras3.Model(inputs, keras3.layers.Dense(1)(keras3.layers.Dropout(0.4)(x)))

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(N, 5)).astype("float32"), rng.normal(size=(N, 1)).astype("float32")
    with pytest.raises(AssertionError) as failed:
        assert_equivalent(build, x, y, devices=logical_devices[:2], ratios=[3, 2], method=method, batch_size=BATCH)
    message = str(failed.value)
    assert "with randomness off; Dropout draw per device" in message and "with them on: FAIL" in message


def test_a_model_without_random_layers_is_compared_once(logical_devices, keras3):
    builds: list = []

    def build():
        builds.append(1)
        return keras3.Sequential([keras3.Input((5,)), keras3.layers.Dense(3), keras3.layers.Dropout(0.0),
                                  keras3.layers.Dense(1)])

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(N, 5)).astype("float32"), rng.normal(size=(N, 1)).astype("float32")
    report = compare_training(build, x, y, devices=logical_devices[:2], ratios=[3, 2], method="towers",
                              batch_size=BATCH)
    assert report.random_layers == () and report.with_randomness is None and not report.randomness_off
    assert report.randomness_note() == "" and report.verdict() == "exact"
    assert len(builds) == 2  # the single-device model and the template: no second comparison


def test_randomness_off_or_as_is_compares_once(logical_devices, keras3):
    builds: list = []

    def build():
        builds.append(1)
        return keras3.Sequential([keras3.Input((5,)), keras3.layers.Dense(3), keras3.layers.Dropout(0.5),
                                  keras3.layers.Dense(1)])

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(N, 5)).astype("float32"), rng.normal(size=(N, 1)).astype("float32")
    common = dict(devices=logical_devices[:2], ratios=[3, 2], method="towers", batch_size=BATCH)
    off = compare_training(build, x, y, randomness="off", **common)
    assert len(builds) == 2 and off.randomness_off and off.with_randomness is None and off.verdict() == "exact"
    as_is = compare_training(build, x, y, randomness="as-is", **common)
    assert len(builds) == 4 and not as_is.randomness_off and as_is.verdict() == "FAIL"
    assert as_is.random_layers == ("Dropout",) and as_is.randomness_note().startswith("with randomness on: Dropout")
    with pytest.raises(ValueError, match="randomness must be one of"):
        compare_training(build, x, y, randomness="none", **common)


def test_a_random_keras2_classifier_is_judged_with_its_randomness_off(logical_devices, keras2):
    report = _compare(keras2, logical_devices, "mirrored", _classifier(keras2))
    assert report.random_layers == ("RandomFlip", "Dropout") and report.randomness_off
    assert report.verdict() == "exact", report.summary()
    assert report.with_randomness is not None and report.with_randomness.verdict() == "FAIL"


CLASSIFIER = '''
import keras
import numpy as np
import tensorflow as tf
from keras import layers


class BatchCentre(layers.Layer):
    """Subtracts the batch's mean feature: each row's output depends on the other rows of its batch (TensorFlow's
    mean: the model file runs on the environment's keras, Keras 2 in the tf215 env)."""

    def call(self, x):
        return x - tf.reduce_mean(x, axis=0, keepdims=True)


def build():
    augment = keras.Sequential([layers.RandomFlip("horizontal")], name="augmentation")
    inputs = keras.Input((6, 6, 2))
    x = layers.Conv2D(4, 3, use_bias=False)(augment(inputs))
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    x = layers.Dropout(0.5)(layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, layers.Dense(3, activation="softmax")(x))
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    return model


def build_mixing():  # planted: a Dropout model whose difference no randomness explains (small: cheap to trace)
    inputs = keras.Input((6, 6, 2))
    x = layers.Dropout(0.5)(BatchCentre()(layers.Flatten()(inputs)))
    model = keras.Model(inputs, layers.Dense(3, activation="softmax")(x))
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    return model


def data(batch_size):
    rng = np.random.default_rng(0)
    return rng.normal(size=(4 * batch_size, 6, 6, 2)).astype("float32"), np.eye(3, dtype="float32")[
        rng.integers(0, 3, 4 * batch_size)]
'''


@pytest.mark.parametrize("method", ["towers", pytest.param("mirrored", marks=[
    pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_randomness.py::test_check_passes_a_random_classifier_and_fails_a_planted_one[towers]")])])
def test_check_passes_a_random_classifier_and_fails_a_planted_one(tmp_path, method):
    """``harness check --model`` of a Dropout model: judged with its randomness off, its random layers named, the
    run with them on beside it; the same model with a layer mixing the batch's rows still fails (exit 1)."""
    (tmp_path / "classifier.py").write_text(textwrap.dedent(CLASSIFIER))
    exact, mixing = f"{tmp_path}/classifier.py:build", f"{tmp_path}/classifier.py:build_mixing"
    done = run_harness(["check", "--model", exact, mixing, "--data", f"{tmp_path}/classifier.py:data",
                        "--logical-cpus", "2", "--ratios", "3", "2", "--methods", method, "--samples", "22",
                        "--batch-size", "8", "--time-steps", "0", "--json"], tmp_path)
    assert done.returncode == 1, done.stderr[-4000:]  # the planted model fails: the exit status says so
    rows = {row["model"]: row for row in json.loads(done.stdout)["equivalence"]}
    assert [(row["method"], row["random_layers"]) for row in rows.values()] == [
        (method, ["RandomFlip", "Dropout"]), (method, ["Dropout"])]
    row = rows[exact]
    assert row["passed"] and row["verdict"] == "exact" and row["max_deviation"] <= 1e-6, row
    assert row["with_randomness"]["verdict"] == "FAIL" and row["with_randomness"]["max_deviation"] > 1e-4
    row = rows[mixing]
    assert not row["passed"] and row["verdict"] == "FAIL" and row["max_deviation"] > 1e-4, row
