"""harness.ci.containers without an engine: mirror discovery, client choice, refusals that name the problem,
and the Docker SDK-driven steps (containers, images, errors) against a fake SDK client.

The fake client stands in for ``docker.DockerClient`` (``Engine(api=...)``); the SDK itself is needed
for its error classes, and the tests that use it skip, saying so, where it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.ci import containers
from harness.ci.matrix import image_tag, load_matrix, newest
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


def test_no_client_means_no_engine_and_a_clear_refusal_to_start_one(tmp_path, monkeypatch, fresh_client, sdk):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
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


def test_starting_a_private_engine_needs_root(tmp_path, monkeypatch, fresh_client, sdk):
    _fake_tools(tmp_path, monkeypatch, "exit 1", uid=1000)
    with pytest.raises(RuntimeError, match="needs root; start one yourself and set DOCKER_HOST"):
        containers.start_engine(tmp_path / "engine")


def test_a_private_engine_that_dies_is_reported_with_its_log(tmp_path, monkeypatch, fresh_client, sdk):
    _fake_tools(tmp_path, monkeypatch, "echo 'failed to mount overlay: permission denied'\nexit 1", uid=0)
    with pytest.raises(RuntimeError, match="did not answer .*\n.*failed to mount overlay"):
        containers.start_engine(tmp_path / "engine", timeout=10)
    assert not (tmp_path / "engine").exists()  # what it started is cleaned up


# A dockerd that refuses overlay2 as a kernel without overlay mounts does, and otherwise answers the SDK on its
# socket (ping and version) until SIGTERM, having made its data root.
_FAKE_DOCKERD = """
import http.server, json, os, socketserver, sys
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
if opts["storage-driver"] == "overlay2":
    print("failed to start daemon: error initializing graphdriver: driver not supported", flush=True)
    sys.exit(1)
os.makedirs(opts["data-root"], exist_ok=True)

