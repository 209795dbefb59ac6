"""Exact ratio-split across workers: loopback clusters of 2 and 3 worker processes (``harness launch``).

Each worker runs tests/parallel/multiworker_worker.py: the same model and global batches,
``parallelize(model, harness.use_cluster(), ratios)``; the chief also trains on one device and
reports the largest weight deviation. Uneven splits over workers with different device counts
(1+2, 2+1+1: towers inside a worker), partial last batches (one smaller than the device count
too), BatchNormalization and sample weights, optimizer options (clipping, accumulation, EMA) and
sparse gradients, Keras 3 and Keras 2; and a worker killed mid-training.
"""

import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tf_zygote import ENV, python

from harness.launch import launch

WORKER = Path(__file__).with_name("multiworker_worker.py")


def _cluster_run(workers: int, *args: str, devices=None, keep_going: bool = False, timeout_s: float = 420.0):
    out, err = io.StringIO(), io.StringIO()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    start = time.monotonic()
    result = launch([sys.executable, str(WORKER), *args], workers, env=env, out=out, err=err, timeout_s=timeout_s,
                    grace_s=2.0, stop_on_failure=not keep_going, devices_per_worker=devices)
    seconds = time.monotonic() - start
    reports = {}
    for line in out.getvalue().splitlines():
        prefix, _, text = line.partition("] ")
        if text.startswith("RESULT "):
            reports[int(prefix.split()[1])] = json.loads(text[len("RESULT "):])
    return result, reports, out.getvalue() + err.getvalue(), seconds


_HERE = "tests/parallel/test_multiworker.py::"
_CLUSTER = f"{_HERE}test_a_cluster_step_equals_the_single_device_step"


@pytest.mark.parametrize("workers, devices, args", [
    (2, None, ["dense", "3:1", "62", "20", "--save", "{tmp}"]),  # last batch 2: one row per worker
    # last batch 1: empty devices. Extended: the quick loop's 1+2 cluster with an empty device is
    # test_harness_check_under_harness_launch_checks_across_workers (cnn_bn), its sample weights 2w-keras2-bn.
    pytest.param(2, [1, 2], ["bn", "1:2:3", "61", "20", "--sample-weight", "--activity"], marks=[
        pytest.mark.extended, pytest.mark.covered_by(
            f"{_HERE}test_harness_check_under_harness_launch_checks_across_workers",
            f"{_CLUSTER}[2w-keras2-bn-1:2-weights]")]),
    pytest.param(3, [2, 1, 1], ["bn", "5:3:2:1", "45", "16"], marks=pytest.mark.extended),  # last batch 13
    # Keras 2 (marked keras2: the test asks for the keras2 fixture by name): its SyncBN drifted (0.0094)
    pytest.param(2, None, ["bn", "1:2", "61", "20", "--sample-weight", "--keras2"], marks=pytest.mark.keras2),
    pytest.param(2, [2, 1], ["dense", "2:1:3", "61", "20", "--keras2"],
                 marks=[pytest.mark.extended, pytest.mark.keras2]),
    # The split tuned while it trains. Extended: quick, test_run_workers.py's re-split of every worker alike.
    pytest.param(2, None, ["dense", "auto", "600", "30", "--emulate", "400,200"], marks=[
        pytest.mark.extended, pytest.mark.covered_by(
            "tests/unit/test_run_workers.py::test_rebalance_across_workers_re_splits_every_worker_alike")]),
    # Optimizer options clip, accumulate and average the whole cluster's gradient, as one device does.
    pytest.param(2, [1, 2], ["dense", "1:2:3", "61", "20", "--optimizer", "Adam(0.05, global_clipnorm=0.05)"],
                 marks=pytest.mark.extended),
    # Extended: quick, the options over one process's devices (test_optimizer_options.py's own optimizer: clipnorm,
    # accumulation, EMA) and 2w-dense-3:1's cluster.
    pytest.param(2, None, ["dense", "3:1", "62", "20", "--optimizer", "SGD(0.1, clipvalue=0.01, use_ema=True, "
                           "ema_overwrite_frequency=3, gradient_accumulation_steps=2)"], marks=[
        pytest.mark.extended, pytest.mark.covered_by(
            "tests/parallel/test_optimizer_options.py::test_the_users_own_optimizer_object_steps_the_mirrored_model"
            "[own-optimizer]", f"{_CLUSTER}[2w-dense-3:1]")]),
    pytest.param(2, [2, 1], ["tokens", "1:2:3", "61", "20", "--optimizer", "Adam(0.05, clipnorm=0.01)"],
                 marks=pytest.mark.extended),  # sparse rows
    # Keras 2's sparse rows across workers: extended; the quick loop keeps Keras 2's cluster (bn above) and its
    # sparse rows in one process (tests/parallel/test_sparse.py).
    pytest.param(2, [2, 1], ["tokens", "1:2:3", "61", "20", "--optimizer", "Adam(0.05, clipnorm=0.01)", "--keras2"],
                 marks=[pytest.mark.extended, pytest.mark.keras2, pytest.mark.covered_by(
                     f"{_CLUSTER}[2w-keras2-bn-1:2-weights]",
                     "tests/parallel/test_sparse.py::test_lookups_of_every_shape_under_adam[keras2-broadcast-towers-2]",
                     "tests/parallel/test_sparse.py::test_lookups_of_every_shape_under_adam[keras2-broadcast-mirrored-2]")]),
], ids=["2w-dense-3:1", "2w-1+2-bn-1:2:3-weights", "3w-2+1+1-bn-5:3:2:1", "2w-keras2-bn-1:2-weights",
        "2w-2+1-keras2-dense-2:1:3", "2w-auto-emulated-400,200", "2w-1+2-global-clipnorm", "2w-clip-ema-accumulation",
        "2w-2+1-tokens-clipnorm", "2w-2+1-keras2-tokens-clipnorm"])
