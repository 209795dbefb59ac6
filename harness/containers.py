"""Builds, smoke-tests and tests the version matrix's images, with a private engine when none runs.

Everything goes through the ``docker`` client. Where no engine answers, a
private ``dockerd`` is started on its own socket and data root (vfs storage, no
iptables, no bridge: what works inside an unprivileged sandbox), and stopped
and deleted afterwards. Where no registry answers, the Debian base image is
built from ``debootstrap`` against the mirror apt is configured with, and every
Python package comes from a wheelhouse filled on the host (``OFFLINE=1``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.matrix import CPU_BASE, Entry, build_args

__all__ = ["Engine", "find_engine", "start_engine", "apt_mirror", "ensure_cpu_base", "fill_wheelhouse",
           "build_image", "image_facts", "run_in_image", "DEBIAN_BASE_TAG"]

DEBIAN_BASE_TAG = "harness-base:bookworm"
_SUITE = "bookworm"
Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


@dataclass
class Engine:
    """A Docker engine the client can reach; ``started`` when this process started it."""

    host: str | None = None  # DOCKER_HOST for the client; None: the client's default
    started: bool = False
    root: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        env = dict(os.environ, DOCKER_BUILDKIT="1")
        if self.host:
            env["DOCKER_HOST"] = self.host
        return env

    def docker(self, *args: str, timeout: float | None = 600, check: bool = True) -> subprocess.CompletedProcess:
        """Runs ``docker ARGS``; raises RuntimeError with its stderr when it fails and ``check``."""
        proc = subprocess.run([docker_client(), *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])} failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        return proc

    def stream(self, args: list[str], log: Log, timeout: float) -> tuple[int, list[str]]:
        """Runs ``docker ARGS``, passing each output line to ``log``; returns (exit status, last lines)."""
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
        """Stops an engine this process started and deletes its data root; leaves others alone."""
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
            shutil.rmtree(self.root, ignore_errors=True)
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
        raise RuntimeError("no docker client on PATH (Debian: apt-get install docker.io)")
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


def _answers(host: str | None) -> bool:
    env = dict(os.environ)
    if host:
        env["DOCKER_HOST"] = host
    try:
        proc = subprocess.run([docker_client(), "version", "--format", "{{.Server.Version}}"], env=env,
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def find_engine() -> Engine | None:
    """The engine the client reaches as configured (``DOCKER_HOST`` or its default socket), if any."""
    if not _candidates() and not os.environ.get("HARNESS_DOCKER"):
        return None
    return Engine(host=os.environ.get("DOCKER_HOST")) if _answers(os.environ.get("DOCKER_HOST")) else None


def start_engine(root: Path, log: Log = _quiet, timeout: float = 90) -> Engine:
    """Starts a private ``dockerd`` under ``root`` (socket, data, exec root, pid file, log).

    Raises:
        RuntimeError: without ``docker``/``dockerd`` or root, or when it does not answer in ``timeout``.
    """
    missing = [tool for tool, found in (("docker", _candidates()), ("dockerd", shutil.which("dockerd"))) if not found]
    if missing:
        raise RuntimeError(f"no Docker engine answers and {', '.join(missing)} is not installed "
                           "(Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise RuntimeError("no Docker engine answers, and starting a private dockerd needs root; "
                           "start one yourself and set DOCKER_HOST")
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    # Sockets live under the exec root, and a Unix socket path has at most 107 bytes: keep it short.
    run = Path(tempfile.mkdtemp(prefix="harness-dockerd-"))
    (root / "run").symlink_to(run)
    sock = run / "docker.sock"
    cmd = ["dockerd", "--storage-driver=vfs", "--iptables=false", "--ip6tables=false", "--bridge=none",
           f"--data-root={root / 'data'}", f"--exec-root={run / 'exec'}", f"--pidfile={run / 'dockerd.pid'}",
           f"--host=unix://{sock}"]
    log(f"starting a private engine: {' '.join(cmd)}")
    with open(root / "dockerd.log", "w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(host=f"unix://{sock}", started=True, root=root, process=process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _answers(engine.host):
            return engine
        time.sleep(0.5)
    log_tail = (root / "dockerd.log").read_text(errors="replace").splitlines()[-15:]
    engine.stop()
    raise RuntimeError(f"the private dockerd did not answer within {timeout:.0f} s; its log ends:\n"
                       + "\n".join(log_tail))


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
    raise RuntimeError(f"apt names no mirror for Debian {_SUITE} main in {[str(p) for p in paths]}")


def _has_image(engine: Engine, tag: str) -> bool:
    return engine.docker("image", "inspect", tag, check=False, timeout=60).returncode == 0


def ensure_cpu_base(engine: Engine, cache: Path, want: str = CPU_BASE, log: Log = _quiet,
                    pull: bool = True) -> str:
    """An image tag to build the CPU variant on: ``want`` if present or pullable, else a debootstrapped Debian.

    The debootstrap root file system is cached as a tarball under ``cache``.
    """
    if _has_image(engine, want):
        return want
    if pull:
        log(f"pulling {want}")
        try:
            if engine.docker("pull", want, check=False, timeout=180).returncode == 0:
                return want
        except subprocess.TimeoutExpired:
            pass
        log(f"no registry gave {want}; building {DEBIAN_BASE_TAG} with debootstrap")
    if _has_image(engine, DEBIAN_BASE_TAG):
        return DEBIAN_BASE_TAG
    tarball = Path(cache) / f"debian-{_SUITE}-minbase.tar"
    if not tarball.exists():
        _debootstrap(tarball, log)
    engine.docker("import", "--message", f"debootstrap --variant=minbase {_SUITE}", str(tarball), DEBIAN_BASE_TAG,
                  timeout=600)
    return DEBIAN_BASE_TAG


def _debootstrap(tarball: Path, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise RuntimeError("no Debian base image and no debootstrap to build one (apt-get install debootstrap)")
    mirror = apt_mirror()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase {_SUITE} from {mirror} (a few minutes, once)")
        proc = subprocess.run(["debootstrap", "--variant=minbase", _SUITE, str(rootfs), mirror],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {proc.returncode}): "
                               f"{proc.stdout[-1500:]}{proc.stderr[-500:]}")
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.rename(tarball)


def fill_wheelhouse(dest: Path, entry: Entry, variant: str, repo: Path, offline: bool, log: Log = _quiet) -> Path:
    """Builds the harness wheel into ``dest``; with ``offline``, also every wheel the image installs.

    Returns:
        The harness wheel's path.

    Raises:
        RuntimeError: when pip fails, or the host Python differs from the entry's (wheels must match it).
    """
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if offline and host != entry.python:
        raise RuntimeError(f"an offline wheelhouse for {entry.name} needs Python {entry.python} on the host "
                           f"to resolve its wheels; this is Python {host}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("harness-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _pip(pip + ["wheel", "--no-deps", "--wheel-dir", str(dest), str(repo)], "the harness wheel", log)
    wheel = next(dest.glob("harness-*.whl"))
    if offline:
        args = build_args(entry, variant)
        reqs = [args["TF_REQUIREMENT"]] + ([args["KERAS_REQUIREMENT"]] if args["KERAS_REQUIREMENT"] else [])
        log(f"filling the wheelhouse {dest} for {' '.join(reqs)} harness[test,bench]")
        _pip(pip + ["wheel", "--wheel-dir", str(dest), "--find-links", str(dest), *reqs, f"{wheel}[test,bench]"],
             "the wheelhouse", log)
    return wheel


def _pip(cmd: list[str], what: str, log: Log) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not build {what} (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    log(f"{what}: done")


def build_image(engine: Engine, dockerfile: Path, context: Path, tag: str, args: dict[str, str],
                log: Log = _quiet, timeout: float = 3600) -> float:
    """``docker build`` with BuildKit and the host network; returns the build's seconds.

    Raises:
        RuntimeError: with the build's last output lines when it fails.
    """
    cmd = ["build", "--network=host", "--progress=plain", "--file", str(dockerfile), "--tag", tag]
    for key, value in args.items():
        cmd.append(f"--build-arg={key}={value}")
    start = time.perf_counter()
    code, tail = engine.stream([*cmd, str(context)], log, timeout)
    if code != 0:
        raise RuntimeError(f"building {tag} failed (exit {code}); the build output ends:\n" + "\n".join(tail[-25:]))
    return time.perf_counter() - start


def image_facts(engine: Engine, tag: str) -> dict:
    """Size in bytes, the configured user and the labels of an image."""
    import json

    data = json.loads(engine.docker("image", "inspect", tag, timeout=60).stdout)[0]
    return {"size_bytes": int(data["Size"]), "user": data["Config"].get("User", ""),
            "labels": data["Config"].get("Labels") or {}}


def run_in_image(engine: Engine, tag: str, command: list[str], *, mount: Path | None = None, gpus: bool = False,
                 log: Log = _quiet, timeout: float = 3600) -> tuple[int, list[str], float]:
    """``docker run --rm`` without network (with ``mount`` read-only at /src); returns (status, lines, seconds)."""
    cmd = ["run", "--rm", "--network=none"]
    if gpus:
        cmd += ["--gpus", "all"]
    if mount is not None:
        cmd += ["--volume", f"{Path(mount).resolve()}:/src:ro"]
    lines: list[str] = []

    def keep(line: str) -> None:
        lines.append(line)
        log(line)

    start = time.perf_counter()
    code, _ = engine.stream([*cmd, tag, *command], keep, timeout)
    return code, lines, time.perf_counter() - start
