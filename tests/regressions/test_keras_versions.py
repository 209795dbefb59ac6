"""Keras 2 models train with towers or get a clear refusal, never a TypeError deep inside a step.

Guards: TF 2.16 swapping tf.keras from Keras 2 to Keras 3 (a tf_keras model under
TF_USE_LEGACY_KERAS=1 is not a keras.Model); seed 001's version sensitivity.
"""

import pytest

import harness
from harness.compat import Keras2NotSupported


def test_a_tf_keras_model_under_mirrored_is_refused_with_a_clear_error(logical_devices):
    tf_keras = pytest.importorskip("tf_keras", reason="tf-keras not installed (the matrix's legacy env has it)")
    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
    with pytest.raises(Keras2NotSupported, match="on a Keras 2 model \\(tf_keras.*method='mirrored'"):
        harness.parallelize(model, logical_devices[:2], method="mirrored")
    assert harness.parallelize(model, logical_devices[:2], method="towers").template is model
