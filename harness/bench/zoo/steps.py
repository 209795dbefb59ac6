"""The zoo's models with steps of their own, after the Keras guides' patterns (``harness.parallel.custom``).

- ``vae_train_step``: keras-io "Variational AutoEncoder": encoder and decoder called in ``train_step``, the KL
  term added there, its own loss trackers (the sampling noise is an input: a parallel run draws no other noise);
- ``gan_train_step``: Keras guide "Customizing what happens in fit()", GAN: a generator and a discriminator, two
  optimizers, both updated in one step (no label noise: deterministic);
- ``distiller_train_step``: keras-io "Knowledge Distillation": a frozen teacher called in ``train_step``, the
  student trained on the hard labels and the teacher's softened outputs;
- ``compute_loss_aux``: Keras guide "Customizing what happens in fit()", ``compute_loss`` overridden to add an
  auxiliary penalty on the logits (tracked as a metric);
- ``custom_test_step``: Keras guide "Customizing what happens in evaluate()": ``train_step`` and ``test_step``
  of its own with its own metrics, checked with validation data each epoch.

Each class is written once with TensorFlow ops (Keras 3 here runs on TensorFlow), per Keras module; where the
generations differ (``compute_loss``' signature, Keras 3's ``compute_loss`` vs Keras 2's ``compiled_loss``) the
class asks ``is_keras3``. TensorFlow is imported by the steps themselves, when one runs: the models build on Keras
3's JAX backend too, where ``harness.parallelize`` refuses their steps by name (``custom-train-step``) before any runs.
"""

from __future__ import annotations

from functools import cache, partial
from types import SimpleNamespace

import numpy as np

from harness.bench.zoo.entry import ZooEntry, adam, is_keras3, ranked_labels, sgd, sparse_ce

__all__ = ["ENTRIES", "step_classes"]

N = 27  # samples: batch 10 ends each epoch on a batch of 7
FEATURES, LATENT = 12, 2


