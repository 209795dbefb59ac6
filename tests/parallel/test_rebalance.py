"""Online rebalancing: a throttled emulated device, with and without ``Rebalance``.

Two emulated devices at 1000 samples/s share a batch of 400 evenly; from step 7
device 1 runs at 400. Without rebalancing it sets the pace (200 samples per
0.5 s: 800 samples/s); with it the split moves to 286/114 and the pair gets back
to about 1000 + 400. Where this host could not keep up with 1000 samples/s
(the ``emulation`` fixture's calibration), every rate is scaled down by the
same factor and every window lengthened by its inverse: the same steps per
window, the same splits. (Steps of 0.2 s and more keep the real work between
the devices' emulated windows - input, loss, optimizer - small next to them,
also on a busy 2-core machine.) Each case runs in its own process: TensorFlow
fixes its devices once per process, and emulated devices need their own
inter-op threads. ``ratios="auto"`` runs on both Keras generations (``any_keras``).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tf_zygote import ENV, python

_THROTTLED = """
import json, sys, harness
devices = harness.use_logical_devices(2, inter_op_threads=4)
from harness.emulate import EmulatedDevice
from harness.bench.runner import RunConfig, host_bound, run_one
method, every = sys.argv[1], None if sys.argv[2] == "none" else int(sys.argv[2])
factor = float(sys.argv[3])
r = run_one(RunConfig("mnist_maxing", "tiny", method, devices, (200, 200), seconds=1.0 / factor, windows=6,
                      emulate=(EmulatedDevice(1000 * factor),) * 2, rebalance_every=every,
                      throttle=((1, 400.0 * factor, 7),)))
print(json.dumps({"status": r["status"], "sps": [w["samples_per_second"] for w in r["windows"]],
                  "batches": [[d["batch"] for d in w["devices"]] for w in r["windows"]],
                  "busy_rate": [[d["busy_rate"] for d in w["devices"]] for w in r["windows"]],
                  "rebalance": r.get("rebalance"), "config": r["config"], "host_bound": host_bound(r)}))
"""


def _throttled(method: str, every: int | None, factor: float) -> dict:
    """Device 1 of two emulated 1000 samples/s devices drops to 400 before step 7 (counted from 0); rates x factor."""
    done = python(["-c", _THROTTLED, method, str(every or "none"), repr(factor)], timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    print(method, every, factor, [round(s) for s in run["sps"]], run["batches"])  # the figures, shown with -s
    assert run["host_bound"] == [], run["host_bound"]  # the figures are the emulation's, not this CPU's
    return run


@pytest.mark.timing
def test_without_rebalance_the_throttled_device_sets_the_pace(emulation):
    f = emulation.factor(1000)
    fixed = _throttled("towers", None, f)
    assert fixed["status"] == "complete" and fixed["config"]["throttle"] == [{"device": 1, "rate": 400.0 * f,
                                                                             "at_step": 7}]
    assert fixed["sps"][0] == pytest.approx(2000 * f, rel=0.1)  # before the throttle: both at 1000
    assert fixed["sps"][-2:] == pytest.approx([800 * f, 800 * f], rel=0.1)
    assert fixed["busy_rate"][-1] == pytest.approx([1000 * f, 400 * f], rel=0.05)
    assert all(b == [200, 200] for b in fixed["batches"]) and fixed["rebalance"] is None


@pytest.mark.timing
@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_rebalance_recovers_the_throttled_throughput(method, emulation):
    f = emulation.factor(1000)
    run = _throttled(method, 5, f)
    assert run["status"] == "complete"
    assert min(run["sps"][-2:]) >= 0.9 * (1000 + 400) * f  # without rebalancing: 800 (the test above)
    # 400 in proportion to 1000:400 is 286/114; the split follows *measured* rates, which a loaded
    # machine moves by a percent or two (one tox matrix run here gave 285/115)
    assert abs(run["batches"][-1][0] - 286) <= 4, run["batches"][-1]
    assert all(sum(b) == 400 for b in run["batches"])
    resplits = [e for e in run["rebalance"] if e["resplit"]]
    assert resplits and resplits[0]["step"] > 7  # measured after the throttle, not before
    assert resplits[-1]["rates"] == pytest.approx([1000 * f, 400 * f], rel=0.05)
    assert all(e["batch"] == 400 for e in run["rebalance"])


_AUTO = """
import importlib, json, sys, harness
devices = harness.use_logical_devices(2, inter_op_threads=4)
from harness.parallel.rebalance import is_rebalance
from harness.bench.workloads import small
k, method = importlib.import_module(sys.argv[1]), sys.argv[2]  # keras, or a Keras 2 module (tf_keras)
made = []


