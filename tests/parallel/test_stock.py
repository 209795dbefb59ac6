"""The stock baseline beside harness: Keras fit under a stock MirroredStrategy, run and checked (issue 16).

``harness check --methods keras`` reports how far stock training lands from
one device and never fails for it (it is the baseline); ``harness run
--method keras`` runs it on emulated devices as well (``harness.bench.stock``).
"""

import json

import pytest
from tf_process import run_harness


def test_check_reports_the_stock_baseline_without_failing_for_it(tmp_path):
    done = run_harness(["check", "--methods", "keras", "mirrored", "--models", "dense", "cnn_bn", "--logical-cpus", "2",
                        "--ratios", "1", "1", "--samples", "60", "--time-steps", "0", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["model"], r["method"]): r for r in json.loads(done.stdout)["equivalence"]}
    assert rows[("dense", "mirrored")]["exact"] and rows[("cnn_bn", "mirrored")]["exact"]
    # Stock BatchNormalization normalises each replica's half with its own statistics: not the one-device step.
    stock = rows[("cnn_bn", "keras")]
    assert stock["baseline"] and not stock["exact"] and stock["max_deviation"] > 1e-4
    assert stock["passed"]  # reported, not failed


def test_the_stock_split_must_be_even():
    from harness.bench.stock import keras

    with pytest.raises(ValueError, match=r"splits every batch evenly; got ratios=\[3, 2\]"):
        keras(None, ["/device:CPU:0", "/device:CPU:1"], [3, 2])
