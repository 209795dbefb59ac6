"""A model's own steps on the devices (``harness.parallel.custom``): its ``train_step`` runs, unchanged, and
every call of its models inside it runs split over the devices.

The zoo's custom-step rows (``harness.bench.zoo.steps``) judge exactness against one device and float64;
here: that the user's step is the one that ran (a side effect only it produces), that each device computed
its share of every call's batch (what dropping the parallel forward would lose, while still training
exactly: so it is checked by the devices' own logs), and the refusals, by name.
"""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.errors import NotSupported, Refused
from harness.parallel.towers import Towers
from harness.split import split_batch


def _counting_class(k):
    import tensorflow as tf

    class Counting(k.Model):
        """Its own train_step: an encoder and a head called separately, a counter only this step increments."""

        def __init__(self, encoder=None, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder or k.Sequential([k.Input((6,)), k.layers.Dense(8, activation="tanh")],
                                                   name="encoder")
            self.head = k.Sequential([k.Input((8,)), k.layers.Dense(2)], name="head")
            self.steps_run = tf.Variable(0, trainable=False, dtype=tf.int64)
            self.loss_tracker = k.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, x):
            return self.head(self.encoder(x))

        def train_step(self, data):
            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self.head(self.encoder(x, training=True), training=True)
                loss = tf.reduce_mean(tf.square(y_pred - y))
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.steps_run.assign_add(1)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return Counting


def _model(k):
    k.utils.set_random_seed(5)
    model = _counting_class(k)(name="counting")
    model(np.zeros((1, 6), "float32"))
    return model


def _data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(47, 6)).astype("float32")
    return x, np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1).astype("float32")


def _shares(batches, ratios) -> list[int]:
    """Each device's samples over the batches, as the split cuts each batch."""
    sizes = [split_batch(b, ratios) for b in batches]
    return [sum(s[i] for s in sizes) for i in range(len(ratios))]


def _train(k, devices, ratios, epochs=2, batch_size=10):
    x, y = _data()
    single = _model(k)
    initial = single.get_weights()
    single.compile(optimizer=k.optimizers.Adam(0.01))
    expected = single.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0).history
    template = _model(k)
    template.set_weights(initial)
    parallel = harness.parallelize(template, devices, ratios=ratios, method="towers")
    parallel.compile(optimizer=k.optimizers.Adam(0.01))
    log = parallel.time_devices()
    history = parallel.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0).history
    busy = log.busy_between(0.0, float("inf"))
    batches = [len(x[i:i + batch_size]) for i in range(0, len(x), batch_size)] * epochs
    return single, template, parallel, expected, history, busy, batches


def _devices_did_their_shares(busy, devices, batches, ratios, calls_per_step) -> bool:
    """Each device computed its share of each model call's batch (the encoder's and the head's)."""
    return [busy[d].samples if d in busy else 0 for d in devices] == [
        calls_per_step * s for s in _shares(batches, ratios)]


def test_the_users_train_step_runs_with_its_model_calls_split(logical_devices, any_keras):
    k, devices, ratios = any_keras, logical_devices[:3], [5, 3, 2]
    single, template, parallel, expected, history, busy, batches = _train(k, devices, ratios)
    assert int(template.steps_run.numpy()) == int(single.steps_run.numpy()) == len(batches)  # its step, each batch
    assert parallel.own_steps == ("train_step",)
    assert _devices_did_their_shares(busy, devices, batches, ratios, calls_per_step=2), busy
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-6)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # Keras' own predict_step on this model: its call() split too, the single device's outputs.
    x, _ = _data()
    np.testing.assert_allclose(parallel.predict(x, batch_size=10, verbose=0),
                               single.predict(x, batch_size=10, verbose=0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("ratios", [[5, 3, 2], [1, 1, 1]])
def test_dropping_the_parallel_forward_is_detected(logical_devices, monkeypatch, ratios):
    """The planted defect: each model call of the user's step runs whole on the merge device. It still trains
    exactly (one device is exact), so the weights cannot tell; the devices' logs do."""
    import keras
    import tensorflow as tf

    def whole_on_merge_device(self, model, args, kwargs):
        self.split_calls += 1
        with tf.device(self.merge_device):
            return type(model)._harness_split_of.__call__(model, *args, **kwargs)

    monkeypatch.setattr(Towers, "_split_call", whole_on_merge_device)
    devices = logical_devices[:3]
    single, template, parallel, expected, history, busy, batches = _train(keras, devices, ratios, epochs=1)
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-6)  # exact all the same
    assert not _devices_did_their_shares(busy, devices, batches, ratios, calls_per_step=2), busy


def _refused_at_fit(k, devices, forward, name: str, call=None) -> NotSupported:
    """The refusal ``fit`` raises for a model whose own train_step computes its predictions with ``forward(model,
    x)`` (and whose ``call`` is ``call``, where given)."""
    import tensorflow as tf

    body: dict = {}
    if call is not None:
        body["call"] = call

    def train_step(self, data):
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(forward(self, x) - y))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
        return {"loss": loss}

    model = type(name.capitalize(), (_counting_class(k),), {**body, "train_step": train_step})(name=name)
    model(np.zeros((1, 6), "float32"))
    parallel = harness.parallelize(model, devices, method="towers")
    parallel.compile(optimizer="sgd")
    with pytest.raises(NotSupported) as info:
        parallel.fit(*_data(), batch_size=10, epochs=1, verbose=0)
    return info.value