@cache
def step_classes(k) -> SimpleNamespace:  # noqa: C901 - one class per pattern, defined together per Keras module
    """The custom-step model classes of Keras module ``k`` (defined on first use, then reused)."""
    keras3 = is_keras3(k)
    dense = k.layers.Dense

    def own_loss(model, x, y, y_pred):
        """The compiled loss (and call-time losses) as each generation's guide computes it in a step."""
        if keras3:
            return model.compute_loss(x=x, y=y, y_pred=y_pred)
        return model.compiled_loss(y, y_pred, regularization_losses=model.losses)

    class VAE(k.Model):
        def __init__(self, features=FEATURES, latent=LATENT, **kwargs):
            super().__init__(**kwargs)
            self.features, self.latent = features, latent
            self.encoder = k.Sequential([k.Input((features,)), dense(16, activation="tanh"), dense(2 * latent)],
                                        name="encoder")
            self.decoder = k.Sequential([k.Input((latent,)), dense(16, activation="tanh"), dense(features)],
                                        name="decoder")
            self.total_loss_tracker = k.metrics.Mean(name="loss")
            self.kl_loss_tracker = k.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.kl_loss_tracker]

        def call(self, inputs):
            x, _ = inputs
            return self.decoder(self.encoder(x)[:, : self.latent])

        def train_step(self, data):
            import tensorflow as tf

            x, eps = data[0]
            with tf.GradientTape() as tape:
                h = self.encoder(x)
                mean, log_var = h[:, : self.latent], h[:, self.latent:]
                reconstruction = self.decoder(mean + tf.exp(0.5 * log_var) * tf.cast(eps, h.dtype))
                reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(tf.cast(x, h.dtype) - reconstruction),
                                                                   axis=1))
                kl_loss = tf.reduce_mean(tf.reduce_sum(-0.5 * (1 + log_var - tf.square(mean) - tf.exp(log_var)),
                                                       axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {m.name: m.result() for m in self.metrics}

        def get_config(self):
            return {"name": self.name, "features": self.features, "latent": self.latent}

    class GAN(k.Model):
        def __init__(self, features=FEATURES, latent=4, **kwargs):
            super().__init__(**kwargs)
            self.features, self.latent = features, latent
            self.generator = k.Sequential([k.Input((latent,)), dense(16, activation="relu"), dense(features)],
                                          name="generator")
            self.discriminator = k.Sequential([k.Input((features,)), dense(16, activation="tanh"), dense(1)],
                                              name="discriminator")
            self.d_loss_tracker = k.metrics.Mean(name="d_loss")
            self.g_loss_tracker = k.metrics.Mean(name="g_loss")
            self.loss_tracker = k.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker, self.d_loss_tracker, self.g_loss_tracker]

        def call(self, inputs):
            _, z = inputs
            return self.discriminator(self.generator(z))

        def compile(self, optimizer="rmsprop", loss=None, **kwargs):
            # The guide's compile(d_optimizer, g_optimizer, loss_fn), from compile's own arguments: the
            # discriminator steps with ``optimizer``, the generator with a fresh copy of it.
            kwargs.pop("metrics", None)
            kwargs.pop("loss_weights", None)
            super().compile(optimizer=optimizer, **kwargs)
            self.d_optimizer = self.optimizer
            self.g_optimizer = type(self.optimizer).from_config(self.optimizer.get_config())
            self.g_optimizer.build(self.generator.trainable_variables)
            self.loss_fn = loss if loss is not None else k.losses.BinaryCrossentropy(from_logits=True)

        def train_step(self, data):
            import tensorflow as tf

            real, z = data[0]
            n = tf.shape(real)[0]
            fake = self.generator(z)
            combined = tf.concat([fake, tf.cast(real, fake.dtype)], axis=0)
            labels = tf.concat([tf.ones((n, 1), fake.dtype), tf.zeros((n, 1), fake.dtype)], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined, training=True))
            weights = self.discriminator.trainable_weights
            self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(z, training=True), training=True)
                g_loss = self.loss_fn(tf.zeros((n, 1), fake.dtype), predictions)
            weights = self.generator.trainable_weights
            self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            self.loss_tracker.update_state(d_loss + g_loss)
            return {m.name: m.result() for m in self.metrics}

        def get_config(self):
            return {"name": self.name, "features": self.features, "latent": self.latent}

    class Distiller(k.Model):
        def __init__(self, student, teacher, **kwargs):
            super().__init__(**kwargs)
            self.student, self.teacher = student, teacher
            self.teacher.trainable = False
            self.loss_tracker = k.metrics.Mean(name="loss")
            self.distillation_tracker = k.metrics.Mean(name="distillation_loss")
            self.accuracy = k.metrics.SparseCategoricalAccuracy(name="accuracy")

        @property
        def metrics(self):
            return [self.loss_tracker, self.distillation_tracker, self.accuracy]

        def compile(self, optimizer="rmsprop", loss=None, alpha=0.1, temperature=3.0, **kwargs):
            kwargs.pop("metrics", None)
            kwargs.pop("loss_weights", None)
            super().compile(optimizer=optimizer, **kwargs)
            self.student_loss_fn = loss
            self.distillation_loss_fn = k.losses.KLDivergence()
            self.alpha, self.temperature = alpha, temperature

        def call(self, x):
            return self.student(x)

        def train_step(self, data):
            import tensorflow as tf

            x, y = data[0], data[1]
            teacher_predictions = self.teacher(x, training=False)
            with tf.GradientTape() as tape:
                student_predictions = self.student(x, training=True)
                student_loss = self.student_loss_fn(y, student_predictions)
                t = self.temperature
                distillation_loss = self.distillation_loss_fn(tf.nn.softmax(teacher_predictions / t, axis=1),
                                                              tf.nn.softmax(student_predictions / t, axis=1)) * t ** 2
                loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            weights = self.student.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
            self.loss_tracker.update_state(loss)
            self.distillation_tracker.update_state(distillation_loss)
            self.accuracy.update_state(y, student_predictions)
            return {m.name: m.result() for m in self.metrics}

    class AuxiliaryLoss(k.Model):
        """A Functional model whose ``compute_loss`` adds a penalty on the logits (and tracks it)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.aux_tracker = k.metrics.Mean(name="aux_loss")

        def compute_loss(self, *args, **kwargs):
            import tensorflow as tf

            loss = super().compute_loss(*args, **kwargs)
            y_pred = kwargs["y_pred"] if "y_pred" in kwargs else args[2]
            aux = 0.01 * tf.reduce_mean(tf.reduce_sum(tf.square(y_pred), axis=1))
            self.aux_tracker.update_state(aux)
            return loss + tf.cast(aux, loss.dtype)

    class EvaluatedStep(k.Model):
        """Functional, with a ``train_step`` and a ``test_step`` of its own and metrics of its own."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = k.metrics.Mean(name="loss")
            self.mae_metric = k.metrics.MeanAbsoluteError(name="mae")

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

        def train_step(self, data):
            import tensorflow as tf

            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = own_loss(self, x, y, y_pred)
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                               self.trainable_variables))
            return self._track(loss, y, y_pred)

        def test_step(self, data):
            x, y = data[0], data[1]
            y_pred = self(x, training=False)
            return self._track(own_loss(self, x, y, y_pred), y, y_pred)

        def _track(self, loss, y, y_pred):
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    return SimpleNamespace(VAE=VAE, GAN=GAN, Distiller=Distiller, AuxiliaryLoss=AuxiliaryLoss,
                           EvaluatedStep=EvaluatedStep)


