"""Which Keras the user's models are, decided without importing TensorFlow.

Three setups share one TensorFlow API and differ in Keras:

- Keras 3 (``keras`` >= 3; TF 2.16 and later by default): what harness's
  parallel core is written for.
- TF 2.15 and older: the ``keras`` package is Keras 2 (``tf.keras``).
- ``TF_USE_LEGACY_KERAS=1`` with ``tf-keras`` installed: ``tf.keras`` is
  Keras 2 (``tf_keras``) even though ``import keras`` still gives Keras 3; the
  user's models are then Keras 2 models.

Every Keras 2 / Keras 3 difference harness knows of is decided here. The
parallel core (``harness.parallel``) and ``compare_training`` need Keras 3 and
say so on Keras 2 instead of failing deep inside a step.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata

__all__ = ["KerasFlavour", "keras_flavour", "flavour_of", "require_keras3", "Keras2NotSupported", "is_keras2_model",
           "check_model"]


class Keras2NotSupported(RuntimeError):
    """Raised where a harness feature needs Keras 3 and the environment's models are Keras 2."""


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


def require_keras3(feature: str, environ=None) -> KerasFlavour:
    """Raises ``Keras2NotSupported`` naming ``feature`` when the ``keras`` package is Keras 2 (TF <= 2.15).

    Returns:
        The environment's flavour (Keras 2 under ``TF_USE_LEGACY_KERAS=1``, where ``keras`` is still Keras 3).
    """
    flavour = keras_flavour(environ)
    keras = _version("keras")
    if keras and _major_minor(keras) < (3, 0):
        raise Keras2NotSupported(
            f"{feature} needs Keras 3; this environment's models are Keras 2 ({flavour.why}). "
            "Keras 2 support for the parallel core is not built yet: use TensorFlow >= 2.16 with Keras 3 "
            "(unset TF_USE_LEGACY_KERAS)"
        )
    return flavour


_KERAS2_MODULES = ("tf_keras", "keras.engine", "keras.src.engine")  # tf-keras; Keras 2.13-2.15's own package


def is_keras2_model(model) -> bool:
    """True for a Keras 2 model (``tf_keras`` or TF <= 2.15's ``keras``), from its class, without imports."""
    return any(cls.__module__.startswith(_KERAS2_MODULES) for cls in type(model).__mro__)


def check_model(model, feature: str) -> None:
    """Raises ``Keras2NotSupported`` for a Keras 2 model (a clear error, not a TypeError deep inside).

    In a ``TF_USE_LEGACY_KERAS=1`` environment, ``import keras`` still gives
    Keras 3: models built from it are fine; ``tf.keras`` / ``tf_keras`` models are not.
    """
    if is_keras2_model(model):
        raise Keras2NotSupported(
            f"{feature} needs a Keras 3 model; got {type(model).__module__}.{type(model).__name__}, a Keras 2 "
            f"model ({keras_flavour().why}). Build it with `import keras` (Keras 3) instead of tf.keras/tf_keras; "
            "Keras 2 support for the parallel core is not built yet"
        )
