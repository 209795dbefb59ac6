"""How one commit is run (harness.ci.asvrun), without asv: the argv per mode, exit codes, the PYTHONPATH warning."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from harness.ci.asvrun import AsvProject, resolve_mode


@pytest.fixture
def calls(monkeypatch):
    """The asv argv lists a project runs (asv itself stands in with exit ``status``)."""
    seen: list[list[str]] = []
    status = {"code": 0}

    def fake_asv(self, argv, check=True):
        seen.append(list(argv))
        return status["code"]

    monkeypatch.setattr(AsvProject, "asv", fake_asv)
    monkeypatch.setattr(AsvProject, "_installed", lambda self, commit: contextlib.nullcontext())
    return seen, status


def test_virtualenv_mode_runs_the_commit_alone(calls):
    seen, _ = calls
    AsvProject(Path("/x/asv.conf.json"), "m").run_commit("a" * 40, ["^bench$"])
    assert seen == [["run", "--machine", "m", "--record-samples", "--show-stderr", "--bench", "^bench$",
                     "a" * 40 + "^!"]]


def test_existing_mode_sets_the_commit_hash_and_warns_about_pythonpath(calls, monkeypatch, capsys):
    seen, _ = calls
    project = AsvProject(Path("/x/asv.conf.json"), "m", "existing")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    project.run_commit("b" * 40)
    assert seen[-1][:4] == ["run", "--python=same", "--set-commit-hash", "b" * 40]
    assert "PYTHONPATH" not in capsys.readouterr().err
    # asv's timeraw_ benchmarks timed a tree on PYTHONPATH rather than the installed commit (docs/regressions.md)
    monkeypatch.setenv("PYTHONPATH", "/src/tree")
    project.run_commit("b" * 40)
    assert "PYTHONPATH is set (/src/tree)" in capsys.readouterr().err


def test_a_failed_benchmark_is_results_but_another_failure_raises(calls):
    _, status = calls
    project = AsvProject(Path("/x/asv.conf.json"), "m")
    status["code"] = 2  # a benchmark failed: in the saved results, for the caller to judge
    assert project.run_commit("c" * 40) == 2
    status["code"] = 1
    with pytest.raises(RuntimeError, match="asv run on cccccccccccc failed with exit status 1"):
        project.run_commit("c" * 40)


def test_modes():
    assert resolve_mode("existing") == "existing" and resolve_mode("auto") in ("existing", "virtualenv")
    with pytest.raises(ValueError, match="mode must be one of auto, virtualenv, existing; got 'docker'"):
        resolve_mode("docker")