# -- builders (each returns a built model) ------------------------------------------------------------------

def _vae(k):
    model = step_classes(k).VAE(name="vae")
    model((np.zeros((1, FEATURES), "float32"), np.zeros((1, LATENT), "float32")))
    return model


def _gan(k):
    model = step_classes(k).GAN(name="gan")
    model((np.zeros((1, FEATURES), "float32"), np.zeros((1, 4), "float32")))
    return model


def _distiller(k):
    teacher = k.Sequential([k.Input((FEATURES,)), k.layers.Dense(24, activation="relu"), k.layers.Dense(3)],
                           name="teacher")
    student = k.Sequential([k.Input((FEATURES,)), k.layers.Dense(8, activation="relu"), k.layers.Dense(3)],
                           name="student")
    model = step_classes(k).Distiller(student, teacher, name="distiller")
    model(np.zeros((1, FEATURES), "float32"))
    return model


def _aux_loss(k):
    inputs = k.Input(shape=(FEATURES,))
    h = k.layers.Dense(16, activation="relu")(inputs)
    return step_classes(k).AuxiliaryLoss(inputs, k.layers.Dense(3)(h), name="aux_loss")


def _evaluated(k):
    inputs = k.Input(shape=(FEATURES,))
    h = k.layers.Dense(16, activation="tanh")(inputs)
    return step_classes(k).EvaluatedStep(inputs, k.layers.Dense(1)(h), name="evaluated_step")


# -- data ---------------------------------------------------------------------------------------------------

def _with_noise(width: int, seed: int):
    """Vectors, and the noise the step reads as an input (the VAE's epsilon, the GAN's latent vectors)."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(N, FEATURES)).astype("float32")
    noise = rng.normal(size=(N, width)).astype("float32")
    return (x, noise), np.zeros((N,), "float32"), None


def _classes(seed: int = 21):
    x = np.random.RandomState(seed).normal(size=(N, FEATURES)).astype("float32")
    return x, ranked_labels(x[:, 0] - x[:, 1], 3), None


def _regression(seed: int = 22):
    x = np.random.RandomState(seed).normal(size=(N, FEATURES)).astype("float32")
    return x, (x[:, :1] - 0.5 * x[:, 1:2]).astype("float32"), None


def _no_loss(k):
    return None


def _mse(k):
    return k.losses.MeanSquaredError()


ENTRIES = (
    ZooEntry("vae_train_step", "keras-io: Variational AutoEncoder (train_step with the KL term)",
             "encoder Dense(16)->4, decoder Dense(16)->12, latent 2; the sampling noise an input",
             _vae, partial(_with_noise, LATENT, 23), _no_loss, adam, fast=True),
    ZooEntry("gan_train_step", "Keras guide: Customizing what happens in fit() (GAN)",
             "generator 4->Dense(16)->12, discriminator 12->Dense(16)->1, two Adams, one step; latent an input",
             _gan, partial(_with_noise, 4, 24), lambda k: k.losses.BinaryCrossentropy(from_logits=True), adam,
             fast=True),
    ZooEntry("distiller_train_step", "keras-io: Knowledge Distillation",
             "frozen teacher Dense(24), student Dense(8), 3 classes, alpha 0.1, temperature 3",
             _distiller, _classes, sparse_ce, adam),
    ZooEntry("compute_loss_aux", "Keras guide: Customizing what happens in fit() (compute_loss)",
             "Dense(16), Dense(3) logits; compute_loss adds 0.01 x the logits' squared norm, tracked",
             _aux_loss, partial(_classes, 25), sparse_ce, sgd, fast=True),
    ZooEntry("custom_test_step", "Keras guide: Customizing what happens in evaluate()",
             "Dense(16, tanh), Dense(1); own train_step and test_step, own loss and MAE trackers; validated each "
             "epoch", _evaluated, _regression, _mse, sgd, epochs=2, validation=True),
)
