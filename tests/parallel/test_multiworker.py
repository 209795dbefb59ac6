"""Exact ratio-split across workers: loopback clusters of 2 and 3 worker processes (``harness launch``).

Each worker runs tests/parallel/multiworker_worker.py: the same model and global batches,
``parallelize(model, harness.use_cluster(), ratios)``; the chief also trains on one device and
reports the largest weight deviation. Uneven splits, partial last batches (one smaller than the
replica count too), BatchNormalization and sample weights; and a worker killed mid-training.
"""

import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from harness.launch import launch

WORKER = Path(__file__).with_name("multiworker_worker.py")


def _cluster_run(workers: int, *args: str, keep_going: bool = False, timeout_s: float = 420.0):
    out, err = io.StringIO(), io.StringIO()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    start = time.monotonic()
    result = launch([sys.executable, str(WORKER), *args], workers, env=env, out=out, err=err, timeout_s=timeout_s,
                    grace_s=2.0, stop_on_failure=not keep_going)
    seconds = time.monotonic() - start
    reports = {}
    for line in out.getvalue().splitlines():
        prefix, _, text = line.partition("] ")
        if text.startswith("RESULT "):
            reports[int(prefix.split()[1])] = json.loads(text[len("RESULT "):])
    return result, reports, out.getvalue() + err.getvalue(), seconds


@pytest.mark.parametrize("workers, args", [
    (2, ["dense", "3:1", "62", "20"]),  # last batch 2: one row per worker
    (2, ["bn", "1:2", "61", "20", "--sample-weight"]),  # last batch 1: fewer rows than replicas
    (3, ["bn", "5:3:2", "45", "16"]),  # last batch 13
    (2, ["dense", "1:2", "61", "20", "--sample-weight", "--keras2"]),  # a Keras 2 (tf_keras) model
], ids=["2w-dense-3:1", "2w-bn-1:2-weights", "3w-bn-5:3:2", "2w-keras2-dense-1:2-weights"])
def test_a_cluster_step_equals_the_single_device_step(workers, args):
    if "--keras2" in args:
        pytest.importorskip("tf_keras", reason="no Keras 2 (tf_keras) here")
    result, reports, output, _ = _cluster_run(workers, *args)
    assert result.status == 0, output[-6000:]
    assert sorted(reports) == list(range(workers)), output[-6000:]
    chief = reports[0]
    assert len(chief["devices"]) == workers and all(f"task:{i}/" in d for i, d in enumerate(chief["devices"]))
    assert chief["deviation"] <= 1e-6, chief
    assert chief["loss"] == pytest.approx(chief["single_loss"], rel=1e-6, abs=1e-7)
    assert chief["evaluate"] == pytest.approx(chief["single_evaluate"], rel=1e-6)
    assert chief["predict_deviation"] <= 1e-5
    for report in reports.values():  # every worker reports the whole batch's loss and metrics
        assert report["loss"] == chief["loss"] and report["evaluate"] == chief["evaluate"]


def test_a_worker_killed_mid_training_ends_the_others_with_an_error_naming_it():
    result, reports, output, seconds = _cluster_run(2, "dense", "1:1", "400", "20", "--epochs", "1",
                                                    "--die-at-step", "3", keep_going=True)
    assert (result.status, result.first_failure) == (137, 1), output[-4000:]
    assert result.statuses[0] not in (None, 0)  # worker 0 ended on its own, with an error
    assert reports == {}
    assert "[worker 0] RuntimeError: worker 0 lost worker 1 (127.0.0.1:" in output, output[-4000:]
    assert "harness launch: worker 1 was killed by SIGKILL (status 137) first" in output
    assert seconds < 120


def test_use_cluster_without_tf_config_says_how_to_start_workers():
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([sys.executable, "-c", "import harness; harness.use_cluster()"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ValueError: TF_CONFIG is not set: start the workers with `harness launch --workers N -- ...`" in done.stderr


def test_what_is_not_exact_across_workers_yet_is_refused_by_name(logical_devices, keras2):
    import harness
    from harness.cluster import Cluster

    task = "/job:worker/replica:0/task:{}/device:CPU:0"
    cluster = Cluster(index=0, workers=2, local_devices=(task.format(0),), devices=(task.format(0), task.format(1)),
                      strategy=None)  # refused before the strategy is used
    layers = keras2.layers
    model = keras2.Sequential([keras2.Input((3,)), layers.Dense(4), layers.BatchNormalization(name="bn1")])
    with pytest.raises(NotImplementedError, match=r"Keras 2 \(tf_keras\) BatchNormalization layers \['bn1'\]"):
        harness.parallelize(model, cluster, ratios=[1, 2])
    with pytest.raises(ValueError, match="method must be 'mirrored'; got method='towers'"):
        harness.parallelize(model, cluster, ratios=[1, 2], method="towers")
