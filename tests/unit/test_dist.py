"""harness.dist on real installs: a wheel pip installed from a file, from a local index, from a git repository and
from a directory; an editable install's and a source tree's metadata as installers and setuptools write them.

Each case runs ``installed()`` and ``default_requirement()`` in a fresh interpreter (``-I -S``: no site-packages,
no PYTHONPATH) whose ``sys.path`` holds the install and, for editable and source cases, a small project: a
``harness`` package with a copy of harness/dist.py, installed as the distribution keras-harness.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.dist import Installed, default_requirement, is_release

DIST_PY = Path(__file__).resolve().parents[2] / "harness" / "dist.py"
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
_INIT = """\
from importlib import metadata as _metadata

try:  # as harness/__init__.py
    __version__ = _metadata.version("keras-harness")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
"""
_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "keras-harness"
version = "1.2.3"

[tool.setuptools]
packages = ["harness"]
"""


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.strip()


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "install",
                           "--quiet", "--no-deps", "--no-index", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _ask(*path: Path) -> tuple[dict, list[str]]:
    """installed() and default_requirement() in a fresh interpreter whose sys.path starts with ``path``; its
    version is harness.__version__ there (what harness --version prints)."""
    code = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1])\n"
            "from dataclasses import asdict\n"
            "from harness.dist import installed, default_requirement\n"
            "import harness, harness.dist\n"
            "info = installed()\n"
            "print(json.dumps([asdict(info), list(default_requirement(info)), harness.dist.__file__,\n"
            "                  harness.__version__]))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, json.dumps([str(p) for p in path])],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **_GIT_ENV})
    assert done.returncode == 0, done.stderr
    info, requirement, module, version = json.loads(done.stdout)
    assert Path(module).resolve().parent.parent in {p.resolve() for p in path}, module  # this case's own copy
    assert info["version"] == version
    return info, requirement


def _package(root: Path) -> Path:
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "__init__.py").write_text(_INIT)
    shutil.copy(DIST_PY, root / "harness" / "dist.py")
    return root


def _wheel(dest: Path, version: str) -> Path:
    """A real wheel of the distribution keras-harness ``version``: the harness package, METADATA, WHEEL, RECORD."""
    src = _package(dest / f"src-{version}")
    info = f"keras_harness-{version}.dist-info"
    files = {f"harness/{p.name}": p.read_bytes() for p in sorted((src / "harness").glob("*.py"))}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: keras-harness\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test_dist\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = dest / f"keras_harness-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A git repository of a small keras-harness project, 1.2.3, tagged v1.2.3 and one commit past the tag."""
    root = _package(tmp_path_factory.mktemp("dist") / "project")
    (root / "pyproject.toml").write_text(_PYPROJECT)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "one")
    _git(root, "tag", "v1.2.3")
    (root / "README").write_text("two\n")
    _git(root, "add", "README")
    _git(root, "commit", "-q", "-m", "two")
    return root


def test_a_wheel_installed_from_a_file_is_an_archive(tmp_path):
    wheel = _wheel(tmp_path, "1.2.3")
    _pip("--target", str(tmp_path / "site"), str(wheel))
    info, (requirement, reason) = _ask(tmp_path / "site")
    assert info == {"version": "1.2.3", "release": True, "commit": None, "url": wheel.as_uri(), "how": "archive"}
    assert requirement == f"keras-harness @ {wheel.as_uri()}"
    assert "archive" in reason and "only this machine" in reason


def test_a_release_from_an_index_is_pinned_by_version(tmp_path):
    _wheel(tmp_path / "index", "1.2.3")
    _pip("--target", str(tmp_path / "site"), "--find-links", str(tmp_path / "index"), "keras-harness==1.2.3")
    assert not list((tmp_path / "site").glob("*.dist-info/direct_url.json"))  # an index install writes none
    info, requirement = _ask(tmp_path / "site")
    assert info == {"version": "1.2.3", "release": True, "commit": None, "url": None, "how": "index"}
    assert requirement == ["keras-harness==1.2.3", "the installed release"]


def test_a_git_install_is_pinned_to_its_commit(tmp_path, repo):
    head = _git(repo, "rev-parse", "HEAD")
    _pip("--no-build-isolation", "--target", str(tmp_path / "site"), f"git+{repo.as_uri()}@{head}")
    info, (requirement, reason) = _ask(tmp_path / "site")
    assert info == {"version": "1.2.3", "release": True, "commit": head, "url": repo.as_uri(), "how": "vcs"}
    assert requirement == f"keras-harness @ git+{repo.as_uri()}@{head}"
    assert head[:12] in reason


def test_a_directory_install_is_its_checkouts_head(tmp_path, repo):
    _pip("--no-build-isolation", "--target", str(tmp_path / "site"), str(repo))
    info, (requirement, reason) = _ask(tmp_path / "site")
    tagged = _git(repo, "rev-parse", "v1.2.3^{commit}")  # a release's commit: its tag's
    assert info == {"version": "1.2.3", "release": True, "commit": tagged, "url": repo.as_uri(), "how": "dir"}
    head = _git(repo, "rev-parse", "HEAD")
    assert requirement == f"keras-harness @ git+{repo.as_uri()}@{head}"
    assert reason.startswith("not a release") and "only this machine" in reason


