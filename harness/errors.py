"""The errors harness raises on purpose, each explained in its message.

A :class:`HarnessError` is a failure harness diagnosed itself: its message names the bad value,
the missing thing or what is not supported, and says what to do. Anything else that escapes
harness (a ``KeyError``, an error from TensorFlow or Keras that harness did not expect) is a bug
or an unforeseen case, and the ``harness`` command says so (with the traceback).

Exit statuses follow pytest's convention (:func:`exit_status`), so that a gate can tell "no verdict" from
"a regression": ``EXIT_OK`` 0; ``EXIT_VERDICT`` 1, a negative verdict (not equivalent, a regression, a failed
check); ``EXIT_USAGE`` 2, a usage error or bad input (one line naming the value: :class:`InvalidValue`,
:class:`InvalidType`, :class:`Refused`, :class:`Unavailable`); ``EXIT_NO_VERDICT`` 3, no verdict: a step that
failed (:class:`Failed`: a benchmark or asv that crashed, an engine that did not answer, nothing measured where
something was asked) or an internal error (any other exception, its traceback printed).

Each subclass also derives from the built-in exception it replaces, so ``except ValueError``
and ``pytest.raises(ValueError)`` still catch an :class:`InvalidValue` or a :class:`Refused`:

- :class:`InvalidValue` (a ``ValueError``): a bad argument, option or input file value;
- :class:`InvalidType` (a ``TypeError``): an argument of the wrong type;
- :class:`Unavailable` (a ``RuntimeError``): something the environment lacks (an optional
  package, a Docker engine, enough devices, a Keras generation);
- :class:`Failed` (a ``RuntimeError``): a step harness ran failed or cannot go on (a
  subprocess' exit status, workers that disagree), diagnosed;
- :class:`Refused` (a ``ValueError``): harness deliberately does not support something, with a
  short machine-readable :attr:`Refused.reason` besides the message (:class:`NotSupported`: one
  that is a ``NotImplementedError`` too).

This module imports nothing of harness and no TensorFlow (the bottom layer, docs/design.md).
"""

from __future__ import annotations

import re

__all__ = ["HarnessError", "InvalidValue", "InvalidType", "Unavailable", "Failed", "Refused", "NotSupported",
           "EXIT_OK", "EXIT_VERDICT", "EXIT_USAGE", "EXIT_NO_VERDICT", "exit_status", "REFUSALS"]

EXIT_OK = 0
EXIT_VERDICT = 1  # a negative verdict: not equivalent, a regression, a failed check
EXIT_USAGE = 2  # a usage error or bad input, one line naming the value
EXIT_NO_VERDICT = 3  # no verdict: a step that failed (infrastructure) or an internal error (a bug)


def exit_status(err: BaseException) -> int:
    """The exit status for an exception that ends a command: ``EXIT_NO_VERDICT`` for :class:`Failed` and for
    anything harness did not diagnose, ``EXIT_USAGE`` for every other :class:`HarnessError`.

    Examples:
        >>> [exit_status(err) for err in (InvalidValue("got ratios=[3, -1]"), Failed("asv failed"), KeyError())]
        [2, 3, 3]
    """
    if isinstance(err, HarnessError) and not isinstance(err, Failed):
        return EXIT_USAGE
    return EXIT_NO_VERDICT


class HarnessError(Exception):
    """A failure harness diagnosed itself; the message says what was wrong (the value, the missing thing)."""


class InvalidValue(HarnessError, ValueError):
    """A bad argument, option or input value; the message names it (``got ratios=[3, -1]``)."""


class InvalidType(HarnessError, TypeError):
    """An argument of the wrong type; the message names it and the type wanted."""


class Unavailable(HarnessError, RuntimeError):
    """Something the environment lacks: an optional package or extra, a Docker engine, enough devices,
    a Keras generation that is not installed."""


class Failed(HarnessError, RuntimeError):
    """A step harness ran failed or cannot go on, diagnosed: a subprocess' exit status, workers that
    read different checkpoints, TensorFlow initialised before the devices were laid out. No verdict
    comes of it: the command exits ``EXIT_NO_VERDICT`` (3), never as a negative verdict or a pass."""


