"""The regression gate on a planted regression (issue 5): a throw-away repository with a tiny package.

Four commits: the original, an unchanged copy (README only), a 30% slower one, and
one whose benchmark raises. ``harness bench-compare`` must exit 0, 1 and 2 on the
three pairs. The gate runs in *existing* mode (as inside a prebuilt image): each
commit is installed by pip into a private target directory on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("asv")

_WORK = "import time\n\n\ndef work():\n    time.sleep({seconds})\n"
_CONF = {"version": 1, "project": "gatedemo", "repo": ".", "branches": ["main"], "environment_type": "virtualenv",
         "benchmark_dir": "benchmarks", "results_dir": ".asv/results", "html_dir": ".asv/html", "env_dir": ".asv/env"}
_BENCH = textwrap.dedent('''
    import gatedemo


    class Work:
        number = 3
        repeat = 10
        rounds = 1
        warmup_time = 0

        def time_work(self):
            gatedemo.work()
''')


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gatedemo")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "gate@example.invalid")
    _git(repo, "config", "user.name", "gate test")
    pyproject = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                 '[project]\nname = "gatedemo"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["gatedemo"]\n')
    first = _commit(repo, {  # a throw-away repository's files (tests/unit/test_docs.py: not-a-reference)
        "pyproject.toml": pyproject,
        "gatedemo/__init__.py": _WORK.format(seconds=0.02), "asv.conf.json": json.dumps(_CONF),
        "benchmarks/__init__.py": "",
        "benchmarks/bench.py": _BENCH, ".gitignore": ".asv/\n"}, "original")  # not-a-reference
    same = _commit(repo, {"README.md": "unchanged code\n"}, "docs only")
    slower = _commit(repo, {"gatedemo/__init__.py": _WORK.format(seconds=0.026)}, "30% slower")
    broken = _commit(repo, {"gatedemo/__init__.py": "def work():\n    raise RuntimeError('broken')\n"}, "broken")
    return repo, {"first": first, "same": same, "slower": slower, "broken": broken}


def _gate(repo: Path, base: str, head: str, mode: str = "existing") -> subprocess.CompletedProcess:
    site = repo.parent / f"site-{repo.name}"
    install = f"{{python}} -m pip install --quiet --no-deps --no-build-isolation --upgrade --target {site} {{path}}"
    env = {**os.environ, "HOME": str(repo.parent), "ASV_PYTHONPATH": str(site)}  # asv drops PYTHONPATH
    return subprocess.run([sys.executable, "-m", "harness", "bench-compare", base, head, "--mode", mode,
                           "--machine", "gate-test", "--install-command", install, "--markdown",
                           str(repo.parent / "summary.md")], cwd=repo, capture_output=True, text=True, env=env,
                          timeout=300)


def test_gate_passes_an_unchanged_pair(planted):
    repo, commits = planted
    done = _gate(repo, commits["first"], commits["same"])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "No benchmark got worse" in done.stdout and "1 same" in done.stdout


def test_gate_fails_a_planted_30_percent_slowdown(planted):
    repo, commits = planted
    done = _gate(repo, commits["same"], commits["slower"])
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "Performance regression" in done.stdout
    row = next(line for line in done.stdout.splitlines() if "bench.Work.time_work" in line)
    assert row.startswith("| + |")
    worse_by = float(row.split("|")[5].strip().rstrip("x"))
    assert 1.2 < worse_by < 1.45
    assert (repo.parent / "summary.md").read_text().strip() == done.stdout.strip()


def test_gate_reports_a_benchmark_error_as_2(planted):
    repo, commits = planted
    done = _gate(repo, commits["slower"], commits["broken"])
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert "Benchmark errors" in done.stdout and "| ! |" in done.stdout


@pytest.mark.slow
def test_gate_in_virtualenv_mode_builds_both_commits(planted):
    # asv continuous creates a virtualenv and builds each commit there (about a minute here).
    repo, commits = planted
    done = _gate(repo, commits["same"], commits["slower"], mode="virtualenv")
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "asv continuous --factor 1.1" in done.stderr and "| + | `bench.Work.time_work`" in done.stdout
