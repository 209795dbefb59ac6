"""One model-zoo entry, and what the entries share: optimizers, losses, data, dtype policies.

Nothing here imports TensorFlow or Keras at import time: every builder takes the Keras module
(``keras`` for Keras 3, ``tf_keras`` or TF 2.15's ``keras`` for Keras 2) as its argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ZooEntry", "is_keras3", "sgd", "adam", "sparse_ce", "images", "tokens", "ranked_labels"]


@dataclass(frozen=True)
class ZooEntry:
    """A real architecture at CPU size, with the data and training setup it is checked with.

    Attributes:
        name: short id (``--zoo-models NAME``).
        source: the public definition it follows.
        params: the size parameters chosen, in words.
        builder: ``builder(k) -> model``, a new built model of Keras module ``k``; use ``build``.
        data: ``data() -> (x, y, sample_weight)``, deterministic NumPy; the sample count is not a
            multiple of ``batch_size``, so every epoch ends on a partial batch.
        loss: ``loss(k)``: a loss (or list/dict of losses) of ``k``.
        optimizer: ``optimizer(k)``: a new optimizer of ``k`` (SGD with momentum or Adam).
        batch_size: the global batch.
        epochs: passes over the data.
        metrics: ``metrics(k)`` or None.
        loss_weights: list or dict, as ``compile`` takes it, or None.
        class_weight: as ``fit`` takes it, or None.
        policy: ``"mixed_float16"``/``"mixed_bfloat16"`` while building, or None.
        keras2: also checked on Keras 2 (tf-keras).
        fast: in the fast subset (the default test suite).
        validation: fit also evaluates the training data each epoch (``validation_data``): the ``val_`` losses and
            metrics are compared too (a model's own ``test_step``).
    """

    name: str
    source: str
    params: str
    builder: Callable[[Any], Any]
    data: Callable[[], tuple]
    loss: Callable[[Any], Any]
    optimizer: Callable[[Any], Any]
    batch_size: int = 10
    epochs: int = 1
    metrics: Callable[[Any], Any] | None = None
    loss_weights: list | dict | None = None
    class_weight: dict | None = None
    policy: str | None = None
    keras2: bool = True
    fast: bool = False
    validation: bool = False

    def build(self, k):
        """A new, built model of Keras module ``k``, under the entry's dtype policy (then restored)."""
        with _dtype_policy(k, self.policy):
            return self.builder(k)


def is_keras3(k) -> bool:
    """Keras 3 has ``keras.ops``; Keras 2 (``tf_keras``, TF 2.15's ``keras``) has not."""
    return hasattr(k, "ops")


@contextlib.contextmanager
def _dtype_policy(k, policy: str | None) -> Iterator[None]:
    # Only over the default float32: a float64 reference copy (compare_training(reference="float64")
    # builds under a float64 policy) must stay float64 instead of turning mixed.
    current = k.mixed_precision.global_policy().name
    if policy is None or current != "float32":
        yield
        return
    k.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        k.mixed_precision.set_global_policy(current)


def output_dtype(k) -> str | None:
    """``"float32"`` for the last layer under a mixed policy (the Keras mixed-precision guide), else the policy's."""
    return "float32" if k.mixed_precision.global_policy().name.startswith("mixed") else None


# -- training setup -------------------------------------------------------------------------------

def sgd(k):
    return k.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def adam(k):
    return k.optimizers.Adam(learning_rate=1e-3)


def sparse_ce(k, from_logits: bool = True):
    return k.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


# -- data -----------------------------------------------------------------------------------------

def ranked_labels(score: np.ndarray, classes: int) -> np.ndarray:
    """Balanced labels that follow ``score``: the i-th quantile of scores is class i (learnable)."""
    ranks = np.argsort(np.argsort(score, kind="stable"), kind="stable")
    return (ranks * classes // len(score)).astype("int32")


def images(n: int, shape: tuple[int, ...], classes: int, low: float = 0.0, high: float = 1.0, seed: int = 0):
    """``n`` images of ``shape`` in ``[low, high)`` and labels from their top-minus-bottom brightness."""
    x = np.random.RandomState(seed).uniform(low, high, (n, *shape)).astype("float32")
    half = shape[0] // 2
    score = x[:, :half].mean(axis=tuple(range(1, x.ndim))) - x[:, half:].mean(axis=tuple(range(1, x.ndim)))
    return x, ranked_labels(score, classes)


def tokens(n: int, length: int, vocab: int, seed: int = 0, min_length: int = 2):
    """``n`` int32 token rows, zero-padded at the end to ``length``; and each row's true length."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(min_length, length + 1, n)
    x = rng.randint(1, vocab, (n, length)).astype("int32")
    x[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return x, lengths
