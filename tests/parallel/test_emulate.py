"""Emulated heterogeneous devices: speed within 10%, overlap like real GPUs, TF's own OOM error.

Every case runs in its own process: TensorFlow fixes its devices once per process.
"""

from __future__ import annotations

import json

import pytest
from tf_process import run_harness, run_python

from harness.emulate import EmulatedDevice, Emulator, parse_emulate


def test_parse_emulate():
    assert parse_emulate("1345:1100, 875") == (EmulatedDevice(1345.0, 1100), EmulatedDevice(875.0, None))
    assert parse_emulate(["1000", "500:8"]) == (EmulatedDevice(1000.0), EmulatedDevice(500.0, 8))
    assert parse_emulate("1438:1100:49,900::5") == (EmulatedDevice(1438.0, 1100, 49.0),
                                                    EmulatedDevice(900.0, None, 5.0))
    assert EmulatedDevice(1438.0, None, 49.0).step_seconds(1024) == pytest.approx(0.049 + 1024 / 1438)
    for bad in ("", "0", "-1", "nan", "inf", "1:-1", "1:1.5", "a:b", "1:2:3:4", "1:2:x", "1:2:-1", "1:2:inf"):
        with pytest.raises(ValueError, match="emulat"):
            parse_emulate(bad)


def test_busy_time_counts_work_that_ended_in_the_window():
    emulator = Emulator({"/cpu:0": EmulatedDevice(100.0)})
    emulator._events.extend([("/cpu:0", 0.5, 1.5, 100), ("/cpu:0", 1.5, 2.5, 100), ("/cpu:0", 2.5, 3.5, 100)])
    busy = emulator.busy_between(1.0, 3.0)["/cpu:0"]
    assert (busy.steps, busy.samples) == (2, 200)
    assert busy.seconds == pytest.approx(1.5)  # the first event is clipped to the window's start


# Seed 000's devices, smaller batches: measured figures must land within 10% of the emulated rates.
_ACCURACY = """
import json, harness
devices = harness.use_logical_devices(2, inter_op_threads=4)
from harness.emulate import parse_emulate
from harness.runner import RunConfig, run_one
emulate = parse_emulate("1345:1100,875:700")
out = {}
for name, method, devs, batches, emu in [
        ("alone0", "single", devices[:1], (400,), emulate[:1]), ("alone1", "single", devices[1:], (400,), emulate[1:]),
        ("even", "towers", devices, (300, 300), emulate), ("ratio", "mirrored", devices, (364, 236), emulate),
        ("oom", "towers", devices, (300, 701), emulate)]:
    r = run_one(RunConfig("mnist_maxing", "tiny", method, devs, batches, seconds=0.8, windows=2, emulate=emu))
    out[name] = {"status": r["status"], "error": r["error"],
                 "sps": r["summary"] and r["summary"]["samples_per_second"]["median"],
                 "busy_rate": r["summary"] and [d["busy_rate"]["median"] for d in r["summary"]["devices"]]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def accuracy():
    return json.loads(run_python(_ACCURACY).strip().splitlines()[-1])


def test_alone_each_device_runs_at_its_emulated_rate(accuracy):
    assert accuracy["alone0"]["sps"] == pytest.approx(1345, rel=0.10)
    assert accuracy["alone1"]["sps"] == pytest.approx(875, rel=0.10)
    assert accuracy["alone0"]["busy_rate"][0] == pytest.approx(1345, rel=0.02)


def test_devices_overlap_like_real_gpus(accuracy):
    # Even 300/300: the slow device sets the pace, 600 samples per 300/875 s. Serialised devices would
    # give 600 / (300/1345 + 300/875) = 1060.
    assert accuracy["even"]["sps"] == pytest.approx(600 / (300 / 875), rel=0.10)
    # Ratio 364/236 keeps both busy: close to the sum of the rates.
    assert accuracy["ratio"]["sps"] == pytest.approx(1345 + 875, rel=0.10)
    assert accuracy["ratio"]["busy_rate"] == pytest.approx([1345, 875], rel=0.02)


def test_beyond_maxbatch_is_tensorflows_out_of_memory(accuracy):
    assert accuracy["oom"]["status"] == "oom"
    assert accuracy["oom"]["error"] == (
        "emulated out of memory on /device:CPU:1: batch slice of 701 samples exceeds its MAXBATCH 700"
    )


def test_the_oom_is_resource_exhausted_error():
    code = """
