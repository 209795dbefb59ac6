"""The workloads in Keras 2 (tf_keras): one definition builds in either Keras (``keras_module``), as the stock
baseline across workers needs (``harness run --workers N --method keras`` trains them with tf_keras' fit)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.bench import workloads
from harness.compat import is_keras2_model, keras_module_name

# Every test here touches TensorFlow: the process' devices are set up first (harness.pytest_plugin's rule).
pytestmark = pytest.mark.usefixtures("logical_devices")


def _architecture(model) -> list:
    return [(type(layer).__name__, [tuple(int(d) for d in w.shape) for w in layer.weights]) for layer in model.layers]


@pytest.mark.parametrize("name", workloads.names())
def test_each_workload_builds_the_same_architecture_in_keras_2(name, keras2, keras3):
    workload = workloads.get(name)
    ours, theirs = workload.build("tiny", seed=0), workload.build("tiny", seed=0, keras_module=keras2)
    assert is_keras2_model(theirs) and not is_keras2_model(ours)
    assert _architecture(theirs) == _architecture(ours)
    assert theirs.count_params() == ours.count_params()
    assert theirs.output_shape[1:] == workload.output_shape("tiny")
    for made in (workload.loss(keras2), workload.optimizer(keras2), workload.accuracy(keras2)):
        assert type(made).__module__.startswith(keras2.__name__), type(made)
    theirs.compile(optimizer=workload.optimizer(keras2), loss=workload.loss(keras2))  # Keras 2 takes them


def test_the_seed_fixes_keras_2_weights(keras2):
    workload = workloads.get("mnist_maxing")
    first, again, other = (workload.build("tiny", seed=s, keras_module=keras2).get_weights() for s in (0, 0, 1))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("name", workloads.names())
def test_the_same_seed_gives_the_same_initial_weights_where_the_initialisers_agree(name, keras2, keras3):
    if not (keras3.__version__.startswith("3.15.") and keras2.__version__.startswith("2.21.")):
        pytest.skip(f"checked on Keras 3.15 and tf_keras 2.21; here Keras {keras3.__version__}, "
                    f"{keras2.__name__} {keras2.__version__}")
    workload = workloads.get(name)
    ours = workload.build("tiny", seed=3).get_weights()
    theirs = workload.build("tiny", seed=3, keras_module=keras2).get_weights()
    same = [np.array_equal(a, b) for a, b in zip(ours, theirs)]
    if name == "gru_stack":  # the orthogonal initialisers draw seeds differently: alike up to the first GRU only
        assert same[:3] == [True] * 3 and not all(same[3:]), same
    else:
        assert all(same), same


def test_the_stock_model_runs_emulated_devices_in_keras_2(keras2):
    # harness.bench.stock's Emulated wrapper is generic in the Keras module: a tf_keras model on one emulated device
    # trains through tf_keras' fit, and the device logs each step's rows.
    import time

    from harness.bench.stock import stock_model
    from harness.emulate import emulator_for, parse_emulate

    workload = workloads.get("wide_mlp")
    devices = ("/cpu:0",)
    emulator = emulator_for(parse_emulate("400"), devices)  # 100 ms a step: far below this host
    model = stock_model(lambda: workload.build("tiny", seed=0, keras_module=keras2),
                        lambda m: m.compile(optimizer=workload.optimizer(keras2), loss=workload.loss(keras2)),
                        devices, emulator)
    assert keras_module_name(model) == keras2.__name__ and model.emulator is emulator
    x, y = workload.make_data("tiny", 160, seed=0)
    start = time.perf_counter()
    model.fit(x, y, batch_size=40, epochs=1, verbose=0, shuffle=False)
    busy = emulator.busy_between(start, time.perf_counter())["/cpu:0"]
    assert (busy.steps, busy.samples) == (4, 160)
    # The emulated rate, or, where this host could not compute a step in 100 ms (a loaded CI host measured 257
    # samples/s), the device says it is host-bound: its figure is never the emulation's silently.
    assert busy.rate <= 400 * 1.25, busy
    assert busy.rate == pytest.approx(400, rel=0.25) or busy.host_bound, busy
    assert float(model.finish_gate.numpy()) == 0.0  # the emulator's gradient is an exact zero
