"""The Docker SDK client's API timeout, against a fake engine on a Unix socket (no Docker needed: not marked docker).

A vfs-backed engine takes minutes to create a container of a TensorFlow image; the client that
``harness docker`` keeps must wait that long (``containers.api_timeout()``), not the few seconds
of the ping that found the engine, and a call past it must say which engine and which timeout.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from harness.ci import containers
from harness.errors import InvalidValue

pytest.importorskip("docker", reason="needs the Docker SDK for Python (pip install 'keras-harness[ci]')")


class _Engine(BaseHTTPRequestHandler):
    """Answers a ping, the version and an image inspection at once; sits on a container create for ``slow`` s."""

    slow = 0.0
    created: list[str] = []

    def log_message(self, *args):  # a Unix socket's client address is no (host, port)
        pass

    def _answer(self, status: int, body: dict | str) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self):
        self._answer(200, "OK")

    def do_GET(self):
        path = re.sub(r"^/v[0-9.]+", "", self.path.split("?")[0])
        if path == "/_ping":
            self._answer(200, "OK")
        elif path == "/version":
            self._answer(200, {"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux", "Arch": "amd64"})
        elif path.startswith("/images/"):
            self._answer(200, {"Id": "sha256:" + "0" * 64, "Size": 1, "Config": {}, "Os": "linux"})
        else:
            self._answer(404, {"message": f"no such thing: {path}"})

    def do_POST(self):
        if "/containers/create" in self.path:
            self.created.append(self.path)
            time.sleep(self.slow)
        self._answer(404, {"message": "not in this fake"})

    def do_DELETE(self):
        self._answer(404, {"message": "no such container"})


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def slow_engine(tmp_path):
    """The address of a fake engine whose container create takes 30 s; the handler class, to read what it saw."""
    sock = tmp_path / "engine.sock"
    _Engine.slow, _Engine.created = 30.0, []
    server = _Server(str(sock), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"unix://{sock}"
    server.shutdown()
    server.server_close()


def test_the_client_that_found_the_engine_waits_the_api_timeout_not_the_pings(slow_engine, monkeypatch):
    monkeypatch.delenv("HARNESS_DOCKER_TIMEOUT", raising=False)
    client = containers._reach(slow_engine, timeout=2)
    assert client is not None and client.api.timeout == containers.API_TIMEOUT_S == 300
    assert containers.connect(slow_engine).api.timeout == 300
    monkeypatch.setenv("HARNESS_DOCKER_TIMEOUT", "450")
    assert containers._reach(slow_engine, timeout=2).api.timeout == 450


def test_a_container_create_past_the_api_timeout_names_the_engine_and_the_timeout(slow_engine, monkeypatch):
    monkeypatch.setenv("HARNESS_DOCKER_TIMEOUT", "1")
    engine = containers.Engine(host=slow_engine)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        containers.run_in_image(engine, "harness:tf221", ["harness", "env"])
    assert time.monotonic() - start < 20  # the 1 s timeout, not the engine's 30 s
    assert _Engine.created, "the container create never reached the engine"
    message = str(caught.value)
    assert message.startswith(f"the Docker engine at {slow_engine} did not create and start a container of "
                              "harness:tf221 (harness env) within the API timeout of 1 s "
                              "(set HARNESS_DOCKER_TIMEOUT=SECONDS to wait longer): "), message
    assert "\n" not in message and "timed out" in message


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_timeout_variable_is_named(value, monkeypatch):
    monkeypatch.setenv("HARNESS_DOCKER_TIMEOUT", value)
    with pytest.raises(InvalidValue, match=re.escape(f"got HARNESS_DOCKER_TIMEOUT={value!r}")):
        containers.api_timeout()
