"""The zoo's optimizer axis: every built-in optimizer of a Keras generation x the options people train with.

Two models carry the axis: ``mlp`` (dense, the issue-30 MLP 10-32-16-3 with a softmax; every
weight's gradient dense) and ``causal_lm`` (a causal Transformer language model: token and
position lookups whose position ids are broadcast to the batch's shape, causal
MultiHeadAttention, per-token logits; sparse gradients). Each case is an optimizer (``OPTIMIZERS``)
with one option (``OPTIONS``): gradient clipping of three kinds, gradient accumulation, EMA with
overwrites, weight decay, a learning-rate schedule with warm-up, loss scaling, mixed precision.
An optimizer a Keras generation lacks, or an option its constructor does not take (Keras 2 has no
``gradient_accumulation_steps``), is not a case there (``applicable``); nor is what Keras cannot
train on one device (``UPSTREAM``). A case whose float64 reference Keras cannot train
(``NO_FLOAT64``) is judged by the tolerance alone.

Nothing here imports TensorFlow or Keras at import time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from harness.bench.zoo.custom import classes_of
from harness.bench.zoo.entry import ZooEntry, is_keras3, output_dtype, ranked_labels, sparse_ce
from harness.errors import InvalidValue

__all__ = ["OPTIMIZERS", "OPTIONS", "MODELS", "AxisCase", "cases", "make_optimizer", "applicable", "FAST", "UPSTREAM",
           "NO_FLOAT64"]


@dataclass(frozen=True)
class OptimizerSpec:
    """A built-in optimizer with the settings the axis trains it with."""

    cls: str  # the class name in ``k.optimizers``
    kwargs: dict = dataclasses.field(default_factory=dict)  # learning_rate first


@dataclass(frozen=True)
class OptionSpec:
    """A setting added to any optimizer: constructor arguments, a learning-rate schedule, loss scaling or a
    dtype policy."""

    kwargs: dict = dataclasses.field(default_factory=dict)
    schedule: bool = False  # learning_rate becomes a CosineDecay with warm-up to it
    loss_scale: bool = False  # wrapped in a LossScaleOptimizer (float32 model)
    policy: str | None = None  # the model built under this dtype policy (compile wraps the optimizer)


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "sgd": OptimizerSpec("SGD", {"learning_rate": 0.05, "momentum": 0.9}),
    "sgd_nesterov": OptimizerSpec("SGD", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True}),
    "adam": OptimizerSpec("Adam", {"learning_rate": 0.01}),
    "adam_amsgrad": OptimizerSpec("Adam", {"learning_rate": 0.01, "amsgrad": True}),
    "adamw": OptimizerSpec("AdamW", {"learning_rate": 0.01, "weight_decay": 0.05}),
    "adamax": OptimizerSpec("Adamax", {"learning_rate": 0.01}),
    "nadam": OptimizerSpec("Nadam", {"learning_rate": 0.01}),
    "rmsprop": OptimizerSpec("RMSprop", {"learning_rate": 0.005}),
    "rmsprop_centered": OptimizerSpec("RMSprop", {"learning_rate": 0.005, "momentum": 0.5, "centered": True}),
    "adagrad": OptimizerSpec("Adagrad", {"learning_rate": 0.05}),
    "adadelta": OptimizerSpec("Adadelta", {"learning_rate": 1.0}),
    "adafactor": OptimizerSpec("Adafactor", {"learning_rate": 0.01}),
    "ftrl": OptimizerSpec("Ftrl", {"learning_rate": 0.05, "l1_regularization_strength": 0.001,
                                   "l2_regularization_strength": 0.001}),
    "lion": OptimizerSpec("Lion", {"learning_rate": 0.002}),
    "lamb": OptimizerSpec("Lamb", {"learning_rate": 0.01}),
    "muon": OptimizerSpec("Muon", {"learning_rate": 0.01}),
    "schedule_free_adamw": OptimizerSpec("ScheduleFreeAdamW", {"learning_rate": 0.01}),
}

OPTIONS: dict[str, OptionSpec] = {
    "plain": OptionSpec(),
    "clipnorm": OptionSpec({"clipnorm": 0.05}),
    "clipvalue": OptionSpec({"clipvalue": 0.01}),
    "global_clipnorm": OptionSpec({"global_clipnorm": 0.05}),
    "accumulation": OptionSpec({"gradient_accumulation_steps": 2}),
    "ema": OptionSpec({"use_ema": True, "ema_momentum": 0.9, "ema_overwrite_frequency": 3}),
    "weight_decay": OptionSpec({"weight_decay": 0.01}),
    "schedule": OptionSpec(schedule=True),
    "loss_scale": OptionSpec(loss_scale=True),
    "mixed_float16": OptionSpec(policy="mixed_float16"),
}


class NotApplicable(Exception):
    """An optimizer or option this Keras generation does not have."""


def make_optimizer(k, optimizer: str, option: str = "plain"):
    """A new ``optimizer`` of Keras module ``k`` with ``option``.

    Raises:
        KeyError: an unknown optimizer or option name.
        NotApplicable: ``k`` has no such optimizer, or its constructor does not take the option.
    """
    spec, extra = OPTIMIZERS[optimizer], OPTIONS[option]
    cls = getattr(k.optimizers, spec.cls, None)
    if cls is None:
        raise NotApplicable(f"{k.__name__} has no optimizers.{spec.cls}")
    kwargs = {**spec.kwargs, **extra.kwargs}
    if extra.schedule:
        top = kwargs["learning_rate"]
        kwargs["learning_rate"] = k.optimizers.schedules.CosineDecay(top / 4, decay_steps=6, warmup_target=top,
                                                                     warmup_steps=3)
    try:
        made = cls(**kwargs)
    except TypeError as err:  # e.g. Keras 2's optimizers have no gradient_accumulation_steps
        raise NotApplicable(f"{k.__name__}.optimizers.{spec.cls} takes no {sorted(extra.kwargs)}: {err}") from err
    if extra.loss_scale:
        wrapper = k.optimizers.LossScaleOptimizer if is_keras3(k) else k.mixed_precision.LossScaleOptimizer
        made = wrapper(made)
    return made


def applicable(k, optimizer: str, option: str) -> bool:
    """Whether Keras module ``k`` has ``optimizer`` and its constructor takes ``option``."""
    try:
        make_optimizer(k, optimizer, option)
    except NotApplicable:
        return False
    return True


# -- the two models ------------------------------------------------------------------------------

def _mlp(k):
    return k.Sequential([k.Input((10,)), k.layers.Dense(32, activation="relu"), k.layers.Dense(16, activation="relu"),
                         k.layers.Dense(3), k.layers.Activation("softmax", dtype=output_dtype(k))], name="mlp")


def _mlp_data():
    x = np.random.RandomState(30).normal(size=(57, 10)).astype("float32")  # batch 16: a last batch of 9
    return x, ranked_labels(x[:, 0] + x[:, 1] - x[:, 2], 3), None


LENGTH, VOCAB = 8, 20


def _causal_lm(k):
    c = classes_of(k)
    tokens = k.Input((LENGTH,), dtype="int32")
    h = c.TokenAndPositionIds(LENGTH, VOCAB, 16)(tokens)
    # No biases: the key bias gets an exactly zero gradient (softmax ignores a shift of a row's logits), whose
    # rounding noise Lion's sign() turns into whole steps in any two runs, float64 included (8.0e-03 apart
    # after 4 steps, parallel or not): a rounding floor the float64 reference cannot tell from drift.
    attended = k.layers.MultiHeadAttention(num_heads=2, key_dim=8, use_bias=False)(h, h, use_causal_mask=True)
    h = k.layers.LayerNormalization()(h + attended)
    logits = k.layers.Dense(VOCAB)(h)
    return k.Model(tokens, k.layers.Activation("linear", dtype=output_dtype(k))(logits), name="causal_lm")


def _causal_lm_data():
    rng = np.random.RandomState(31)
    x = rng.randint(1, VOCAB, (27, LENGTH)).astype("int32")  # batch 8: a last batch of 3
    y = np.roll(x, -1, axis=1)
    y[:, -1] = 0
    return x, y, None


MODELS: dict[str, ZooEntry] = {
    "mlp": ZooEntry("mlp", "the optimizer settings people train with",
                    "Dense(32) relu, Dense(16) relu, Dense(3), softmax; 57 samples, batch 16",
                    _mlp, _mlp_data, partial(sparse_ce, from_logits=False), lambda k: None, batch_size=16, epochs=2),
    "causal_lm": ZooEntry("causal_lm", "keras-io: Text generation with a miniature GPT",
                          f"token and position Embedding (position ids broadcast to the batch), causal "
                          f"MultiHeadAttention(2, 8, use_bias=False), LayerNorm, per-token logits; {LENGTH} tokens, "
                          f"vocab {VOCAB}, "
                          "27 samples, batch 8", _causal_lm, _causal_lm_data, sparse_ce, lambda k: None,
                          batch_size=8, epochs=2),
}

#: ``(model, optimizer, why)``: cases Keras itself cannot train on one device, left out of the axis (each one
#: checked to still fail in tests/upstream/test_optimizers.py)
UPSTREAM: tuple[tuple[str, str, str], ...] = (
    ("causal_lm", "rmsprop_centered", "Keras 3's RMSprop(centered=True) fails on one device on sparse rows with "
     "repeated ids (its sparse division's scatter_nd sums repeated positions, then gathers out of range)"),
)

#: ``(optimizer, option, why)``: cases whose float64 reference run Keras cannot train; judged by the tolerance alone
#: (exact or FAIL), checked to still fail in float64 in tests/upstream/test_optimizers.py
NO_FLOAT64: tuple[tuple[str, str, str], ...] = (
    ("muon", "schedule", "Keras 3's Muon multiplies its update by a schedule's float32 learning rate without a "
     "cast: a float64 model fails (Input 'y' of 'Mul' Op has type float64 that does not match type float32)"),
)

#: the default suite's cases: each optimizer plain on the dense model, each option with Adam on it and the
#: gradient-side ones with SGD, and on the language model Adam with the gradient-side options and the
#: row-sensitive optimizers plain
FAST: tuple[tuple[str, str, str], ...] = (
    tuple(("mlp", name, "plain") for name in OPTIMIZERS)
    + tuple(("mlp", "adam", option) for option in OPTIONS if option != "plain")
    + tuple(("mlp", "sgd", option) for option in ("clipnorm", "clipvalue", "global_clipnorm", "accumulation", "ema"))
    + tuple(("causal_lm", "adam", option) for option in ("plain", "clipnorm", "global_clipnorm", "accumulation",
                                                          "ema", "mixed_float16"))
    + tuple(("causal_lm", name, "plain") for name in ("rmsprop", "adagrad", "lion"))
    + (("causal_lm", "sgd", "clipnorm"),)
)


@dataclass(frozen=True)
class AxisCase:
    """One model with one optimizer and option: ``entry`` trains with them (``label``: ``optimizer/option``);
    ``float64``: whether a float64 reference can judge it (``NO_FLOAT64``)."""

    entry: ZooEntry
    optimizer: str
    option: str
    float64: bool = True

    @property
    def label(self) -> str:
        return f"{self.optimizer}/{self.option}"


def cases(k, models: Sequence[str] | None = None, optimizers: Sequence[str] | None = None,
          options: Sequence[str] | None = None, fast_only: bool = False) -> list[AxisCase]:
    """The axis' cases for Keras module ``k``: models x optimizers x options (default all), the ones ``k``
    has (``applicable``); ``fast_only``: only those in ``FAST``.

    Raises:
        ValueError: an unknown model, optimizer or option name (all of them named).
    """
    unknown = [f"model {m!r}" for m in models or () if m not in MODELS]
    unknown += [f"optimizer {o!r}" for o in optimizers or () if o not in OPTIMIZERS]
    unknown += [f"option {o!r}" for o in options or () if o not in OPTIONS]
    if unknown:
        raise InvalidValue(f"unknown {', '.join(unknown)}; models {list(MODELS)}, optimizers {list(OPTIMIZERS)}, "
                         f"options {list(OPTIONS)}")
    out = []
    for model in models or list(MODELS):
        for optimizer in optimizers or list(OPTIMIZERS):
            for option in options or list(OPTIONS):
                if fast_only and (model, optimizer, option) not in FAST:
                    continue
                if any((model, optimizer) == (m, o) and is_keras3(k) for m, o, _ in UPSTREAM):
                    continue
                if applicable(k, optimizer, option):
                    float64 = (optimizer, option) not in {(o, p) for o, p, _ in NO_FLOAT64}
                    out.append(AxisCase(_with(MODELS[model], optimizer, option), optimizer, option, float64))
    return out


def _with(entry: ZooEntry, optimizer: str, option: str) -> ZooEntry:
    make: Callable[[Any], Any] = partial(_made, optimizer=optimizer, option=option)
    return dataclasses.replace(entry, optimizer=make, policy=OPTIONS[option].policy)


def _made(k, optimizer: str, option: str):
    return make_optimizer(k, optimizer, option)
