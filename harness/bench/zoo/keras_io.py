"""keras-io and Keras-guide models at CPU size: text, sequences, siamese, nested, subclassed,
multi-input/multi-output, class weights, softmax outputs, mixed precision, a custom train_step.

Dropout rates are 0 (random masks would make any two runs differ); everything else follows the
example named in each entry's ``source``.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from harness.bench.zoo.custom import classes_of, clipped_step_class, math_of
from harness.bench.zoo.entry import ZooEntry, adam, images, output_dtype, ranked_labels, sgd, sparse_ce, tokens

__all__ = ["ENTRIES"]

N = 27  # samples: batch 10 ends each epoch on a batch of 7


def _text_bilstm(k):
    inputs = k.Input(shape=(None,), dtype="int32")
    h = k.layers.Embedding(50, 16, mask_zero=True)(inputs)
    h = k.layers.Bidirectional(k.layers.LSTM(8))(h)
    return k.Model(inputs, k.layers.Dense(1, activation="sigmoid")(h), name="text_bilstm")


def _text_data():
    x, lengths = tokens(N, 12, 50)
    return x, (lengths > 7).astype("float32"), None


def _transformer(k):
    c = classes_of(k)
    inputs = k.Input(shape=(12,), dtype="int32")
    h = c.TokenAndPositionEmbedding(12, 50, 16)(inputs)
    h = c.TransformerBlock(16, 2, 16)(h)
    h = k.layers.GlobalAveragePooling1D()(h)
    h = k.layers.Dropout(0.0)(h)
    h = k.layers.Dense(20, activation="relu")(h)
    return k.Model(inputs, k.layers.Dense(2, activation="softmax")(h), name="transformer_encoder")


def _transformer_data():
    x, _ = tokens(N, 12, 50, seed=1, min_length=12)
    return x, (x[:, :6].sum(axis=1) > x[:, 6:].sum(axis=1)).astype("int32"), None


def _seq2seq(k):
    inputs = k.Input(shape=(8, 4))
    h = k.layers.Masking(mask_value=0.0)(inputs)
    h = k.layers.LSTM(16, return_sequences=True)(h)
    return k.Model(inputs, k.layers.TimeDistributed(k.layers.Dense(5))(h), name="seq2seq_masked")


def _seq2seq_data():
    rng = np.random.RandomState(2)
    x = rng.normal(size=(N, 8, 4)).astype("float32")
    lengths = rng.randint(3, 9, N)
    padded = np.arange(8)[None, :] >= lengths[:, None]
    x[padded] = 0.0
    y = ranked_labels(x.sum(axis=2).ravel(), 5).reshape(N, 8)
    y[padded] = 0
    return x, y, None


def _siamese(k):
    c = classes_of(k)
    inputs = k.Input((12, 12, 1))
    h = k.layers.BatchNormalization()(inputs)
    h = k.layers.Conv2D(4, (3, 3), activation="tanh")(h)
    h = k.layers.AveragePooling2D(pool_size=(2, 2))(h)
    h = k.layers.Flatten()(h)
    h = k.layers.BatchNormalization()(h)
    tower = k.Model(inputs, k.layers.Dense(10, activation="tanh")(h), name="tower")
    a, b = k.Input((12, 12, 1), name="left"), k.Input((12, 12, 1), name="right")
    distance = c.EuclideanDistance()([tower(a), tower(b)])
    h = k.layers.BatchNormalization()(distance)
    return k.Model([a, b], k.layers.Dense(1, activation="sigmoid")(h), name="siamese")


def _contrastive(k, margin: float = 1.0):
    m = math_of(k)

    def contrastive_loss(y_true, y_pred):
        y_true = m.cast(y_true, y_pred.dtype)
        return m.mean((1 - y_true) * m.square(y_pred) + y_true * m.square(m.maximum(margin - y_pred, 0.0)))

    return contrastive_loss


def _siamese_data():
    left, classes = images(N, (12, 12, 1), 3, seed=3)
    right, other = images(N, (12, 12, 1), 3, seed=4)
    return [left, right], (classes == other).astype("float32"), None


def _nested(k):
    encoder_input = k.Input(shape=(28, 28, 1), name="img")
    h = k.layers.Conv2D(4, 3, activation="relu")(encoder_input)
    h = k.layers.Conv2D(8, 3, activation="relu")(h)
    h = k.layers.MaxPooling2D(3)(h)
    h = k.layers.Conv2D(8, 3, activation="relu")(h)
    h = k.layers.Conv2D(16, 3, activation="relu")(h)
    encoder = k.Model(encoder_input, k.layers.GlobalMaxPooling2D()(h), name="encoder")
    decoder = k.Sequential([
        k.Input(shape=(16,)), k.layers.Reshape((4, 4, 1)),
        k.layers.Conv2DTranspose(8, 3, activation="relu"), k.layers.Conv2DTranspose(8, 3, activation="relu"),
        k.layers.UpSampling2D(3), k.layers.Conv2DTranspose(4, 3, activation="relu"), k.layers.Conv2DTranspose(1, 3),
    ], name="decoder")
    inputs = k.Input(shape=(28, 28, 1), name="img")
    return k.Model(inputs, decoder(encoder(inputs)), name="autoencoder")


def _nested_data():
    x, _ = images(N, (28, 28, 1), 2, seed=5)
    return x, x, None


def _subclassed(k):
    model = classes_of(k).ResidualMLP(hidden=32, classes=3, name="residual_mlp")
    model(np.zeros((1, 12), "float32"))
    return model


def _no_gradient(k):
    model = classes_of(k).TemperatureClassifier(classes=3, name="temperature_classifier")
    model(np.zeros((1, 12), "float32"))
    return model


def _vectors(seed: int = 6, features: int = 12, classes: int = 3, weights: bool = False):
    x = np.random.RandomState(seed).normal(size=(N, features)).astype("float32")
    sample_weight = np.linspace(0.5, 1.5, N).astype("float32") if weights else None
    return x, ranked_labels(x[:, 0] - x[:, 1], classes), sample_weight


def _ticket(k, as_dict: bool):
    """Keras guide "The Functional API", multiple inputs and outputs (ticket priority and department)."""
    title = k.Input(shape=(None,), dtype="int32", name="title")
    body = k.Input(shape=(None,), dtype="int32", name="body")
    tags = k.Input(shape=(6,), name="tags")
    title_features = k.layers.LSTM(8)(k.layers.Embedding(50, 8)(title))
    body_features = k.layers.LSTM(4)(k.layers.Embedding(50, 8)(body))
    h = k.layers.concatenate([title_features, body_features, tags])
    priority = k.layers.Dense(1, name="priority")(h)
    department = k.layers.Dense(4, name="department")(h)
    outputs = {"priority": priority, "department": department} if as_dict else [priority, department]
    return k.Model([title, body, tags], outputs, name="ticket_classifier")


def _ticket_data(as_dict: bool):
    title, _ = tokens(N, 6, 50, seed=7)
    body, _ = tokens(N, 10, 50, seed=8)
    tags = (np.random.RandomState(9).rand(N, 6) > 0.5).astype("float32")
    priority = (title.sum(axis=1) > np.median(title.sum(axis=1))).astype("float32")[:, None]
    department = np.eye(4, dtype="float32")[ranked_labels(body.sum(axis=1) + tags.sum(axis=1), 4)]
    weights = np.linspace(0.5, 1.5, N).astype("float32")
    if as_dict:
        y = {"priority": priority, "department": department}
        return [title, body, tags], y, {"priority": weights, "department": weights[::-1].copy()}
    return [title, body, tags], [priority, department], weights


def _ticket_losses(k, as_dict: bool):
    losses = [k.losses.BinaryCrossentropy(from_logits=True), k.losses.CategoricalCrossentropy(from_logits=True)]
    return dict(zip(("priority", "department"), losses)) if as_dict else losses


def _imbalanced(k):
    return k.Sequential([
        k.Input(shape=(30,)), k.layers.Dense(32, activation="relu"), k.layers.Dense(32, activation="relu"),
        k.layers.Dropout(0.0), k.layers.Dense(1, activation="sigmoid"),
    ], name="fraud_mlp")


def _imbalanced_data():
    x = np.random.RandomState(10).normal(size=(N, 30)).astype("float32")
    return x, (x[:, 0] > 1.0).astype("float32")[:, None], None


def _softmax_cnn(k):
    return k.Sequential([
        k.Input(shape=(12, 12, 1)), k.layers.Conv2D(8, 3, activation="relu"), k.layers.MaxPooling2D(2),
        k.layers.Conv2D(16, 3, activation="relu"), k.layers.MaxPooling2D(2), k.layers.Flatten(),
        k.layers.Dropout(0.0), k.layers.Dense(10, activation="softmax"),
    ], name="mnist_convnet")


def _saturated_data():
    # Large inputs and labels unrelated to them: the softmax saturates with a true-class probability
    # near zero, where the loss from probabilities (clipped) and from logits part.
    x = np.random.RandomState(11).uniform(0, 40, (N, 12, 12, 1)).astype("float32")
    return x, np.eye(10, dtype="float32")[np.random.RandomState(12).randint(0, 10, N)], None


def _timeseries(k):
    inputs = k.Input(shape=(32, 1))
    h = inputs
    for _ in range(3):
        h = k.layers.Conv1D(filters=8, kernel_size=3, padding="same")(h)
        h = k.layers.BatchNormalization()(h)
        h = k.layers.ReLU()(h)
    h = k.layers.GlobalAveragePooling1D()(h)
    return k.Model(inputs, k.layers.Dense(2, activation="softmax")(h), name="timeseries_fcn")


def _timeseries_data():
    rng = np.random.RandomState(13)
    x = rng.normal(size=(N, 32, 1)).astype("float32")
    return x, ranked_labels(np.abs(np.diff(x[:, :, 0], axis=1)).mean(axis=1), 2), None


def _mixed_mlp(k):
    inputs = k.Input(shape=(32,))
    h = k.layers.Dense(64, activation="relu")(inputs)
    h = k.layers.Dense(64, activation="relu")(h)
    h = k.layers.Dense(10)(h)
    return k.Model(inputs, k.layers.Activation("softmax", dtype=output_dtype(k))(h), name="mixed_mlp")


def _custom_step(k):
    inputs = k.Input(shape=(12,))
    h = k.layers.Dense(16, activation="relu")(inputs)
    return clipped_step_class(k)(inputs, k.layers.Dense(3)(h), name="clipped_step")


def _accuracy(k):
    return ["accuracy"]


ENTRIES = (
    ZooEntry("text_bilstm", "keras-io: Bidirectional LSTM on IMDB", "Embedding(50, 16, mask_zero=True), "
             "Bidirectional(LSTM(8)), sigmoid; 12 tokens, zero-padded", _text_bilstm, _text_data,
             lambda k: k.losses.BinaryCrossentropy(), adam, metrics=_accuracy),
    ZooEntry("transformer_encoder", "keras-io: Text classification with Transformer", "maxlen 12, vocab 50, "
             "embed 16, 2 heads, ff 16, softmax over 2", _transformer, _transformer_data,
             partial(sparse_ce, from_logits=False), adam, metrics=_accuracy),
    ZooEntry("seq2seq_masked", "Keras guide: Understanding masking & padding (Masking -> LSTM -> TimeDistributed)",
             "8 steps x 4 features, zero-padded, LSTM(16, return_sequences=True), 5 classes per step",
             _seq2seq, _seq2seq_data, sparse_ce, sgd, epochs=2),
    ZooEntry("siamese", "keras-io: Image similarity with a Siamese network and contrastive loss",
             "12x12 pairs, shared tower (BN, Conv2D(4), Dense(10)), Euclidean distance, sigmoid",
             _siamese, _siamese_data, _contrastive, adam),
    ZooEntry("nested_autoencoder", "Keras guide: The Functional API (models are callable: encoder/decoder)",
             "28x28x1, encoder Model + decoder Sequential nested in a Model, mse", _nested, _nested_data,
             lambda k: "mse", sgd),
    ZooEntry("subclassed_mlp", "Keras guide: Making new layers and models via subclassing",
             "keras.Model subclass with get_config: Dense(32), residual Dense(32), LayerNormalization, 3 logits",
             _subclassed, _vectors, sparse_ce, sgd, metrics=_accuracy, fast=True),
    ZooEntry("subclassed_no_gradient", "Keras guide: subclassing; a temperature fitted after training",
             "keras.Model subclass whose trainable temperature gets no gradient (stop_gradient)",
             _no_gradient, partial(_vectors, 14), sparse_ce, sgd),
    ZooEntry("multi_io_list", "Keras guide: The Functional API, multiple inputs and outputs",
             "3 inputs (title, body, tags), Embedding + LSTM, 2 outputs; list losses, loss_weights [1.0, 0.2], "
             "sample_weight", partial(_ticket, as_dict=False), partial(_ticket_data, False),
             partial(_ticket_losses, as_dict=False), adam, loss_weights=[1.0, 0.2]),
    ZooEntry("multi_io_dict", "Keras guide: The Functional API, multiple inputs and outputs",
             "as multi_io_list with dict outputs, losses, loss_weights and per-output sample weights",
             partial(_ticket, as_dict=True), partial(_ticket_data, True), partial(_ticket_losses, as_dict=True),
             adam, loss_weights={"priority": 1.0, "department": 0.2}),
    ZooEntry("imbalanced_class_weight", "keras-io: Imbalanced classification (credit card fraud)",
             "30 features, Dense(32) x2, sigmoid; class_weight {0: 1, 1: 6}", _imbalanced, _imbalanced_data,
             lambda k: k.losses.BinaryCrossentropy(), adam,
             metrics=lambda k: [k.metrics.Precision(), k.metrics.Recall()], class_weight={0: 1.0, 1: 6.0},
             fast=True),
    ZooEntry("softmax_cnn", "keras-io: Simple MNIST convnet", "12x12x1, Conv2D(8)/(16), softmax over 10, "
             "categorical_crossentropy on probabilities; saturated (inputs up to 40, random labels)",
             _softmax_cnn, _saturated_data, lambda k: k.losses.CategoricalCrossentropy(), adam,
             metrics=_accuracy, epochs=2, fast=True),
    ZooEntry("timeseries_fcn", "keras-io: Timeseries classification from scratch (FCN)",
             "32 steps, 3 x (Conv1D(8), BatchNormalization, ReLU), GAP, softmax over 2",
             _timeseries, _timeseries_data, partial(sparse_ce, from_logits=False), adam, metrics=_accuracy,
             fast=True),
    ZooEntry("mixed_float16", "Keras guide: Mixed precision", "Dense(64) x2, Dense(10), float32 softmax; "
             "policy mixed_float16 (loss scaling)", _mixed_mlp, partial(_vectors, 15, 32, 10),
             partial(sparse_ce, from_logits=False), adam, policy="mixed_float16"),
    ZooEntry("mixed_bfloat16", "Keras guide: Mixed precision", "as mixed_float16 under mixed_bfloat16",
             _mixed_mlp, partial(_vectors, 16, 32, 10), partial(sparse_ce, from_logits=False), sgd,
             policy="mixed_bfloat16"),
    ZooEntry("custom_train_step", "Keras guide: Customizing what happens in fit()",
             "Functional keras.Model subclass with its own train_step (clips gradients by global norm)",
             _custom_step, partial(_vectors, 17), sparse_ce, sgd, fast=True),
)
