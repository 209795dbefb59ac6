"""The model zoo: every entry, looked up by name, and the Keras module of each generation.

A case's ``keras`` is where it runs: ``"3"`` (Keras 3 on TensorFlow), ``"2"`` (Keras 2: tf-keras, or TF 2.15's
``keras``) or ``"jax"`` (``ON_JAX``: Keras 3 on its JAX backend, the only Keras there is on JAX), so that a pin of
Keras 3 on JAX never shares a key with Keras 3 on TensorFlow's.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.bench.zoo import applications, keras_io, steps
from harness.bench.zoo.entry import ZooEntry
from harness.errors import InvalidValue, Unavailable

__all__ = ["CATALOG", "NAMES", "GENERATIONS", "ON_JAX", "select", "keras_module"]

CATALOG: tuple[ZooEntry, ...] = applications.ENTRIES + keras_io.ENTRIES + steps.ENTRIES
NAMES: tuple[str, ...] = tuple(e.name for e in CATALOG)
GENERATIONS = ("3", "2")  # on TensorFlow
ON_JAX = "jax"  # Keras 3 on the JAX backend


def select(names: Sequence[str] | None = None, keras: str = "3", fast_only: bool = False) -> list[ZooEntry]:
    """The entries named (all by default) that apply to Keras ``keras`` ("3", "2" or "jax": Keras 3's entries), in
    catalog order.

    Raises:
        ValueError: an unknown name or generation.
    """
    _check_generation(keras)
    unknown = sorted(set(names or ()) - set(NAMES))
    if unknown:
        raise InvalidValue(f"unknown zoo models {unknown}; choose from {list(NAMES)}")
    wanted = set(names) if names else set(NAMES)
    return [e for e in CATALOG if e.name in wanted and (keras != "2" or e.keras2) and (e.fast or not fast_only)]


def keras_module(keras: str):
    """``keras`` for "3" and "jax"; for "2" the ``keras`` package where it is Keras 2 (TF <= 2.15), else ``tf_keras``.

    Raises:
        ValueError: that generation is not installed here; "3" where Keras runs on JAX, "jax" where it does not
            (Keras reads its backend once per process: ``KERAS_BACKEND``).
    """
    import importlib
    from importlib import metadata

    _check_generation(keras)
    try:
        package_major = int(metadata.version("keras").split(".")[0])
    except metadata.PackageNotFoundError:
        package_major = 0
    if keras in ("3", ON_JAX):
        if package_major < 3:
            raise Unavailable(f"keras={keras!r} needs Keras 3; the keras package here is "
                             f"{'missing' if not package_major else f'Keras {package_major}'}")
        module = importlib.import_module("keras")
        _check_backend(keras, module.backend.backend())
        return module
    if package_major == 2:
        return importlib.import_module("keras")
    try:
        return importlib.import_module("tf_keras")
    except ImportError as err:
        raise Unavailable("keras='2' needs Keras 2: install tf-keras (or use TF <= 2.15, whose keras is Keras 2)") \
            from err


def _check_generation(keras: str) -> None:
    if keras not in (*GENERATIONS, ON_JAX):
        raise InvalidValue(f"keras must be one of {[*GENERATIONS, ON_JAX]}; got keras={keras!r}")


def _check_backend(keras: str, backend: str) -> None:
    """Keras 3's cases are TensorFlow's under "3" and JAX's under "jax": a run on the other backend would be held to
    (and pin) the other's outcomes."""
    wanted = "jax" if keras == ON_JAX else "tensorflow"
    if backend != wanted:
        instead = {"jax": f" (keras={ON_JAX!r} is Keras 3 on JAX)", "tensorflow": " (keras='3')"}.get(backend, "")
        raise InvalidValue(f"keras={keras!r} is Keras 3 on {wanted}, and Keras runs on {backend} in this process"
                           f"{instead}; set KERAS_BACKEND={wanted} before Keras is imported")
