"""A hung collective becomes a reported failure within the timeout, not a hung CI job.

Guards: seed 001 (docs/background.md: "the system crashed without warning when I used 2 GPUs" on
TF 1.10/1.12); collectives that never complete when a replica stalls
(tensorflow/tensorflow#36224-style hangs, two strategies sharing collective keys: see
harness/parallel/collective.py).
"""

import io
import time

import pytest
from tf_zygote import ENV, python

from harness.watchdog import EXIT_STATUS, Watchdog

HANG = """
import importlib, sys, time
import numpy as np
import tensorflow as tf
import harness

devices = harness.use_logical_devices(2)
k = importlib.import_module(sys.argv[1])  # keras, or a Keras 2 module (tf_keras)
calls = [0]


def stall(x):
    calls[0] += 1
    if calls[0] > 4:  # two replicas x two steps, then one replica never comes back
        time.sleep(600)
    return x


class Stall(k.layers.Layer):
    def call(self, x):
        y = tf.py_function(stall, [x], x.dtype)
        y.set_shape(x.shape)
        return y


model = k.Sequential([k.Input((4,)), k.layers.Dense(3), Stall(), k.layers.Dense(1)])
parallel = harness.parallelize(model, devices, ratios=[1, 1], method="mirrored")
parallel.compile(optimizer="sgd", loss="mse")
x = np.ones((64, 4), "float32")
print("fitting", flush=True)
parallel.fit(x, np.ones((64, 1), "float32"), batch_size=8, epochs=1, verbose=0,
             callbacks=[harness.step_watchdog(timeout_s=5, first_timeout_s=60, model=parallel)])
print("finished", flush=True)
"""


@pytest.mark.keras2_extended  # the watchdog is harness' own, alike for each Keras
@pytest.mark.covered_by("tests/upstream/test_watchdog.py::test_a_stalled_replica_ends_the_run_with_a_report_within_the_"
                        "timeout[keras3]")
def test_a_stalled_replica_ends_the_run_with_a_report_within_the_timeout(any_keras):
    # A Keras 3 model, then a Keras 2 one (the plugin's any_keras fixture), each in its own process.
    module = any_keras.__name__
    start = time.monotonic()
    proc = python(["-c", HANG, module], timeout=240, env=ENV)
    took = time.monotonic() - start
    assert proc.returncode == EXIT_STATUS, (proc.returncode, proc.stderr[-3000:])
    assert "finished" not in proc.stdout
    assert "harness watchdog: training step 3 has not finished after" in proc.stderr
    assert "(limit 5 s)" in proc.stderr and "Thread" in proc.stderr  # the stacks follow
    assert took < 200


def test_the_watchdog_fires_once_a_step_overruns_and_not_before():
    fired, out = [], io.StringIO()
    dog = Watchdog(0.2, first_timeout_s=0.5, on_timeout=fired.append, stream=out)
    dog.arm(1)
    time.sleep(0.3)  # under the first step's limit
    dog.disarm()
    dog.arm(2)
    time.sleep(0.1)
    dog.disarm()
    assert not fired
    dog.arm(3)
    time.sleep(0.6)
    assert fired and "training step 3 has not finished after" in fired[0] and "(limit 0.2 s)" in fired[0]
    assert dog.fired
    dog.close()


def test_a_closed_watchdog_never_fires():
    fired = []
    dog = Watchdog(0.05, on_timeout=fired.append, stream=io.StringIO())
    dog.arm(1)
    dog.disarm()
    dog.close()
    time.sleep(0.2)
    assert not fired


@pytest.mark.parametrize(("kwargs", "fragment"), [({"timeout_s": 0}, "timeout_s must be positive; got timeout_s=0"),
                                                   ({"timeout_s": 1, "first_timeout_s": -1}, "first_timeout_s=-1")])
def test_bad_limits_are_named(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", "\\(")):
        Watchdog(**kwargs)
