"""harness.containers without an engine: mirror discovery, client choice, refusals that name the problem."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness import containers
from harness.cli import main


def _fake_docker(folder: Path, version: str, buildx: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "Docker version {version}, build abc"; exit 0; fi\n'
        f'if [ "$1" = "buildx" ]; then {"echo v0.12.1; exit 0" if buildx else "exit 1"}; fi\n'
        "exit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def fresh_client(monkeypatch):
    monkeypatch.setattr(containers, "_CLIENT", [])
    monkeypatch.delenv("HARNESS_DOCKER", raising=False)


def test_deb822_sources_give_the_bookworm_main_mirror(tmp_path):
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://mirror.example/node\nSuites: nodistro\nComponents: main\n\n"
                       "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
                       "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
                       "Suites: bookworm-security\nComponents: main\n")
    assert containers.apt_mirror([sources]) == "http://mirror.example/debian"


def test_one_line_sources_give_the_bookworm_main_mirror(tmp_path):
    listing = tmp_path / "sources.list"
    listing.write_text("# comment\ndeb [arch=amd64] http://mirror.example/debian-security bookworm-security main\n"
                       "deb [signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n")
    assert containers.apt_mirror([listing]) == "http://mirror.example/debian"


def test_no_bookworm_mirror_is_an_error_naming_the_files(tmp_path):
    listing = tmp_path / "sources.list"
    listing.write_text("deb http://mirror.example/ubuntu jammy main\n")
    with pytest.raises(RuntimeError, match="no mirror for Debian bookworm main in .*sources.list"):
        containers.apt_mirror([listing])


def test_the_client_with_builtin_buildkit_wins_over_a_newer_one_without_buildx(tmp_path, monkeypatch, fresh_client):
    # Debian's docker.io 20.10 builds with the daemon's BuildKit; a 28.x client without the buildx
    # plugin refuses to build at all ("BuildKit is enabled but the buildx component is missing").
    _fake_docker(tmp_path / "new", "28.2.2", buildx=False)
    old = _fake_docker(tmp_path / "old", "20.10.24+dfsg1", buildx=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'new'}{os.pathsep}{tmp_path / 'old'}")
    assert containers.docker_client() == str(old)


def test_a_client_with_buildx_is_taken_first(tmp_path, monkeypatch, fresh_client):
    new = _fake_docker(tmp_path / "new", "28.2.2", buildx=True)
    _fake_docker(tmp_path / "old", "20.10.24", buildx=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'new'}{os.pathsep}{tmp_path / 'old'}")
    assert containers.docker_client() == str(new)


def test_harness_docker_overrides_the_choice(monkeypatch, fresh_client):
    monkeypatch.setenv("HARNESS_DOCKER", "/opt/my/docker")
    assert containers.docker_client() == "/opt/my/docker"


def test_no_client_means_no_engine_and_a_clear_refusal_to_start_one(tmp_path, monkeypatch, fresh_client):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert containers.find_engine() is None
    with pytest.raises(RuntimeError, match="docker, dockerd is not installed .*apt-get install docker.io"):
        containers.start_engine(tmp_path / "engine")


def _fake_tools(tmp_path, monkeypatch, dockerd_body: str, uid: int):
    """A fake Debian docker client and a dockerd running ``dockerd_body`` on PATH; ``uid`` as geteuid."""
    _fake_docker(tmp_path / "bin", "20.10.24", buildx=False)
    dockerd = tmp_path / "bin" / "dockerd"
    dockerd.write_text(f"#!/bin/sh\n{dockerd_body}\n")
    dockerd.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(os, "geteuid", lambda: uid)


def test_starting_a_private_engine_needs_root(tmp_path, monkeypatch, fresh_client):
    _fake_tools(tmp_path, monkeypatch, "exit 1", uid=1000)
    with pytest.raises(RuntimeError, match="needs root; start one yourself and set DOCKER_HOST"):
        containers.start_engine(tmp_path / "engine")


def test_a_private_engine_that_dies_is_reported_with_its_log(tmp_path, monkeypatch, fresh_client):
    _fake_tools(tmp_path, monkeypatch, "echo 'failed to mount overlay: permission denied'\nexit 1", uid=0)
    with pytest.raises(RuntimeError, match="did not answer .*\n.*failed to mount overlay"):
        containers.start_engine(tmp_path / "engine", timeout=10)
    assert not (tmp_path / "engine").exists()  # what it started is cleaned up


def test_harness_docker_rejects_an_unknown_entry(capsys):
    assert main(["docker", "build", "--entry", "tf999"]) == 2
    err = capsys.readouterr().err
    assert "--entry must be one of" in err and "got 'tf999'" in err


def test_a_silent_command_is_killed_at_its_timeout(tmp_path, monkeypatch, fresh_client):
    slow = tmp_path / "docker"
    slow.write_text("#!/bin/sh\necho building\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("HARNESS_DOCKER", str(slow))
    lines = []
    code, tail = containers.Engine().stream(["build", "."], lines.append, timeout=1)
    assert code != 0 and lines == ["building"] and tail[-1] == "(killed after 1 s)"


def test_sigterm_still_removes_the_image_and_stops_a_private_engine(monkeypatch, tmp_path):
    # A cancelled CI job sends SIGTERM: without the handler Python dies without running `finally`,
    # leaving a private dockerd and its mounted data root behind (seen here once).
    import signal

    from harness.cli import docker as docker_cli

    calls = []

    class FakeEngine:
        started, host = True, "unix:///tmp/fake.sock"

        def docker(self, *args, **kwargs):
            calls.append(("docker", *args[:2]))

        def stop(self):
            calls.append(("stop",))

    def build_then_get_killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(containers, "find_engine", FakeEngine)
    monkeypatch.setattr(docker_cli, "_build_and_check", build_then_get_killed)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        main(["docker", "build", "--work-dir", str(tmp_path)])
    assert ("docker", "image", "rm") in calls and calls[-1] == ("stop",)
    assert signal.getsignal(signal.SIGTERM) is before
