"""The asv suite runs (issue 5): ``asv check`` and one cheap combination of every benchmark.

``HARNESS_BENCH_GRID=smoke`` is the ci grid's parameters with the shortest
timings; ``--bench`` regexes pick parameter combinations (asv matches them
against ``name(param, ...)``). ``--dry-run`` saves nothing; the config is a copy
of ``asv.conf.json`` whose output folders live in the test's temporary folder.
Under a minute on 2 CPU cores: one TensorFlow process per combination.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv")

ROOT = Path(__file__).resolve().parents[2]

# One combination per benchmark: each regex is matched against "module.Class.name(params)".
SELECTION = [
    r"^throughput\.(Throughput|TrainStep|GpuMemory)\..*\('mnist_maxing', 'mirrored', 'tuned', 3\)$",
    r"^throughput\.Throughput\..*\('mnist_maxing', 'single', 'even', 2\)$",  # invalid: setup skips it
    r"^throughput\.HostMemory\..*\('mnist_maxing', 'towers', 2\)$",
    r"^fidelity\..*\('mnist_maxing', 'mirrored', 3\)$",
    r"^tuner\.",
    r"^startup\.",
]


def _asv(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path), "HARNESS_BENCH_GRID": "smoke"}  # HOME: asv's machine file
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def config(tmp_path) -> Path:
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "results"),
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"))
    path = tmp_path / "asv.conf.json"
    path.write_text(json.dumps(conf))
    done = _asv(["machine", "--yes", "--machine", "harness-test"], tmp_path, 60)
    assert done.returncode == 0, done.stdout + done.stderr
    return path


def test_asv_check_finds_no_problems(config, tmp_path):
    done = _asv(["check", "--python=same", "--config", str(config)], tmp_path, 120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "No problems found" in out


def test_one_combination_of_every_benchmark_runs(config, tmp_path):
    bench = [arg for regex in SELECTION for arg in ("--bench", regex)]
    done = _asv(["run", "--python=same", "--quick", "--dry-run", "--show-stderr", "--machine", "harness-test",
                 "--config", str(config), *bench], tmp_path, 300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "failed" not in out and "Traceback" not in out, out[-6000:]
    for name in ("track_samples_per_second", "time_train_step", "peakmem_train_step", "track_peak_gpu_memory_bytes",
                 "track_max_weight_deviation", "track_efficiency", "track_tuning_seconds", "timeraw_import_harness",
                 "timeraw_cli_help"):
        assert name in out, f"{name} did not run:\n{out[-6000:]}"
    assert "asv: skipped: NotImplementedError(\"method 'single' runs on one device" in out
