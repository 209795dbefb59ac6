"""The tuner on emulated devices: the out-of-memory search, the chosen split, bad input.

Each test starts its own TensorFlow process (devices are fixed once per process).
"""

from __future__ import annotations

import json

import pytest
from tf_process import run_harness, run_python

_PROBE = """
import json, harness
from harness.bench import workloads
from harness.emulate import EmulatedDevice
from harness.bench.tuning.probe import probe_device
devices = harness.use_logical_devices(1, inter_op_threads=3)
probe = probe_device(workloads.get("mnist_maxing"), "tiny", devices[0], emulate=EmulatedDevice(20000.0, {ceiling}),
                     start=16, min_seconds=0.02, tolerance=0.03)
print(json.dumps(probe.to_json()))
"""


@pytest.mark.extended
@pytest.mark.parametrize("ceiling", [300, 1])
def test_ceiling_search_finds_the_emulated_ceiling(ceiling):
    probe = json.loads(run_python(_PROBE.format(ceiling=ceiling)))
    assert probe["ceiling"] <= ceiling < probe["oom_at"]
    assert probe["oom_at"] - probe["ceiling"] <= max(1, 0.03 * probe["ceiling"])
    assert probe["stopped_by"] == "oom" and "exceeds its MAXBATCH" in probe["oom_error"]
    fits = [p["batch"] for p in probe["points"] if p["fits"]]
    assert all(b <= ceiling for b in fits) and all(p["batch"] > ceiling for p in probe["points"] if not p["fits"])


# A model whose counting layer tells how often its step was traced (a script's own model: "__main__:build").
_COUNTED = """
import json, keras, harness
CALLS = []  # the layer's Python call runs once per trace of a step (and when Keras builds the model)
class Count(keras.layers.Layer):
    def call(self, x):
        CALLS.append(1)
        return x
def build():
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(2)(Count()(inputs)))
    model.compile("sgd", "mse")
    return model
"""
_TRACES = _COUNTED + """
from harness.bench import workloads
from harness.emulate import EmulatedDevice
from harness.bench.tuning.probe import probe_device
devices = harness.use_logical_devices(1, inter_op_threads=3)
seen = []
probe_device(workloads.get("__main__:build"), "tiny", devices[0], emulate=EmulatedDevice(20000.0, 300), start=16,
             min_seconds=0.02, on_point=lambda device, point: seen.append((point.batch, point.fits, len(CALLS))))
print(json.dumps(seen))
"""


@pytest.mark.extended
def test_the_probe_traces_one_step_for_every_batch_size():
    # Every size the probe tries (growth and bisection, timed or not) runs the one trace of fit's step made for the
    # first: a train_on_batch step before each fit traced each new size again, on every device (seconds apiece on a
    # 2-core host, before a single timed step). The planted defect (train_on_batch restored) added one: {5, 6} for {5}.
    seen = json.loads(run_python(_TRACES))
    sizes = sorted({batch for batch, _, _ in seen})
    assert len(sizes) >= 6 and any(not fits for _, fits, _ in seen), seen  # growth, out of memory, bisection
    assert {calls for _, _, calls in seen} == {seen[0][2]}, seen


_WAITS = """
import json, time, harness
import harness.emulate as emulate
from harness.bench import workloads
from harness.emulate import EmulatedDevice
from harness.bench.tuning.probe import probe_device
slept, sleep = [], time.sleep
emulate.time.sleep = lambda s: (slept.append(s), sleep(s))  # the emulated devices' waits
devices = harness.use_logical_devices(1, inter_op_threads=3)
probe = probe_device(workloads.get("mnist_maxing"), "tiny", devices[0], emulate=EmulatedDevice(200.0, 100), start=16,
                     min_seconds=0.02, tolerance=0.03)
print(json.dumps({{"probe": probe.to_json(), "slept": len(slept)}}))
"""


@pytest.mark.extended
def test_the_probe_waits_only_in_its_timed_steps():
    # A point's first step (a trace, a new size) and the bisection's steps (whether a batch fits) are not timed: on an
    # emulated device they skip their emulated waits. Every wait is a timed step's. Planted defect (the untimed step
    # waiting again): one wait more per point that fits.
    seen = json.loads(run_python(_WAITS.format()))
    timed = sum(p["steps"] for p in seen["probe"]["points"])
    assert timed > 0 and any(p["fits"] and not p["steps"] for p in seen["probe"]["points"])  # bisection points
    assert 0 < seen["slept"] <= timed, seen  # a timed step may run late (no wait) on a loaded host


