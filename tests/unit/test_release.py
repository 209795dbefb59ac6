"""The release path: .github/workflows/release.yml's structure, its version check run for real, and the sdist and
wheel that `python -m build` makes of this tree (every tracked file of the package in the wheel built from the sdist,
the version from git, twine check --strict).

The workflow guard returns its findings; it must find nothing in the real workflow and the planted problem in each
altered copy (tests/unit/test_workflows.py checks pins, permissions and the linters for every workflow).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
PUBLISH_ACTION = re.compile(r"^pypa/gh-action-pypi-publish@[0-9a-f]{40}$")
VERSION_STEP = "The built version is the tag's"


def _jobs(workflow: dict) -> dict:
    return workflow.get("jobs") or {}


def _runs(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job.get("steps") or [])


def _uses(job: dict) -> list[str]:
    return [str(step["uses"]) for step in job.get("steps") or [] if "uses" in step]


def _artifact(job: dict, action: str) -> str | None:
    return next((step.get("with", {}).get("name") for step in job.get("steps") or []
                 if str(step.get("uses", "")).startswith(f"actions/{action}@")), None)


def release_problems(text: str) -> list[str]:
    """What release.yml lacks: tag trigger, jobs build -> smoke -> publish, the version check, publishing by
    OIDC from the protected environment with id-token the only permission anywhere that writes."""
    workflow = yaml.safe_load(text)
    problems = []
    on = workflow.get("on", workflow.get(True)) or {}
    if on != {"push": {"tags": ["v*"]}}:
        problems.append(f"triggers are not a push of v* tags alone: {on}")
    jobs = _jobs(workflow)
    build, smoke, publish = (jobs.get(name, {}) for name in ("build", "smoke", "publish"))
    if set(jobs) != {"build", "smoke", "publish"}:
        problems.append(f"jobs are not build, smoke and publish: {sorted(jobs)}")
    if smoke.get("needs") not in ("build", ["build"]) or publish.get("needs") not in ("smoke", ["smoke"]):
        problems.append("publish does not need smoke, or smoke build")
    for job_id, job in jobs.items():
        perms = job.get("permissions")
        wanted = {"id-token": "write"} if job_id == "publish" else {"contents": "read"}
        if perms != wanted:
            problems.append(f"job {job_id} has permissions {perms}, not {wanted}")
    if workflow.get("permissions") != {}:
        problems.append(f"top-level permissions {workflow.get('permissions')}, not {{}}")
    environment = publish.get("environment")
    if (environment.get("name") if isinstance(environment, dict) else environment) != "release":
        problems.append(f"publish runs in environment {environment}, not the protected 'release'")
    if [u.split("@")[0] for u in _uses(publish)] != ["actions/download-artifact", "pypa/gh-action-pypi-publish"]:
        problems.append(f"publish does more than download the artifact and publish it: {_uses(publish)}")
    if not any(PUBLISH_ACTION.match(u) for u in _uses(publish)):
        problems.append("publish does not use pypa/gh-action-pypi-publish pinned by commit")
    if "secrets." in text or any(step.get("with", {}).get("password") for step in publish.get("steps") or []):
        problems.append("a stored secret or password: trusted publishing needs none")
    checkout = next((s for s in build.get("steps") or [] if str(s.get("uses", "")).startswith("actions/checkout@")), {})
    if checkout.get("with", {}).get("fetch-depth") != 0:
        problems.append("build's checkout has no fetch-depth 0: setuptools-scm needs the tags")
    runs = _runs(build)
    problems += [f"build does not run {cmd}" for cmd in ("python -m build", "twine check --strict") if cmd not in runs]
    if not any(step.get("name") == VERSION_STEP for step in build.get("steps") or []):
        problems.append(f"build has no step {VERSION_STEP!r}")
    if "scripts/wheel-smoke --dist" not in _runs(smoke):
        problems.append("smoke does not run scripts/wheel-smoke on the built files")
    names = {_artifact(build, "upload-artifact"), _artifact(smoke, "download-artifact"),
             _artifact(publish, "download-artifact")}
    if len(names) != 1 or None in names:
        problems.append(f"build uploads, smoke and publish download different artifacts: {names}")
    return problems


def test_the_release_workflow_has_its_structure():
    assert release_problems(RELEASE.read_text()) == []


@pytest.mark.parametrize(("old", "new", "found"), [
    ("    permissions:\n      contents: read\n    steps:\n      # The whole history",
     "    permissions:\n      contents: read\n      id-token: write\n    steps:\n      # The whole history",
     "job build has permissions"),
    ("      id-token: write  # trusted publishing's OIDC token; nothing else\n",
     "      id-token: write\n      contents: write\n", "job publish has permissions"),
    ("    environment: release\n", "", "not the protected 'release'"),
    ("    needs: smoke\n", "    needs: build\n", "publish does not need smoke"),
    ("      - name: The built version is the tag's\n", "      - name: list\n", "no step"),
    ("          fetch-depth: 0\n", "", "fetch-depth 0"),
    ("      - uses: pypa/gh-action-pypi-publish@dc37677b2e1c63e2034f94d8a5b11f265b73ba33 # v1.14.2\n",
     "      - uses: pypa/gh-action-pypi-publish@dc37677b2e1c63e2034f94d8a5b11f265b73ba33 # v1.14.2\n"
     "        with:\n          password: ${{ secrets.INDEX_TOKEN }}\n", "stored secret"),
    ('    tags: ["v*"]\n', '    branches: [main]\n', "triggers"),
    ("      - run: scripts/wheel-smoke --dist dist\n", "      - run: echo skipped\n", "wheel-smoke"),
])
def test_the_release_guard_reports_a_planted_problem(old, new, found):
    text = RELEASE.read_text()
    assert old in text
    problems = release_problems(text.replace(old, new))
    assert any(found in p for p in problems), problems


def _version_check(tmp_path: Path, tag: str, files: list[str]) -> subprocess.CompletedProcess:
    """The build job's version step, run by bash (as the runner does) in a folder whose dist/ holds ``files``."""
    steps = yaml.safe_load(RELEASE.read_text())["jobs"]["build"]["steps"]
    script = next(step["run"] for step in steps if step.get("name") == VERSION_STEP)
    (tmp_path / "dist").mkdir()
    for name in files:
        (tmp_path / "dist" / name).write_bytes(b"")
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "GITHUB_REF_NAME": tag})


