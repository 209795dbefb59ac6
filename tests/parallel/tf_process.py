"""Running TensorFlow code and the ``harness`` CLI in their own processes.

TensorFlow fixes its devices once per process, and emulated devices need their
own inter-op threads, so every device layout a test needs runs in a subprocess.
On failure the child's stderr is shown.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_python(code: str, timeout: float = 900) -> str:
    """Runs ``code`` with ``python -c``; returns its stdout, failing the test on a non-zero exit."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def run_harness(args: list[str], results_dir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``python -m harness ARGS`` with its records going to ``results_dir``."""
    env = {**ENV, "HARNESS_RESULTS_DIR": str(results_dir)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
