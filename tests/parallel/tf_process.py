"""Running TensorFlow code and the ``harness`` CLI in their own processes.

TensorFlow fixes its devices once per process, and emulated devices need their
own inter-op threads, so every device layout a test needs runs in a process of
its own: forked from a zygote that imported TensorFlow once (tests/tf_zygote.py),
as ``python -c``/``python -m`` would run it. On failure the child's stderr is shown.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tf_zygote import ENV, python


def run_python(code: str, timeout: float = 900) -> str:
    """Runs ``code`` as ``python -c`` does; returns its stdout, failing the test on a non-zero exit."""
    done = python(["-c", code], env=ENV, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def run_harness(args: list[str], results_dir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``python -m harness ARGS`` with its records going to ``results_dir``."""
    return python(["-m", "harness", *args], env={**ENV, "HARNESS_RESULTS_DIR": str(results_dir)}, timeout=timeout)