@pytest.mark.parametrize(("tag", "files", "status"), [
    ("v1.2.0", ["keras_harness-1.2.0-py3-none-any.whl", "keras_harness-1.2.0.tar.gz"], 0),
    ("v1.2.0rc1", ["keras_harness-1.2.0rc1-py3-none-any.whl", "keras_harness-1.2.0rc1.tar.gz"], 0),
    ("v1.2.0", ["keras_harness-1.2.1.dev1+g1a2b3c4-py3-none-any.whl", "keras_harness-1.2.1.dev1+g1a2b3c4.tar.gz"], 1),
    ("v1.2.0-rc1", ["keras_harness-1.2.0rc1-py3-none-any.whl", "keras_harness-1.2.0rc1.tar.gz"], 1),
    ("v1.2.0", ["keras_harness-1.2.0-py3-none-any.whl"], 1),
    ("v1.2.0", ["keras_harness-1.2.0-py3-none-any.whl", "keras_harness-1.2.0.tar.gz", "other-1.0.tar.gz"], 1),
])
def test_the_version_check_passes_only_the_tags_own_files(tmp_path, tag, files, status):
    done = _version_check(tmp_path, tag, files)
    assert done.returncode == status, done.stdout + done.stderr
    if status:
        assert f"::error::the tag {tag} wants" in done.stdout, done.stdout


def _copy_of_this_tree(dest: Path) -> Path:
    """This working tree as git sees it (tracked and untracked files, not the ignored ones) and its .git: a build
    there reads the version and the file list from git as the release build does, and writes nothing here."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    shutil.copytree(ROOT / ".git", dest / ".git", symlinks=True)
    return dest


def test_the_wheel_built_from_the_sdist_has_every_tracked_file_of_the_package(tmp_path):
    tree = _copy_of_this_tree(tmp_path / "tree")
    # python -m build: the sdist, then the wheel from the unpacked sdist (not from the tree), as the release job.
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                           str(tree)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,), (sdist,) = (tmp_path / "dist").glob("*.whl"), (tmp_path / "dist").glob("*.tar.gz")
    version = wheel.name.split("-")[1]
    assert sdist.name == f"keras_harness-{version}.tar.gz"
    assert re.search(r"\+g[0-9a-f]{7,}", version) or "dev" not in version, f"{version}: not from git"
    tracked = subprocess.run(["git", "ls-files", "harness"], cwd=tree, capture_output=True, text=True, check=True,
                             timeout=60).stdout.split()
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"keras_harness-{version}.dist-info/METADATA").decode()
    assert [name for name in tracked if name not in names] == []
    assert f"\nVersion: {version}\n" in metadata
    assert "harness/ci/matrix.toml" in names and "harness/bench/zoo/outcomes.json" in names
    with tarfile.open(sdist) as tar:
        assert f"keras_harness-{version}/PKG-INFO" in tar.getnames()  # a build of the sdist alone keeps the version
    twine = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                           capture_output=True, text=True, timeout=120)
    assert twine.returncode == 0, twine.stdout + twine.stderr