def test_a_step_that_calls_no_model_is_refused_by_name(logical_devices, any_keras):
    # It calls the models' layers: no model call harness could split.
    err = _refused_at_fit(any_keras, logical_devices[:2], lambda m, x: m.head.layers[-1](m.encoder.layers[-1](x)),
                          "direct")
    assert err.reason == "custom-step-unsplit" and "Direct.train_step called none of its models" in str(err)


def test_a_model_call_with_more_than_the_batch_is_refused_by_name(logical_devices, any_keras):
    import tensorflow as tf

    def call(self, x, scale=None):
        return self.head(self.encoder(x)) * (1.0 if scale is None else scale)

    err = _refused_at_fit(any_keras, logical_devices[:2], lambda m, x: m(x, scale=tf.ones_like(x[:, :1])), "scaled",
                          call=call)
    assert err.reason == "custom-step-call" and "calls 'scaled' with (inputs, scale)" in str(err)


def _single_and_parallel(k, build, devices, ratios, learning_rate, batch_size, epochs):
    """``build()`` trained on one device and with towers from the same weights: ``(single, template, their
    losses per epoch)``."""
    x, y = _data()
    single, template = build(), build()
    template.set_weights(single.get_weights())
    single.compile(optimizer=k.optimizers.SGD(learning_rate))
    expected = single.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0).history["loss"]
    parallel = harness.parallelize(template, devices, ratios=ratios, method="towers")
    parallel.compile(optimizer=k.optimizers.SGD(learning_rate))
    got = parallel.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0).history["loss"]
    return single, template, expected, got


def test_batchnorm_in_a_called_model_gets_the_whole_batch_statistics(logical_devices, any_keras):
    """A sub-model with BatchNormalization, called in the user's step: its statistics are the whole batch's
    (``layerwise``, as for towers' own step), so its moving averages are the single device's."""
    k = any_keras

    def build():
        k.utils.set_random_seed(5)
        model = _counting_class(k)(k.Sequential([k.Input((6,)), k.layers.Dense(8), k.layers.BatchNormalization(),
                                                 k.layers.Activation("tanh")], name="encoder"), name="with_norm")
        model(np.zeros((1, 6), "float32"))
        return model

    single, template, _, _ = _single_and_parallel(k, build, logical_devices[:2], [3, 1], 0.05, 12, 1)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    x, y = _data()

    class Normed(k.Model):  # subclassed: no graph to walk layer by layer
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense, self.norm = k.layers.Dense(8), k.layers.BatchNormalization()

        def call(self, x, training=None):
            return self.norm(self.dense(x), training=training)

    outer = _counting_class(k)(Normed(name="normed"), name="outer")
    outer(np.zeros((1, 6), "float32"))
    own = harness.parallelize(outer, logical_devices[:2], method="towers")
    own.compile(optimizer="sgd")
    with pytest.raises(Refused, match="calls the subclassed Normed 'normed'") as info:
        own.fit(x, y, batch_size=12, epochs=1, verbose=0)
    assert info.value.reason == "subclassed-batchnorm"


def test_assert_equivalent_checks_a_model_with_its_own_step(logical_devices, any_keras):
    k = any_keras
    x, y = _data()
    check = dict(devices=logical_devices[:3], ratios=[5, 3, 2], batch_size=10, epochs=2,
                 optimizer=lambda: k.optimizers.Adam(0.01), loss=None, reference="float64")
    harness.assert_equivalent(lambda: _model(k), x, y, method="towers", **check)
    with pytest.raises(NotSupported, match="defines its own train_step"):
        harness.assert_equivalent(lambda: _model(k), x, y, method="mirrored", **check)


def test_call_time_losses_of_a_split_call_are_the_whole_batch_s(logical_devices, any_keras):
    """An activity regulariser inside a model the step calls: ``model.losses`` after the split call is the whole
    batch's (``Adapter.set_call_losses``), so a step that adds it trains as on one device."""
    k = any_keras
    import tensorflow as tf

    class Regularised(_counting_class(k)):
        def train_step(self, data):
            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y)) + tf.add_n(self.losses)
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    def build():
        k.utils.set_random_seed(5)
        encoder = k.Sequential([k.Input((6,)), k.layers.Dense(8, activation="tanh"),
                                k.layers.ActivityRegularization(l2=0.5)], name="encoder")
        model = Regularised(encoder, name="regularised")
        model(np.zeros((1, 6), "float32"))
        return model

    single, template, expected, got = _single_and_parallel(k, build, logical_devices[:3], [5, 3, 2], 0.1, 10, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_step_that_ignores_y_trains_on_x_alone_with_a_compiled_loss_it_never_uses(logical_devices, any_keras):
    """keras-io's VAE as users write it: compiled with a loss its own train_step never uses, fit on x alone. Keras
    trains it on one device (a compiled loss is built at its first use, which never comes); towers must too,
    rather than build that loss from a y there is not ("None values not supported")."""
    from harness.bench.zoo.steps import FEATURES, LATENT, _vae

    k = any_keras
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(40, FEATURES)).astype("float32"), rng.normal(size=(40, LATENT)).astype("float32"))
    k.utils.set_random_seed(7)
    single = _vae(k)
    initial = single.get_weights()
    single.compile(optimizer=k.optimizers.Adam(0.01), loss="mse")
    expected = single.fit(x, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    template = _vae(k)
    template.set_weights(initial)
    parallel = harness.parallelize(template, logical_devices[:3], ratios=[5, 3, 2], method="towers")
    parallel.compile(optimizer=k.optimizers.Adam(0.01), loss="mse")
    history = parallel.fit(x, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