_REASON = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")

# Every Refused reason id harness raises, with what it refuses: the ids a workload's ``expect`` (harness.toml) and
# the zoo's pins name. tests/unit/test_errors.py checks the list against the raises in harness' source.
REFUSALS = {
    "custom-train-step": "a method that cannot run a model's own train_step",
    "towers-unsupported-layer": "a layer the towers method cannot split (e.g. one that keeps state across calls)",
    "optimizer-drifts": "an optimizer that does not step as on one device under a method",
    "unsynchronised-batchnorm": "BatchNormalization whose statistics a method cannot take over the whole batch",
    "subclassed-batchnorm": "whole-batch BatchNormalization in a model that is not a functional graph",
    "unbuilt-subclassed-model": "a subclassed model that is not built, so its layers cannot be cloned",
    "not-cloneable": "a model that cannot be cloned onto each device",
    "jit-compile": "jit_compile=True, which the method cannot place per device",
    "float64-loss": "a float64 reference with a loss that cannot compute in float64",
    "float64-low-precision": "a float64 reference of a model whose layers fix a lower precision themselves",
    "no-tuned-split": "a global batch the devices cannot hold together",
    "files-exist": "harness init over files it did not write",
    "custom-step-call": "a model's own step that calls a model with more than one batch argument (towers)",
    "custom-step-nested": "a model's own step run by towers inside another split step",
    "custom-step-unsplit": "a model's own step that calls none of its models (towers)",
    "keras2-batchnorm": "whole-batch BatchNormalization a method cannot give a Keras 2 model",
    "masked-batchnorm": "BatchNormalization over masked inputs, not synchronised across towers",
    "sparse-layout": "embedding lookups whose rows harness cannot attribute to the single device's",
    "sparse-lookups-differ": "devices whose sparse gradients hold different lookups (not the same model traced)",
    # Keras 3 on JAX (harness.parallel.jax, harness.bench.jaxbench): what is TensorFlow's or not built there yet
    "jax-method": "a method other than towers on Keras' JAX backend (mirrored is TensorFlow's MirroredStrategy)",
    "jax-batchnorm": "a BatchNormalization whose whole-batch statistics JAX towers cannot share: moments of its own (a "
                     "subclass's _moments), or computed inside a JAX transformation of the forward pass",
    "jax-stateful-layer": "a layer that updates state other than a seed generator's or BatchNormalization's moving "
                          "statistics in training, on JAX devices",
    "jax-jit-compile": "jit_compile=True on JAX, which would make the whole step one program on one device",
    "jax-emulated-link": "an emulated device's link on JAX (links are modelled on TensorFlow's methods)",
    "jax-cluster": "several workers on JAX (harness across workers runs TensorFlow's collectives)",
    "jax-workload": "a workload whose data goes through tf.data, run on --backend jax",
}


class Refused(HarnessError, ValueError):
    """Harness deliberately does not support something (a model with its own ``train_step``, a sparse
    layout, an optimizer that drifts under a method); ``str()`` is the message.

    Args:
        reason: a short kebab-case id of what is refused (``"custom-train-step"``), for programs
            that sort refusals; stable across versions.
        message: what is refused and why, for people.

    Raises:
        InvalidValue: ``reason`` is not a kebab-case id.

    Examples:
        >>> err = Refused("custom-train-step", "method='mirrored' cannot train 'net': it has its own train_step")
        >>> err.reason, str(err)
        ('custom-train-step', "method='mirrored' cannot train 'net': it has its own train_step")
    """

    def __init__(self, reason: str, message: str):
        if not isinstance(reason, str) or not _REASON.fullmatch(reason):
            raise InvalidValue(f"a refusal's reason is a kebab-case id like 'custom-train-step'; got reason={reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self):  # pickles (multiprocessing, pytest-xdist) with both arguments
        return type(self), (self.reason, self.message)

    def __str__(self) -> str:
        return self.message


class NotSupported(Refused, NotImplementedError):
    """A :class:`Refused` that is a ``NotImplementedError`` too: the refusals harness raised as one before
    (a model with its own ``train_step``, masked inputs to a synchronised BatchNormalization)."""
