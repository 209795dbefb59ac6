"""A commit's build requirements against the installing Python (harness.ci.buildreqs), and existing mode's stop
before installing a commit this Python cannot build without isolation (exit 2, nothing installed).

The environment is a real one: this test's interpreter, asked by ``python -c`` as existing mode asks it; the
commits are real ones, of a git repository made in ``tmp_path``.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ci import buildreqs
from harness.ci.asvrun import INSTALL, AsvProject
from harness.cli import main
from harness.errors import InvalidValue, Unavailable

SETUPTOOLS = importlib.metadata.version("setuptools")  # this interpreter's, as the query must find it
ABSENT = "harness-no-such-dist"  # installed nowhere


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *argv], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str]) -> str:
    """A repository in ``repo`` (made on first use) with ``files`` committed; the commit's hash."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "c")
    return _git(repo, "rev-parse", "HEAD")


def _pyproject(*requires: str) -> dict[str, str]:
    return {"pyproject.toml": f"[build-system]\nrequires = {json.dumps(list(requires))}\n"
                              'build-backend = "setuptools.build_meta"\n'}


def test_an_old_or_missing_build_requirement_is_named_with_the_version_there_and_the_pip_command(tmp_path):
    commit = _commit(tmp_path, _pyproject("setuptools>=1", "setuptools>=9999", f"{ABSENT}>=8"))
    why = buildreqs.check(sys.executable, tmp_path, commit)
    assert why == (f"the environment {sys.executable} lacks the build requirements of {commit[:12]} (pyproject.toml "
                   f"[build-system].requires): setuptools>=9999 (has {SETUPTOOLS}), {ABSENT}>=8 (missing); install "
                   f"them ({sys.executable} -m pip install 'setuptools>=9999' '{ABSENT}>=8') or use --mode virtualenv")
    assert "setuptools>=1 " not in why


def test_requirements_the_environment_meets_pass(tmp_path):
    met = _commit(tmp_path, _pyproject("setuptools>=1", "SetupTools[core] >= 1.0, != 9999", "PIP"))
    assert buildreqs.check(sys.executable, tmp_path, met) is None


def test_markers_that_do_not_apply_skip_a_requirement_and_unknown_ones_check_it(tmp_path):
    skipped = _commit(tmp_path, _pyproject(f"{ABSENT}; python_version < '3'", "setuptools>=9999; sys_platform == "
                                           "'no-such-platform'"))
    assert buildreqs.check(sys.executable, tmp_path, skipped) is None
    checked = _commit(tmp_path, _pyproject(f"{ABSENT}; python_version >= '3' and extra == 'x'"))
    assert f"{ABSENT} (missing)" in buildreqs.check(sys.executable, tmp_path, checked)


def test_a_commit_without_build_system_needs_setuptools_and_bad_toml_names_the_commit(tmp_path):
    bare = _commit(tmp_path, {"setup.py": "from setuptools import setup\nsetup()\n"})
    assert buildreqs.commit_requires(tmp_path, bare) == list(buildreqs.DEFAULT_REQUIRES)
    assert buildreqs.check(sys.executable, tmp_path, bare) is None
    broken = _commit(tmp_path, {"pyproject.toml": "[build-system\n"})
    with pytest.raises(InvalidValue, match=f"{broken[:12]}:pyproject.toml is not valid TOML"):
        buildreqs.commit_requires(tmp_path, broken)


def test_names_are_normalized_and_extras_urls_and_parentheses_read():
    read = buildreqs.parse_requirement
    assert read("Setuptools_SCM[toml] >= 8 ; python_version >= '3.9'") == buildreqs.Requirement(
        "Setuptools_SCM[toml] >= 8", "setuptools-scm", ((">=", "8"),), "python_version >= '3.9'")
    assert read("cython (>=0.29,<3)").specifiers == ((">=", "0.29"), ("<", "3"))
    assert read("pkg @ https://example.invalid/pkg.whl").specifiers == ()
    with pytest.raises(InvalidValue, match="'setuptools>=' "):
        read("setuptools>=")
    env = buildreqs.Environment("python", {"setuptools-scm": "8.1.0"}, {})
    assert buildreqs.missing(["setuptools.SCM>=8", "SETUPTOOLS_scm[toml]>=9"], env) == [
        (read("SETUPTOOLS_scm[toml]>=9"), "8.1.0")]