_EVEN_TRACES = _COUNTED + """
from harness.bench.tuning.tuner import tune
from harness.emulate import parse_emulate
devices = harness.use_logical_devices(2, inter_op_threads=4)
seen = []
record = tune("__main__:build", devices=devices, emulate=parse_emulate("20000:300,10000:150"), method="{method}",
              verify_seconds=0.1, verify_windows=1, max_step_s=0.2,
              on_event=lambda line: seen.append((line, len(CALLS))))
print(json.dumps({{"seen": seen, "verify": record["verify"]}}))
"""


@pytest.mark.extended
@pytest.mark.parametrize("method", ["mirrored", "towers"])
def test_the_even_split_runs_the_tuned_splits_trace(method):
    # The tuned and the even split train one model (the even split set by set_ratios): the even run traces
    # nothing. Planted defect (a model of its own for the even split): its run traced the step again.
    out = json.loads(run_python(_EVEN_TRACES.format(method=method)))
    verify = out["verify"]
    assert verify["tuned"]["batches"] != verify["even"]["batches"] and verify["even"]["status"] == "complete"
    runs = [(line, calls) for line, calls in out["seen"] if line.startswith(("verifying: ", "    measured"))]
    tuned, *others, stock = (i for i, (line, _) in enumerate(runs)
                             if line.startswith("verifying: ") and "alone" not in line)
    # the tuned split, the ratio split where it differs, the even split, the stock baseline
    assert [runs[i][0].split(":")[1].split()[0] for i in (tuned, *others, stock)] == [
        method, *[method] * len(others), "keras"], runs
    # the ratio split runs where it differs from the tuned one and fits the memory ceilings the probe found (on a
    # loaded host a ceiling can come out below the ratio's slice: then it is named "not run", not run)
    ratio_ran = verify["ratio"]["batches"] != verify["tuned"]["batches"] and verify["ratio"]["status"] != "not run"
    assert len(others) == (2 if ratio_ran else 1), verify["ratio"]
    assert runs[tuned + 1][1] > runs[tuned][1]  # the tuned split's run traced the step
    assert all(runs[i + 1][1] == runs[i][1] for i in others), runs  # the ratio and even splits' traced nothing


_PLANTED_CHOICE = """
import json, harness
from harness.bench.tuning import solver
from harness.bench.tuning.tuner import tune
from harness.emulate import parse_emulate
best = solver.best_split
def planted(models, ceilings):  # the tuner's choice reversed: the slow device gets the fast one's share
    split = best(models, ceilings)
    return solver.predict(models, split.batches[::-1])
solver.best_split = planted
devices = harness.use_logical_devices(2, inter_op_threads=4)
record = tune("mnist_maxing", devices=devices, emulate=parse_emulate("{fast}:300,{slow}:300"), method="towers",
              verify_seconds=0.3, verify_windows=2, max_step_s=1.0, compare_even=False)
print(json.dumps({{"verify": record["verify"], "choice": record["choice"], "host_bound": record["host_bound"]}}))
"""


@pytest.mark.extended
def test_the_verification_keeps_the_ratio_split_where_it_measures_faster(emulation):
    """The tuner's verification measures the ratio split (the global batch divided by the devices' measured speeds
    alone) beside its own and keeps the faster, saying which and by how much. The planted defect, a solver that
    gives the slow device the fast one's share, loses to the ratio split: the recommendation is the ratio split."""
    # Rates this host sustains (fixed 20000 and 10000 samples/s were host-bound beside two CPU hogs: both splits
    # then ran at the host's speed, 1.02x apart).
    fast, slow = emulation.scale(4000, 2000)
    # A run the tuner finds host-bound is no verdict on it: run once more, as test_tune_balances_... does. Beside
    # the gate's tests starting process pairs in .ci/run's extended step (3a48798) a profile phase ran at 4792
    # samples/s of host against 2580 emulated and came out host-bound.
    for _ in range(2):
        out = json.loads(run_python(_PLANTED_CHOICE.format(fast=fast, slow=slow)))
        if out["host_bound"] == []:
            break
    verify, choice = out["verify"], out["choice"]
    assert out["host_bound"] == [], out["host_bound"]
    tuned, ratio, kept = verify["tuned"], verify["ratio"], verify["kept"]
    assert tuned["batches"][0] < tuned["batches"][1] and ratio["batches"][0] > ratio["batches"][1], verify
    assert ratio["status"] == "complete" and ratio["samples_per_second"] > tuned["samples_per_second"]
    assert kept["split"] == "ratio" and kept["over"] == "tuned" and kept["faster"] > 1.05, kept  # 1.18 here
    assert kept["why"].startswith(f"{kept['faster']:.3f}x the tuned split's")
    assert choice["kept"] == "ratio" and choice["batches"] == ratio["batches"]
    assert choice["tuned_batches"] == tuned["batches"]


