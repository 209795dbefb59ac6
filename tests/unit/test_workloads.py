"""The workload registry and its synthetic data: names, errors, determinism, learnable labels. No TensorFlow."""

import subprocess
import sys

import numpy as np
import pytest

from harness.bench import workloads
from harness.bench.workloads import Labels
from harness.bench.workloads.pipeline import InputRate, default_pool_size, is_starved

SEEDED = ("mnist_maxing", "gru_stack", "wide_mlp", "resnet50")
NAMES = (*SEEDED, "mlp_head10", "mlp_head8192", "tagger1024")


def _classes(workload, y):
    """Integer class of each label, whatever the encoding."""
    if workload.labels is Labels.ONE_HOT:
        assert np.all(y.sum(axis=1) == 1)
        return np.argmax(y, axis=1)
    if workload.labels is Labels.BINARY:
        return y[:, 0].astype(int)
    return y


def test_names_are_the_seed_workloads_in_seed_order_then_the_overhead_models():
    # source: the seed document (docs/background.md) a workload comes from; "" for harness' own
    assert workloads.names() == NAMES
    assert [workloads.get(n).source for n in NAMES] == ["000", "001", "002", "004", "", "", ""]


def test_names_and_shapes_import_no_tensorflow():
    # The CLI builds its argparse choices from names(), and `harness --help` must not load TensorFlow.
    code = (
        "import sys\n"
        "from harness.bench import workloads\n"
        "workloads.names(); w = workloads.get('resnet50'); w.input_shape('full'); w.sample_bytes('tiny')\n"
        "workloads.get('wide_mlp').make_data('tiny', 4)\n"
        "import harness.bench.workloads.pipeline\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False False"


def test_get_unknown_names_the_choices():
    with pytest.raises(ValueError) as err:
        workloads.get("x")
    assert str(err.value) == ("unknown workload 'x'; choose from mnist_maxing, gru_stack, wide_mlp, resnet50, "
                              "mlp_head10, mlp_head8192, tagger1024")
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.get(None)


@pytest.mark.parametrize("bad", ["huge", "", "Tiny", None])
def test_check_size_names_bad_and_allowed(bad):
    with pytest.raises(ValueError) as err:
        workloads.check_size(bad)
    assert repr(bad) in str(err.value) and "full, tiny" in str(err.value)


def test_check_size_returns_size():
    assert [workloads.check_size(s) for s in workloads.SIZES] == ["full", "tiny"]


def test_bad_size_is_rejected_everywhere():
    w = workloads.get("wide_mlp")
    for call in (lambda: w.make_data("big", 4), lambda: w.input_shape("big"), lambda: w.build("big")):
        with pytest.raises(ValueError, match="unknown size 'big'"):
            call()


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_make_data_rejects_bad_samples(bad):
    with pytest.raises(ValueError, match=f"samples must be a positive integer; got samples={bad!r}"):
        workloads.get("mnist_maxing").make_data("tiny", bad)


@pytest.mark.parametrize("bad", [-1, 1.0, "0"])
def test_make_data_rejects_bad_seed(bad):
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        workloads.get("gru_stack").make_data("tiny", 4, seed=bad)


@pytest.mark.parametrize("name", NAMES)
def test_make_data_is_deterministic_and_seeded(name):
    w = workloads.get(name)
    x1, y1 = w.make_data("tiny", 64, seed=3)
    x2, y2 = w.make_data("tiny", 64, seed=3)
    x3, y3 = w.make_data("tiny", 64, seed=4)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x3)
    assert not np.array_equal(y1, y3)


@pytest.mark.parametrize("name", NAMES)
def test_make_data_shapes_dtypes_and_labels(name):
    w = workloads.get(name)
    x, y = w.make_data("tiny", 256, seed=0)
    assert x.dtype == np.float32 and x.shape == (256, *w.input_shape("tiny"))
    assert y.shape == (256, *w.label_shape("tiny"))
    assert y.dtype == (np.int32 if w.labels is Labels.SPARSE else np.float32)
    assert np.all(np.isfinite(x))
    classes = _classes(w, y)
    n_classes = 2 if w.labels is Labels.BINARY else w.output_shape("tiny")[-1]
    assert classes.min() >= 0 and classes.max() < n_classes
    assert len(np.unique(classes)) > 1
    assert w.sample_bytes("tiny") == (x.nbytes + y.nbytes) // 256


def test_data_of_full_sizes_has_the_seed_shapes():
    expected = {
        "mnist_maxing": ((28, 28, 1), (10,)),
        "gru_stack": ((49, 128), (128,)),
        "wide_mlp": ((8000,), (1,)),
        "resnet50": ((224, 224, 3), ()),
    }
    for name, (x_shape, y_shape) in expected.items():
        w = workloads.get(name)
        x, y = w.make_data("full", 2, seed=0)
        assert x.shape[1:] == x_shape == w.input_shape("full")
        assert y.shape[1:] == y_shape == w.label_shape("full")


def test_two_seeds_draw_the_same_task():
    # Labels mean the same thing under every seed: a validation set agrees with a training set.
    w = workloads.get("wide_mlp")
    x, y = w.make_data("tiny", 2000, seed=0)
    xv, yv = w.make_data("tiny", 2000, seed=1)
    normal, *_ = np.linalg.lstsq(x - 0.5, y[:, 0] - 0.5, rcond=None)  # fit the hyperplane on seed 0
    agree = np.mean(((xv - 0.5) @ normal > 0) == (yv[:, 0] > 0.5))
    assert agree > 0.8


def test_default_pool_is_a_few_batches_capped_in_bytes():
    resnet = workloads.get("resnet50")
    assert default_pool_size(workloads.get("mnist_maxing"), "tiny", 256) == 1024
    assert default_pool_size(resnet, "full", 256) == 445  # 256 MiB of 224x224x3 float32
    assert default_pool_size(resnet, "full", 1024) == 1024  # at least one batch


def test_is_starved_compares_with_margin():
    assert is_starved(100.0, 100.0)
    assert is_starved(input_sps=109.0, train_sps=100.0)
    assert not is_starved(input_sps=111.0, train_sps=100.0)
    assert not is_starved(100.0, 100.0, margin=1.0)


@pytest.mark.parametrize(
    "args, name", [((0.0, 1.0), "input_sps"), ((1.0, -2.0), "train_sps"), ((1.0, 1.0, 0), "margin")]
)
def test_is_starved_rejects_non_positive(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive finite number; got {name}="):
        is_starved(*args)


def test_is_starved_rejects_nan():
    with pytest.raises(ValueError, match="input_sps=nan"):
        is_starved(float("nan"), 1.0)


def test_input_rate_batches_per_second():
    assert InputRate(samples_per_second=512.0, batches=4, seconds=2.0).batches_per_second == 2.0
