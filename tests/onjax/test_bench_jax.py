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


# The head of a script that runs harness twice in one JAX process (one import of JAX and Keras): ``run(results)``
# runs ARGS once, as it is, into RESULTS[0]; the script then plants a defect and runs them again into RESULTS[1].
_TWO_RUNS = """
import contextlib, io, json
from harness.bench import jaxbench
from harness.cli import main

def run(results):
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        status = main([*ARGS, "--results-dir", results])
    return status, said.getvalue()

runs = [run(RESULTS[0])]
"""

# harness run, then with a planted defect of the per-device figures: each device's share counted from the whole batch
# instead of its own rows.
_RUN_AND_PLANTED = _TWO_RUNS + """
shares = jaxbench._window_record

def whole_batch_shares(window, config, *rest):
    record = shares(window, config, *rest)
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


# harness run --method keras: Keras' own DataParallel as it is, then planted: the stock row quietly running plain
# Keras on one device (no distribution), which the record's weights_on must give away.
_STOCK_AND_PLANTED = _TWO_RUNS + """
@contextlib.contextmanager
def plain_keras(config):
    yield jaxbench.STOCK["several"]

jaxbench._stock_scope = plain_keras
runs.append(run(RESULTS[1]))
print(json.dumps(runs))
"""


def _data_parallel(result: dict, devices: list[str]) -> bool:
    """Whether a stock row ran Keras' DataParallel over ``devices``: the weights on every one of them, even shards."""
    return (result["stock"] == "keras.distribution.DataParallel, even shards" and result["weights_on"] == devices
            and len(set(result["config"]["batches"])) == 1)


def test_the_stock_baseline_is_keras_dataparallel_in_even_shards_and_a_planted_plain_keras_fails(tmp_path):
    results = [str(tmp_path / "run"), str(tmp_path / "planted")]
    args = ["run", "--backend", "jax", "--logical-cpus", "3", "--method", "keras", "--batch", "100", *FAST]
    done = run_jax(f"RESULTS = {results!r}\nARGS = {args!r}\n" + _STOCK_AND_PLANTED, timeout=180)
    (status, said), (planted_status, _) = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == planted_status == 0, done.stderr[-4000:]
    record = only_record(tmp_path / "run", "run")
    assert record["status"] == "complete" and record["result"]["summary"]["samples_per_second"]["median"] > 0
    assert record["result"]["config"]["batches"] == [33, 33, 33]  # 100 rounded down to a multiple of 3, said so
    assert record["note"] == "batch 100 rounded to 99: DataParallel shards evenly, a multiple of the 3 devices"
    assert "the stock baseline: keras.distribution.DataParallel" in said and "rounded to 99" in said
    assert _data_parallel(record["result"], ["cpu:0", "cpu:1", "cpu:2"]), record["result"]
    planted = only_record(tmp_path / "planted", "run")["result"]
    assert not _data_parallel(planted, ["cpu:0", "cpu:1", "cpu:2"]) and planted["weights_on"] == ["cpu:0"]


@pytest.mark.extended  # 12 s
@pytest.mark.covered_by(
    "tests/onjax/test_bench_jax.py::test_run_on_three_cpu_devices_by_ratios_and_a_planted_share_fails",
    "tests/onjax/test_bench_jax.py::"
    "test_the_stock_baseline_is_keras_dataparallel_in_even_shards_and_a_planted_plain_keras_fails")
def test_compare_writes_rows_json_and_chart(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib: harness' [bench] extra draws the chart")
    done = harness("compare", "--backend", "jax", "--logical-cpus", "3", "--batch", "100", "--ratios", "5", "3", "2",
                   *FAST, "--results-dir", str(tmp_path), devices=3)
    assert done.returncode == 0, done.stderr[-4000:]
    record = only_record(tmp_path, "compare")
    assert record["status"] == "complete" and record["backend"] == "jax"
    rows = {row["label"]: row for row in record["rows"]}
    assert list(rows) == ["cpu:0 alone", "cpu:1 alone", "cpu:2 alone", "cpu:0 whole", "cpu:0 keras", "even keras",
                          "even towers", "ratio towers"]
    assert all(row["status"] == "complete" and row["summary"]["samples_per_second"]["median"] > 0
               for row in record["rows"])
    assert rows["ratio towers"]["config"]["batches"] == [50, 30, 20]
    assert rows["even towers"]["config"]["batches"] == [34, 33, 33]
    assert _data_parallel(rows["even keras"], ["cpu:0", "cpu:1", "cpu:2"]) and "rounded to 99" in rows["even keras"][
        "note"]
    assert rows["cpu:0 keras"]["stock"] == "plain Keras on the device" and rows["cpu:0 keras"]["weights_on"] == [
        "cpu:0"]
    # harness over stock, each pair measured in this run and charged alike (no link modelled on JAX devices)
    pairs = {(e["row"], e["baseline"]): e for e in record["versus_stock"]}
    assert set(pairs) == {("cpu:0 whole", "cpu:0 keras"), ("even towers", "even keras"), ("even towers", "cpu:0 keras")}
    assert all(e["ratio"] > 0 and not e["modelled"] for e in pairs.values())
    assert "even towers / even keras: " in done.stdout and "DataParallel" in done.stdout
    assert "stock rows" not in " ".join(record.get("left_out", []))
    assert list(tmp_path.glob("compare-*.png")), done.stdout


@pytest.mark.parametrize(("command", "option", "words"), [
    (["run", "--emulate", "1000@pcie3x16,500"], "--emulate", "no link"),
    (["compare", "--emulate", "1000,500", "--logical-cpus", "2"], "--emulate", "its own devices"),
    (["run", "--logical-cpus", "2", "--method", "mirrored"], "--method mirrored", "MirroredStrategy"),
    (["run", "--logical-cpus", "2", "--method", "keras", "--rebalance", "5"], "--rebalance", "no split"),
    (["compare", "--workers", "2"], "--workers", "one process"),
    (["compare", "--logical-cpus", "2", "--methods", "mirrored"], "--methods mirrored", "towers"),
    (["tune", "--logical-cpus", "2", "--method", "mirrored"], "--method mirrored", "towers"),
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
