"""Saving a parallel model writes the single-device model.

Guards: keras-team/keras#9548 and #8764 (ModelCheckpoint could not save a `multi_gpu_model`),
#8123 (saving a multi-GPU model at all); the Keras 2 advice to save the template by hand. On
Keras 3 and Keras 2 models (the ``any_keras`` fixture; both write and read the ``.keras`` format).
"""

import numpy as np
import pytest

import harness
from harness.bench.workloads import small


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_save_then_load_gives_the_single_device_model_with_equal_predictions(logical_devices, any_keras, tmp_path,
                                                                              method):
    k = any_keras
    x, y, _ = small.make_data("cnn_bn", 40)
    template = small.build("cnn_bn", keras=k)
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[3, 2, 1], method=method)
    parallel.compile(optimizer="sgd", loss=small.loss(k))
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    parallel.save(path)
    loaded = k.models.load_model(path, compile=False)
    assert type(loaded).__name__ != type(parallel).__name__  # the plain model, no replicas inside
    assert [w.shape for w in loaded.weights] == [w.shape for w in template.weights]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), parallel.predict(x, verbose=0), atol=1e-5)


@pytest.mark.parametrize("method", ["towers", "mirrored"])
def test_model_checkpoint_during_fit_saves_a_loadable_single_device_model(logical_devices, any_keras, tmp_path,
                                                                         method):
    # keras-team/keras#9548: the callback saves `self.model`, the parallel model, every epoch.
    k = any_keras
    x, y, _ = small.make_data("dense", 30)
    template = small.build("dense", keras=k)
    parallel = harness.parallelize(template, logical_devices[:2], ratios=[2, 1], method=method)
    parallel.compile(optimizer="sgd", loss=small.loss(k))
    path = tmp_path / "epoch{epoch}.keras"
    parallel.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[k.callbacks.ModelCheckpoint(str(path))])
    loaded = k.models.load_model(tmp_path / "epoch2.keras", compile=False)
    assert [w.shape for w in loaded.weights] == [w.shape for w in template.weights]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), template.predict(x, verbose=0), atol=1e-6)
