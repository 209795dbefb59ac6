"""Real image builds (``pytest --run-docker -m docker tests/docker``, or ``tox -e docker``).

Each test uses the engine ``docker`` reaches, or starts a private one (root, dockerd installed) and
stops it afterwards. The entry is ``HARNESS_DOCKER_ENTRY`` (default: the matrix's newest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import containers
from harness.matrix import build_args, default_path, load_matrix, newest

pytestmark = pytest.mark.docker

REPO = default_path().parent.parent
CACHE = Path.home() / ".cache" / "harness" / "docker"  # as `harness docker`: the debootstrap tarball


def _entry():
    entries = load_matrix()
    name = os.environ.get("HARNESS_DOCKER_ENTRY")
    return newest(entries) if not name else next(e for e in entries if e.name == name)


def test_the_image_builds_offline_smokes_and_passes_the_fast_suite_inside(tmp_path):
    entry = _entry()
    record = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "docker", "test", "--entry", entry.name,
                           "--json", str(record)], capture_output=True, text=True, timeout=3600)
    print(proc.stdout)  # the report: shown by `pytest -rP`
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report = json.loads(record.read_text())
    labels = report["labels"]
    assert labels["io.harness.tensorflow"] == entry.tensorflow and labels["io.harness.entry"] == entry.name
    assert labels["io.harness.cuda"] == entry.cuda and labels["io.harness.variant"] == "cpu"
    assert report["user"] == "1000:1000" and report["offline"] is True
    assert f"tensorflow   {entry.tensorflow} (tensorflow-cpu)" in report["env_output"]
    legacy = entry.env.get("TF_USE_LEGACY_KERAS", "0")
    assert f"TF_USE_LEGACY_KERAS={legacy}" in report["env_output"]
    assert " passed" in report["tests_summary"] and "failed" not in report["tests_summary"]


def test_an_offline_build_without_the_wheels_fails_and_names_the_missing_package(tmp_path):
    # The guard of the offline mode: OFFLINE=1 must never fall back to an index. A wheelhouse with
    # only the harness wheel has to fail, naming what it could not find.
    entry = _entry()
    engine = containers.find_engine() or containers.start_engine(tmp_path / "engine")
    try:
        context = tmp_path / "context"
        context.mkdir()
        (context / "Dockerfile").write_text((REPO / "docker" / "Dockerfile").read_text())
        containers.fill_wheelhouse(context / "wheelhouse", entry, "cpu", REPO, offline=False)
        args = build_args(entry, "cpu")
        args["BASE_IMAGE"] = containers.ensure_cpu_base(engine, CACHE, args["BASE_IMAGE"])
        args["OFFLINE"] = "1"
        with pytest.raises(RuntimeError, match="(?s)building harness:guard failed.*tensorflow-cpu"):
            containers.build_image(engine, context / "Dockerfile", context, "harness:guard", args)
    finally:
        engine.docker("image", "rm", "--force", "harness:guard", check=False)
        engine.stop()

