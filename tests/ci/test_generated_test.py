"""The pytest file ``harness init`` writes, run as an adopter runs it, on real models and real ``harness check``
processes: it passes on a good model, names a Dropout model's random layers instead of failing blind, and fails
on a batch-dependent layer and on an exact workload that slipped to "as accurate" (mixed precision turned on),
saying which method, the verdict against what was expected and the command to rerun. The workload that expects
"as accurate" holds the same model, and one with its own train_step expects mirrored's refusal by its id. 25 s on
2 cores (six workloads, each checked in its own process): extended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import main

pytestmark = pytest.mark.extended

_MODELS = '''
"""Small dense classifiers of an adopter's package: one good, one with training-time randomness, one whose layer
centres its features over the batch (each row's output depends on the other rows)."""
import keras
from keras import layers


class BatchCentre(layers.Layer):
    def call(self, x):
        return x - keras.ops.mean(x, axis=0, keepdims=True)


def _net(*middle):
    model = keras.Sequential([keras.Input((12,)), layers.Dense(24, activation="relu"), *middle,
                              layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    return model


def good():
    return _net()


def noisy():
    return _net(layers.GaussianNoise(0.1), layers.Dropout(0.3))


def centred():
    return _net(BatchCentre())


class OwnStep(keras.Model):
    def train_step(self, data):  # a team's own step (here Keras' own, called): mirrored refuses it by name
        return super().train_step(data)


def own_step():
    inputs = keras.Input((12,))
    model = OwnStep(inputs, layers.Dense(3, activation="softmax")(layers.Dense(24, activation="relu")(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    return model
'''
# mixed precision turned on for the whole module, as a team turns it on: the workload's float16 arithmetic rounds
# the split batch otherwise than the whole one (as accurate as one device, not exact)
_MIXED = '''
import keras

keras.mixed_precision.set_dtype_policy("mixed_float16")


def build():
    from models import _net

    return _net()
'''


def _cases(report: Path) -> dict[str, tuple[bool, str]]:
    """Test id -> (passed, failure text) from a JUnit file."""
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        out[case.get("name")] = (failure is None, "" if failure is None else (failure.get("message") or "")
                                 + (failure.text or ""))
    return out


def test_the_generated_test_passes_names_and_fails_for_the_right_reasons(tmp_path):
    repo = tmp_path / "adopter"
    repo.mkdir()
    (repo / "models.py").write_text(_MODELS)
    (repo / "mixed.py").write_text(_MIXED)
    argv = ["init", str(repo), "--model", "good=models:good", "--model", "noisy=models:noisy", "--model",
            "centred=models:centred", "--model", "slipped=mixed:build", "--model", "mixed=mixed:build",
            "--model", "own_step=models:own_step",
            "--methods", "mirrored", "towers", "--ratios", "3", "2", "--harness-requirement", "keras-harness",
            "--branch", "main"]
    assert main(argv) == 0
    config = repo / "harness.toml"
    text = config.read_text()
    head, tail = text.split("[workloads.mixed]")
    tail = tail.replace('expect = "exact"', 'expect = "as accurate"', 1)
    head_own, tail_own = tail.split("[workloads.own_step]")
    config.write_text(head + "[workloads.mixed]" + head_own + "[workloads.own_step]"
                      + tail_own.replace('expect = "exact"', 'expect = { mirrored = "custom-train-step" }', 1))
    report = tmp_path / "generated.xml"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "tests/test_harness_equivalence.py", "--junitxml", str(report)],
                          cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    said = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 1, said
    cases = {name.split("[")[1].rstrip("]"): result for name, result in _cases(report).items()}
    assert set(cases) == {"good", "noisy", "centred", "slipped", "mixed", "own_step"}, said
    assert cases["good"][0] and cases["mixed"][0], said
    assert cases["own_step"][0], said  # towers exact, mirrored refused by the id the workload expects
    # Dropout and GaussianNoise draw per device: judged with them off, and named
    assert cases["noisy"][0], said
    # the batch-dependent layer: FAIL for both methods, with what was expected and the command to rerun
    passed, failure = cases["centred"]
    assert not passed and "mirrored: FAIL" in failure and "towers: FAIL" in failure, said
    assert "expected 'exact'" in failure and "rerun: harness check --model models:centred" in failure, said
    # an exact workload that slipped to as accurate: fails, naming the verdict and what was expected
    passed, failure = cases["slipped"]
    assert not passed and "as accurate as one device" in failure and "-- expected 'exact'" in failure, said
    assert "did NOT come out as expected" in failure, said
