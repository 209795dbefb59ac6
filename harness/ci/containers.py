"""Builds, smoke-tests and tests the version matrix's images, with a private engine when none runs.

The engine is driven through the Docker SDK for Python (``docker``, the ``keras-harness[ci]``
extra): ping and version, image inspection, pulls, imports and removal, and the containers
that run the smoke test and the suite, their logs streamed line by line. Its errors become one
line naming what failed: ``harness.errors.Unavailable`` where something is missing (an engine, a
tool, an image), ``harness.errors.Failed`` where a step failed (both ``RuntimeError``).
Only builds go through the ``docker`` command line: the SDK has no BuildKit (its
``images.build`` is the classic builder, which cannot read the Dockerfile's ``RUN --mount``)
and no ``buildx bake``.

Where no engine answers, a private ``dockerd`` is started on its own socket and data root (overlay2
storage where the kernel allows it, else vfs; no iptables, no bridge: what works inside an unprivileged
sandbox), and stopped afterwards; ``harness docker`` keeps its data root between runs, so that the next
build takes its unchanged layers from the cache, as a long-running engine would.

Every API call of the SDK client may wait ``api_timeout()`` seconds for the engine: 300 by
default, ``HARNESS_DOCKER_TIMEOUT`` otherwise. An engine on vfs storage copies an image's whole
file system to create a container (a TensorFlow image: gigabytes), which takes far longer than
the few seconds a ping needs; the pings that find an engine keep their own short timeout. A call
that runs past it is one line naming the engine, what it was doing and the timeout.

Where no registry answers, the Debian base image is built from
``debootstrap`` against the mirror apt is configured with, and every Python package comes from
a wheelhouse filled on the host (``OFFLINE=1``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.ci.matrix import CPU_BASE, Entry, build_args
from harness.errors import Failed, InvalidValue, Unavailable
from harness.extras import require

__all__ = ["Engine", "sdk", "api_timeout", "API_TIMEOUT_S", "connect", "find_engine", "start_engine", "engine_version",
           "apt_mirror",
           "ensure_cpu_base", "fill_wheelhouse", "build_image", "prune_build_cache", "STORAGE_DRIVERS",
           "image_facts", "remove_image", "run_in_image",
           "DEBIAN_BASE_TAG"]

DEBIAN_BASE_TAG = "harness-base:bookworm"
_SUITE = "bookworm"
_DEFAULT_HOST = "unix:///var/run/docker.sock"  # where the SDK, like the CLI, looks without DOCKER_HOST
# Seconds an API call may wait for the engine (containers.run: create and start). Generous: on vfs
# storage (the private engine's) creating a container copies the image's file system, minutes for a
# TensorFlow image on a slow disk; the SDK's 60 s, or a ping's 5 s, is not enough there.
API_TIMEOUT_S = 300.0
_TIMEOUT_VAR = "HARNESS_DOCKER_TIMEOUT"
Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def sdk() -> Any:
    """The Docker SDK for Python (the ``docker`` module), imported on first use.

    Raises:
        harness.extras.MissingExtra: naming the ``keras-harness[ci]`` extra, where the SDK is not installed.
    """
    return require("docker", package="the Docker SDK for Python (docker)", extra="ci", purpose="harness docker")


def _errors(docker: Any) -> tuple[type[BaseException], ...]:
    """What the SDK raises when the engine fails or cannot be reached: its own errors, and the
    ``requests`` ones it lets through (a connection refused or reset mid-stream)."""
    import requests  # a dependency of the SDK

    return docker.errors.DockerException, requests.exceptions.RequestException


def _why(err: BaseException) -> str:
    """An SDK error as one line: the engine's own explanation where it gave one."""
    text = getattr(err, "explanation", None) or str(err) or type(err).__name__
    return " ".join(str(text).split())


def api_timeout() -> float:
    """Seconds each Docker API call may wait for the engine: ``HARNESS_DOCKER_TIMEOUT``, else ``API_TIMEOUT_S`` (300).

    Raises:
        InvalidValue: ``HARNESS_DOCKER_TIMEOUT`` is not a positive number of seconds (naming it).
    """
    text = os.environ.get(_TIMEOUT_VAR, "").strip()
    if not text:
        return API_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise InvalidValue(f"{_TIMEOUT_VAR} must be a positive number of seconds; got {_TIMEOUT_VAR}={text!r}")
    return seconds


