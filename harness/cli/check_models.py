"""What ``harness check`` trains: the models ``--models`` names, each with its data, loss and optimizer.

A built-in equivalence model (``harness.bench.workloads.small``) trains with ``--optimizer``
(default sgd); a model of the user's (``--models path/to/file.py:build``, ``MODULE:ATTR``, or a
``harness.Workload``: docs/user-models.md) with its own compiled loss, metrics and optimizer
(``--optimizer`` replaces the optimizer), on batches made up from its inputs and loss or read
from ``--data``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.bench.workloads import FORMS
from harness.bench.workloads.small import EQUIVALENCE_MODELS
from harness.errors import InvalidValue

__all__ = ["Subject", "subject_of", "model_choice", "optimizer_factory", "precheck"]


def model_choice(value: str) -> str:
    """A ``--models`` entry: a built-in equivalence model, or a reference to the user's (checked when looked up)."""
    if value in EQUIVALENCE_MODELS or ":" in value:
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(EQUIVALENCE_MODELS)}, or "
                                     f"give your own model as {FORMS})")


def precheck(args) -> None:
    """Looks the user's models up (``--data`` too) before the devices are set up: a bad reference is one line.

    Raises:
        InvalidValue: a bad reference (``harness.bench.workloads.user``); ``--data`` with a built-in model.
    """
    from harness.bench import workloads

    for name in args.models:
        if workloads.is_reference(name):
            workloads.get(name, args.data)
        elif args.data is not None:
            raise _data_for_builtin(args.data, name)


def _data_for_builtin(data: str, name: str) -> InvalidValue:
    return InvalidValue(f"--data {data!r} is data for a model of your own (--models {FORMS}); the built-in model "
                        f"{name!r} makes its own")


def optimizer_factory(spec: str):
    """A factory of new Keras 3 optimizers from ``NAME`` or ``NAME:key=value,...`` (``adam:global_clipnorm=0.05``).

    Raises:
        ValueError: a value that is not a Python literal, or a setting without ``=``.
    """
    import ast

    name, _, settings = spec.partition(":")
    config = {}
    for item in filter(None, (part.strip() for part in settings.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidValue(f"--optimizer settings are key=value pairs; got {item!r} in --optimizer {spec!r}")
        try:
            config[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError) as err:
            raise InvalidValue(f"--optimizer setting {key.strip()}={value.strip()!r} is not a number, True/False or "
                               f"None (in --optimizer {spec!r})") from err

    def make():
        import keras

        # The name's optimizer, then its config with the settings: Keras 2.15's get() of a config dict makes a
        # legacy optimizer (its `variables` a method), where get() of the name makes the current one.
        optimizer = keras.optimizers.get(name.strip())
        return type(optimizer).from_config({**optimizer.get_config(), **config}) if config else optimizer

    make.__name__ = spec
    return make


@dataclass(frozen=True)
class Subject:
    """What ``harness check`` trains for one ``--models`` entry: a built-in equivalence model or the user's own."""

    build: Callable[[], Any]
    data: Callable[[int], tuple]  # samples -> (x, y, sample_weight)
    optimizer: Callable[[], Any]  # a factory of new optimizers
    loss: Any
    metrics: Callable[[], Any]  # a factory of new metrics (a metric object counts for one model only)
    loss_weights: Any = None

    def compile_args(self, model) -> dict:
        """What a model of this subject is compiled with (a new optimizer and new metrics)."""
        return {"optimizer": self.optimizer(), "loss": self.loss, "metrics": self.metrics(),
                **({"loss_weights": self.loss_weights} if self.loss_weights is not None else {})}


def subject_of(args, name: str) -> Subject:
    """A built-in model with ``--optimizer`` (default sgd), or a model of the user's (``--models file.py:build``):
    its compiled loss, metrics and optimizer (copies of the first model's; ``--optimizer`` replaces it), its
    batches made up from its inputs and loss or read from ``--data``.

    Raises:
        InvalidValue: ``--data`` with a built-in model; a bad reference, a model without a loss, batches that cannot
            be inferred (``harness.bench.workloads.user``).
    """
    from harness.bench import workloads
    from harness.bench.workloads import small

    if not workloads.is_reference(name):
        if args.data is not None:
            raise _data_for_builtin(args.data, name)
        return Subject(functools.partial(small.build, name), functools.partial(small.make_data, name),
                       optimizer_factory(args.optimizer or "sgd"), small.loss(), lambda: ["accuracy"])
    workload = workloads.get(name, args.data)
    compiled = workload.compile_args(workload.build("tiny", seed=0))  # the first model: its compiled arguments

    def data(samples: int) -> tuple:
        return (*workload.make_data("tiny", samples, seed=0), None)

    return Subject(functools.partial(workload.build, "tiny", 0), data,
                   optimizer_factory(args.optimizer) if args.optimizer else workload.optimizer, compiled["loss"],
                   workload.metrics, compiled.get("loss_weights"))