import harness
devices = harness.use_logical_devices(2)
import keras, numpy as np, tensorflow as tf
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
parallel = harness.parallelize(model, devices, method="towers", emulate="1000:4,1000:4")
parallel.compile(optimizer="sgd", loss="mse")
parallel.fit(np.ones((8, 3)), np.ones((8, 2)), batch_size=8, verbose=0)  # 4 + 4: fits
try:
    parallel.fit(np.ones((10, 3)), np.ones((10, 2)), batch_size=10, verbose=0)
except tf.errors.ResourceExhaustedError as err:
    print("OOM", "MAXBATCH 4" in str(err))
"""
    assert run_python(code).strip().splitlines()[-1] == "OOM True"


def test_harness_run_emulated_prints_windows_and_keeps_a_record(tmp_path):
    done = run_harness(["run", "--emulate", "2000,1000", "--batches", "200", "100", "--seconds", "0.5",
                     "--windows", "2", "--method", "mirrored"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("window ") == 2
    assert "emulated device: its own busy time" in done.stdout
    records = list(tmp_path.glob("run-*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == "complete"
    assert record["config"]["run"]["batches"] == [200, 100]
    devices = record["result"]["summary"]["devices"]
    assert [d["busy_rate"]["median"] for d in devices] == pytest.approx([2000, 1000], rel=0.05)
    assert record["environment"]["tensorflow"]["version"]
    assert record["result"]["input"]["starved"] is False


def test_harness_run_out_of_memory_fails_cleanly_and_records_it(tmp_path):
    done = run_harness(["run", "--emulate", "2000:150,1000", "--batches", "200", "100", "--seconds", "0.3",
                     "--windows", "1"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "harness run: oom: emulated out of memory on /device:CPU:0: batch slice of 200 samples exceeds its "
        "MAXBATCH 150"
    )
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("run-*.json")]
    assert record["status"] == "failed" and "MAXBATCH 150" in record["error"]


def test_a_slow_input_pipeline_is_flagged_as_starved(tmp_path):
    # 100 ms of preprocessing per 64-sample batch: at most 640 samples/s, against devices worth 20000.
    done = run_harness(["run", "--emulate", "20000", "--batches", "64", "--seconds", "0.5", "--windows", "1",
                     "--input-delay-ms", "100", "--json", "--no-save"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)["result"]
    assert result["input"]["starved"] is True
    assert result["input"]["samples_per_second"] < 700


def test_harness_compare_puts_even_and_ratio_side_by_side(tmp_path):
    done = run_harness(["compare", "--emulate", "4000,2000", "--batch", "240", "--seconds", "0.3", "--windows", "2"],
                    tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("compare-*.json")]
    assert record["status"] == "complete"
    rows = {r["label"]: r for r in record["rows"]}
    assert list(rows) == ["CPU:0 alone", "CPU:1 alone", "even towers", "even mirrored", "ratio towers",
                          "ratio mirrored", "tuned towers", "tuned mirrored"]
    sps = {label: r["summary"]["samples_per_second"]["median"] for label, r in rows.items()}
    fast, slow = rows["ratio towers"]["config"]["batches"]  # split by the measured ~4000:2000
    assert fast + slow == 240 and 152 <= fast <= 164
    # Even: the slow device sets the pace (120 / 2000 s); ratio: both busy, about 6000 samples/s.
    assert sps["even towers"] == pytest.approx(4000, rel=0.15)
    assert sps["ratio mirrored"] > 1.3 * sps["even mirrored"]
    tuned_fast, tuned_slow = rows["tuned mirrored"]["config"]["batches"]  # the tuner's split of the same batch
    assert tuned_fast + tuned_slow == 240 and 152 <= tuned_fast <= 164
    assert sps["tuned mirrored"] > 1.3 * sps["even mirrored"]
    assert [d["stopped_by"] for d in record["tuning"]["devices"]] == ["limit", "limit"]  # grown up to the batch
    png = next(tmp_path.glob("compare-*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio split from measured single-device speeds" in done.stdout
