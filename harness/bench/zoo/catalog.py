"""The model zoo: every entry, looked up by name, and the Keras module of each generation."""

from __future__ import annotations

from collections.abc import Sequence

from harness.bench.zoo import applications, keras_io, steps
from harness.bench.zoo.entry import ZooEntry
from harness.errors import InvalidValue, Unavailable

__all__ = ["CATALOG", "NAMES", "GENERATIONS", "select", "keras_module"]

CATALOG: tuple[ZooEntry, ...] = applications.ENTRIES + keras_io.ENTRIES + steps.ENTRIES
NAMES: tuple[str, ...] = tuple(e.name for e in CATALOG)
GENERATIONS = ("3", "2")


def select(names: Sequence[str] | None = None, keras: str = "3", fast_only: bool = False) -> list[ZooEntry]:
    """The entries named (all by default) that apply to Keras ``keras`` ("3" or "2"), in catalog order.

    Raises:
        ValueError: an unknown name or generation.
    """
    _check_generation(keras)
    unknown = sorted(set(names or ()) - set(NAMES))
    if unknown:
        raise InvalidValue(f"unknown zoo models {unknown}; choose from {list(NAMES)}")
    wanted = set(names) if names else set(NAMES)
    return [e for e in CATALOG if e.name in wanted and (keras == "3" or e.keras2) and (e.fast or not fast_only)]


def keras_module(keras: str):
    """``keras`` for "3"; for "2" the ``keras`` package where it is Keras 2 (TF <= 2.15), else ``tf_keras``.

    Raises:
        ValueError: that generation is not installed here.
    """
    import importlib
    from importlib import metadata

    _check_generation(keras)
    try:
        package_major = int(metadata.version("keras").split(".")[0])
    except metadata.PackageNotFoundError:
        package_major = 0
    if keras == "3":
        if package_major < 3:
            raise Unavailable("keras='3' needs Keras 3; the keras package here is "
                             f"{'missing' if not package_major else f'Keras {package_major}'}")
        return importlib.import_module("keras")
    if package_major == 2:
        return importlib.import_module("keras")
    try:
        return importlib.import_module("tf_keras")
    except ImportError as err:
        raise Unavailable("keras='2' needs Keras 2: install tf-keras (or use TF <= 2.15, whose keras is Keras 2)") \
            from err


def _check_generation(keras: str) -> None:
    if keras not in GENERATIONS:
        raise InvalidValue(f"keras must be one of {list(GENERATIONS)}; got keras={keras!r}")
