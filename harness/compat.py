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

    random.seed(seed)
    np.random.seed(seed)
    if on_jax_backend():  # Keras 3 on JAX: no TensorFlow on this path (keras.utils.set_random_seed imports it)
        _seed_keras3(seed)
        return
    import tensorflow as tf

    tf.random.set_seed(seed)
    keras = _version("keras")
    if keras and _major_minor(keras) >= (3, 0):
        import keras as keras3

        keras3.utils.set_random_seed(seed)
    for name in ("tf_keras", "keras"):
        module = sys.modules.get(name)
        if module is not None and not str(getattr(module, "__version__", "3")).startswith("3"):
            module.utils.set_random_seed(seed)


def on_jax_backend() -> bool:
    """Whether Keras 3 runs on JAX here (``KERAS_BACKEND=jax`` or keras.json), read without importing TensorFlow: the
    path of ``harness.parallel.jax``, on which nothing of harness imports it."""
    import sys

    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend") and hasattr(keras.backend, "backend"):
        return bool(keras.backend.backend() == "jax")
    version = _version("keras")
    if not version or _major_minor(version) < (3, 0):
        return False
    import keras as keras3  # Keras 3 reads its backend from the environment when imported

    return bool(keras3.backend.backend() == "jax")


def _seed_keras3(seed: int) -> None:
    """``keras.utils.set_random_seed`` less its TensorFlow seed: the global seed Keras 3 draws initial weights and
    unseeded generators from, and its global generator dropped to be made again from it. Private Keras (checked on
    Keras 3.15: ``keras/src/utils/rng_utils.py``)."""
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    global_state.set_global_attribute("global_random_seed", seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)


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
    if on_jax_backend():  # Keras 3 on JAX: TensorFlow traces nothing (and is not imported on this path)
        yield
        return
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


def map_structure(fn, data):
    """``data`` (a leaf, or dicts, lists, tuples and named tuples of them) with ``fn`` applied to each leaf, the
    structure kept; None stays None. Framework-neutral (``tf.nest``/``keras.tree`` without importing either)."""
    if data is None:
        return None
    if isinstance(data, dict):
        return type(data)((key, map_structure(fn, value)) for key, value in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_structure(fn, value) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_structure(fn, value) for value in data)
    return fn(data)


def first_leaf(data):
    """The first leaf of ``data`` (``map_structure``'s structures; dicts in key order as ``tf.nest`` sorts them)."""
    while isinstance(data, (dict, list, tuple)):
        if isinstance(data, dict):
            data = data[sorted(data)[0]]
        else:
            data = data[0]
    return data


# Keras' own probe for an optional TensorFlow (``tf.available`` in its seeding and saving code, on any backend): it
# takes a failed import as "not installed". Its attempts are Keras', not the caller's.
KERAS_PROBE = "keras/src/utils/module_utils.py"


class TensorFlowBlocker:
    """Makes every import of TensorFlow in this process fail as if it were not installed, and records who tried
    (``block_tensorflow``): ``attempts``, each ``{"module", "from": "file:line", "keras_probe"}``."""

    def __init__(self, report=None):
        self.attempts: list[dict] = []
        self._report = report

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" and not name.startswith("tensorflow."):
            return None
        import traceback

        frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename and f.filename != __file__]
        where = frames[-1] if frames else None
        attempt = {"module": name, "from": f"{where.filename}:{where.lineno}" if where else None,
                   "keras_probe": bool(where and where.filename.replace("\\", "/").endswith(KERAS_PROBE))}
        self.attempts.append(attempt)
        if self._report is not None and not attempt["keras_probe"]:
            self._report(name, traceback.format_list(frames[-10:]))
        raise ModuleNotFoundError(f"No module named {name!r} (TensorFlow is blocked here)", name=name)

    @property
    def own(self) -> list[dict]:
        """The attempts that were not Keras' own probe for an optional TensorFlow."""
        return [a for a in self.attempts if not a["keras_probe"]]


def block_tensorflow(report=None) -> TensorFlowBlocker:
    """Blocks TensorFlow in this process (first on ``sys.meta_path``): the proof that a path runs without it (Keras 3
    on JAX). ``report(module, stack_lines)`` is called for each attempt that is not Keras' own probe. Call it before
    anything imports TensorFlow; an import already done is not undone.

    Examples:
        >>> blocker = block_tensorflow()
        >>> import keras  # with KERAS_BACKEND=jax
        >>> assert not blocker.own, blocker.own
    """
    import sys

    blocker = TensorFlowBlocker(report)
    sys.meta_path.insert(0, blocker)
    return blocker
