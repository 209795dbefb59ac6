"""The checker must catch the bug class we exist for: Keras fit on uneven replicas.

docs/design.md, "Keras fit on uneven replicas": Keras 3 ``fit`` under MirroredStrategy with a
60/40 split drifted 0.042 from single-device training in one epoch, because each replica's mean
loss is scaled by 1/num_replicas whatever its sample count. Keras 3 only: the naive path reaches
into Keras 3's fit (``_symbolic_build``).
"""

import numpy as np
import pytest

import harness
from harness.split import split_batch

pytestmark = pytest.mark.usefixtures("keras3")


class NaiveUnevenFit:
    """Keras' own fit fed uneven per-replica slices: the path users try first."""

    def __init__(self, template, devices, ratios):
        import keras

        from harness.parallel.collective import strategy_for

        self.template, self.ratios = template, ratios
        self.strategy = strategy_for(tuple(devices))
        with self.strategy.scope():
            self.model = keras.models.clone_model(template)
            self.model.set_weights(template.get_weights())

    @property
    def optimizer(self):
        return self.model.optimizer

    def compile(self, **kwargs):
        with self.strategy.scope():
            self.model.compile(**kwargs)

    def fit(self, x, y, *, batch_size, epochs, **_):
        import tensorflow as tf

        def slices():
            for start in range(0, len(y), batch_size):
                xb, yb = x[start : start + batch_size], y[start : start + batch_size]
                offset = 0
                for size in split_batch(len(yb), self.ratios):
                    yield xb[offset : offset + size], yb[offset : offset + size]
                    offset += size

        spec = (tf.TensorSpec((None, x.shape[1]), tf.float32), tf.TensorSpec((None, y.shape[1]), tf.float32))
        data = self.strategy.distribute_datasets_from_function(
            lambda ctx: tf.data.Dataset.from_generator(slices, output_signature=spec)
        )
        # An uneven first batch crashes fit's symbolic build (per-replica shapes are summed):
        # build on a whole batch first, as a user working around it would.
        with self.strategy.scope():
            self.model._symbolic_build(data_batch=(x[:batch_size], y[:batch_size]))
        self.model._maybe_symbolic_build = lambda *args, **kwargs: None
        history = self.model.fit(data, epochs=epochs, verbose=0)
        self.template.set_weights(self.model.get_weights())
        return history


def _build():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1))).astype("float32")


def test_checker_fails_on_naive_uneven_fit(logical_devices, data):
    x, y = data
    with pytest.raises(AssertionError, match="parallel training differs") as info:
        harness.assert_equivalent(
            _build, x, y, devices=logical_devices[:2], ratios=[3, 2], method=NaiveUnevenFit,
            batch_size=20, epochs=1, optimizer="sgd", loss="mse",
        )
    assert "variable" in str(info.value)  # the table of worst-differing weights


def test_checker_passes_the_exact_path_on_the_same_case(logical_devices, data):
    x, y = data
    report = harness.assert_equivalent(
        _build, x, y, devices=logical_devices[:2], ratios=[3, 2], method="mirrored",
        batch_size=20, epochs=1, optimizer="sgd", loss="mse",
    )
    assert report.max_deviation < 1e-6