@pytest.mark.timing
@pytest.mark.usefixtures("keras3")
def test_tune_balances_emulated_devices_and_verifies(tmp_path, emulation):
    # Keras 3 only: with TF 2.15's Keras 2 workloads the fast device's batch missed twice the slow one's
    # in 3 of 3 runs here (518 for 562, 562 for 412 and for 530), where Keras 3's passed beside them.
    fast, slow = emulation.scale(4000, 2000)
    # A run the tuner itself finds host-bound (more than a tenth of some phase's steps late: the figures are the
    # host's) is no verdict on the tuner: run once more. Beside two CPU hogs the host ran one profile at 2.4x the
    # emulated rate where it had been calibrated at 4x, and that phase came out host-bound (.ci/run at f43eddf).
    for attempt in range(2):
        done = run_harness(["tune", "--emulate", f"{fast}:600,{slow}:300", "--seconds", "0.4", "--windows", "2",
                            "--json"], tmp_path / f"attempt-{attempt}")
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads(done.stdout)
        result = record["result"]
        if result["host_bound"] == []:
            break
    assert result["host_bound"] == [] and "harness tune: warning" not in done.stderr  # the figures are the emulation's
    choice, tuned, even = result["choice"], result["verify"]["tuned"], result["verify"]["even"]
    # Ceilings bind: the most samples/s is the slow device near its ceiling, the fast one at about twice that:
    # less by what its larger fixed cost per step takes (the host's work per step is the same on both devices,
    # a larger share of the fast one's step; beside two CPU hogs here 518 for 562, 8% less).
    assert [d["ceiling"] <= m for d, m in zip(result["devices"], (600, 300))] == [True, True]
    assert choice["batches"][1] <= result["devices"][1]["ceiling"]
    fits = [d["fit"] for d in result["devices"]]
    assert choice["batches"][0] == pytest.approx(2 * choice["batches"][1], rel=0.12), fits
    assert tuned["status"] == "complete" and tuned["efficiency"] > 0.9
    assert tuned["samples_per_second"] == pytest.approx(tuned["predicted_samples_per_second"], rel=0.1)
    assert even["status"] == "complete" and even["efficiency"] < tuned["efficiency"]
    # The stock baseline on the same even split (Keras fit under MirroredStrategy, harness.bench.stock): the slow
    # device paces it as it paces ours.
    stock = result["verify"]["keras"]
    # on the even split less its remainder (Keras' split is equal; beside two CPU hogs the tuner chose 721 once)
    assert stock["status"] == "complete" and stock["batches"] == [sum(even["batches"]) // 2] * 2
    assert stock["samples_per_second"] == pytest.approx(even["samples_per_second"], rel=0.15)
    assert record["status"] == "complete" and result["seconds"]["total"] < 180
    assert next(tmp_path.glob(f"attempt-{attempt}/tune-*.json")).exists()
    assert next(tmp_path.glob(f"attempt-{attempt}/tune-*.png")).stat().st_size > 10_000


@pytest.mark.timing
def test_a_fast_card_on_a_slow_link_gets_less(tmp_path, emulation):
    # Two cards of one speed, the second on a link that copies a sample in twice the time it computes one: its
    # solo curve pays for its input slices (copied while the step before runs: slower than it computes them), and
    # in the parallel run it also exchanges the weights and gradients with the first (the merge device), beside
    # its compute. The link scales with the rate (a fixed 1 MB/s link left the two curves 1.23x apart once, at a
    # rate scaled down beside two CPU hogs). At an eighth of what this host sustained: at a quarter, its staged
    # probe steps were late beside two CPU hogs (host-bound, 1 run in 4).
    rate = emulation.scale(2000)[0] // 2
    gb_per_s = float(f"{rate * 784 * 4 / 2 / 1e9:.3g}")  # mnist_maxing's 28 x 28 float32 images
    # Grown until the two hold the global batch: a slow host scales the rate down (116 samples/s once beside two
    # CPU hogs), and the default 1 s step stopped growth at 128 and 64, short of 400.
    done = run_harness(["tune", "--emulate", f"{rate}:600:2@pcie3x16,{rate}:600:2@{gb_per_s}", "--global-batch",
                        "400", "--max-step-s", f"{400 / rate + 0.5:.2f}", "--seconds", "0.4", "--windows", "2",
                        "--no-even", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)["result"]
    assert result["host_bound"] == []
    choice, tuned = result["choice"], result["verify"]["tuned"]
    assert choice["batches"][0] > 1.3 * choice["batches"][1], choice
    links = choice["links"]
    assert links[0]["exchange_ms"] == 0 and links[1]["link"]["gb_per_s"] == gb_per_s and links[1]["overlap"]
    # the exchange counted: mnist_maxing's weights in and as many gradient bytes out, a latency per tensor each way
    weights = result["devices"][1]
    expected = 1000 * (2 * weights["weight_tensors"] * 10e-6 + 10e-6 + 2 * weights["weight_bytes"] / (gb_per_s * 1e9))
    assert links[1]["exchange_ms"] == pytest.approx(expected, rel=1e-9) and expected > 5
    assert tuned["status"] == "complete"
    # Measured beside whatever the other xdist worker runs then: the host's pauses outside the devices' steps (the
    # staging thread, fit's loop) slow the run without making a step late. Idle here within 2% of the prediction;
    # in the default suite 14% under it once (966 for 1120, at 6368d67); beside two CPU hogs 20.5% under (185 for
    # 233, at 951dfd7; this card's step waits for its slice's copy, twice its compute, on a thread of a busy host:
    # the likely cause, not isolated), so within 30%.
    assert tuned["samples_per_second"] == pytest.approx(tuned["predicted_samples_per_second"], rel=0.3)
    # Of the devices' solo samples/s at their batches, each paying its own copies. The solo rates and the parallel
    # one are measured minutes apart: idle here 0.98 to 1.03 (predicted 1.00), 0.88 once in CI's suite at 9014a53.
    # Beside two CPU hogs 0.82 for 1.00 (as above, at 951dfd7). Within 0.25 of the prediction:
    # what a tuner that ignored the link would choose is the even split, which the ratio above rules out.
    assert tuned["efficiency"] > choice["efficiency"] - 0.25, (tuned, choice)


def test_tune_beyond_the_host_says_host_bound_and_recommends_nothing(tmp_path, emulation):
    # The guard's bad case (`harness tune --emulate 40000,20000` on this host): rates eight and
    # four times what this host computes. Nothing is presented as the emulated devices' performance.
    fast, slow = round(8 * emulation.sustained), round(4 * emulation.sustained)
    done = run_harness(["tune", "--emulate", f"{fast},{slow}", "--max-batch", "256", "--max-step-s", "0.2",
                        "--seconds", "0.3", "--windows", "1", "--no-even"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recommended:" not in done.stdout and "not a recommendation for the emulated devices" in done.stdout
    assert "HOST-BOUND: /device:CPU:0, /device:CPU:1 ran at this host's speed" in done.stdout
    record = json.loads(next(tmp_path.glob("tune-*.json")).read_text())
    # the ratio split is verified beside the tuned one where it differs: host-bound there too
    phases = ["profile", "verify tuned"] + (["verify ratio"] if record["result"]["verify"]["ratio"].get(
        "host_bound") and record["result"]["verify"]["ratio"]["batches"] != record["result"]["verify"]["tuned"][
        "batches"] else [])
    warnings = [line for line in done.stderr.splitlines() if line.startswith("harness tune: warning:")]
    assert [w.split(":")[2].strip() for w in warnings] == phases, done.stderr[-3000:]
    assert f"/device:CPU:0 emulates {fast} samples/s but this host computes its slices at" in warnings[0]
    bound = record["result"]["host_bound"]
    assert {(b["phase"], b["device"]) for b in bound} == {(phase, device) for phase in phases
                                                          for device in ("/device:CPU:0", "/device:CPU:1")}
    assert record["result"]["verify"]["tuned"]["host_bound"]


def test_device_out_of_memory_at_batch_one_is_a_clear_error(tmp_path):
    done = run_harness(["tune", "--emulate", "4000:200,2000:0", "--seconds", "0.2", "--windows", "1"], tmp_path)
    assert done.returncode == 2
    assert "runs out of memory at batch 1" in done.stderr and "/device:CPU:1" in done.stderr
    record = json.loads(next(tmp_path.glob("tune-*.json")).read_text())
    assert record["status"] == "failed" and "batch 1" in record["error"]


def test_global_batch_beyond_the_measured_ceilings_is_a_clear_error():
    code = """
import harness
from harness.emulate import parse_emulate
devices = harness.use_logical_devices(2, inter_op_threads=4)
try:
    harness.tune(devices=devices, emulate=parse_emulate("9000:100,9000:100"), global_batch=250)
except ValueError as err:
    print("ERROR", err)
"""
    out = run_python(code)
    assert "ERROR --global-batch 250 does not fit: the devices hold" in out


def test_tune_needs_devices():
    import harness

    with pytest.raises(ValueError, match="at least one device; got none"):
        harness.tune(devices=[])