def _timed_out(err: BaseException) -> bool:
    """Whether an SDK error is its HTTP client's timeout (``Read timed out. (read timeout=5)``)."""
    import requests

    return isinstance(err, requests.exceptions.Timeout) or "timed out" in str(err)


def _open(docker: Any, host: str | None, timeout: float) -> Any:
    # The configured engine goes through from_env, which also reads DOCKER_TLS_VERIFY and
    # DOCKER_CERT_PATH; any other address (a private engine's socket) is connected to directly.
    if host is None or host == os.environ.get("DOCKER_HOST"):
        return docker.from_env(timeout=timeout)
    return docker.DockerClient(base_url=host, timeout=timeout)


def connect(host: str | None = None, timeout: float | None = None) -> Any:
    """An SDK client (``docker.DockerClient``) for the engine at ``host``, which answered a ping.

    Args:
        host: the engine's address, e.g. ``unix:///run/x/docker.sock``; None: as ``DOCKER_HOST``
            (with its TLS variables) says, else the default socket.
        timeout: seconds each API call may wait for the engine (log streams and ``wait`` are
            exempt); None: ``api_timeout()`` (300, or ``HARNESS_DOCKER_TIMEOUT``).

    Raises:
        RuntimeError: without the SDK, or when no engine answers there (one line naming the address).
    """
    docker = sdk()
    timeout = api_timeout() if timeout is None else timeout
    try:
        client = _open(docker, host, timeout)
        client.ping()
    except _errors(docker) as err:
        raise Unavailable(f"no Docker engine answers at {_address(host)}: {_why(err)}") from None
    return client


def _reach(host: str | None, timeout: float = 10) -> Any | None:
    """``connect(host)``, or None where no engine answers a ping there within ``timeout`` seconds.

    Only the ping waits ``timeout``: the client returned waits ``api_timeout()`` per call, as
    ``connect``'s does (a client kept with the ping's few seconds cannot create a container on a
    vfs engine: "Read timed out. (read timeout=5)").
    """
    docker = sdk()
    try:
        probe = _open(docker, host, timeout)
        probe.ping()
    except _errors(docker):
        return None
    probe.close()
    return _open(docker, host, api_timeout())


def _address(host: str | None) -> str:
    return host or os.environ.get("DOCKER_HOST") or _DEFAULT_HOST


