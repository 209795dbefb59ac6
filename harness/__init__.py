"""harness: exact ratio-split data parallelism for Keras, and the harness that proves it.

Only pure-Python pieces are imported eagerly (``split_batch``, the exceptions of ``harness.errors``);
anything that needs TensorFlow is loaded on first use, so ``import harness`` and ``harness --help`` stay fast.
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata

from harness.errors import Failed, HarnessError, InvalidType, InvalidValue, NotSupported, Refused, Unavailable
from harness.split import split_batch

# The installed distribution's version (setuptools-scm wrote it from the git tag at build time; harness.dist says
# how it was installed). A source tree on sys.path that was never installed has no metadata: "0+unknown".
try:
    __version__: str = _metadata.version("keras-harness")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "split_batch",
    "use_logical_devices",
    "use_jax_cpu_devices",
    "parallelize",
    "multi_gpu_model",
    "compare_training",
    "assert_equivalent",
    "EquivalenceReport",
    "tune",
    "Rebalance",
    "step_watchdog",
    "use_cluster",
    "BackupAndRestore",
    "Workload",
    "HarnessError",
    "InvalidValue",
    "InvalidType",
    "Unavailable",
    "Failed",
    "Refused",
    "NotSupported",
]

_LAZY = {
    "use_logical_devices": "harness.devices",
    "use_jax_cpu_devices": "harness.devices",
    "parallelize": "harness.parallel",
    "multi_gpu_model": "harness.parallel",
    "compare_training": "harness.equivalence",
    "EquivalenceReport": "harness.equivalence",
    "assert_equivalent": "harness.equivalence",
    "tune": "harness.bench.tuning.tuner",
    "Rebalance": "harness.parallel.rebalance",
    "step_watchdog": "harness.watchdog",
    "use_cluster": "harness.parallel.multiworker",
    "BackupAndRestore": "harness.parallel.backup",
    "Workload": "harness.bench.workloads.user",  # a user's model as a workload (docs/user-models.md)
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