def parallelize(template, devs, ratios):  # compare_training's hook: emulated devices and ratios="auto"
    # 500 and 200 samples/s, device 1 with 40 ms per step more: the rule converges to equal step times.
    # (A small dense model: its real work is a fraction of a millisecond, far below what it emulates.)
    made.append(harness.parallelize(template, devs, ratios="auto", method=method, emulate="500,200::40"))
    return made[0]


x, y, _ = small.make_data("dense", 1400)
report = harness.compare_training(lambda: small.build("dense", keras=k), x, y, devices=devices, method=parallelize,
                                  batch_size=70, epochs=2, loss=small.loss(k),
                                  optimizer=lambda: k.optimizers.SGD(0.05, momentum=0.5))
rebalancer = made[0].rebalancer
print(json.dumps({"deviation": report.max_deviation, "steps": [report.steps, rebalancer.steps],
                  "loss": [report.loss_single, report.loss_parallel], "batches": rebalancer.history[-1]["batches"],
                  "resplits": sum(e["resplit"] for e in rebalancer.history),
                  "callback": isinstance(rebalancer, k.callbacks.Callback) and is_rebalance(rebalancer)}))
"""


@pytest.mark.extended
@pytest.mark.timing
@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_auto_ratios_tune_the_split_while_training_and_stay_exact(any_keras, method):
    done = python(["-c", _AUTO, any_keras.__name__, method], timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["callback"]  # the built-in rebalancer is a callback of the model's Keras
    assert out["steps"] == [40, 40] and out["resplits"] >= 1
    # Equal step times: b0 / 500 = 40 ms + b1 / 200 with b0 + b1 = 70 -> b0 = 55.7.
    assert out["batches"] in ([55, 15], [56, 14], [57, 13])
    assert out["deviation"] <= 1e-6  # weights and optimizer state
    np.testing.assert_allclose(out["loss"][1], out["loss"][0], atol=1e-6)


@pytest.mark.extended
@pytest.mark.timing
def test_harness_run_rebalance_and_throttle_options(tmp_path, emulation):
    # Two devices at R, device 1 drops to R / 4 at step 4: the split of 200 moves to 160/40.
    f = emulation.factor(4000)
    rate, throttled = emulation.scale(4000, 1000)
    env = {**ENV, "HARNESS_RESULTS_DIR": str(tmp_path)}
    done = python(["-m", "harness", "run", "--emulate", f"{rate},{rate}", "--batch", "200", "--rebalance", "3",
                "--throttle", f"1:{throttled}@4", "--seconds", f"{0.4 / f:.3f}", "--windows", "4"],
                  timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HOST-BOUND" not in done.stdout, done.stdout[-3000:]
    assert f"rebalancing every 3 steps; device 1 to {throttled} samples/s at step 4" in done.stdout
    # The split follows measured rates: a sample either way where the host's timing moves them a percent.
    resplits = [tuple(map(int, m)) for m in re.findall(r"Rebalance: step \d+: .*-> \[(\d+), (\d+)\] of 200",
                                                         done.stdout)]
    assert resplits and abs(resplits[-1][0] - 160) <= 2, done.stdout[-3000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("run-*.json")]
    run = record["config"]["run"]
    assert run["rebalance_every"] == 3 and run["throttle"] == [{"device": 1, "rate": float(throttled), "at_step": 4}]
    assert [d["batch"] for d in record["result"]["windows"][-1]["devices"]] == list(resplits[-1])
    assert record["result"]["rebalance"][-1]["batches"] == list(resplits[-1])
