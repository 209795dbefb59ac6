"""Real image builds (``pytest --run-docker -m docker tests/images``, or ``tox -e docker``).

Each test uses the engine the Docker SDK for Python reaches (``DOCKER_HOST``, else the default
socket), or starts a private one (root, dockerd installed) and stops it afterwards; images and
containers are inspected through the SDK (``keras-harness[ci]``). The entry is ``HARNESS_DOCKER_ENTRY``
(default: the matrix's newest; ``jax011`` is Keras 3 on JAX, its base ubuntu:24.04 from a registry or the
engine, its offline wheelhouse from a host Python 3.12).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ci import containers
from harness.ci.matrix import build_args, default_path, load_matrix, newest

pytestmark = pytest.mark.docker

REPO = default_path().parent.parent
CACHE = Path.home() / ".cache" / "harness" / "docker"  # as `harness docker`: the debootstrap tarball


@pytest.fixture
def engine(tmp_path):
    """The engine the SDK reaches, else a private one, stopped (and deleted) afterwards."""
    engine = containers.find_engine() or containers.start_engine(tmp_path / "engine")
    yield engine
    engine.stop()


def _leftovers(engine, label: str) -> list[str]:
    """Containers ``run_in_image`` made for ``label`` (an image) that are still there."""
    return [c.name for c in engine.client().containers.list(all=True, filters={"label": f"io.harness.run={label}"})]


def _entry():
    entries = load_matrix()
    name = os.environ.get("HARNESS_DOCKER_ENTRY")
    return newest(entries) if not name else next(e for e in entries if e.name == name)


def test_the_image_builds_offline_smokes_and_passes_the_fast_suite_inside(tmp_path):
    import docker

    entry = _entry()
    before = containers.find_engine()  # None: the command starts (and removes) a private engine of its own
    record = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "docker", "test", "--entry", entry.name,
                           "--json", str(record)], capture_output=True, text=True, timeout=3600)
    print(proc.stdout)  # the report: shown by `pytest -rP`
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report = json.loads(record.read_text())
    labels = report["labels"]
    assert labels["io.harness.tensorflow"] == (entry.tensorflow or "none") and labels["io.harness.entry"] == entry.name
    assert labels["io.harness.jax"] == (entry.jax or "none") and labels["io.harness.backend"] == entry.backend
    assert labels["io.harness.cuda"] == entry.cuda and labels["io.harness.variant"] == "cpu"
    assert report["user"] == "1000:1000" and report["offline"] is True
    if entry.has_tensorflow:
        assert f"tensorflow   {entry.tensorflow} (tensorflow-cpu)" in report["env_output"]
    else:  # jax011: Keras 3 on JAX, no TensorFlow in the image
        assert "tensorflow   not installed" in report["env_output"] and "KERAS_BACKEND=jax" in report["env_output"]
    legacy = entry.env.get("TF_USE_LEGACY_KERAS", "0")
    assert f"TF_USE_LEGACY_KERAS={legacy}" in report["env_output"]
    assert " passed" in report["tests_summary"] and "failed" not in report["tests_summary"]
    if before is not None:  # the engine outlived the command: nothing of the run is left in it
        try:
            with pytest.raises(docker.errors.ImageNotFound):
                before.client().images.get(report["tag"])
            assert _leftovers(before, report["tag"]) == []
        finally:
            before.stop()


def test_a_rebuild_takes_all_but_the_harness_layer_from_the_layer_cache_and_no_cache_takes_none(tmp_path):
    # Each commit brings a new harness wheel: only its layer is built again; TensorFlow's comes from the cache.
    def build(*extra: str) -> dict:
        record = tmp_path / f"build{len(list(tmp_path.glob('*.json')))}.json"
        proc = subprocess.run([sys.executable, "-m", "harness", "docker", "build", "--entry", _entry().name,
                               "--json", str(record), *extra], capture_output=True, text=True, timeout=3600)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        return json.loads(record.read_text())

    cold = build("--no-cache")
    assert cold["build_steps_cached"] == 0 and cold["build_steps"] >= 5
    build()
    warm = build()
    # The apt, user and dependency layers (FROM, the harness layer and what follows it are built).
    assert warm["build_steps_cached"] == 3, (warm["build_steps_cached"], warm["build_steps"])


def test_a_container_streams_its_lines_returns_its_status_and_is_removed(engine):
    base = containers.ensure_cpu_base(engine, CACHE)
    assert engine.client().images.get(base).attrs["Os"] == "linux"
    seen: list[str] = []
    code, lines, _ = containers.run_in_image(engine, base, ["sh", "-c", "echo one; echo two >&2; exit 3"],
                                             log=seen.append, timeout=120)
    assert (code, lines, seen) == (3, ["one", "two"], ["one", "two"])
    assert _leftovers(engine, base) == []
    with pytest.raises(RuntimeError, match="^no image harness:no-such-tag in the Docker engine at "):
        containers.run_in_image(engine, "harness:no-such-tag", ["true"])


def test_an_offline_build_without_the_wheels_fails_and_names_the_missing_package(tmp_path, engine):
    # The guard of the offline mode: OFFLINE=1 must never fall back to an index. A wheelhouse with
    # only the harness wheel has to fail, naming what it could not find.
    import docker

    entry = _entry()
    try:
        context = tmp_path / "context"
        context.mkdir()
        (context / "Dockerfile").write_text((REPO / "docker" / "Dockerfile").read_text())
        containers.fill_wheelhouse(context / "wheelhouse", entry, "cpu", REPO, offline=False)
        args = build_args(entry, "cpu")
        args["BASE_IMAGE"] = containers.ensure_cpu_base(engine, CACHE, args["BASE_IMAGE"])
        args["OFFLINE"] = "1"
        package = "tensorflow-cpu" if entry.has_tensorflow else "jax"
        with pytest.raises(RuntimeError, match=f"(?s)building harness:guard failed.*{package}"):
            containers.build_image(engine, context / "Dockerfile", context, "harness:guard", args)
        with pytest.raises(docker.errors.ImageNotFound):
            engine.client().images.get("harness:guard")
    finally:
        containers.remove_image(engine, "harness:guard")