def _editable(site: Path, repo: Path, version: str) -> None:
    """The metadata an editable install writes (PEP 610 and PEP 660): dist-info naming the project's directory."""
    info = site / f"keras_harness-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: keras-harness\nVersion: {version}\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "direct_url.json").write_text(json.dumps({"url": repo.as_uri(), "dir_info": {"editable": True}}))


@pytest.mark.parametrize(("origin", "url"), [
    (None, None),
    ("https://example.org/team/harness.git", "git+https://example.org/team/harness.git"),
    ("git@example.org:team/harness.git", "git+ssh://git@example.org/team/harness.git"),
])
def test_an_editable_checkout_names_its_commit_and_pins_head_at_origin(tmp_path, repo, origin, url):
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    _git(clone, "remote", "remove", "origin")
    if origin:
        _git(clone, "remote", "add", "origin", origin)
    head = _git(clone, "rev-parse", "HEAD")
    _editable(tmp_path / "site", clone, f"1.2.4.dev1+g{head[:9]}")
    info, (requirement, reason) = _ask(tmp_path / "site", clone)
    assert info == {"version": f"1.2.4.dev1+g{head[:9]}", "release": False, "commit": head, "url": clone.as_uri(),
                    "how": "editable"}
    assert requirement == f"keras-harness @ {url or 'git+' + clone.as_uri()}@{head}"
    assert reason.startswith("not a release") and "uncommitted" not in reason
    (clone / "README").write_text("changed\n")
    assert "uncommitted changes are not in it" in _ask(tmp_path / "site", clone)[1][1]


def test_a_source_tree_is_neither_its_egg_info_nor_another_install(tmp_path, repo):
    # The egg-info a build leaves in the tree, and another harness installed elsewhere, are not this harness.
    (repo / "keras_harness.egg-info").mkdir(exist_ok=True)
    (repo / "keras_harness.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: keras-harness\n"
                                                             "Version: 9.9.9\n")
    _wheel(tmp_path / "index", "1.2.3")
    _pip("--target", str(tmp_path / "site"), "--find-links", str(tmp_path / "index"), "keras-harness==1.2.3")
    try:
        info, (requirement, reason) = _ask(repo, tmp_path / "site")
    finally:
        shutil.rmtree(repo / "keras_harness.egg-info")
    head = _git(repo, "rev-parse", "HEAD")
    # Its version is harness.__version__'s: the tree's own metadata, the egg-info of its last build.
    assert info == {"version": "9.9.9", "release": True, "commit": head, "url": None, "how": "source"}
    assert requirement == f"keras-harness @ git+{repo.as_uri()}@{head}"
    assert "(source)" in reason


def test_a_directory_that_is_no_checkout_is_a_file_url(tmp_path):
    root = _package(tmp_path / "copy")
    info, (requirement, reason) = _ask(root)
    assert info == {"version": "0+unknown", "release": False, "commit": None, "url": None, "how": "source"}
    assert requirement == f"keras-harness @ {root.as_uri()}"
    assert "not a git checkout" in reason


@pytest.mark.parametrize(("version", "release"), [
    ("1.2.3", True), ("0.2.0rc1", True), ("2.0.post1", True), ("0.2.dev3+g1a2b3c4", False),
    ("0.2.dev3+g1a2b3c4.d20261128", False), ("1.2.3+local", False), ("0.1.0.dev0", False), ("0+unknown", False),
])
def test_a_release_is_a_tags_version(version, release):
    assert is_release(version) is release


def test_requirements_of_each_kind():
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert default_requirement(Installed("0.3.dev1", False, None, None, "index")) == (
        "keras-harness==0.3.dev1", "the installed pre-release 0.3.dev1 from the package index")
    assert default_requirement(Installed("0.3.0", True, sha, "https://example.org/h.git", "vcs"))[0] == (
        f"keras-harness @ git+https://example.org/h.git@{sha}")
    hg = default_requirement(Installed("0.3.0", True, sha, "hg+https://example.org/h", "vcs"))
    assert hg[0] == f"keras-harness @ hg+https://example.org/h@{sha}"
    url = "https://example.org/keras_harness-0.3.0-py3-none-any.whl"
    archive = default_requirement(Installed("0.3.0", True, None, url, "archive"))
    assert archive[0] == f"keras-harness @ {url}" and "only this machine" not in archive[1]


def test_harness_env_says_how_harness_was_installed(capsys):
    from dataclasses import asdict

    from harness.cli import main
    from harness.dist import installed

    info = installed()
    assert main(["env", "--no-tf", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["harness"]["installed"] == asdict(info)
    assert main(["env", "--no-tf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("harness ") and lines[1].startswith("installed    ")
    assert lines[1].endswith("(a release)" if info.release else "(not a release)")
