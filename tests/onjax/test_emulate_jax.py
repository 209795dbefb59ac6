"""Emulated devices on Keras 3's JAX backend (``harness.emulation``'s host-side waits, ``harness.parallel.jax``):
harness' towers and Keras' DataParallel charged alike, the rebalancer and the tuner on them.

Each test runs in a JAX process (tests/onjax/jax_process.py: TensorFlow blocked). An emulated figure is valid only
while this host computes each slice faster than its emulated device: the rates here are a few hundred samples/s of
``mlp_head10`` (a step's real work, dispatch and the merge device's programs included, took ~12 ms for 80 rows on this
2-core host beside a test run; a 250 samples/s device's 45 rows are 180 ms: room for a host three times slower still,
as beside two CPU hogs), and every run must say it was not host-bound. Their assertions hold an emulated step to its
bound, which no host speed can beat: a step of devices that each take ``rows / rate`` seconds cannot end sooner than
its slowest device.
"""

from __future__ import annotations

import json

import pytest
from jax_process import run_jax  # tests/onjax/jax_process.py

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

FAST = ["--model", "mlp_head10", "--seconds", "0.5", "--windows", "2", "--warmup-steps", "2", "--no-save", "--json"]

# harness ARGS for each of RUNS, then each again with a planted defect of the emulation: each step waits only for its
# fastest device's emulated end (as if the devices' waits were not all kept), so a split step beats its slowest device.
_RUNS_AND_PLANTED = """
import contextlib, io, json
from harness.cli import main
from harness.emulation import HostEmulator

def run(args):
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        status = main(args)
    return status, json.loads(said.getvalue())

runs = [run(args) for args in RUNS]
honest = HostEmulator.wait_steps

def fastest_only(self, started, slices):
    first = min(slices, key=lambda s: self._deadline(s[0], started, s[1]))
    honest(self, started, [first])

HostEmulator.wait_steps = fastest_only
runs += [run(args) for args in RUNS]
print(json.dumps(runs))
"""


def _bound(batches: list[int], rates: list[float]) -> float:
    """The most samples/s a step of ``batches`` on devices of ``rates`` can reach: the slowest device sets it."""
    return sum(batches) / max(b / r for b, r in zip(batches, rates))


def test_an_emulated_step_ends_with_its_slowest_device_and_a_planted_early_end_fails():
    # harness' towers at 3:1 on devices of 250 and 125 samples/s (180 and 120 ms a step: the slower device sets it);
    # the stock row, Keras' DataParallel, in even shards (120 and 240 ms), charged alike
    rates = [250.0, 125.0]
    common = ["run", "--backend", "jax", "--emulate", "250,125", "--batch", "60", *FAST]
    runs = [[*common, "--method", "towers", "--ratios", "3", "1"], [*common, "--method", "keras"]]
    done = run_jax(f"RUNS = {runs!r}\n" + _RUNS_AND_PLANTED, devices=2, timeout=240)
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert [status for status, _ in outcomes] == [0] * 4, done.stderr[-4000:]
    (_, towers), (_, keras), (_, towers_planted), (_, keras_planted) = outcomes
    assert towers["config"]["run"]["emulate"] == [{"rate": 250.0, "max_batch": None, "overhead_ms": 0.0},
                                                  {"rate": 125.0, "max_batch": None, "overhead_ms": 0.0}]
    for record, batches, planted in ((towers, [45, 15], towers_planted), (keras, [30, 30], keras_planted)):
        result = record["result"]
        assert result["config"]["batches"] == batches
        bound = _bound(batches, rates)  # towers 333, keras 250 samples/s
        assert result["summary"]["host_bound"] == [], result["summary"]
        for window in result["windows"]:
            assert window["samples_per_second"] <= bound * 1.01, (window, bound)
            assert window["samples_per_second"] >= bound * 0.5, (window, bound)  # the emulation, not the host
            for device, batch, rate in zip(window["devices"], batches, rates):
                assert device["source"] == "emulated" and device["emulated_rate"] == rate
                assert device["busy_rate"] == pytest.approx(rate, rel=0.01), device  # busy: rows / rate a step
                assert device["late_steps"] == 0 and device["rows_per_step"] == batch
        assert any(w["samples_per_second"] > bound * 1.05 for w in planted["result"]["windows"]), planted["result"]
    assert keras["result"]["stock"] == "keras.distribution.DataParallel, even shards"


# The waits are the host's: an emulated model trains to the same weights, bit for bit, as one that is not. And an
# emulated device's MAXBATCH is its memory: a slice beyond it ends a run as out of memory, naming the device.
def test_emulated_devices_change_a_steps_time_not_its_result_and_their_maxbatch_is_their_memory():
    oom = ["run", "--backend", "jax", "--emulate", "250:100,125:20", "--batch", "60", "--ratios", "1", "1", *FAST]
    done = run_jax(f"""
import contextlib, io, json
import numpy as np
import harness
from harness.bench import workloads
from harness.cli import main

workload = workloads.get("mlp_head10")
x, y = workload.make_data("tiny", 96, seed=0)
weights = []
for emulate in (None, "250,125"):
    template = workload.build("tiny", seed=0)
    model = harness.parallelize(template, ["cpu:0", "cpu:1"], ratios=[2, 1], emulate=emulate)
    model.compile(**workload.compile_args(template))
    model.fit(x, y, batch_size=48, epochs=1, verbose=0, shuffle=False)
    weights.append([np.asarray(w) for w in template.get_weights()])
    logged = model.emulator.busy_between(0, float("inf")) if model.emulator is not None else {{}}
said = io.StringIO()
with contextlib.redirect_stdout(said):
    status = main({oom!r})
print(json.dumps({{"equal": all(np.array_equal(a, b) for a, b in zip(*weights)),
                  "steps": {{d: b.steps for d, b in logged.items()}}, "oom": [status, json.loads(said.getvalue())]}}))
""", devices=2, timeout=240)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["equal"] and out["steps"] == {"cpu:0": 2, "cpu:1": 2}, out
    status, record = out["oom"]
    assert status == 1 and record["result"]["status"] == "oom", record["result"]
    assert record["result"]["error"] == ("emulated out of memory on cpu:1: batch slice of 30 samples exceeds its "
                                         "MAXBATCH 20")