def test_a_cluster_step_equals_the_single_device_step(workers, devices, args, tmp_path, logical_devices, request):
    if "--keras2" in args:
        request.getfixturevalue("keras2")  # tf_keras, or TF 2.15's keras; skips, saying so, where there is neither
    elif "gradient_accumulation_steps" in " ".join(args):  # a Keras 3 optimizer option (not in TF 2.15's Keras 2)
        request.getfixturevalue("keras3")
    args = [a.format(tmp=tmp_path) for a in args]
    result, reports, output, _ = _cluster_run(workers, *args, devices=devices)
    assert result.status == 0, output[-6000:]
    assert sorted(reports) == list(range(workers)), output[-6000:]
    chief = reports[0]
    counts = devices or [1] * workers
    assert [sum(f"task:{w}/" in d for d in chief["devices"]) for w in range(workers)] == counts
    for w, report in reports.items():
        assert len(report["local_devices"]) == counts[w] and all(f"task:{w}/" in d for d in report["local_devices"])
    assert chief["deviation"] <= 1e-6, chief
    # The epoch's loss, a mean of the steps' losses summed in another order: rel 1.33e-06 once (TF 2.15's Keras 2,
    # bn 1:2 with sample weights, on an AMD EPYC host; weights within 1e-6), so 3e-6; a drift is orders above.
    assert chief["loss"] == pytest.approx(chief["single_loss"], rel=3e-6, abs=1e-7)
    assert chief["evaluate"] == pytest.approx(chief["single_evaluate"], rel=1e-6)
    assert chief["predict_deviation"] <= 1e-5
    for report in reports.values():  # every worker reports the whole batch's loss and metrics
        assert report["loss"] == chief["loss"] and report["evaluate"] == chief["evaluate"]
    if "auto" in args:  # every worker re-split alike, towards the emulated rates 400:200 (slow: a busy host keeps up)
        assert chief["resplits"] and reports[1]["ratios"] == chief["ratios"], reports
        assert 1.5 < chief["ratios"][0] / chief["ratios"][1] < 2.7, chief["ratios"]
    if "--save" in args:  # every worker called save(): the chief alone wrote the plain model
        import keras

        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.keras"]
        assert reports[1]["written"] == [] and ["open", "model.keras"] in chief["written"], reports
        saved = keras.saving.load_model(tmp_path / "model.keras")
        assert type(saved) is keras.Sequential and len(saved.get_weights()) == 4


def test_a_worker_killed_mid_training_ends_the_others_with_an_error_naming_it():
    result, reports, output, seconds = _cluster_run(2, "dense", "1:1", "400", "20", "--epochs", "1",
                                                    "--die-at-step", "3", keep_going=True)
    assert (result.status, result.first_failure) == (137, 1), output[-4000:]
    assert result.statuses[0] not in (None, 0)  # worker 0 ended on its own, with an error
    assert reports == {}
    assert "[worker 0] harness.errors.Failed: worker 0 lost worker 1 (127.0.0.1:" in output, output[-4000:]
    assert "harness launch: worker 1 was killed by SIGKILL (status 137) first" in output
    assert seconds < 60  # the bound; 8.7 s measured idle


def test_harness_check_under_harness_launch_checks_across_workers():
    import subprocess

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    done = subprocess.run([sys.executable, "-m", "harness", "launch", "--workers", "2", "--devices-per-worker", "1",
                           "2", "--timeout", "400", "--", sys.executable, "-m", "harness", "check", "--ratios", "3",
                           "2", "1", "--models", "dense", "cnn_bn"], env=env, capture_output=True, text=True,
                          timeout=450)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "[worker 0] 2 workers, devices per worker [1, 2], ratios [3.0, 2.0, 1.0]: batch 20 -> [10, 7, 3], " \
           "last batch 2" in lines
    # The last batch of 2 leaves worker 1's second device empty: the CNN's borrowed row keeps it exact.
    assert any(line.startswith("[worker 0] cnn_bn     mirrored") and line.endswith(" ok") for line in lines), lines
    assert "[worker 0] 2 of 2 checks within tol 1e-06 across 2 workers" in lines
    assert not any(line.startswith("[worker 1] model") for line in lines)  # only the chief prints the table


