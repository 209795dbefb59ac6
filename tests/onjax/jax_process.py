"""JAX processes for the tests of Keras 3 on the JAX backend (``harness.parallel.onjax``).

Each runs as a ``python`` child forked from a zygote that imported numpy, JAX and Keras and nothing else
(tests/tf_zygote.py's ``JAX``; a plain child under ``HARNESS_TEST_NO_ZYGOTE=1``), with ``KERAS_BACKEND=jax``, JAX on
the host platform and ``devices`` CPU devices, and a guard that makes any import of TensorFlow in it fail the run
(``NO_TF``): the JAX path must not need it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tf_zygote import JAX, python

ROOT = Path(__file__).resolve().parents[2]

# First in the child: harness.compat.block_tensorflow, every attempt to import TensorFlow said on stderr with who tried
# (a traceback), so that an attempt its caller catches fails the test too; Keras' own probe for an optional
# TensorFlow (``tf.available`` in its saving and seeding code) is Keras', whatever its backend, and not reported.
ATTEMPT = "HARNESS-TEST: TensorFlow import attempted: "
NO_TF = f"""
import sys
from harness.compat import block_tensorflow
block_tensorflow(lambda name, stack: sys.stderr.write({ATTEMPT!r} + name + chr(10) + "".join(stack)))
"""


# JAX's persistent compilation cache for these processes, in the checkout (git-ignored, like .pytest_cache): the
# programs the tests compile again and again (one model's step in test after test, run after run) are read back
# instead of compiled by XLA anew. The cache's key holds the program, the compile options, XLA_FLAGS and the JAX and
# jaxlib versions, so a changed program or device count compiles afresh; what runs is the executable XLA made, so no
# result changes (what it saves: docs/design.md, beside the zygote's figures). Every entry is cached
# (no minimum compile time or size); the size bound (its LRU eviction) brings JAX's file lock, which keeps the two
# xdist workers from reading an entry the other is writing: without filelock, no cache. A JAX_COMPILATION_CACHE_DIR
# of the caller's own is kept; HARNESS_TEST_JAX_CACHE=0 turns it off.
JAX_CACHE = ROOT / ".jax-cache"


def _compilation_cache() -> dict[str, str]:
    import importlib.util

    if os.environ.get("HARNESS_TEST_JAX_CACHE") == "0" or importlib.util.find_spec("filelock") is None:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE)),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(512 * 2**20)}


def jax_env(devices: int = 3, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "XLA_FLAGS")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **_compilation_cache(), **extra)
    return env


def run_jax(code: str, devices: int = 3, timeout: float = 600, allow_tf: bool = False,
            expect_rc: int = 0) -> subprocess.CompletedProcess:
    """Runs ``code`` in a JAX process (TensorFlow blocked unless ``allow_tf``); fails the test on another exit
    status than ``expect_rc``."""
    pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")
    done = python(["-c", ("" if allow_tf else NO_TF) + code], env=jax_env(devices), timeout=timeout, cwd=str(ROOT),
                  preload=JAX)
    assert done.returncode == expect_rc, done.stderr[-4000:]
    assert allow_tf or ATTEMPT not in done.stderr, done.stderr[done.stderr.index(ATTEMPT):][:3000]
    return done


def run_jax_script(path: Path, *args: str, devices: int = 3, timeout: float = 600, expect_rc: int = 0):
    """``run_jax`` of the script ``path`` with ``args`` (as ``python PATH ARGS...``, TensorFlow blocked); the JSON
    of its last stdout line."""
    code = f"import runpy, sys\nsys.argv = {[str(path), *args]!r}\nrunpy.run_path({str(path)!r}, run_name='__main__')\n"
    done = run_jax(code, devices, timeout, expect_rc=expect_rc)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_harness_cli(*args: str, devices: int = 3, timeout: float = 300, env: dict | None = None,
                    cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``harness ARGS`` in a JAX process (TensorFlow blocked, an attempt failing the test); its exit status is the
    caller's to judge."""
    pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")
    code = NO_TF + ("import runpy\nsys.argv = ['harness', *sys.argv[1:]]\n"
                    "runpy.run_module('harness', run_name='__main__', alter_sys=True)\n")
    done = python(["-c", code, *args], env={**jax_env(devices), **(env or {})}, cwd=str(cwd or ROOT),
                  timeout=timeout, preload=JAX)
    assert ATTEMPT not in done.stderr, done.stderr[done.stderr.index(ATTEMPT):][:3000]
    return done
