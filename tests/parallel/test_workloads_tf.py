"""The seed workloads build, match their losses, learn from their data, and their pipelines feed (or starve).

Tiny sizes only, except parameter counts of the full models (building is cheap; running is not:
one training step of every full model is marked slow).
"""

import random
import statistics
import time

import numpy as np
import pytest

from harness.bench import workloads
from harness.bench.workloads.pipeline import is_starved, make_dataset, measure_input_rate

NAMES = workloads.names()

# Seed 002 (docs/background.md) states 41,157,101; keras.applications' ResNet50 at 1000 classes is 25,636,712.
FULL_PARAMS = {"mnist_maxing": 78_923_530, "gru_stack": 5_779_584, "wide_mlp": 41_157_101, "resnet50": 25_636_712}

# Steps of batch 64 for the loss to fall clearly: deep narrow stacks (tiny mnist_maxing, four GRU(16))
# pass little gradient at first, and wide_mlp keeps the seed's Adam at 1e-4.
LEARN_STEPS = {"mnist_maxing": 64, "gru_stack": 64, "wide_mlp": 96, "resnet50": 12, "mlp_head10": 12,
               "mlp_head8192": 12, "tagger1024": 12}


def _compiled(w, size="tiny", seed=0):
    model = w.build(size, seed=seed)
    model.compile(optimizer=w.optimizer(), loss=w.loss(), metrics=[w.accuracy()])
    return model


def test_wide_mlp_full_has_the_seed_parameter_count():
    # Seed 002: "Keras tells me that the model I defined above has 41,157,101 parameters".
    assert workloads.get("wide_mlp").build("full").count_params() == 41_157_101


@pytest.mark.parametrize("name", ["mnist_maxing", "gru_stack", "resnet50"])
def test_full_parameter_counts(name):
    model = workloads.get(name).build("full")
    assert model.count_params() == FULL_PARAMS[name]
    assert model.output_shape == (None, *workloads.get(name).output_shape("full"))


def test_full_models_end_in_logits():
    # Losses take from_logits=True, so no model may end in softmax/sigmoid (or the loss double-applies it).
    for name in NAMES:
        w = workloads.get(name)
        assert w.loss().get_config()["from_logits"] is True
        for size in workloads.SIZES:
            last = w.build(size).layers[-1]
            assert last.get_config().get("activation", "linear") == "linear", (name, size)