@dataclass
class Engine:
    """A Docker engine the SDK can reach; ``started`` when this process started it.

    ``api`` is the SDK client, connected on first use of ``client()`` (tests pass a fake one).
    """

    host: str | None = None  # the engine's address; None: as DOCKER_HOST says, else the default socket
    started: bool = False
    root: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)
    api: Any = field(default=None, repr=False)
    keep_data: bool = False  # a started engine's data root (images, layer cache) outlives it
    driver: str | None = None  # a started engine's storage driver
    lock: Any = field(default=None, repr=False)  # the open lock file on its root

    @property
    def address(self) -> str:
        """Where the engine listens, for messages."""
        return _address(self.host)

    def client(self) -> Any:
        """The SDK client for this engine (``docker.DockerClient``).

        Raises:
            RuntimeError: without the SDK, or when the engine does not answer.
        """
        if self.api is None:
            self.api = connect(self.host)
        return self.api

    def env(self) -> dict[str, str]:
        """The environment for the ``docker`` command line (builds): BuildKit on, this engine's address."""
        env = dict(os.environ, DOCKER_BUILDKIT="1")
        if self.host:
            env["DOCKER_HOST"] = self.host
        return env

    def stream(self, args: list[str], log: Log, timeout: float) -> tuple[int, list[str]]:
        """Runs the command line ``docker ARGS``, passing each line to ``log``; returns (exit status, last lines).

        Only for what the SDK cannot do (BuildKit builds); everything else goes through ``client()``.
        """
        tail: list[str] = []
        with subprocess.Popen([docker_client(), *args], env=self.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
            timer = threading.Timer(timeout, proc.kill)  # also when the command goes silent
            timer.start()
            try:
                for line in proc.stdout:  # type: ignore[union-attr]
                    log(line.rstrip())
                    tail = (tail + [line.rstrip()])[-40:]
                code = proc.wait()
            finally:
                timer.cancel()
            if code < 0:
                tail.append(f"(killed after {timeout:.0f} s)")
            return code, tail

    def stop(self) -> None:
        """Closes the SDK client; stops an engine this process started and deletes its data root (kept with
        ``keep_data``).

        Leaves engines it did not start alone.
        """
        if self.api is not None:
            self.api.close()
            self.api = None
        if not self.started or self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.root is not None:
            _unmount_under(self.root)  # dockerd bind-mounts its data root onto itself; a killed one leaves it
            run = self.root / "run"
            if run.is_symlink():
                shutil.rmtree(run.resolve(), ignore_errors=True)
            if self.keep_data:
                _clear(self.root, keep_data=True, also_keep=("dockerd.log",))  # the log: why it stopped
            else:
                shutil.rmtree(self.root, ignore_errors=True)
        if self.lock is not None:
            self.lock.close()
            self.lock = None
        self.started = False


def _unmount_under(root: Path) -> None:
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    prefix = str(Path(root).resolve())
    for point in sorted((m for m in mounts if m == prefix or m.startswith(prefix + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def _candidates() -> list[str]:
    found = [os.path.join(d, "docker") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    return list(dict.fromkeys(p for p in found if os.access(p, os.X_OK)))


def docker_client() -> str:
    """The ``docker`` client that can build with BuildKit: ``HARNESS_DOCKER``, else the first on PATH
    with buildx, else the first older than 23 (BuildKit built in), else the first found.

    Raises:
        RuntimeError: when there is no ``docker`` at all.
    """
    if os.environ.get("HARNESS_DOCKER"):
        return os.environ["HARNESS_DOCKER"]
    if _CLIENT:
        return _CLIENT[0]
    candidates = _candidates()
    if not candidates:
        raise Unavailable("no docker client on PATH (Debian: apt-get install docker.io)")
    chosen = candidates[0]
    for path in candidates:
        if _run_ok([path, "buildx", "version"]):
            chosen = path
            break
        major = re.search(r"version (\d+)\.", _run_ok([path, "--version"]))  # "Docker version 20.10.24+dfsg1, ..."
        if major and int(major.group(1)) < 23:
            chosen = path
            break
    _CLIENT.append(chosen)
    return chosen


_CLIENT: list[str] = []


def _run_ok(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def find_engine() -> Engine | None:
    """The engine the SDK reaches as configured (``DOCKER_HOST``, else the default socket), if it answers a ping.

    Raises:
        RuntimeError: without the Docker SDK for Python (the ``keras-harness[ci]`` extra).
    """
    host = os.environ.get("DOCKER_HOST") or None
    client = _reach(host)
    return None if client is None else Engine(host=host, api=client)


def engine_version(engine: Engine) -> dict[str, str]:
    """The engine's ``version``, ``api_version``, ``os`` and ``arch`` (the server half of ``docker version``).

    Raises:
        RuntimeError: one line naming the engine's address, where it does not answer.
    """
    docker = sdk()
    try:
        data = engine.client().version()
    except _errors(docker) as err:
        raise Failed(f"the Docker engine at {engine.address} did not give its version: {_why(err)}") from None
    return {"version": str(data.get("Version", "?")), "api_version": str(data.get("ApiVersion", "?")),
            "os": str(data.get("Os", "?")), "arch": str(data.get("Arch", "?"))}


# Storage drivers a private engine tries, in order: overlay2 shares an image's layers with its containers (a
# container of a TensorFlow image starts at once); vfs, which copies every layer, works wherever overlay mounts
# are refused (an unprivileged sandbox).
STORAGE_DRIVERS = ("overlay2", "vfs")


def start_engine(root: Path, log: Log = _quiet, timeout: float = 90, *, keep_data: bool = False,
                 drivers: Iterable[str] = STORAGE_DRIVERS) -> Engine:
    """Starts a private ``dockerd`` under ``root`` (socket, data, exec root, pid file, log).

    Each storage driver of ``drivers`` is tried in turn until one comes up. With ``keep_data``, the data root
    (``root/data-DRIVER``: images, the build's layer cache) outlives the engine, and the next engine started
    under ``root`` builds from that cache; ``root/lock`` keeps two engines off one data root. Without it the
    whole of ``root`` is deleted before and after.

    The SDK connects to its socket; builds (BuildKit) need the ``docker`` command line too.

    Raises:
        RuntimeError: without the SDK, ``docker``/``dockerd`` or root; where another engine holds ``root``; or
            when it does not answer in ``timeout`` with any driver (the last log lines said).
    """
    sdk()
    missing = [tool for tool, found in (("docker", _candidates()), ("dockerd", shutil.which("dockerd"))) if not found]
    if missing:
        raise Unavailable(f"no Docker engine answers and {', '.join(missing)} is not installed "
                           "(Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise Unavailable("no Docker engine answers, and starting a private dockerd needs root; "
                           "start one yourself and set DOCKER_HOST")
    drivers = tuple(drivers)
    if not drivers:
        raise InvalidValue("start_engine needs at least one storage driver; got none")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lock = _hold(root / "lock")
    try:
        _unmount_under(root)  # an engine killed before it could stop leaves its mounts
        _clear(root, keep_data)
        # Sockets live under the exec root, and a Unix socket path has at most 107 bytes: keep it short.
        run = Path(tempfile.mkdtemp(prefix="harness-dockerd-"))
        (root / "run").symlink_to(run)
    except BaseException:
        lock.close()
        raise
    sock = run / "docker.sock"
    engine = Engine(host=f"unix://{sock}", started=True, root=root, keep_data=keep_data, lock=lock)
    deadline = time.monotonic() + timeout
    log_path = root / "dockerd.log"
    for driver in drivers:
        cmd = ["dockerd", f"--storage-driver={driver}", "--iptables=false", "--ip6tables=false", "--bridge=none",
               f"--data-root={root / f'data-{driver}'}", f"--exec-root={run / 'exec'}",
               f"--pidfile={run / 'dockerd.pid'}", f"--host=unix://{sock}"]
        log(f"starting a private engine: {' '.join(cmd)}")
        with open(log_path, "a") as out:
            engine.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() < deadline and engine.process.poll() is None:
            client = _reach(engine.host, timeout=5)
            if client is not None:
                engine.api, engine.driver = client, driver
                return engine
            time.sleep(0.5)
        if engine.process.poll() is None:  # out of time: no other driver gets a try
            break
        why = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        log(f"dockerd did not start with the {driver} storage driver (exit {engine.process.returncode}): {why[0]}")
        _remove(root / f"data-{driver}")  # what a failed start made there, or a data root it could not read
    log_tail = log_path.read_text(errors="replace").splitlines()[-15:]
    engine.stop()
    raise Failed(f"the private dockerd did not answer within {timeout:.0f} s (storage drivers tried: "
                 f"{', '.join(drivers)}); its log ends:\n" + "\n".join(log_tail))


def _hold(path: Path) -> Any:
    """An open file holding an exclusive lock on ``path``, for as long as it stays open.

    Raises:
        RuntimeError: where another process holds it (naming the folder).
    """
    import fcntl

    handle = open(path, "a+")  # noqa: SIM115 - held open until the engine stops
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise Unavailable(f"another private engine uses {path.parent} (it holds {path.name}); wait for it, or give "
                          "harness docker another --work-dir") from None
    return handle


def _clear(root: Path, keep_data: bool, also_keep: Iterable[str] = ()) -> None:
    """Removes what an engine left under ``root``, but its lock, ``also_keep`` and, with ``keep_data``, its data
    roots (``data-DRIVER``)."""
    for child in root.iterdir():
        if child.name not in ("lock", *also_keep) and not (keep_data and child.name.startswith("data-")):
            _remove(child)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def prune_build_cache(engine: Engine, keep: str = "10GB", log: Log = _quiet) -> None:
    """``docker builder prune --keep-storage KEEP`` on an engine this process started, keeping its layer cache
    within ``keep`` (the least recently used goes first); an engine it did not start is left alone.

    Raises:
        RuntimeError: where the engine refuses (its last output lines said).
    """
    if not engine.started:
        return
    code, tail = engine.stream(["builder", "prune", "--force", "--keep-storage", keep], log, timeout=600)
    if code != 0:
        raise Failed(f"pruning the build cache of the engine at {engine.address} failed (exit {code}): "
                     + " ".join(tail[-5:]))


def apt_mirror(paths: list[Path] | None = None) -> str:
    """The Debian mirror apt is configured with for ``bookworm`` (deb822 ``.sources`` or ``sources.list``).

    Raises:
        RuntimeError: when apt names none.
    """
    if paths is None:
        paths = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
        paths += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.+)$", stanza, re.M))
            if _SUITE in fields.get("Suites", "").split() and "main" in fields.get("Components", "").split():
                return fields["URIs"].split()[0]
        for line in text.splitlines():  # one-line style: deb [options] URI SUITE COMPONENT...
            parts = line.split()
            uris = [i for i, part in enumerate(parts) if "://" in part]
            if parts[:1] == ["deb"] and uris and parts[uris[0] + 1:uris[0] + 2] == [_SUITE] and "main" in parts:
                return parts[uris[0]]
    raise Unavailable(f"apt names no mirror for Debian {_SUITE} main in {[str(p) for p in paths]}")


def _inspect(engine: Engine, tag: str) -> dict:
    """``docker image inspect TAG`` through the SDK.

    Raises:
        RuntimeError: one line naming the image, where the engine has no such image or fails.
    """
    docker = sdk()
    try:
        return engine.client().images.get(tag).attrs
    except docker.errors.ImageNotFound:
        raise Unavailable(f"no image {tag} in the Docker engine at {engine.address}") from None
    except _errors(docker) as err:
        raise Failed(f"could not inspect image {tag}: {_why(err)}") from None


def _has_image(engine: Engine, tag: str) -> bool:
    docker = sdk()
    try:
        engine.client().images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    except _errors(docker) as err:
        raise Failed(f"could not inspect image {tag}: {_why(err)}") from None
    return True


def ensure_cpu_base(engine: Engine, cache: Path, want: str = CPU_BASE, log: Log = _quiet,
                    pull: bool = True) -> str:
    """An image tag to build the CPU variant on: ``want`` if present or pullable, else a debootstrapped Debian.

    The debootstrap root file system is cached as a tarball under ``cache``. It is Debian bookworm's, so it
    stands in for ``CPU_BASE`` (``debian:bookworm-slim``) only: another base (jax011's ``ubuntu:24.04``, for its
    Python 3.12) must be in the engine already or come from a registry.

    Raises:
        RuntimeError: when debootstrap fails, or the engine does not import its tarball (naming the tag); when
            ``want`` is another base than Debian bookworm's and neither the engine nor a registry has it.
    """
    docker = sdk()
    if _has_image(engine, want):
        return want
    debian = want == CPU_BASE or want.startswith(f"debian:{_SUITE}")
    why = "no pull (--no-pull)"
    if pull:
        log(f"pulling {want}")
        try:
            engine.client().images.pull(want)
            return want
        except _errors(docker) as err:
            why = f"no registry gave it ({_why(err)[:300]})"
            if debian:
                log(f"no registry gave {want} ({_why(err)[:300]}); building {DEBIAN_BASE_TAG} with debootstrap")
    if not debian:
        raise Unavailable(f"no base image {want} in the Docker engine at {engine.address}, and {why}; the "
                          f"debootstrap fallback builds Debian {_SUITE} only, which cannot stand in for it (its "
                          f"Python differs): load {want} into the engine (docker load, or docker import of a root "
                          "file system tarball tagged so), or let it reach a registry")
    if _has_image(engine, DEBIAN_BASE_TAG):
        return DEBIAN_BASE_TAG
    tarball = Path(cache) / f"debian-{_SUITE}-minbase.tar"
    if not tarball.exists():
        _debootstrap(tarball, log)
    repository, _, tag = DEBIAN_BASE_TAG.partition(":")
    log(f"importing {tarball} as {DEBIAN_BASE_TAG}")
    try:
        said = engine.client().api.import_image_from_file(str(tarball), repository=repository, tag=tag)
    except _errors(docker) as err:
        raise Failed(f"importing {tarball} as {DEBIAN_BASE_TAG} failed: {_why(err)}") from None
    if not _has_image(engine, DEBIAN_BASE_TAG):  # the engine reports some failures inside a 200 answer
        raise Failed(f"importing {tarball} left no image {DEBIAN_BASE_TAG}; the engine said: "
                           f"{' '.join(str(said).split())[-500:]}")
    return DEBIAN_BASE_TAG


def _debootstrap(tarball: Path, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise Unavailable("no Debian base image and no debootstrap to build one (apt-get install debootstrap)")
    mirror = apt_mirror()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase {_SUITE} from {mirror} (a few minutes, once)")
        proc = subprocess.run(["debootstrap", "--variant=minbase", _SUITE, str(rootfs), mirror],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise Failed(f"debootstrap failed (exit {proc.returncode}): "
                               f"{proc.stdout[-1500:]}{proc.stderr[-500:]}")
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.rename(tarball)


def fill_wheelhouse(dest: Path, entry: Entry, variant: str, repo: Path, offline: bool, log: Log = _quiet) -> Path:
    """Builds the harness wheel into ``dest``; with ``offline``, also every other wheel the image installs, into
    ``deps`` beside it (``dest.parent / "deps"``, the Dockerfile's other mount; made empty where online).

    The dependencies' wheels stay apart from the harness wheel, so the image's dependency layer reads the same
    files from one commit to the next and comes from the engine's layer cache.

    Returns:
        The harness wheel's path.

    Raises:
        RuntimeError: when pip fails, or the host Python differs from the entry's (wheels must match it).
    """
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if offline and host != entry.python:
        raise Unavailable(f"an offline wheelhouse for {entry.name} needs Python {entry.python} on the host "
                           f"to resolve its wheels; this is Python {host}")
    dest.mkdir(parents=True, exist_ok=True)
    deps = dest.parent / "deps"
    deps.mkdir(exist_ok=True)
    for old in dest.glob("keras_harness-*.whl"):
        old.unlink()
    for old in dest.glob("*.whl"):  # an older layout kept the dependencies here: they now live in deps
        old.replace(deps / old.name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _pip(pip + ["wheel", "--no-deps", "--wheel-dir", str(dest), str(repo)], "the harness wheel", log)
    wheel = next(dest.glob("keras_harness-*.whl"))
    if offline:
        args = build_args(entry, variant)
        reqs = args["FRAMEWORK_REQUIREMENT"].split()  # space-separated: jax==X jaxlib==X
        reqs += [args["KERAS_REQUIREMENT"]] if args["KERAS_REQUIREMENT"] else []
        log(f"filling the wheelhouse {deps} for {' '.join(reqs)} keras-harness[test,bench]")
        # Into a fresh folder, the last fill's wheels a local source: the image installs every wheel in deps, so a
        # version this resolution no longer picks must not stay beside the one it does (two pyproject-api wheels,
        # 1.12.1 from an older fill and 1.12.6, failed the image's pip with ResolutionImpossible).
        fresh = deps.parent / "deps.filling"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir()
        _pip(pip + ["wheel", "--wheel-dir", str(fresh), "--find-links", str(deps), "--find-links", str(dest), *reqs,
                    f"{wheel}[test,bench]"], "the wheelhouse", log)
        for copy in fresh.glob("keras_harness-*.whl"):  # pip wheel copies the local wheel too
            copy.unlink()
        shutil.rmtree(deps)
        fresh.rename(deps)
    else:
        for old in deps.glob("*.whl"):
            old.unlink()
    return wheel


def _pip(cmd: list[str], what: str, log: Log) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise Failed(f"pip could not build {what} (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    log(f"{what}: done")


def build_image(engine: Engine, dockerfile: Path, context: Path, tag: str, args: dict[str, str],
                log: Log = _quiet, timeout: float = 3600, *, no_cache: bool = False) -> float:
    """``docker build`` with BuildKit and the host network; returns the build's seconds.

    Unchanged steps come from the engine's layer cache (each reads ``#N CACHED`` in the output), unless
    ``no_cache``. The one step on the ``docker`` command line: the SDK has no BuildKit equivalent. Its
    ``images.build`` is the classic builder, which rejects the Dockerfile's ``RUN --mount``, and it
    has nothing for ``docker buildx bake`` either (the CI workflows bake with the command line too).

    Raises:
        RuntimeError: with the build's last output lines when it fails.
    """
    cmd = ["build", "--network=host", "--progress=plain", "--file", str(dockerfile), "--tag", tag]
    if no_cache:
        cmd.append("--no-cache")
    for key, value in args.items():
        cmd.append(f"--build-arg={key}={value}")
    start = time.perf_counter()
    code, tail = engine.stream([*cmd, str(context)], log, timeout)
    if code != 0:
        raise Failed(f"building {tag} failed (exit {code}); the build output ends:\n" + "\n".join(tail[-25:]))
    return time.perf_counter() - start


def image_facts(engine: Engine, tag: str) -> dict:
    """Size in bytes, the configured user and the labels of an image.

    Raises:
        RuntimeError: one line naming the image, where the engine has no such image or fails.
    """
    data = _inspect(engine, tag)
    config = data.get("Config") or {}
    return {"size_bytes": int(data["Size"]), "user": config.get("User") or "", "labels": config.get("Labels") or {}}


def remove_image(engine: Engine, tag: str) -> bool:
    """Removes an image, forced (``docker image rm --force``); False where there was no such image.

    Raises:
        RuntimeError: one line naming the image, where the engine refuses or fails.
    """
    docker = sdk()
    try:
        engine.client().images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        return False
    except _errors(docker) as err:
        raise Failed(f"could not remove image {tag}: {_why(err)}") from None
    return True


def run_in_image(engine: Engine, tag: str, command: list[str], *, mount: Path | None = None, gpus: bool = False,
                 log: Log = _quiet, timeout: float = 3600) -> tuple[int, list[str], float]:
    """Runs ``command`` in a new container of ``tag``, without network (``mount`` read-only at /src).

    Each output line (stdout and stderr, in the order written) goes to ``log`` as it arrives.
    The container is removed afterwards in every case: the command succeeded or failed; it ran
    past ``timeout`` seconds (it is killed, and the last line says so); or this process was
    interrupted (KeyboardInterrupt, which SIGTERM becomes in ``harness docker``): the container
    is stopped and removed, and the interrupt goes on.

    Returns:
        (the command's exit status, its output lines, seconds).

    Raises:
        RuntimeError: one line naming the image, where it does not exist, the container does not
            start, or the engine fails while it runs.
    """
    docker = sdk()
    errors = _errors(docker)
    client = engine.client()
    _inspect(engine, tag)  # say "no image" here: containers.run would go and ask a registry for it
    what = f"{tag} ({_shorten(shlex.join(command))})"
    name = f"harness-run-{uuid.uuid4().hex[:12]}"
    options: dict[str, Any] = {"name": name, "detach": True, "network_mode": "none",
                               "labels": {"io.harness.run": tag}}
    if mount is not None:
        options["volumes"] = {str(Path(mount).resolve()): {"bind": "/src", "mode": "ro"}}
    if gpus:  # --gpus all
        options["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    lines: list[str] = []
    killed = threading.Event()
    container = None
    timer = None
    start = time.perf_counter()
    try:
        try:
            container = client.containers.run(tag, command, **options)
        except errors as err:
            if _timed_out(err):
                raise Unavailable(
                    f"the Docker engine at {engine.address} did not create and start a container of {what} within "
                    f"the API timeout of {_client_timeout(client):.0f} s (set {_TIMEOUT_VAR}=SECONDS to wait "
                    f"longer): {_why(err)}") from None
            raise Failed(f"could not start a container of {what}: {_why(err)}") from None
        timer = threading.Timer(timeout, _kill, (container, killed, errors))
        timer.daemon = True
        timer.start()
        try:
            for line in _lines(container.logs(stream=True, follow=True)):
                lines.append(line)
                log(line)
            status = int(container.wait()["StatusCode"])
        except errors as err:
            raise Failed(f"the engine failed while running {what}: {_why(err)}") from None
        except KeyboardInterrupt:
            log(f"interrupted: stopping container {name}")
            try:
                container.stop(timeout=10)
            except errors:
                pass  # removed by force below
            raise
    finally:
        if timer is not None:
            timer.cancel()
        _remove_container(client, container, name, errors, log)
    if killed.is_set():
        lines.append(f"(killed after {timeout:.0f} s)")
        log(lines[-1])
    return status, lines, time.perf_counter() - start


def _client_timeout(client: Any) -> float:
    """The seconds an SDK client's API calls wait (``DockerClient.api.timeout``), else ``api_timeout()``."""
    seconds = getattr(getattr(client, "api", None), "timeout", None)
    return float(seconds) if isinstance(seconds, (int, float)) else api_timeout()


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a log stream whose chunks may end mid-line (UTF-8, undecodable bytes replaced)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield raw.decode(errors="replace").rstrip()
    if pending:
        yield pending.decode(errors="replace").rstrip()


def _kill(container: Any, killed: threading.Event, errors: tuple[type[BaseException], ...]) -> None:
    killed.set()
    try:
        container.kill()
    except errors:
        pass  # it exited meanwhile


def _remove_container(client: Any, container: Any, name: str, errors: tuple[type[BaseException], ...],
                      log: Log) -> None:
    """Removes a container by force; by ``name`` where ``containers.run`` created it but raised."""
    try:
        if container is None:
            container = client.containers.get(name)
        container.remove(force=True)
    except errors as err:
        if getattr(err, "status_code", None) != 404:  # never created, or already gone
            log(f"could not remove container {name}: {_why(err)}")
