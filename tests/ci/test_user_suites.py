"""harness.suites in another repository: asv runs the thin subclasses ``harness init`` writes.

A throw-away git repository holds a package with a small Keras 3 model (``userdemo``), a
``harness.toml`` naming two workloads (``classifier``: a build function; ``learner``: a
``harness.Workload`` with real data, validation data and a goal), an asv config and the thin
benchmark module. As in a prebuilt image (tests/ci/demorepo.py), the package is installed by pip
into a target folder that asv's benchmark processes get on their path (``ASV_PYTHONPATH``), and asv
runs this Python (``--python=same``) on the commit. A suite ran when asv saved a number for it
(``harness.ci.asvresults``). About a minute and a half on 2 busy cores: one TensorFlow process per
selected combination, and one per ``setup_cache`` (Fidelity, TimeToAccuracy).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("asv")

from demorepo import CONF, commit, git, install_command  # noqa: E402

MODEL = textwrap.dedent('''
    import keras
    import numpy as np

    import harness


    def build():
        inputs = keras.Input((32,))
        hidden = keras.layers.Dense(64, activation="relu")(inputs)
        outputs = keras.layers.Dense(10, activation="softmax")(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model


    def _arrays(samples, seed):
        # Learnable at once: the label's feature stands out of the noise.
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 10, samples).astype("int32")
        x = rng.standard_normal((samples, 32)).astype("float32")
        x[np.arange(samples), y] += 3.0
        return x, y


    def batches(batch_size):
        return _arrays(64 * batch_size, 0)


    def held_out(batch_size):
        return _arrays(512, 1)


    workload = harness.Workload(build=build, data=batches, validation_data=held_out, goal=0.7,
                                optimizer=lambda: keras.optimizers.SGD(0.1))
''')
CONFIG = textwrap.dedent('''
    devices = 2
    ratios = [3, 2]
    methods = ["mirrored"]

    [workloads.classifier]
    model = "userdemo.model:build"
    batch-size = 40
    check-batch-size = 20
    check-samples = 40

    [workloads.learner]
    model = "userdemo.model:workload"
    batch-size = 40
    check-batch-size = 20
    check-samples = 40
''')
BENCH = textwrap.dedent('''
    """asv benchmarks of this project's workloads ([tool.harness] in pyproject.toml or harness.toml)."""
    from harness import suites

    class Throughput(suites.Throughput): pass
    class StepTime(suites.StepTime): pass
    class PeakMemory(suites.PeakMemory): pass
    class Fidelity(suites.Fidelity): pass
    class TimeToAccuracy(suites.TimeToAccuracy): pass