def test_harness_check_workers_launches_its_own_workers(capsys):
    import subprocess

    from harness.cli import main

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    done = subprocess.run([sys.executable, "-m", "harness", "check", "--workers", "2", "--devices-per-worker", "2", "1",
                           "--models", "dense"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "[worker 0] 2 workers, devices per worker [2, 1], ratios [3.0, 2.0, 1.0]: batch 20 -> [10, 7, 3], " \
           "last batch 2" in done.stdout.splitlines()
    assert "[worker 0] 1 of 1 checks within tol 1e-06 across 2 workers" in done.stdout.splitlines()
    assert main(["check", "--devices-per-worker", "2"]) == 2
    assert "--devices-per-worker needs --workers N" in capsys.readouterr().err


def test_use_cluster_without_tf_config_says_how_to_start_workers():
    env = {k: v for k, v in ENV.items() if k != "TF_CONFIG"}  # forked from the test process' TensorFlow zygote
    done = python(["-c", "import harness; harness.use_cluster()"], env=env, timeout=120)
    assert done.returncode != 0
    assert ("harness.errors.InvalidValue: TF_CONFIG is not set: start the workers with `harness launch --workers N -- "
            "...`") in done.stderr


def test_what_is_not_exact_across_workers_yet_is_refused_by_name(logical_devices, keras3, keras2):
    import harness
    from harness.cluster import Cluster

    task = "/job:worker/replica:0/task:{}/device:CPU:{}"
    one_each = Cluster(index=0, workers=2, local_devices=(task.format(0, 0),),
                       devices=(task.format(0, 0), task.format(1, 0)), strategy=None)  # refused before it is used
    one_and_two = Cluster(index=0, workers=2, local_devices=(task.format(0, 0),),
                          devices=(task.format(0, 0), task.format(1, 0), task.format(1, 1)), strategy=None,
                          devices_per_worker=(1, 2))
    model = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(4), keras3.layers.BatchNormalization()])
    with pytest.raises(ValueError, match="method must be 'mirrored'; got method='towers'"):
        harness.parallelize(model, one_each, ratios=[1, 2], method="towers")
    with pytest.raises(ValueError, match=r"emulate needs one EmulatedDevice .* got 1 for 2 devices"):
        harness.parallelize(model, one_each, ratios=[1, 2], emulate="1000")
    with pytest.raises(ValueError, match=r"ratios has 2 entries but there are 3 devices|3"):
        harness.parallelize(model, one_and_two, ratios=[1, 2])

    class Subclassed(keras3.Model):
        def __init__(self):
            super().__init__()
            self.dense, self.bn = keras3.layers.Dense(4), keras3.layers.BatchNormalization()

        def call(self, x, training=None):
            return self.bn(self.dense(x), training=training)

    subclassed = Subclassed()
    subclassed(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"\[1, 2\] devices per worker.*subclassed Subclassed.*Give each worker one"):
        harness.parallelize(subclassed, one_and_two, ratios=[1, 2, 3])

    class Subclassed2(keras2.Model):
        def __init__(self):
            super().__init__()
            self.dense, self.bn = keras2.layers.Dense(4), keras2.layers.BatchNormalization()

        def call(self, x, training=None):
            return self.bn(self.dense(x), training=training)

    subclassed2 = Subclassed2()
    subclassed2(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"Keras 2 model needs a Functional or Sequential model.*Use a Keras 3"):
        harness.parallelize(subclassed2, one_each, ratios=[1, 2])


def test_a_bad_device_count_for_a_worker_is_named(monkeypatch):
    from harness.parallel.multiworker import _device_count

    monkeypatch.setenv("HARNESS_WORKER_DEVICES", "two")
    with pytest.raises(ValueError, match="HARNESS_WORKER_DEVICES must be an int >= 1; got "
                                         "HARNESS_WORKER_DEVICES='two'"):
        _device_count(None)
    monkeypatch.setenv("HARNESS_WORKER_DEVICES", "0")
    with pytest.raises(ValueError, match="HARNESS_WORKER_DEVICES must be an int >= 1"):
        _device_count(None)
    with pytest.raises(ValueError, match="devices must be an int >= 1 .this worker's device count.; got devices=True"):
        _device_count(True)
    monkeypatch.setenv("HARNESS_WORKER_DEVICES", "3")
    assert (_device_count(None), _device_count(2)) == (3, 2)
    monkeypatch.delenv("HARNESS_WORKER_DEVICES")
    assert _device_count(None) is None  # every GPU, or one CPU