@pytest.mark.parametrize(("version", "spec", "expected"), [
    ("65.5.0", ">=77", False), ("77.0.3", ">=77", True), ("80.9.0", ">=77,<81", True), ("81.0", "<81", False),
    ("8.1.1", "~=8.0", True), ("9.0", "~=8.0", False), ("8.0.5", "~=8.0.2", True), ("8.1", "~=8.0.2", False),
    ("2.0rc1", "<2", False), ("2.0rc1", "<2.0rc2", True), ("2.0rc1", ">=2.0.dev0", True), ("1.0.post1", ">1.0", False),
    ("1.1", ">1.0", True), ("2.3.1", "==2.*", True), ("3.0", "==2.*", False), ("1.0.0", "==1.0", True),
    ("1.0+local", "==1.0", True), ("1.0+local", "==1.0+other", False), ("1.5", "!=1.5", False), ("1!0.1", ">=9", True),
    ("1.0.dev1", "<1.0", False), ("1.0a1", "<1.0.post1", True), ("1.0", "===1.0", True), ("1.0.0", "===1.0", False),
])
def test_pep440_specifiers(version, spec, expected):
    specifiers = buildreqs.parse_requirement(f"x{spec}").specifiers
    assert buildreqs.satisfies(version, specifiers) is expected


def test_a_version_that_is_not_pep440_is_left_to_pip():
    assert buildreqs.satisfies("not.a version", ((">=", "1"),)) is None
    env = buildreqs.Environment("python", {"odd": "not.a version"}, {})
    assert buildreqs.missing(["odd>=1"], env) == []


def test_markers_read_from_the_installing_interpreter():
    env = buildreqs.query(sys.executable)
    major_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert env.markers["python_version"] == major_minor and env.markers["sys_platform"] == sys.platform
    assert env.distributions["setuptools"] == SETUPTOOLS
    assert buildreqs.marker_applies(f"python_version >= '{major_minor}' and os_name == '{env.markers['os_name']}'",
                                    env.markers)
    assert not buildreqs.marker_applies(f"python_version > '{major_minor}' or sys_platform == 'x'", env.markers)
    assert buildreqs.marker_applies("platform_machine not in ''", env.markers)


def _asv_repo(tmp_path: Path, *requires: str) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    commit = _commit(repo, {**_pyproject(*requires), "asv.conf.json": json.dumps(
        {"version": 1, "project": "demo", "repo": ".", "branches": ["main"], "environment_type": "virtualenv"})})
    return repo, commit


def test_existing_mode_stops_before_installing_with_the_default_install_command(tmp_path, capsys):
    repo, commit = _asv_repo(tmp_path, "setuptools>=9999")
    project = AsvProject(repo / "asv.conf.json", "m", mode="existing")
    with pytest.raises(Unavailable, match=rf"setuptools>=9999 \(has {SETUPTOOLS}\)"):
        project.run_commit(commit)
    assert _git(repo, "worktree", "list").count("\n") == 0  # no worktree made, nothing installed
    custom = AsvProject(repo / "asv.conf.json", "m", mode="existing", install=INSTALL.replace("--quiet", "-q"))
    custom.check_build_requirements(commit, commit)  # builds without isolation too: a warning, once
    assert capsys.readouterr().err.count("harness: warning: the environment") == 1
    AsvProject(repo / "asv.conf.json", "m", mode="existing", install="true {python} {path}").check_build_requirements(
        commit)  # a command that isolates its build (or builds nothing) is the user's
    AsvProject(repo / "asv.conf.json", "m").check_build_requirements(commit)  # virtualenv: asv builds it
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["bench-compare", "HEAD", "HEAD", "--bench", "x"],
                                  ["bisect", "Work.time_work", "HEAD~1", "HEAD"]])
def test_bench_compare_and_bisect_exit_2_naming_the_missing_requirement(tmp_path, capsys, monkeypatch, argv):
    ran: list = []
    monkeypatch.setattr(AsvProject, "asv", lambda self, argv, check=True: ran.append(argv))
    repo, _ = _asv_repo(tmp_path, "setuptools>=1")
    head = _commit(repo, _pyproject("setuptools>=1", f"{ABSENT}>=8"))
    status = main([*argv, "--mode", "existing", "--config", str(repo / "asv.conf.json"), "--machine", "m"])
    err = capsys.readouterr().err
    assert status == 2
    assert f"harness {argv[0]}: error: the environment {sys.executable} lacks the build requirements of " \
           f"{head[:12]} (pyproject.toml [build-system].requires): {ABSENT}>=8 (missing); install them" in err
    assert ran == []  # stopped before asv ran (no machine registered, nothing installed)
