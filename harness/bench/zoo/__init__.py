"""Model-zoo conformance: real architectures at CPU size, trained on one device and in parallel.

``CATALOG`` holds the models (``keras.applications`` backbones and keras-io examples, see
``harness.bench.zoo.applications`` and ``harness.bench.zoo.keras_io``); ``run_zoo`` checks each model x
method x split with ``harness.compare_training`` and returns one ``ZooRow`` per case, which
``text_table``, ``markdown`` and ``to_json`` print. ``run_optimizer_axis`` checks the optimizer axis
(``harness.bench.zoo.optimizers``: every built-in optimizer x the options people train with, on a
dense model and a causal language model). ``harness check --zoo`` is the command line.
``run_zoo(keras="jax")`` (``ON_JAX``) checks Keras 3's entries on its JAX backend, method towers, without
TensorFlow (``harness check --zoo --backend jax``); their pins are keyed ``"jax"``, beside TensorFlow's.
Importing this package does not import TensorFlow or Keras.

Example:
    >>> import harness
    >>> from harness.bench import zoo
    >>> harness.use_logical_devices(3)
    >>> rows = zoo.run_zoo(["subclassed_mlp", "text_bilstm"], methods=["mirrored"])
    >>> print(zoo.text_table(rows))
"""

from harness.bench.zoo.catalog import CATALOG, GENERATIONS, NAMES, ON_JAX, keras_module, select
from harness.bench.zoo.entry import ZooEntry
from harness.bench.zoo.render import from_json, keras_label, markdown, overview, summary, text_table, to_json
from harness.bench.zoo.runner import (
    ALL_SPLITS,
    KINDS,
    METHODS,
    SPLITS,
    ZooRow,
    count,
    kind_of,
    methods_of,
    run_case,
    run_optimizer_axis,
    run_zoo,
    splits_of,
    status_of_error,
)

__all__ = ["CATALOG", "NAMES", "GENERATIONS", "ON_JAX", "METHODS", "SPLITS",
           "ALL_SPLITS", "splits_of", "KINDS", "ZooEntry", "ZooRow", "select",
           "keras_module", "methods_of", "run_zoo", "run_optimizer_axis",
           "run_case", "status_of_error", "kind_of", "count", "text_table", "markdown",
           "to_json", "from_json", "summary", "overview", "keras_label"]
