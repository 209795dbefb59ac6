"""Fresh TensorFlow processes without importing TensorFlow each time: a zygote forks them.

A test that needs its own device layout, or runs the ``harness`` CLI as a user does, needs a process of its
own: TensorFlow fixes its devices once per process. Importing TensorFlow is most of what such a process
costs on a small host (several seconds, against a fraction of a second for the work most of these tests
do). The zygote is one process per test process that imports TensorFlow (and numpy) and nothing else, then
waits; each run is a ``fork()`` of it that runs the code or the module like ``python -c CODE`` or
``python -m MODULE`` would: its own pid, environment, working directory, arguments, standard streams
(files, read back as ``subprocess.run(capture_output=True)`` returns them), exit status and interpreter
shutdown (atexit, non-daemon threads). TensorFlow's runtime starts in the child: the zygote never creates
a TensorFlow context, so each child sets up its own devices, threads and Keras.

A zygote serves one environment, less the variables read after start-up (``LATE_ENV``): a run in another
(``TF_USE_LEGACY_KERAS=1``, another ``CUDA_VISIBLE_DEVICES``) forks from a zygote of its own. It serves one set of
imports too: ``TENSORFLOW`` (numpy and TensorFlow, the default) or ``JAX`` (numpy, JAX and Keras, for the runs of
tests/onjax/jax_process.py with ``KERAS_BACKEND=jax``: ~1.9 s of import each on this project's 2-core host, and no
TensorFlow, which the zygote checks it did not import, so that those runs' guard against TensorFlow still sees every
import). JAX starts its backend in the child too, at the first device a child asks for: ``XLA_FLAGS`` (the number of
CPU devices) is read then, so it is late for the JAX zygote. A ``fresh=True`` run
(a test of what a command imports) and every run under ``HARNESS_TEST_NO_ZYGOTE=1`` (to compare, or to rule the
zygote out when a test fails) is a plain ``subprocess.run``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence

# Variables read after start-up (by harness, by a strategy), so a forked child may set them itself; any other
# difference from a zygote's environment gets a zygote of its own. (TF_USE_LEGACY_KERAS is not one of these:
# TensorFlow's import reads it.)
LATE_ENV = frozenset({"HARNESS_RESULTS_DIR", "TF_CONFIG", "COLUMNS", "PYTEST_CURRENT_TEST"})

TENSORFLOW = ("numpy", "tensorflow")
JAX = ("numpy", "jax", "keras")  # with KERAS_BACKEND=jax in the environment; no JAX backend is started by these
_LATE_FOR = {JAX: frozenset({"XLA_FLAGS"})}  # read at the JAX backend's start, in the child

_SERVE = r"""
import json, os, sys
for _name in sys.argv[1:]:  # the imports each child is spared; no TensorFlow context or JAX backend is made here
    __import__(_name)
if "tensorflow" not in sys.argv[1:] and "tensorflow" in sys.modules:
    sys.exit("tf_zygote: importing " + ", ".join(sys.argv[1:]) + " imported TensorFlow too")
import gc; gc.freeze()  # the imports' objects out of every child's collections (timing, nothing else)
requests, replies = sys.stdin.buffer, sys.stdout.buffer
while True:
    line = requests.readline()
    if not line:
        os._exit(0)  # the test process is gone
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    replies.write(b"%d\n" % pid); replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(b"%d\n" % os.waitstatus_to_exitcode(status)); replies.flush()
# The child: the process a plain ``python -c``/``python -m`` would have been, from here on.
def _become(job):
    os.setpgid(0, 0)  # its own group: a timeout kills it and whatever it started
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY),
                           (2, job["stderr"], os.O_WRONLY)):
        target = os.open(path, mode)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin, sys.stdout, sys.stderr = (open(0, closefd=False), open(1, "w", closefd=False),
                                         open(2, "w", closefd=False, buffering=1))
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    sys.argv = job["argv"]
    if job["module"] is not None:
        import runpy
        sys.path[0] = os.getcwd()
        runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        return
    sys.path[0] = ""
    code = compile(job["code"], "<string>", "exec")
    main = sys.modules["__main__"].__dict__  # python -c runs CODE in a bare __main__
    builtins = main["__builtins__"]
    main.clear()
    main.update(__name__="__main__", __doc__=None, __builtins__=builtins)
    exec(code, main)
