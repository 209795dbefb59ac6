"""A throw-away git repository with a tiny package, ``gatedemo``, for tests of the gate and of bisection.

``make_repo`` writes the package (``work()`` sleeps ``seconds``), an asv config and
a benchmark module, and commits them; ``commit`` adds later commits (a planted
slow-down is ``commit(repo, {"gatedemo/__init__.py": work_source(0.026)}, ...)``).
``run_harness`` runs a ``harness`` command there in *existing* mode, as inside a
prebuilt image: each commit is installed by pip into a private target folder that
asv's benchmark processes get on their path (``ASV_PYTHONPATH``: asv drops PYTHONPATH).
Imported by bare name (``from demorepo import ...``), as tests/parallel does with its helpers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

__all__ = ["BENCH", "CONF", "git", "commit", "make_repo", "work_source", "install_command", "run_harness"]

CONF = {"version": 1, "project": "gatedemo", "repo": ".", "branches": ["main"], "environment_type": "virtualenv",
        "benchmark_dir": "benchmarks", "results_dir": ".asv/results", "html_dir": ".asv/html", "env_dir": ".asv/env"}
BENCH = textwrap.dedent('''
    import gatedemo


    class Work:
        number = 3
        repeat = 10
        rounds = 1
        warmup_time = 0

        def time_work(self):
            gatedemo.work()
''')
_PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
              '[project]\nname = "gatedemo"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["gatedemo"]\n')


def work_source(seconds: float) -> str:
    """``gatedemo/__init__.py`` whose ``work()`` sleeps ``seconds``."""
    return f"import time\n\n\ndef work():\n    time.sleep({seconds})\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    """Writes ``files`` (path -> text), commits them all; returns the commit's hash."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_repo(repo: Path, bench: str = BENCH, seconds: float = 0.02) -> str:
    """Initialises ``repo`` with the package, config and benchmarks; returns the first commit's hash."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "gate@example.invalid")
    git(repo, "config", "user.name", "gate test")
    return commit(repo, {  # a throw-away repository's files (tests/unit/test_docs.py: not-a-reference)
        "pyproject.toml": _PYPROJECT, "gatedemo/__init__.py": work_source(seconds),  # not-a-reference
        "asv.conf.json": json.dumps(CONF), "benchmarks/__init__.py": "",  # not-a-reference
        "benchmarks/bench.py": bench, ".gitignore": ".asv/\n"}, "original")  # not-a-reference


def install_command(repo: Path) -> str:
    """Existing mode's install command: pip into a target folder beside ``repo``."""
    site = repo.parent / f"site-{repo.name}"
    return f"{{python}} -m pip install --quiet --no-deps --no-build-isolation --upgrade --target {site} {{path}}"


def run_harness(repo: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``harness ARGV`` in ``repo`` with HOME beside it (asv's machine file) and the target folder on asv's path."""
    site = repo.parent / f"site-{repo.name}"
    env = {**os.environ, "HOME": str(repo.parent), "ASV_PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=timeout)