# ratios="auto" (harness.Rebalance) on JAX: from an even start the split moves to the devices' measured speeds.
def test_rebalance_on_emulated_jax_devices_moves_the_split_to_their_speeds():
    done = run_jax(f"""
import contextlib, io, json
from harness.cli import main
said = io.StringIO()
with contextlib.redirect_stdout(said):
    status = main({["run", "--backend", "jax", "--emulate", "250,125", "--batch", "60", "--rebalance", "4",
                    *FAST[:2], "--seconds", "0.8", "--windows", "3", "--warmup-steps", "2", "--no-save",
                    "--json"]!r})
print(json.dumps([status, json.loads(said.getvalue())]))
""", devices=2, timeout=240)
    status, record = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 0, record
    result = record["result"]
    resplits = [e for e in result["rebalance"] if e["resplit"]]
    assert resplits, result["rebalance"]
    ratios = result["windows"][-1]["ratios"]
    assert [r / sum(ratios) for r in ratios] == pytest.approx([2 / 3, 1 / 3], abs=0.05), result["windows"][-1]
    assert result["windows"][-1]["devices"][0]["batch"] == pytest.approx(40, abs=3)


def _cli_json(args: list[str], timeout: float = 420) -> dict:
    """``harness ARGS --json`` in a JAX process of two devices; its record."""
    done = run_jax(f"""
import contextlib, io, json
from harness.cli import main
said = io.StringIO()
with contextlib.redirect_stdout(said):
    status = main({args!r})
print(json.dumps([status, json.loads(said.getvalue())]))
""", devices=2, timeout=timeout)
    status, record = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 0, record
    return record


@pytest.mark.extended  # ~25 s: seven rows
@pytest.mark.covered_by("tests/onjax/test_emulate_jax.py::"
                        "test_an_emulated_step_ends_with_its_slowest_device_and_a_planted_early_end_fails")
def test_compare_on_jax_tells_seed_000s_story_on_emulated_devices(tmp_path):
    # Seed 000's pair (a 1080 Ti at 1345 samples/s, a 1080 at 875) at a tenth of their rates, for mlp_head10 on this
    # host: the ratio split within 5% of the two devices' summed solo rates, and at least 1.15x the even split (the
    # seed's own gain: 1.17x); Keras' DataParallel on the even split, charged alike, beside it.
    record = _cli_json(["compare", "--backend", "jax", "--emulate", "134.5,87.5", "--batch", "40", "--model",
                        "mlp_head10", "--seconds", "0.8", "--windows", "2", "--warmup-steps", "2", "--no-save",
                        "--json", "--results-dir", str(tmp_path)])
    rows = {row["label"]: row for row in record["rows"]}
    assert list(rows) == ["cpu:0 alone", "cpu:1 alone", "cpu:0 whole", "cpu:0 keras", "even keras", "even towers",
                          "ratio towers"]
    assert record["config"]["device_kind"] == "emulated" and record["backend"] == "jax"
    rate = {label: row["summary"]["samples_per_second"]["median"] for label, row in rows.items()}
    assert all(not row["summary"]["host_bound"] for row in rows.values()), rows
    solo = rate["cpu:0 alone"] + rate["cpu:1 alone"]
    assert rate["ratio towers"] >= 0.95 * solo, rate
    assert rate["ratio towers"] >= 1.15 * rate["even towers"], rate
    assert rate["even keras"] == pytest.approx(rate["even towers"], rel=0.1), rate  # alike: both even, one bound
    assert rows["even keras"]["stock"] == "keras.distribution.DataParallel, even shards"
    assert all(d["source"] == "emulated" for d in rows["ratio towers"]["summary"]["devices"])


@pytest.mark.extended  # ~40 s: two devices profiled, four verification runs
@pytest.mark.covered_by("tests/onjax/test_emulate_jax.py::"
                        "test_rebalance_on_emulated_jax_devices_moves_the_split_to_their_speeds")
def test_tune_on_jax_picks_a_split_within_5_percent_of_the_emulated_ideal():
    # 1000 and 500 samples/s, memories of 600 and 300 rows: the ideal split of 300 is 200/100
    record = _cli_json(["tune", "--backend", "jax", "--model", "mlp_head10", "--emulate", "1000:600,500:300",
                        "--global-batch", "300", "--seconds", "0.3", "--windows", "2", "--no-save", "--json"])
    result = record["result"]
    assert result["config"]["backend"] == "jax" and result["host_bound"] == [], result["host_bound"]
    chosen = result["choice"]["batches"]
    assert abs(chosen[0] - 200) <= 0.05 * 200 and sum(chosen) == 300, result["choice"]
    verify = result["verify"]
    assert verify["keras"]["status"] == "complete" and verify["keras"]["batches"] == [150, 150]
    assert verify[verify["kept"]["split"]]["samples_per_second"] >= 1.15 * verify["even"]["samples_per_second"]