_become(job)
"""


class _Zygote:
    """One serving process per test process; runs one child at a time (a test process runs one test)."""

    def __init__(self, env: Mapping[str, str], preload: tuple[str, ...] = TENSORFLOW):
        self.env = dict(env)
        self.preload = preload
        self.lock = threading.Lock()
        self.pending = b""  # read from the zygote, not yet taken
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env, bufsize=0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, deadline: float | None) -> int:
        """The zygote's next reply line (a pid, then an exit status). Both may come in one read where the child
        ends at once: what follows the first line is kept for the next call."""
        import time

        out = self.proc.stdout
        while b"\n" not in self.pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([out], [], [], wait)
            if not ready:
                raise TimeoutError
            chunk = os.read(out.fileno(), 64)
            if not chunk:
                raise RuntimeError(f"the zygote of {', '.join(self.preload)} exited ({self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return int(line)

    def run(self, job: dict, timeout: float | None) -> int:
        import time

        with self.lock:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            pid = self._line(None)
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                return self._line(deadline)
            except TimeoutError:
                with _suppress():
                    os.killpg(pid, signal.SIGKILL)  # the child and anything it started
                self._line(None)  # the zygote has reaped it
                raise

    def close(self) -> None:
        with _suppress():
            self.proc.stdin.close()
        with _suppress():
            self.proc.wait(timeout=10)


def _suppress():
    import contextlib

    return contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError)


# The environment the suite's TensorFlow processes run in: TensorFlow's C++ log kept to errors.
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}

_zygotes: dict[tuple, _Zygote] = {}


def _zygote(env: Mapping[str, str], preload: tuple[str, ...] = TENSORFLOW) -> _Zygote:
    late = LATE_ENV | _LATE_FOR.get(preload, frozenset())
    served = {k: v for k, v in env.items() if k not in late}
    key = (preload, tuple(sorted(served.items())))
    zygote = _zygotes.get(key)
    if zygote is None or not zygote.alive():
        zygote = _zygotes[key] = _Zygote(served, preload)
    return zygote


@atexit.register
def _close_all() -> None:
    for zygote in _zygotes.values():
        zygote.close()


def forking() -> bool:
    """Whether ``python`` forks from a zygote (unless ``HARNESS_TEST_NO_ZYGOTE=1``; Linux-like hosts only)."""
    return os.environ.get("HARNESS_TEST_NO_ZYGOTE") != "1" and hasattr(os, "fork") and sys.platform != "darwin"


def python(argv: Sequence[str], *, env: Mapping[str, str], timeout: float | None = None, cwd: str | None = None,
        fresh: bool = False, preload: tuple[str, ...] = TENSORFLOW) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)``, forked where it can be,
    from a zygote that imported ``preload`` (``TENSORFLOW`` or ``JAX``).

    ``argv`` is ``["-c", CODE, ARGS...]`` or ``["-m", MODULE, ARGS...]``. Raises ``subprocess.TimeoutExpired``
    as ``subprocess.run`` does, after killing the child's process group.
    """
    argv = list(argv)
    if fresh or not forking() or argv[:1] not in (["-c"], ["-m"]) or len(argv) < 2:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout,
                              env=dict(env), cwd=cwd)
    zygote = _zygote(env, preload)
    with tempfile.TemporaryDirectory(prefix="harness-zygote-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for path in (out, err):
            open(path, "w").close()
        code, module = (argv[1], None) if argv[0] == "-c" else (None, argv[1])
        job = {"code": code, "module": module, "env": dict(env), "cwd": os.path.abspath(cwd or os.getcwd()),
               "argv": ["-c", *argv[2:]] if module is None else [module, *argv[2:]], "stdout": out, "stderr": err}
        try:
            returncode = zygote.run(job, timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, _read(out), _read(err)) from None
        return subprocess.CompletedProcess([sys.executable, *argv], returncode, _read(out), _read(err))


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()
