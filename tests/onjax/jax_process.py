"""JAX processes for the tests of Keras 3 on the JAX backend (``harness.parallel.onjax``).

Each runs as a plain ``python`` child (not tests/tf_zygote.py's forks: those carry TensorFlow), with
``KERAS_BACKEND=jax``, JAX on the host platform and ``devices`` CPU devices, and a guard that makes any import of
TensorFlow in it fail the run (``NO_TF``): the JAX path must not need it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def jax_env(devices: int = 3, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "XLA_FLAGS")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)
    return env


def run_jax(code: str, devices: int = 3, timeout: float = 600, allow_tf: bool = False,
            expect_rc: int = 0) -> subprocess.CompletedProcess:
    """Runs ``code`` in a JAX process (TensorFlow blocked unless ``allow_tf``); fails the test on another exit
    status than ``expect_rc``."""
    pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")
    done = subprocess.run([sys.executable, "-c", ("" if allow_tf else NO_TF) + code], env=jax_env(devices),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
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
    done = subprocess.run([sys.executable, "-c", code, *args], env={**jax_env(devices), **(env or {})},
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)
    assert ATTEMPT not in done.stderr, done.stderr[done.stderr.index(ATTEMPT):][:3000]
    return done
