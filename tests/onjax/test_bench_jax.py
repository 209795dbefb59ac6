"""``harness run --backend jax`` and ``harness compare --backend jax`` (harness.bench.jaxbench) on JAX CPU devices.

Each test runs the command in a JAX process (tests/onjax/jax_process.py: ``KERAS_BACKEND=jax``, 3 CPU devices, any
attempt of harness to import TensorFlow failing the test). Small workload, short windows.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from jax_process import run_harness_cli, run_jax  # tests/onjax/jax_process.py

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

FAST = ["--model", "mlp_head10", "--seconds", "0.2", "--windows", "2", "--warmup-steps", "2"]


def harness(*args: str, devices: int = 3, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_harness_cli(*args, devices=devices, timeout=timeout)


def only_record(directory: Path, kind: str) -> dict:
    (path,) = directory.glob(f"{kind}-*.json")
    return json.loads(path.read_text())


# harness run twice in one JAX process (one import of JAX and Keras): as it is, then with a planted defect of the
# per-device figures, each device's share counted from the whole batch instead of its own rows.
_RUN_AND_PLANTED = """
import contextlib, io, json
from harness.bench import jaxbench
from harness.cli import main

def run(results):
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        status = main([*ARGS, "--results-dir", results])
    return status, said.getvalue()

runs = [run(RESULTS[0])]
shares = jaxbench._window_record

def whole_batch_shares(window, config):
    record = shares(window, config)
    for device in record["devices"]:
        device["samples_per_second"] = config.batch * window.steps / window.seconds
    return record

jaxbench._window_record = whole_batch_shares
runs.append(run(RESULTS[1]))
print(json.dumps(runs))
"""


def _shares_add_up(record: dict) -> bool:
    """Whether each window's per-device samples/s (each device's rows of its samples) sum to the window's."""
    return all(sum(d["samples_per_second"] for d in window["devices"]) == pytest.approx(window["samples_per_second"])
               for window in record["result"]["windows"])


def test_run_on_three_cpu_devices_by_ratios_and_a_planted_share_fails(tmp_path):
    results = [str(tmp_path / "run"), str(tmp_path / "planted")]
    args = ["run", "--backend", "jax", "--logical-cpus", "3", "--ratios", "5", "3", "2", "--batch", "100", *FAST]
    done = run_jax(f"RESULTS = {results!r}\nARGS = {args!r}\n" + _RUN_AND_PLANTED, timeout=180)
    (status, said), (planted_status, _) = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == planted_status == 0, done.stderr[-4000:]
    record = only_record(tmp_path / "run", "run")
    assert record["status"] == "complete" and record["backend"] == "jax"
    assert record["config"]["backend"] == "jax" and record["result"]["config"]["backend"] == "jax"
    assert record["result"]["config"]["batches"] == [50, 30, 20]
    assert record["environment"]["jax"]["default_backend"] == "cpu"
    summary = record["result"]["summary"]
    assert summary["samples_per_second"]["median"] > 0
    devices = summary["devices"]
    assert [d["device"] for d in devices] == ["cpu:0", "cpu:1", "cpu:2"]
    assert all(d["source"] == "jax share" and d["samples_per_second"]["median"] > 0 for d in devices)
    assert _shares_add_up(record)
    assert "jax share" in said and "samples/s" in said
    assert not _shares_add_up(only_record(tmp_path / "planted", "run"))


@pytest.mark.extended  # 8 s
@pytest.mark.covered_by("tests/onjax/test_bench_jax.py::test_run_on_three_cpu_devices_by_ratios_and_a_planted_share_fails")
def test_compare_writes_rows_json_and_chart(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib: harness' [bench] extra draws the chart")
    done = harness("compare", "--backend", "jax", "--logical-cpus", "2", "--batch", "64", "--ratios", "3", "1",
                   *FAST, "--results-dir", str(tmp_path), devices=2)
    assert done.returncode == 0, done.stderr[-4000:]
    record = only_record(tmp_path, "compare")
    assert record["status"] == "complete" and record["backend"] == "jax"
    labels = [row["label"] for row in record["rows"]]
    assert labels == ["cpu:0 alone", "cpu:1 alone", "cpu:0 whole", "even towers", "ratio towers"]
    assert all(row["status"] == "complete" and row["summary"]["samples_per_second"]["median"] > 0
               for row in record["rows"])
    assert record["rows"][-1]["config"]["batches"] == [48, 16]
    assert any("stock rows" in entry for entry in record["left_out"])
    assert "left out" in done.stdout and "ratio towers" in done.stdout
    assert list(tmp_path.glob("compare-*.png")), done.stdout


@pytest.mark.parametrize(("command", "option", "words"), [
    (["run", "--emulate", "1000,500"], "--emulate", "emulated devices are TensorFlow's"),
    (["run", "--logical-cpus", "2", "--method", "mirrored"], "--method mirrored", "MirroredStrategy"),
    (["run", "--logical-cpus", "2", "--rebalance", "5"], "--rebalance", "TensorFlow"),
    (["compare", "--workers", "2"], "--workers", "one process"),
    (["compare", "--logical-cpus", "2", "--methods", "mirrored"], "--methods mirrored", "towers"),
])
def test_tensorflow_only_options_exit_2_naming_them(command, option, words):
    done = harness(*command[:1], "--backend", "jax", *command[1:], "--no-save")
    assert done.returncode == 2, done.stderr[-4000:]
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith(f"harness {command[0]}: error: {option}") and words in line, line


def test_a_tf_data_workload_is_refused_by_name():
    done = harness("run", "--backend", "jax", "--logical-cpus", "2", "--model", "harness:use_jax_cpu_devices",
                   "--data", "harness:use_jax_cpu_devices", "--no-save")
    assert done.returncode == 2, done.stderr[-4000:]
    assert "--data" in done.stderr and "tf.data" in done.stderr
