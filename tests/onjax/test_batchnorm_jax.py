"""BatchNormalization with whole-batch statistics over uneven shards on 3 JAX CPU devices (harness.parallel.jax).

Each test runs tests/onjax/batchnorm_cases.py in a JAX process (TensorFlow's import blocked): one device and the split
from the same weights on the same batches, in float32 and in float64. In float64 the split is the single-device
step: its weights and moving statistics within 1e-12 (a mean of means, a lost gradient through the statistics, a
cancelling sum of squares land far beyond). In float32 it is within the tolerance harness calls exact, 1e-6, or for
the models that amplify rounding (features far from 0) as accurate: those cases are judged against the floor of one
device by compare_training in test_onjax.py (cnn_bn, dense_bn, nested_bn, the zoo's BatchNormalization models).
23 samples at batch 10: at 7:2:1 a device holds one row, and the last batch of 3 leaves a device with none.
"""

from __future__ import annotations

import pytest
from jax_process import ROOT, run_jax_script  # tests/onjax/jax_process.py

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

CASES = ROOT / "tests" / "onjax" / "batchnorm_cases.py"
FLOAT64 = 1e-12  # float64 rounding, amplified by a few steps of training (measured at most 3.3e-14: raw_features)
QUICK = ("tests/onjax/test_batchnorm_jax.py::"  # the quick loop's case, which the extended tests' claims name
         "test_a_shared_batchnorm_in_a_nested_model_equals_one_device_with_a_one_row_shard")


def _rows(*args: str) -> list[dict]:
    *rows, env = run_jax_script(CASES, *args, timeout=900)
    assert not env["tensorflow_imported"] and len(env["devices"]) == 3, env
    return rows


def _exact(row: dict, float32: float = 1e-6) -> None:
    assert row["float64_dtype"] == "float64", row  # a float64 run that was one (Keras' promotion kept float64)
    assert row["float64"] <= FLOAT64 and (row["float64_moving"] or 0) <= FLOAT64, row
    assert row["float32"] <= float32, row


def test_a_shared_batchnorm_in_a_nested_model_equals_one_device_with_a_one_row_shard():
    # The quick loop's case: the BatchNormalization of a nested model called twice a step, at 7:2:1, 3 steps (a
    # last batch of 3 rows: a device with none).
    (row,) = _rows("nested", "--ratios", "7:2:1", "--epochs", "1")
    _exact(row)


@pytest.mark.extended  # ~2 min; the quick test above, the cut, the combination and its backward pass
@pytest.mark.slow  # 140 s in .ci/run: slow.yml
@pytest.mark.covered_by(QUICK)
def test_every_batchnorm_form_equals_one_device_at_uneven_splits():
    # At 7:2:1, the split with a one-row shard (5:3:2: the pinned cases of test_onjax.py and the JAX zoo).
    rows = _rows("resnet_block", "channels_first", "masked", "frozen_base", "renorm", "--ratios", "7:2:1")
    for row in rows:
        _exact(row, float32=2e-6)  # measured: at most 1.1e-6 (resnet_block, SGD 0.1 with momentum, 6 steps)
    frozen = [row for row in rows if row["case"] == "frozen_base"]
    assert all(row["float32_moving"] == 0.0 for row in frozen), frozen  # inference mode: its statistics untouched


@pytest.mark.extended  # ~1 min; the quick test above runs the correct combination
@pytest.mark.covered_by(QUICK)
@pytest.mark.parametrize("plant", ["mean-of-means", "no-statistics-gradient"])
def test_a_mean_of_means_or_a_lost_statistics_gradient_is_far_from_one_device(plant):
    (row,) = _rows("nested", "--ratios", "7:2:1", "--plant", plant, "--precisions", "float64")
    assert row["float64"] > 1e-2, row  # measured: 2.4e1 and 2.9 (float32: 1.6e2 and 0.82)


@pytest.mark.extended  # ~1 min
def test_features_far_from_zero_need_the_parallel_variance_not_a_sum_of_squares():
    # Features at mean 1000, spread 1 (prices, timestamps) into a first BatchNormalization layer: the parallel
    # (Chan et al.) combination is exact in float64; E[x^2] - E[x]^2 cancels (float64: 1.0e-10; float32: NaN).
    (right,) = _rows("raw_features", "--ratios", "7:2:1")
    assert right["float64"] <= FLOAT64, right
    (wrong,) = _rows("raw_features", "--ratios", "7:2:1", "--plant", "sum-of-squares")
    assert not wrong["float64"] <= 1e-11 and not wrong["float32"] <= 1e-3, wrong  # NaN fails both
