"""Optional dependencies: each is imported where it is used, and its absence is one clear line.

``pip install keras-harness`` gives the library (numpy; TensorFlow and Keras are the user's own,
or the ``[tf]`` extra). The other extras (pyproject.toml):

- ``[bench]``: matplotlib (charts), nvidia-ml-py (GPU facts and telemetry), asv (benchmarks);
- ``[ci]``: the Docker SDK for Python (``harness docker``), tox, Jinja2 (the templates ``harness init`` renders);
- ``[test]``: pytest and its plugins (the opt-in ``harness.pytest_plugin``);
- ``[jax]``: Keras 3 and JAX, for Keras 3 on JAX without TensorFlow (``harness.parallel.jax``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from harness.errors import Unavailable

__all__ = ["MissingExtra", "require"]


class MissingExtra(Unavailable):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, *, package: str, extra: str, purpose: str) -> ModuleType:
    """Imports ``module``, or raises ``MissingExtra`` naming ``package`` and ``keras-harness[extra]``.

    Args:
        module: the import name (``"matplotlib.figure"``).
        package: the distribution that provides it (``"matplotlib"``).
        extra: harness' extra that installs it (``"bench"``).
        purpose: what needs it, for the message (``"charts"``).

    Example:
        >>> require("matplotlib.figure", package="matplotlib", extra="bench", purpose="charts")
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(f"{purpose}: {package} is not installed ({err.msg}); "
                           f"pip install 'keras-harness[{extra}]'") from None
