"""The pytest file ``harness init`` writes, run as an adopter runs it, on real models and real ``harness check``
processes. ``harness init`` measures what each workload expects (the generated test's own check, once): exact for a
good model and for a Dropout model (judged with its randomness off, the random layers named), "as accurate" for a
model in mixed precision, mirrored's refusal by its id for a model with its own train_step, and nothing for a
batch-dependent layer (a FAIL is never expected: it says so). Then the generated test passes on those (the Dropout
model's pass warning RandomLayersOff, naming its random layers), fails on the batch-dependent layer and on an exact
workload that slipped to "as accurate" (mixed precision turned on after init), saying which method, the verdict
against what was expected and the command to rerun. About a minute on 2 cores (six workloads, each checked in its
own process, twice): extended.

A JAX adopter (harness.toml: ``backend = "jax"``) gets the same test: it runs each workload's check on 3 JAX CPU
devices (``harness check --backend jax`` in its own process sets KERAS_BACKEND and the devices before Keras starts),
with TensorFlow blocked in every process, and fails on the batch-dependent layer.
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
# mixed precision for the whole module, as a team turns it on: float16 arithmetic rounds the split batch otherwise
# than the whole one (as accurate as one device, not exact). POLICY is float32 in slip.py at first.
_MIXED = '''
import keras

POLICY = "mixed_float16"
keras.mixed_precision.set_dtype_policy(POLICY)


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


@pytest.mark.usefixtures("keras3")  # its adopter's models: keras.ops, keras.mixed_precision.set_dtype_policy
@pytest.mark.slow  # 163 s in .ci/run: slow.yml; .ci/run's wheel step runs a generated test failing on a planted layer
def test_the_generated_test_passes_names_and_fails_for_the_right_reasons(tmp_path, capsys):
    from harness.project import read_toml

    repo = tmp_path / "adopter"
    repo.mkdir()
    (repo / "models.py").write_text(_MODELS)
    (repo / "mixed.py").write_text(_MIXED)
    (repo / "slip.py").write_text(_MIXED.replace('"mixed_float16"', '"float32"'))
    argv = ["init", str(repo), "--model", "good=models:good", "--model", "noisy=models:noisy", "--model",
            "centred=models:centred", "--model", "slip=slip:build", "--model", "mixed=mixed:build",
            "--model", "own_step=models:own_step", "--methods", "mirrored", "towers", "--ratios", "3", "2",
            "--harness-requirement", "keras-harness", "--branch", "main"]
    assert main(argv) == 0  # measures each workload (check_workload: the repository's root on the path)
    said_init = capsys.readouterr().err
    expects = {name: table["expect"] for name, table in
               read_toml(repo / "harness.toml")["workloads"].items()}
    assert expects == {"good": "exact", "noisy": "exact", "centred": "exact", "slip": "exact",
                       "mixed": "as accurate", "own_step": {"mirrored": "custom-train-step", "towers": "exact"}}, \
        said_init
    assert "centred: not measured as expected, its test will fail" in said_init, said_init  # no FAIL expected
    # after init: mixed precision turned on in slip.py
    (repo / "slip.py").write_text(_MIXED)
    report = tmp_path / "generated.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "tests/test_harness_equivalence.py", "--junitxml", str(report)],
                          cwd=repo, capture_output=True, text=True, timeout=900)
    said = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 1, said
    cases = {name.split("[")[1].rstrip("]"): result for name, result in _cases(report).items()}
    assert set(cases) == set(expects), said
    assert cases["good"][0] and cases["mixed"][0], said
    assert cases["own_step"][0], said  # towers exact, mirrored refused by the id the workload expects
    assert cases["noisy"][0], said  # Dropout and GaussianNoise draw per device: judged with them off, and named
    # that pass says which layers were off (a RandomLayersOff warning in pytest's summary); no other does
    warned = [line.strip() for line in done.stdout.splitlines() if "RandomLayersOff:" in line]
    assert len(warned) == 1 and "workload 'noisy' passed with its random layers off" in warned[0], said
    assert warned[0].endswith(": GaussianNoise, Dropout"), said
    # the batch-dependent layer: FAIL for both methods, with what was expected and the command to rerun
    passed, failure = cases["centred"]
    assert not passed and "mirrored: FAIL" in failure and "towers: FAIL" in failure, said
    assert "expected 'exact'" in failure and "rerun: harness check --model models:centred" in failure, said
    # an exact workload that slipped to as accurate: fails, naming the verdict and what was expected
    passed, failure = cases["slip"]
    assert not passed and "as accurate as one device" in failure and "-- expected 'exact'" in failure, said
    assert "did NOT come out as expected" in failure, said


# First in every Python process of the JAX adopter's test run (on PYTHONPATH, as sitecustomize): TensorFlow blocked,
# each attempt (not Keras' own probe) written to the file HARNESS_TEST_TF_ATTEMPTS names, with who tried.
_NO_TF = """
import os
from harness.compat import block_tensorflow


def _said(name, stack):
    with open(os.environ["HARNESS_TEST_TF_ATTEMPTS"], "a") as out:
        out.write(f"{os.getpid()}: {name}\\n" + "".join(stack))


block_tensorflow(_said)
"""


def test_a_jax_adopters_generated_test_runs_on_jax_devices_without_tensorflow(tmp_path):
    pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")
    from harness.project import load_project

    repo = tmp_path / "adopter"
    repo.mkdir()
    (repo / "models.py").write_text(_MODELS)
    assert main(["init", str(repo), "--model", "good=models:good", "--model", "centred=models:centred",
                 "--backend", "jax", "--devices", "3", "--ratios", "5", "3", "2", "--no-measure",
                 "--harness-requirement", "keras-harness", "--branch", "main"]) == 0
    config = repo / "harness.toml"  # 2 steps and a partial one: the verdicts, sooner
    config.write_text(config.read_text().replace("batch-size = 64", "batch-size = 64\ncheck-samples = 42"))
    assert load_project(repo).backend == "jax"
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(_NO_TF)
    attempts = tmp_path / "tf-attempts.txt"
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS", "TF_USE_LEGACY_KERAS")}
    env.update(PYTHONPATH=os.pathsep.join([str(guard), str(root)]), JAX_PLATFORMS="cpu",
               HARNESS_TEST_TF_ATTEMPTS=str(attempts))
    report = tmp_path / "generated.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "tests/test_harness_equivalence.py", "--junitxml", str(report)],
                          cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    said = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert not attempts.exists(), attempts.read_text()[:4000]
    assert done.returncode == 1, said
    cases = {name.split("[")[1].rstrip("]"): result for name, result in _cases(report).items()}
    assert set(cases) == {"good", "centred"}, said
    assert cases["good"][0], said
    passed, failure = cases["centred"]
    assert not passed and "towers: FAIL" in failure and "expected 'exact'" in failure, said
    assert "rerun: harness check --backend jax --model models:centred" in failure, said
