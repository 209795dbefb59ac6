"""Which Keras the user's models are, decided without importing TensorFlow.

Three setups share one TensorFlow API and differ in Keras:

- Keras 3 (``keras`` >= 3; TF 2.16 and later by default): what harness's
  parallel core is written for.
- TF 2.15 and older: the ``keras`` package is Keras 2 (``tf.keras``).
- ``TF_USE_LEGACY_KERAS=1`` with ``tf-keras`` installed: ``tf.keras`` is
  Keras 2 (``tf_keras``) even though ``import keras`` still gives Keras 3; the
  user's models are then Keras 2 models.

Which Keras a model and the environment are is decided here; the parallel
steps are written once, and what the generations spell differently sits in
``harness.parallel.adapters`` (what Keras 2 cannot train exactly is refused
with ``Keras2NotSupported``, naming it).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

from harness.errors import Refused

__all__ = ["KerasFlavour", "keras_flavour", "flavour_of", "Keras2NotSupported", "is_keras2_model",
           "keras_module_of", "keras_module_name", "set_random_seed", "releasing_traced_graphs", "callback_class",
           "copy_optimizer", "new_optimizer"]


class Keras2NotSupported(Refused, RuntimeError):
    """Raised where a harness feature needs Keras 3 and the model is a Keras 2 one: harness' own refusal
    (``Refused(reason, message)``; a ``RuntimeError`` too, as it always was)."""


@dataclass(frozen=True)
class KerasFlavour:
    major: int  # 2 or 3
    package: str  # "keras" or "tf-keras"
    version: str
    why: str  # how it was decided, for messages and `harness env`


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)(?:\.(\d+))?", version)
    return (int(match[1]), int(match[2] or 0)) if match else (0, 0)


def flavour_of(tf_version: str | None, keras_version: str | None, tf_keras_version: str | None,
               legacy: str | None) -> str | None:
    """``"keras3"``, ``"tf_keras"`` (Keras 2 as the tf-keras package) or ``"keras2"``: what ``tf.keras`` is."""
    if tf_version is not None and _major_minor(tf_version) < (2, 16):
        return "keras2"  # before TF 2.16, tf.keras is Keras 2 whatever else is installed
    if tf_version is not None and legacy in ("1", "true", "True"):  # TensorFlow's own test of the variable
        return "tf_keras"
    if keras_version is not None:
        return "keras3" if _major_minor(keras_version) >= (3, 0) else "keras2"
    return "tf_keras" if tf_keras_version is not None else None


def keras_flavour(environ=None) -> KerasFlavour:
    """The Keras that ``tf.keras`` is, from installed versions and the environment (no TF import).

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    tf = _version("tensorflow") or _version("tensorflow-cpu")
    keras, tf_keras = _version("keras"), _version("tf-keras")
    legacy = environ.get("TF_USE_LEGACY_KERAS")
    flavour = flavour_of(tf, keras, tf_keras, legacy)
    if flavour == "tf_keras":
        return KerasFlavour(2, "tf-keras", tf_keras or "", f"TF_USE_LEGACY_KERAS={legacy} with TensorFlow {tf}: "
                                                           f"tf.keras is tf-keras {tf_keras or '(not installed)'}")
    if flavour == "keras2":
        return KerasFlavour(2, "keras", keras or "", f"TensorFlow {tf} with keras {keras}: Keras 2")
    return KerasFlavour(3, "keras", keras or "", f"keras {keras}" if keras else "no keras package installed")


_KERAS2_MODULES = ("tf_keras", "keras.engine", "keras.src.engine")  # tf-keras; Keras 2.13-2.15's own package


def is_keras2_model(model) -> bool:
    """True for a Keras 2 model (``tf_keras`` or TF <= 2.15's ``keras``), from its class, without imports."""
    return any(cls.__module__.startswith(_KERAS2_MODULES) for cls in type(model).__mro__)