class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = b"OK" if self.path.endswith("/_ping") else json.dumps(
            {"Version": "20.10.24", "ApiVersion": "1.41", "Os": "linux", "Arch": "amd64"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if body == b"OK" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

Server(opts["host"].removeprefix("unix://"), Answer).serve_forever()
"""


def test_a_private_engine_falls_back_to_vfs_keeps_its_data_root_and_holds_it(tmp_path, monkeypatch, fresh_client,
                                                                            sdk):
    (tmp_path / "fake_dockerd.py").write_text(_FAKE_DOCKERD)
    _fake_tools(tmp_path, monkeypatch, f'exec {sys.executable} {tmp_path / "fake_dockerd.py"} "$@"', uid=0)
    root, said = tmp_path / "engine", []
    engine = containers.start_engine(root, said.append, timeout=60, keep_data=True)
    try:
        assert engine.driver == "vfs" and containers.engine_version(engine)["version"] == "20.10.24"
        assert any("did not start with the overlay2 storage driver (exit 1)" in line and "driver not supported" in line
                   for line in said), said
        assert not (root / "data-overlay2").exists() and (root / "data-vfs").is_dir()
        (root / "data-vfs" / "layer").write_text("cached")
        with pytest.raises(RuntimeError, match=f"^another private engine uses {re.escape(str(root))} "):
            containers.start_engine(root, timeout=10, keep_data=True)  # two engines on one data root: refused
    finally:
        engine.stop()
    assert engine.process.poll() is not None
    assert sorted(p.name for p in root.iterdir()) == ["data-vfs", "dockerd.log", "lock"]  # the socket's folder went
    again = containers.start_engine(root, timeout=60, keep_data=True, drivers=["vfs"])
    again.stop()
    assert (root / "data-vfs" / "layer").read_text() == "cached"  # the next engine found the cache
    containers.start_engine(root, timeout=60, drivers=["vfs"]).stop()
    assert not root.exists()  # without keep_data nothing stays


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


def test_sigterm_still_removes_the_image_and_stops_a_private_engine(monkeypatch, tmp_path, sdk):
    # A cancelled CI job sends SIGTERM: without the handler Python dies without running `finally`,
    # leaving a private dockerd and its mounted data root behind (seen here once).
    import signal

    from harness.cli import docker as docker_cli

    tag = image_tag(newest(load_matrix()), "cpu")
    client = FakeClient(sdk, images={tag: IMAGE})
    stopped = []

    def build_then_get_killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    engine = containers.Engine(host="unix:///tmp/fake.sock", started=True, api=client)
    monkeypatch.setattr(engine, "stop", lambda: stopped.append(client.events[:]))
    monkeypatch.setattr(containers, "find_engine", lambda: engine)
    monkeypatch.setattr(docker_cli, "_build_and_check", build_then_get_killed)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        main(["docker", "build", "--work-dir", str(tmp_path)])
    assert stopped == [[("image remove", tag, True)]]  # the image went first, then the engine
    assert signal.getsignal(signal.SIGTERM) is before


# --- the Docker SDK for Python, driven through a fake client -------------------------------------------------------


@pytest.fixture
def sdk():
    """The ``docker`` module (its error classes are what the fake client raises); skips where it is absent."""
    try:
        import docker
    except ImportError:
        pytest.skip("needs the Docker SDK for Python (pip install 'keras-harness[ci]')")
    return docker


class FakeContainer:
    """A container whose log stream yields ``chunks`` (raising KeyboardInterrupt at ``interrupt_at``), then,
    with ``block``, hangs until killed; ``events`` records what was done to it, in order."""

    def __init__(self, events: list, chunks=(), status=0, interrupt_at=None, block=False):
        self.events, self.chunks, self.status = events, list(chunks), status
        self.interrupt_at = interrupt_at
        self.unblock = threading.Event() if block else None

    def logs(self, stream=False, follow=False):
        assert stream and follow
        for i, chunk in enumerate(self.chunks):
            if i == self.interrupt_at:
                raise KeyboardInterrupt
            self.events.append(("chunk", i))
            yield chunk
        if self.unblock is not None:
            assert self.unblock.wait(30), "never killed"

    def wait(self):
        self.events.append(("wait",))
        return {"StatusCode": self.status, "Error": None}

    def kill(self):
        self.events.append(("kill",))
        self.status = 137
        self.unblock.set()

    def stop(self, timeout=None):
        self.events.append(("stop",))

    def remove(self, force=False):
        self.events.append(("container remove", force))


class FakeClient:
    """What harness uses of ``docker.DockerClient``: images get/pull/remove, containers run/get, version, close.

    ``images`` maps tag to the ``attrs`` of ``images.get``; each ``containers.run`` takes the next of
    ``runs`` (a FakeContainer, or an exception to raise after "creating" it, as the SDK's run can).
    """

    def __init__(self, docker, images=None, runs=(), pull_error=None, remove_error=None):
        self.docker, self.events = docker, []
        self.attrs = dict(images or {})
        self.runs, self.pull_error, self.remove_error = list(runs), pull_error, remove_error
        self.created: dict = {}
        self.images = SimpleNamespace(get=self._get, pull=self._pull, remove=self._remove)
        self.containers = SimpleNamespace(run=self._run, get=self._get_container)

    def _get(self, tag):
        if tag not in self.attrs:
            raise self.docker.errors.ImageNotFound(f"No such image: {tag}")
        return SimpleNamespace(attrs=self.attrs[tag])

    def _pull(self, tag):
        self.events.append(("pull", tag))
        if self.pull_error:
            raise self.pull_error

    def _remove(self, tag, force=False):
        if self.remove_error:
            raise self.remove_error
        self._get(tag)
        self.events.append(("image remove", tag, force))
        del self.attrs[tag]

    def _run(self, image, command, **options):
        self.events.append(("run", image, command, options))
        outcome = self.runs.pop(0)
        self.created[options["name"]] = outcome if isinstance(outcome, FakeContainer) else FakeContainer(self.events)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _get_container(self, name):
        if name not in self.created:
            raise self.docker.errors.NotFound(f"No such container: {name}")
        return self.created[name]

    def version(self):
        return {"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux", "Arch": "amd64"}

    def ping(self):
        return True

    def close(self):
        self.events.append(("close",))


IMAGE = {"Size": 2_000_000_000, "Config": {"User": "1000:1000", "Labels": {"io.harness.entry": "tf221"}}}


def _engine(client):
    return containers.Engine(host="unix:///run/fake/docker.sock", api=client)


def test_the_module_and_the_cli_import_without_the_sdk():
    code = ("import sys; sys.modules['docker'] = None; import harness.ci.containers, harness.cli.docker; "
            "print('imported')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr


def test_without_the_sdk_harness_docker_says_in_one_line_which_extra_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` now raises ImportError
    line = ("harness docker: the Docker SDK for Python (docker) is not installed (import of docker halted; None in "
            "sys.modules); pip install 'keras-harness[ci]'")
    with pytest.raises(RuntimeError, match=re.escape(line)):
        containers.find_engine()
    assert main(["docker", "build", "--work-dir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert err == f"harness docker: error: {line}\n"
    assert not (tmp_path / "work").exists()  # refused before filling a wheelhouse or starting anything


def test_an_engine_that_does_not_answer_is_one_line_naming_its_address(tmp_path, sdk):
    host = f"unix://{tmp_path}/none.sock"
    assert containers.find_engine.__doc__ and containers._reach(host, timeout=2) is None
    with pytest.raises(RuntimeError, match=f"^no Docker engine answers at {host}: [^\\n]+$"):
        containers.connect(host, timeout=2)
    with pytest.raises(RuntimeError, match=f"^no Docker engine answers at {host}: "):
        containers.Engine(host=host).client()


def test_the_engine_version_comes_from_the_sdk(sdk):
    assert containers.engine_version(_engine(FakeClient(sdk))) == {
        "version": "28.2.2", "api_version": "1.50", "os": "linux", "arch": "amd64"}


def test_log_lines_are_passed_on_in_order_as_they_arrive(sdk):
    events: list = []
    # Chunks end mid-line, and mid-character (é is two bytes); stderr lines come interleaved.
    chunks = [b"collecting ", b"3 items\nte", b"st_a PASSED\nwarning: caf\xc3", b"\xa9\n", b"no newline at the end"]
    container = FakeContainer(events, chunks, status=0)
    client = FakeClient(sdk, images={"harness:tf221": IMAGE}, runs=[container])
    client.events = events

    def log(line):
        events.append(("line", line))

    code, lines, seconds = containers.run_in_image(_engine(client), "harness:tf221", ["pytest", "-q"], log=log)
    assert code == 0 and seconds >= 0
    assert lines == ["collecting 3 items", "test_a PASSED", "warning: café", "no newline at the end"]
    # Streamed: each line is logged as soon as its chunk arrived, before the next chunk is read.
    shown = [e for e in events if e[0] in ("chunk", "line")]
    assert shown == [("chunk", 0), ("chunk", 1), ("line", "collecting 3 items"), ("chunk", 2),
                     ("line", "test_a PASSED"), ("chunk", 3), ("line", "warning: café"), ("chunk", 4),
                     ("line", "no newline at the end")]


def test_the_container_runs_without_network_with_the_mount_read_only_and_the_gpus(tmp_path, sdk):
    client = FakeClient(sdk, images={"harness:tf221-gpu": IMAGE}, runs=[FakeContainer([])])
    containers.run_in_image(_engine(client), "harness:tf221-gpu", ["harness", "env"], mount=tmp_path, gpus=True)
    _, image, command, options = client.events[0]
    assert (image, command, options["detach"], options["network_mode"]) == (
        "harness:tf221-gpu", ["harness", "env"], True, "none")
    assert options["volumes"] == {str(tmp_path.resolve()): {"bind": "/src", "mode": "ro"}}
    (request,) = options["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]  # --gpus all


@pytest.mark.parametrize("status", [0, 3])
def test_the_exit_status_comes_back_and_the_container_is_removed(status, sdk):
    events: list = []
    client = FakeClient(sdk, images={"harness:tf221": IMAGE}, runs=[FakeContainer(events, [b"x\n"], status)])
    code, lines, _ = containers.run_in_image(_engine(client), "harness:tf221", ["sh", "-c", f"exit {status}"])
    assert code == status and lines == ["x"]
    assert events[-2:] == [("wait",), ("container remove", True)]


def test_an_interrupt_stops_and_removes_the_container_and_goes_on(sdk):
    events: list = []
    container = FakeContainer(events, [b"one\n", b"two\n"], interrupt_at=1)
    client = FakeClient(sdk, images={"harness:tf221": IMAGE}, runs=[container])
    seen: list = []
    with pytest.raises(KeyboardInterrupt):
        containers.run_in_image(_engine(client), "harness:tf221", ["sleep", "1000"], log=seen.append)
    assert events == [("chunk", 0), ("stop",), ("container remove", True)]
    assert seen[0] == "one" and seen[1].startswith("interrupted: stopping container harness-run-")


def test_a_container_past_its_timeout_is_killed_removed_and_says_so(sdk):
    events: list = []
    container = FakeContainer(events, [b"working\n"], block=True)
    client = FakeClient(sdk, images={"harness:tf221": IMAGE}, runs=[container])
    code, lines, _ = containers.run_in_image(_engine(client), "harness:tf221", ["sleep", "1000"], timeout=1)
    assert code == 137 and lines == ["working", "(killed after 1 s)"]
    assert events[-3:] == [("kill",), ("wait",), ("container remove", True)]


def test_an_api_error_starting_the_container_is_one_line_naming_the_image_and_the_container_goes(sdk):
    # containers.run creates, then starts: a start that fails leaves a created container behind.
    error = sdk.errors.APIError("500 Server Error for http+docker://localhost/v1.50/containers/x/start",
                                explanation='failed to create task for container: exec: "harness":\n'
                                            'executable file not found in $PATH')
    client = FakeClient(sdk, images={"harness:tf221": IMAGE}, runs=[error])
    with pytest.raises(RuntimeError) as raised:
        containers.run_in_image(_engine(client), "harness:tf221", ["harness", "env"])
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("could not start a container of harness:tf221 (harness env): failed to create task for "
                       'container: exec: "harness": executable file not found in $PATH')
    assert client.events[-1] == ("container remove", True)  # found by its name and removed


def test_a_missing_image_is_named_and_no_registry_is_asked_for_it(sdk):
    client = FakeClient(sdk, images={}, runs=[FakeContainer([])])
    with pytest.raises(RuntimeError, match=r"^no image harness:tf999 in the Docker engine at unix:///run/fake/"):
        containers.run_in_image(_engine(client), "harness:tf999", ["harness", "env"])
    assert client.events == []  # containers.run would have pulled it: never called


def test_image_facts_and_removal_go_through_the_sdk(sdk):
    client = FakeClient(sdk, images={"harness:tf221": IMAGE})
    engine = _engine(client)
    assert containers.image_facts(engine, "harness:tf221") == {
        "size_bytes": 2_000_000_000, "user": "1000:1000", "labels": {"io.harness.entry": "tf221"}}
    assert containers.remove_image(engine, "harness:tf221") is True
    assert containers.remove_image(engine, "harness:tf221") is False  # already gone: not an error
    with pytest.raises(RuntimeError, match="^no image harness:tf221 in the Docker engine"):
        containers.image_facts(engine, "harness:tf221")


def test_an_image_the_engine_will_not_remove_is_one_line_naming_it(sdk):
    error = sdk.errors.APIError("409 Client Error", explanation="conflict: unable to remove repository reference "
                                "\"harness:tf221\" (must force) - container 1234 is using its referenced image")
    engine = _engine(FakeClient(sdk, images={"harness:tf221": IMAGE}, remove_error=error))
    with pytest.raises(RuntimeError, match=r'^could not remove image harness:tf221: conflict: .* container 1234 '):
        containers.remove_image(engine, "harness:tf221")


def test_without_a_registry_the_debootstrapped_base_is_used(tmp_path, sdk):
    error = sdk.errors.APIError("500 Server Error", explanation="Get https://registry-1.docker.io/v2/: dial tcp: "
                                "lookup registry-1.docker.io: no such host")
    client = FakeClient(sdk, images={containers.DEBIAN_BASE_TAG: IMAGE}, pull_error=error)
    seen: list = []
    assert containers.ensure_cpu_base(_engine(client), tmp_path, "debian:bookworm-slim", seen.append) == \
        containers.DEBIAN_BASE_TAG
    assert client.events == [("pull", "debian:bookworm-slim")]
    assert "no registry gave debian:bookworm-slim (Get https://registry-1.docker.io" in seen[-1]


def test_the_base_image_present_is_used_without_a_pull(tmp_path, sdk):
    client = FakeClient(sdk, images={"debian:bookworm-slim": IMAGE})
    assert containers.ensure_cpu_base(_engine(client), tmp_path, "debian:bookworm-slim") == "debian:bookworm-slim"
    assert client.events == []


def _cli_with_fake_engine(monkeypatch, client, tag):
    """``harness docker`` with ``client`` as the engine and the wheelhouse, base and build steps skipped."""
    engine = _engine(client)
    monkeypatch.setattr(containers, "find_engine", lambda: engine)
    monkeypatch.setattr(containers, "fill_wheelhouse", lambda dest, *a, **k: dest.mkdir(parents=True))
    monkeypatch.setattr(containers, "ensure_cpu_base", lambda engine, cache, want, *a, **k: want)
    monkeypatch.setattr(containers, "build_image", lambda *a, **k: 12.5)
    return engine


def test_harness_docker_test_reports_a_failing_suite_with_exit_1_and_cleans_up(monkeypatch, tmp_path, capsys, sdk):
    tag = image_tag(newest(load_matrix()), "cpu")
    events: list = []
    smoke = FakeContainer(events, [b"harness 1.0\n", b"tensorflow   2.21.0 (tensorflow-cpu)\n"])
    suite = FakeContainer(events, [b"..F.\n", b"1 failed, 3 passed in 2.00s\n"], status=1)
    client = FakeClient(sdk, images={tag: IMAGE}, runs=[smoke, suite])
    _cli_with_fake_engine(monkeypatch, client, tag)
    record = tmp_path / "report.json"
    assert main(["docker", "test", "--work-dir", str(tmp_path / "work"), "--json", str(record)]) == 1
    report = json.loads(record.read_text())
    assert report["env_rc"] == 0 and "tensorflow   2.21.0" in report["env_output"]
    assert report["tests_rc"] == 1 and report["tests_summary"] == "1 failed, 3 passed in 2.00s"
    assert report["engine_version"] == "28.2.2" and report["user"] == "1000:1000"
    runs = [e for e in client.events if e[0] == "run"]
    assert runs[0][2] == ["harness", "env"] and "volumes" not in runs[0][3]
    assert list(runs[1][3]["volumes"].values()) == [{"bind": "/src", "mode": "ro"}]
    assert events.count(("container remove", True)) == 2
    assert client.events[-2:] == [("image remove", tag, True), ("close",)]  # image removed, client closed
    out = capsys.readouterr()
    assert "engine      existing engine, Docker 28.2.2" in out.out and "  | ..F." in out.err


def test_harness_docker_stops_at_a_failing_smoke_test_naming_image_and_status(monkeypatch, tmp_path, capsys, sdk):
    tag = image_tag(newest(load_matrix()), "cpu")
    events: list = []
    smoke = FakeContainer(events, [b"ImportError: no module named tensorflow\n"], status=2)
    client = FakeClient(sdk, images={tag: IMAGE}, runs=[smoke])
    _cli_with_fake_engine(monkeypatch, client, tag)
    assert main(["docker", "test", "--work-dir", str(tmp_path / "work")]) == 3  # no verdict on the image
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"harness docker: error: `harness env` failed in {tag} (exit 2) (no verdict)"
    assert events[-1] == ("container remove", True)
    assert client.events[-2:] == [("image remove", tag, True), ("close",)]


def test_harness_docker_turns_an_engine_error_into_one_line_naming_the_image(monkeypatch, tmp_path, capsys, sdk):
    tag = image_tag(newest(load_matrix()), "cpu")
    error = sdk.errors.APIError("500 Server Error", explanation="OCI runtime create failed:\nno space left on device")
    client = FakeClient(sdk, images={tag: IMAGE}, runs=[error])
    _cli_with_fake_engine(monkeypatch, client, tag)
    assert main(["docker", "build", "--work-dir", str(tmp_path / "work")]) == 3
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (f"harness docker: error: could not start a container of {tag} (harness env): "
                    "OCI runtime create failed: no space left on device (no verdict)")


def test_without_a_registry_a_base_other_than_debians_is_refused_naming_it(tmp_path, sdk, monkeypatch):
    # jax011's CPU base is ubuntu:24.04 (Python 3.12): the debootstrapped Debian bookworm (3.11) cannot stand in.
    monkeypatch.setattr(containers, "_debootstrap", lambda *a: pytest.fail("debootstrap for an Ubuntu base"))
    error = sdk.errors.APIError("500 Server Error", explanation="dial tcp: lookup registry-1.docker.io: no such host")
    client = FakeClient(sdk, images={containers.DEBIAN_BASE_TAG: IMAGE}, pull_error=error)
    with pytest.raises(RuntimeError, match=r"^no base image ubuntu:24\.04 in the Docker engine at .*no registry gave "
                                           r"it \(dial tcp.*builds Debian bookworm only"):
        containers.ensure_cpu_base(_engine(client), tmp_path, "ubuntu:24.04")
    assert client.events == [("pull", "ubuntu:24.04")]
    with pytest.raises(RuntimeError, match=r"and no pull \(--no-pull\); the debootstrap fallback"):
        containers.ensure_cpu_base(_engine(client), tmp_path, "ubuntu:24.04", pull=False)
    client = FakeClient(sdk, images={"ubuntu:24.04": IMAGE})  # loaded into the engine beforehand: used as it is
    assert containers.ensure_cpu_base(_engine(client), tmp_path, "ubuntu:24.04", pull=False) == "ubuntu:24.04"


def test_an_offline_wheelhouse_of_a_jax_entry_asks_pip_for_jax_jaxlib_and_keras(tmp_path, monkeypatch):
    entry = {e.name: e for e in load_matrix()}["jax011"]
    calls: list = []

    def pip(cmd, what, log):
        calls.append(cmd)
        if "--no-deps" in cmd:
            (tmp_path / "wheelhouse" / "keras_harness-1.0-py3-none-any.whl").write_text("")

    monkeypatch.setattr(containers, "_pip", pip)
    monkeypatch.setattr(containers.sys, "version_info", SimpleNamespace(major=3, minor=12))
    containers.fill_wheelhouse(tmp_path / "wheelhouse", entry, "gpu", tmp_path, offline=True)
    assert calls[1][-4:-1] == ["jax[cuda12]==0.11.2", "jaxlib==0.11.2", "keras==3.15.1"]  # then harness[test,bench]
    monkeypatch.setattr(containers.sys, "version_info", SimpleNamespace(major=3, minor=11))
    with pytest.raises(RuntimeError, match="an offline wheelhouse for jax011 needs Python 3.12 on the host"):
        containers.fill_wheelhouse(tmp_path / "wheelhouse", entry, "cpu", tmp_path, offline=True)


def test_an_offline_wheelhouse_holds_only_what_this_fill_resolved(tmp_path, monkeypatch):
    # The image installs every wheel in deps: a version an earlier fill resolved, kept beside the one this fill
    # resolves, made its pip fail (ResolutionImpossible). This fill's pip (faked: it resolves the newer one, and
    # finds the other wheel it needs among the last fill's) writes into a fresh folder that then replaces deps.
    entry = {e.name: e for e in load_matrix()}["tf221"]
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in ("pyproject_api-1.12.1-py3-none-any.whl", "zipp-4.1.2-py3-none-any.whl"):
        (deps / name).write_text("old fill")

    def pip(cmd, what, log):
        if "--no-deps" in cmd:
            (tmp_path / "wheelhouse" / "keras_harness-1.0-py3-none-any.whl").write_text("")
            return
        target = Path(cmd[cmd.index("--wheel-dir") + 1])
        assert str(deps) in cmd and target != deps  # the last fill is a source, not the destination
        (target / "pyproject_api-1.12.6-py3-none-any.whl").write_text("new")
        (target / "zipp-4.1.2-py3-none-any.whl").write_text((deps / "zipp-4.1.2-py3-none-any.whl").read_text())
        (target / "keras_harness-1.0-py3-none-any.whl").write_text("")

    monkeypatch.setattr(containers, "_pip", pip)
    monkeypatch.setattr(containers.sys, "version_info", SimpleNamespace(major=3, minor=11))
    containers.fill_wheelhouse(tmp_path / "wheelhouse", entry, "cpu", tmp_path, offline=True)
    assert sorted(p.name for p in deps.iterdir()) == ["pyproject_api-1.12.6-py3-none-any.whl",
                                                       "zipp-4.1.2-py3-none-any.whl"]
    assert not (tmp_path / "deps.filling").exists()


def test_harness_docker_test_of_the_jax_entry_runs_its_tox_envs_tests_in_the_image(monkeypatch, tmp_path, sdk):
    entries = {e.name: e for e in load_matrix()}
    tag = image_tag(entries["jax011"], "cpu")
    events: list = []
    smoke = FakeContainer(events, [b"tensorflow   not installed; build info not read\n", b"env KERAS_BACKEND=jax\n"])
    suite = FakeContainer(events, [b"12 passed in 3.00s\n"])
    client = FakeClient(sdk, images={tag: IMAGE}, runs=[smoke, suite])
    _cli_with_fake_engine(monkeypatch, client, tag)
    record = tmp_path / "report.json"
    assert main(["docker", "test", "--entry", "jax011", "--work-dir", str(tmp_path / "work"),
                 "--json", str(record)]) == 0
    report = json.loads(record.read_text())
    assert (report["backend"], report["jax"], report["tensorflow"], report["base"]) == ("jax", "0.11.2", None,
                                                                                        "ubuntu:24.04")
    command = [e for e in client.events if e[0] == "run"][1][2]
    assert "HARNESS_SKIP_CONTEXT=image" in command
    assert "--skip-report ~/skips.jsonl tests/onjax tests/unit/test_device_check.py ;" in command[-1]