''').lstrip()
PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "userdemo"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["userdemo"]\n')
# The combinations run (regexes on "module.Class.name(params)"); Fidelity and TimeToAccuracy train every configured
# combination in their setup_cache whatever is selected.
SELECTION = [
    r"^harness_suites\.Throughput\..*\('classifier', 'single', 'even'\)$",
    r"^harness_suites\.Throughput\..*\('classifier', 'mirrored', 'ratio'\)$",
    r"^harness_suites\.Throughput\..*\('classifier', 'single', 'ratio'\)$",  # meaningless: skipped before setup
    r"^harness_suites\.StepTime\..*\('classifier', 'mirrored'\)$",
    r"^harness_suites\.PeakMemory\..*\('learner', 'single'\)$",
    r"^harness_suites\.Fidelity\.",
    r"^harness_suites\.TimeToAccuracy\.",
]
TIMEOUT = 600  # a safety net: about 90 s idle here


def _run(argv: list[str], repo: Path, timeout: float) -> subprocess.CompletedProcess:
    site = repo.parent / f"site-{repo.name}"
    env = {**os.environ, "HOME": str(repo.parent), "ASV_PYTHONPATH": str(site)}  # HOME: asv's machine file
    env.pop("PYTHONPATH", None)
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path) -> tuple[Path, str]:
    repo = tmp_path / "userdemo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "suites@example.invalid")
    git(repo, "config", "user.name", "suites test")
    conf = {**CONF, "project": "userdemo", "launch_method": "spawn"}  # as harness init writes it
    head = commit(repo, {  # a throw-away repository's files (tests/unit/test_docs.py: not-a-reference)
        "pyproject.toml": PYPROJECT, "userdemo/__init__.py": "", "userdemo/model.py": MODEL,  # not-a-reference
        "harness.toml": CONFIG, "asv.conf.json": json.dumps(conf), "benchmarks/__init__.py": "",  # not-a-reference
        "benchmarks/harness_suites.py": BENCH, ".gitignore": ".asv/\n"}, "adopt harness")  # not-a-reference
    install = install_command(repo).format(python=sys.executable, path=repo)
    done = subprocess.run(install, shell=True, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return repo, head


@pytest.mark.extended
def test_every_suite_of_a_project_records_a_figure(project):
    from harness.ci.asvresults import read_commit

    repo, head = project
    done = _run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", "t"], repo, 60)
    assert done.returncode == 0, done.stdout + done.stderr
    bench = [arg for regex in SELECTION for arg in ("--bench", regex)]
    started = time.time()
    done = _run([sys.executable, "-m", "asv", "run", "--quick", "--python=same", "--set-commit-hash", head,
                 "--machine", "t", "--show-stderr", *bench], repo, TIMEOUT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    saved = read_commit(repo / "asv.conf.json", "t", head)
    # what this run measured, and nothing asv started before it (the gate reads a run's results so)
    assert read_commit(repo / "asv.conf.json", "t", head, since=started).keys() == saved.keys()
    assert read_commit(repo / "asv.conf.json", "t", head, since=time.time() + 60) == {}
    value = {key: m.value for key, m in saved.items()}
    unit = {name: m.unit for (name, _), m in saved.items()}
    figures = {key: v for key, v in value.items() if isinstance(v, (int, float)) and math.isfinite(v)}

    def combo(params: str) -> str:  # asv's names of parameter values: their repr
        return ", ".join(repr(p) for p in params.split(", "))

    def figure(name: str, params: str) -> float:
        key = (name, combo(params))
        assert key in figures, f"{name}({params}): {value.get(key)!r}\n{out[-6000:]}"
        return figures[key]

    assert figure("harness_suites.Throughput.track_samples_per_second", "classifier, single, even") > 0
    assert figure("harness_suites.Throughput.track_samples_per_second", "classifier, mirrored, ratio") > 0
    assert math.isnan(value[("harness_suites.Throughput.track_samples_per_second", combo("classifier, single, ratio"))])
    assert 0 < figure("harness_suites.StepTime.time_train_step", "classifier, mirrored") < 10
    assert figure("harness_suites.PeakMemory.peakmem_train_step", "learner, single") > 100e6  # TensorFlow's own
    for name in ("classifier", "learner"):
        # A dense model on logical CPUs: exact or float rounding, far below the deviation of a broken step.
        assert 0 <= figure("harness_suites.Fidelity.track_max_deviation", f"{name}, mirrored") < 1e-4
        assert 0 <= figure("harness_suites.Fidelity.track_floor_multiple", f"{name}, mirrored") < 10
    for method in ("single", "mirrored"):
        assert figure("harness_suites.TimeToAccuracy.track_seconds_to_goal", f"learner, {method}") > 0
        steps = figure("harness_suites.TimeToAccuracy.track_steps_to_goal", f"learner, {method}")
        assert steps < 1000, out[-6000:]  # reached: a miss records twice the budget
        # A plain build function has no goal: skipped (NaN), with the reason on stderr.
        skipped = ("harness_suites.TimeToAccuracy.track_seconds_to_goal", combo(f"classifier, {method}"))
        assert math.isnan(value[skipped])
    assert "has no accuracy goal" in out
    assert unit["harness_suites.Throughput.track_samples_per_second"] == "samples/s"
    assert unit["harness_suites.Fidelity.track_max_deviation"] == "deviation"
    assert unit["harness_suites.TimeToAccuracy.track_seconds_to_goal"] == "s"
    assert unit["harness_suites.StepTime.time_train_step"] == "seconds"
    assert unit["harness_suites.PeakMemory.peakmem_train_step"] == "bytes"