def keras_module_of(model):
    """The Keras module ``model`` belongs to: ``tf_keras``, or ``keras`` (Keras 3, or Keras 2 on TF <= 2.15)."""
    import importlib

    return importlib.import_module(keras_module_name(model))


def keras_module_name(model) -> str:
    """``"tf_keras"`` or ``"keras"``: the name of ``keras_module_of(model)``, from its classes, without imports."""
    return "tf_keras" if any(cls.__module__.startswith("tf_keras") for cls in type(model).__mro__) else "keras"


def set_random_seed(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow, Keras 3 where installed, and every Keras 2 module already imported.

    Keras 2 (tf_keras, or TF 2.15's keras) keeps a seed generator of its own, which its
    ``utils.set_random_seed`` resets: once any code has called that, seeding TF alone no longer
    gives the same initial weights (a test that did made ``compare_training(seed=0)`` start from
    other weights in later tests of the same process).
    """
    import random
    import sys

    import numpy as np
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    keras = _version("keras")
    if keras and _major_minor(keras) >= (3, 0):
        import keras as keras3

        keras3.utils.set_random_seed(seed)
    for name in ("tf_keras", "keras"):
        module = sys.modules.get(name)
        if module is not None and not str(getattr(module, "__version__", "3")).startswith("3"):
            module.utils.set_random_seed(seed)


@contextlib.contextmanager
def releasing_traced_graphs() -> Iterator[None]:
    """Lets the graphs traced inside the block be freed once nothing else holds them.

    Every ``tf.custom_gradient`` called while a graph is traced registers its gradient function in
    TensorFlow's global gradient registry, under a new ``CustomGradient-<uid>`` name, for the life
    of the process. Keras' optimizers all-reduce the gradients through one in every traced train
    step (``ReplicaContext.all_reduce``, TF 2.12-2.21, also without a strategy), and the function
    holds the step's gradient tensors, so each traced step's whole graph stays in memory: about
    0.5 GB per zoo model in a process that trains many models. Names registered inside
    the block are removed at its end; the models trained there are not differentiated through
    again. A TensorFlow without that registry is left alone.
    """
    from tensorflow.python.framework import ops  # TF's private registry: checked on TF 2.15 and 2.21

    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    before = set(registry) if isinstance(registry, dict) else None
    try:
        yield
    finally:
        if before is not None and isinstance(registry, dict):
            for name in [n for n in registry if n not in before and n.startswith("CustomGradient-")]:
                del registry[name]


def callback_class(public: type, mixin: type, k) -> type:
    """``public`` (a callback of the ``keras`` package) as a callback of Keras module ``k``: itself where it
    already is one, else ``mixin`` (what it does) on ``k.callbacks.Callback`` (a ``tf_keras`` ``fit`` takes its
    own callbacks only)."""
    if issubclass(public, k.callbacks.Callback):
        return public
    return type(public.__name__, (mixin, k.callbacks.Callback),
                {"__doc__": public.__doc__, "__module__": public.__module__})


def copy_optimizer(optimizer):
    """A new optimizer with ``optimizer``'s settings (from its config), made in the current scope.

    A loss-scaling wrapper's inner optimizer is copied by its own class and wrapped again:
    tf_keras 2.13-2.21's ``LossScaleOptimizer.from_config`` deserialises some inner optimizers
    (``Adafactor``) to a string, then refuses it.
    """
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return optimizer.__class__.from_config(optimizer.get_config())
    config = {key: value for key, value in optimizer.get_config().items() if key != "inner_optimizer"}
    return optimizer.__class__(copy_optimizer(inner), **config)


def new_optimizer(optimizer, k):
    """A new optimizer of Keras module ``k`` from a name, an optimizer (copied) or a factory (called)."""
    if callable(optimizer) and not isinstance(optimizer, k.optimizers.Optimizer):
        return optimizer()
    if isinstance(optimizer, k.optimizers.Optimizer):
        return copy_optimizer(optimizer)
    return k.optimizers.get(optimizer)