@pytest.mark.parametrize("name", [  # mlp_head8192 extended: quick, mlp_head10 (the same MLP, a 10-class head)
    pytest.param(n, marks=[pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_workloads_tf.py::test_tiny_trains_on_its_pipeline_and_learns[mlp_head10]")]
                 if n == "mlp_head8192" else []) for n in NAMES])
def test_tiny_trains_on_its_pipeline_and_learns(name):
    w = workloads.get(name)
    model = _compiled(w)
    assert model.output_shape == (None, *w.output_shape("tiny"))
    x, y = w.make_data("tiny", 8, seed=5)
    assert model.predict(x, verbose=0).shape == (8, *w.output_shape("tiny"))
    steps = LEARN_STEPS[name]
    dataset = make_dataset(w, "tiny", 64, samples=512)
    history = model.fit(dataset, epochs=4, steps_per_epoch=steps // 4, shuffle=False, verbose=0).history["loss"]
    assert np.all(np.isfinite(history))
    assert history[-1] < 0.98 * history[0], history


def test_build_is_deterministic_given_seed_and_restores_global_rngs():
    w = workloads.get("mnist_maxing")
    random.seed(123)
    expected = random.random()
    random.seed(123)
    a = w.build("tiny", seed=1).get_weights()
    assert random.random() == expected  # the caller's Python RNG is left where it was
    b = w.build("tiny", seed=1).get_weights()
    c = w.build("tiny", seed=2).get_weights()
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_build_rejects_bad_seed():
    with pytest.raises(ValueError, match="seed must be an integer >= 0; got seed=-1"):
        workloads.get("wide_mlp").build("tiny", seed=-1)


@pytest.mark.parametrize("name", NAMES)
def test_pipeline_batches_have_static_shapes_and_the_pool_data(name):
    w = workloads.get(name)
    dataset = make_dataset(name, "tiny", 32, samples=80, seed=2)
    x_spec, y_spec = dataset.element_spec
    assert tuple(x_spec.shape) == (32, *w.input_shape("tiny"))
    assert tuple(y_spec.shape) == (32, *w.label_shape("tiny"))
    x, y = w.make_data("tiny", 80, seed=2)
    batches = [b for _, b in zip(range(3), dataset)]  # the pool repeats: batch 3 wraps around
    np.testing.assert_array_equal(batches[0][0].numpy(), x[:32])
    np.testing.assert_array_equal(batches[1][1].numpy(), y[32:64])
    np.testing.assert_array_equal(batches[2][0].numpy(), np.concatenate([x[64:], x[:16]]))


def test_pipeline_is_deterministic_and_drops_the_remainder():
    first = [x.numpy() for x, _ in make_dataset("gru_stack", "tiny", 16, samples=40, repeat=False)]
    again = [x.numpy() for x, _ in make_dataset("gru_stack", "tiny", 16, samples=40, repeat=False)]
    assert len(first) == 2  # 40 // 16: the partial batch of 8 is dropped (seed 003, tip 2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_harness_own_pipelines_run_without_tf_datas_autotuning_model_and_a_users_dataset_keeps_its_options():
    # Its thread held up every freed fit iterator (harness/bench/workloads/tfdata.py): 4-20 s full collections.
    import tensorflow as tf

    from harness.bench.workloads import userdata

    assert make_dataset("wide_mlp", "tiny", 16, samples=32).options().autotune.enabled is False
    assert make_dataset("wide_mlp", "tiny", 16, samples=32, input_delay_ms=1).options().autotune.enabled is False
    x, y = np.zeros((32, 4), "float32"), np.zeros((32, 1), "float32")
    assert userdata.dataset(lambda b: (x, y), 16, "m:data").options().autotune.enabled is False
    own = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    assert userdata.dataset(lambda b: own, 16, "m:data").options().autotune.enabled is not False


def test_pipeline_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got batch_size=0"):
        make_dataset("wide_mlp", "tiny", 0)
    with pytest.raises(ValueError, match="input_delay_ms must be a finite number >= 0; got input_delay_ms=-1"):
        make_dataset("wide_mlp", "tiny", 8, input_delay_ms=-1)
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        make_dataset("nope", "tiny", 8)


def test_measure_input_rate_is_positive():
    rate = measure_input_rate(make_dataset("wide_mlp", "tiny", 64), 64, seconds=0.2)
    assert rate.samples_per_second > 0 and rate.batches > 0 and rate.seconds >= 0.2
    capped = measure_input_rate(make_dataset("wide_mlp", "tiny", 64), 64, seconds=60.0, max_batches=5)
    assert capped.batches == 5


def test_measure_input_rate_needs_a_batch():
    with pytest.raises(ValueError, match="no batch to time"):
        measure_input_rate(make_dataset("wide_mlp", "tiny", 64, samples=128, repeat=False), 64)
    with pytest.raises(ValueError, match="seconds must be a positive finite number; got seconds=0"):
        measure_input_rate([], 64, seconds=0)


def _train_step_seconds(w, batch_size: int) -> float:
    """Median wall time of a training step fed from memory."""
    model = _compiled(w)
    x, y = w.make_data("tiny", batch_size, seed=0)
    for _ in range(3):
        model.train_on_batch(x, y)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.mark.timing
def test_slow_preprocessing_starves_training_and_plain_input_does_not():
    # Seed 003, tip 3: CPU-bound preprocessing can leave the accelerator waiting. The preprocessing
    # delay is three of this host's training steps (measured now, load and all), so the pipeline
    # delivers at most a third of what training takes, whatever the machine's speed.
    w = workloads.get("mnist_maxing")
    step = _train_step_seconds(w, 256)
    train_sps = 256 / step
    delay_ms = 3000 * step
    delayed = measure_input_rate(make_dataset(w, "tiny", 256, input_delay_ms=delay_ms), 256, seconds=0.5)
    plain = measure_input_rate(make_dataset(w, "tiny", 256), 256, seconds=0.5)
    assert delayed.batches_per_second <= 1.05 * 1000 / delay_ms  # one sleep per batch, never overlapped with itself
    assert is_starved(delayed.samples_per_second, train_sps), (delayed, train_sps)
    assert not is_starved(plain.samples_per_second, train_sps), (plain, train_sps)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_model_takes_a_training_step(name):
    w = workloads.get(name)
    model = _compiled(w, "full")
    x, y = w.make_data("full", 2, seed=0)
    assert model.predict(x, verbose=0).shape == (2, *w.output_shape("full"))
    loss, _accuracy = model.train_on_batch(x, y)
    assert np.isfinite(loss)
