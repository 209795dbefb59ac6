"""The zoo's subclassed layers and models, defined once per Keras module.

Written after keras-io examples; each has ``get_config`` so Keras (and harness's mirrored
method) can clone it. Keras 3 spells tensor math ``keras.ops``; Keras 2 uses TensorFlow's.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

from harness.bench.zoo.entry import is_keras3

__all__ = ["classes_of", "clipped_step_class", "math_of"]


def math_of(k) -> SimpleNamespace:
    """The handful of tensor functions the zoo's layers and losses use, for Keras module ``k``."""
    if is_keras3(k):
        ops = k.ops
        return SimpleNamespace(arange=ops.arange, shape=ops.shape, stop_gradient=ops.stop_gradient, sqrt=ops.sqrt,
                               sum=ops.sum, square=ops.square, maximum=ops.maximum, mean=ops.mean, cast=ops.cast,
                               broadcast_to=ops.broadcast_to)
    import tensorflow as tf

    return SimpleNamespace(arange=tf.range, shape=tf.shape, stop_gradient=tf.stop_gradient, sqrt=tf.sqrt,
                           sum=tf.reduce_sum, square=tf.square, maximum=tf.maximum, mean=tf.reduce_mean,
                           cast=tf.cast, broadcast_to=tf.broadcast_to)


@cache
def classes_of(k) -> SimpleNamespace:
    """The zoo's layer and model classes for Keras module ``k`` (defined on first use, then reused)."""
    layers: Any = k.layers
    m = math_of(k)

    class TokenAndPositionEmbedding(k.layers.Layer):
        """keras-io "Text classification with Transformer": token plus position embeddings."""

        def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
            super().__init__(**kwargs)
            self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, embed_dim
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            positions = self.pos_emb(m.arange(0, m.shape(x)[-1], 1))
            return self.token_emb(x) + positions

        def get_config(self):
            return {**super().get_config(), "maxlen": self.maxlen, "vocab_size": self.vocab_size,
                    "embed_dim": self.embed_dim}

    class TokenAndPositionIds(TokenAndPositionEmbedding):
        """As ``TokenAndPositionEmbedding``, with one position id per token: ``arange`` broadcast to the
        batch's shape, so the position lookup's indices have the batch dimension (GPT-style models)."""

        def call(self, x):
            positions = m.broadcast_to(m.arange(0, m.shape(x)[-1], 1)[None, :], m.shape(x))
            return self.token_emb(x) + self.pos_emb(positions)

    class TransformerBlock(k.layers.Layer):
        """keras-io "Text classification with Transformer": attention, feed-forward, two LayerNorms."""

        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.0, **kwargs):
            super().__init__(**kwargs)
            self.embed_dim, self.num_heads, self.ff_dim, self.rate = embed_dim, num_heads, ff_dim, rate
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = k.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs, training=None):
            attn_output = self.dropout1(self.att(inputs, inputs), training=training)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.dropout2(self.ffn(out1), training=training)
            return self.layernorm2(out1 + ffn_output)

        def get_config(self):
            return {**super().get_config(), "embed_dim": self.embed_dim, "num_heads": self.num_heads,
                    "ff_dim": self.ff_dim, "rate": self.rate}

    class EuclideanDistance(k.layers.Layer):
        """keras-io siamese network's distance (a Lambda there; Keras cannot clone a Lambda of a function)."""

        def call(self, vectors):
            a, b = vectors
            return m.sqrt(m.maximum(m.sum(m.square(a - b), axis=1, keepdims=True), 1e-7))

        def compute_output_shape(self, input_shape):
            return (input_shape[0][0], 1)

    class ResidualMLP(k.Model):
        """Keras guide "Making new layers and models via subclassing": a subclassed model with get_config."""

        def __init__(self, hidden=32, classes=3, **kwargs):
            super().__init__(**kwargs)
            self.hidden, self.classes = hidden, classes
            self.stem = layers.Dense(hidden, activation="relu")
            self.block = layers.Dense(hidden, activation="relu")
            self.norm = layers.LayerNormalization()
            self.head = layers.Dense(classes)

        def call(self, x):
            h = self.stem(x)
            return self.head(self.norm(h + self.block(h)))

        def get_config(self):
            return {"name": self.name, "hidden": self.hidden, "classes": self.classes}

    class TemperatureClassifier(k.Model):
        """A classifier with a calibration temperature fitted after training: no gradient reaches it."""

        def __init__(self, classes=3, **kwargs):
            super().__init__(**kwargs)
            self.classes = classes
            self.body = layers.Dense(16, activation="tanh")
            self.head = layers.Dense(classes)
            self.temperature = self.add_weight(name="temperature", shape=(), initializer="ones", trainable=True)

        def call(self, x):
            return self.head(self.body(x)) / m.stop_gradient(self.temperature)

        def get_config(self):
            return {"name": self.name, "classes": self.classes}

    return SimpleNamespace(TokenAndPositionEmbedding=TokenAndPositionEmbedding, TokenAndPositionIds=TokenAndPositionIds,
                           TransformerBlock=TransformerBlock,
                           EuclideanDistance=EuclideanDistance, ResidualMLP=ResidualMLP,
                           TemperatureClassifier=TemperatureClassifier)


@cache
def clipped_step_class(k):
    """Keras guide "Customizing what happens in fit()": its own train_step (here clipping gradients), on
    TensorFlow's tape (imported when the step runs: the model builds on Keras 3's JAX backend too, where
    ``harness.parallelize`` refuses its step by name, ``custom-train-step``, before it runs)."""
    return _clipped_step_keras3(k) if is_keras3(k) else _clipped_step_keras2(k)


def _clipped_step_keras3(k):
    class ClippedStep(k.Model):
        def train_step(self, data):
            import tensorflow as tf

            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            grads, _ = tf.clip_by_global_norm(tape.gradient(loss, self.trainable_variables), 1.0)
            self.optimizer.apply(grads, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {metric.name: metric.result() for metric in self.metrics}

    return ClippedStep


def _clipped_step_keras2(k):
    import tensorflow as tf

    class ClippedStep(k.Model):
        def train_step(self, data):
            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
            grads, _ = tf.clip_by_global_norm(tape.gradient(loss, self.trainable_variables), 1.0)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.compiled_metrics.update_state(y, y_pred)
            return {metric.name: metric.result() for metric in self.metrics}

    return ClippedStep
