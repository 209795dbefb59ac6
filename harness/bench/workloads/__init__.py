"""The workloads: models, losses, optimizers and learnable synthetic data, by name.

Most come from the public seed documents (docs/background.md); ``Workload.source`` says
which.

Each workload comes in two sizes: ``full`` (the seed's model, sized for a GPU)
and ``tiny`` (the same design at CPU scale, for tests and CI). Every model
outputs logits; its loss applies the softmax or sigmoid (``from_logits=True``).

Importing this package, ``names()``, ``get()`` and the shape queries import
neither TensorFlow nor Keras (the CLI builds its choices from ``names()``);
``build``, ``loss``, ``optimizer`` and ``accuracy`` import Keras when called.

Your own model is a workload too: ``get("path/to/file.py:build")`` (or ``"MODULE:ATTR"``)
gives a ``harness.bench.workloads.user.UserWorkload`` with the interface below, so the runner,
the tuner, calibration and ``harness check`` train it as they train a built-in one
(docs/user-models.md). That interface: ``name``, ``source``, ``description``, ``build``,
``compile_args`` (what the runner compiles a built model with), ``loss``, ``optimizer``,
``metrics``, ``accuracy``, ``make_data``, ``sample_bytes``, ``training_data`` (real batches, or
None: the pipeline makes them from ``make_data``), ``held_out_data`` and ``train_batches`` (time
to accuracy's), and ``goal``.

One definition builds in either Keras: ``build``, ``loss``, ``optimizer`` and
``accuracy`` take the Keras module to use (``keras_module``: default ``keras``,
Keras 3; ``tf_keras`` gives Keras 2 objects, as the stock baseline across workers
needs), and a workload module's ``build(size, keras)``, ``loss(keras)`` and
``optimizer(keras)`` receive it. Every workload builds in both.

Example:
    >>> from harness.bench import workloads
    >>> w = workloads.get("wide_mlp")
    >>> model = w.build("tiny", seed=0)
    >>> model.compile(optimizer=w.optimizer(), loss=w.loss())
    >>> x, y = w.make_data("tiny", samples=1024, seed=0)
    >>> model.fit(x, y, batch_size=256)
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from harness.bench.workloads.synthetic import Labels
from harness.errors import InvalidValue

if TYPE_CHECKING:
    from harness.bench.workloads.user import UserWorkload

FORMS = "MODULE:ATTR or path/to/file.py:ATTR"


def is_reference(name) -> bool:
    """Whether a ``--model`` value refers to a user's object (it has a ``:``) rather than naming a built-in workload."""
    return isinstance(name, str) and ":" in name

__all__ = ["SIZES", "FORMS", "Labels", "Workload", "names", "get", "check_size", "is_reference"]

SIZES = ("full", "tiny")


def check_size(size: str) -> str:
    """``size`` if it is one of ``SIZES``.

    Raises:
        ValueError: naming the bad size and the allowed ones.
    """
    if size not in SIZES:
        raise InvalidValue(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    return size


@dataclass(frozen=True)
class Workload:
    """One workload: a model, its loss and optimizer, and learnable synthetic data.

    ``source`` is the number of the public seed document the model comes from
    (``"000"``, ``"001"``, ...: see docs/background.md), or ``""`` for a workload of
    harness' own. It is not a random seed: ``build`` and ``make_data`` take that as
    ``seed``. The model code lives in ``harness.bench.workloads.<module>``, imported on
    first use; ``"<module>:<name>"`` names an object of that module with the same
    interface.
    """

    name: str
    source: str
    description: str
    module: str

    def _impl(self):
        module, _, variant = self.module.partition(":")
        impl = importlib.import_module(f"harness.bench.workloads.{module}")
        return getattr(impl, variant) if variant else impl

    @property
    def labels(self) -> Labels:
        """How targets are encoded, which fixes the loss and the accuracy metric."""
        return self._impl().LABELS

    def input_shape(self, size: str) -> tuple[int, ...]:
        """Shape of one input sample (no batch axis)."""
        return tuple(self._impl().INPUT_SHAPES[check_size(size)])

    def output_shape(self, size: str) -> tuple[int, ...]:
        """Shape of the model's logits for one sample (no batch axis)."""
        return tuple(self._impl().OUTPUT_SHAPES[check_size(size)])

    def label_shape(self, size: str) -> tuple[int, ...]:
        """Shape of one label as ``make_data`` returns it: ``()`` for sparse class indices."""
        # sparse: one class index per output position (a scalar, or one per timestep)
        return self.output_shape(size)[:-1] if self.labels is Labels.SPARSE else self.output_shape(size)

    def sample_bytes(self, size: str) -> int:
        """Bytes of one ``(x, y)`` sample as ``make_data`` returns it (float32 inputs, 4-byte labels)."""
        return 4 * (math.prod(self.input_shape(size)) + math.prod(self.label_shape(size)))

    def build(self, size: str = "tiny", seed: int = 0, keras_module=None):
        """A new, built, uncompiled model with deterministic initial weights.

        Args:
            size: ``"full"`` or ``"tiny"``.
            seed: the same seed gives the same initial weights (via the module's ``utils.set_random_seed``;
                Python's and NumPy's global generators are restored afterwards, TensorFlow's stays seeded).
                In Keras 3 and Keras 2 the same seed gives the same architecture; on Keras 3.15 and tf_keras
                2.21 also the same initial weights, but for gru_stack's after its first GRU (the two Keras'
                orthogonal initialisers draw seeds differently from there on).
            keras_module: the Keras module to build with (default ``keras``); ``tf_keras`` builds a Keras 2 model.

        Raises:
            ValueError: for an unknown size or a seed that is not an int >= 0.
        """
        check_size(size)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidValue(f"seed must be an integer >= 0; got seed={seed!r}")
        k = _keras(keras_module)
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            if k.__name__ == "keras" and k.backend.backend() == "jax":
                from harness.compat import set_random_seed  # Keras' own would import TensorFlow (its tf seed)

                set_random_seed(int(seed))
            else:
                k.utils.set_random_seed(int(seed))
            return self._impl().build(size, k)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)

    def loss(self, keras_module=None):
        """A new loss on logits (``from_logits=True``) of ``keras_module`` (default ``keras``)."""
        return self._impl().loss(_keras(keras_module))

    def optimizer(self, keras_module=None):
        """A new optimizer of ``keras_module`` (default ``keras``), the seed's where it names one."""
        return self._impl().optimizer(_keras(keras_module))

    def accuracy(self, keras_module=None):
        """A new accuracy metric of ``keras_module`` matching the labels, on logits (binary: threshold 0, not 0.5)."""
        k = _keras(keras_module)
        if self.labels is Labels.ONE_HOT:
            return k.metrics.CategoricalAccuracy(name="accuracy")
        if self.labels is Labels.SPARSE:
            return k.metrics.SparseCategoricalAccuracy(name="accuracy")
        return k.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)

    def compile_args(self, model, keras_module=None) -> dict:
        """What the runner compiles a model of this workload with: a new optimizer and loss of ``keras_module``."""
        return {"optimizer": self.optimizer(keras_module), "loss": self.loss(keras_module)}

    def metrics(self, keras_module=None):
        """Compile's ``metrics``: none (the runs measure samples/s; ``accuracy`` is time to accuracy's)."""
        return None

    #: a built-in workload's goal comes with the benchmark (``harness.bench.convergence.Goal``)
    goal = None

    def training_data(self, batch_size: int):
        """Real batches: None, a built-in workload's are synthetic (``make_data``, ``pipeline.make_dataset``)."""
        return None

    def held_out_data(self, size: str, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Time to accuracy's held-out set: ``make_data`` with a seed no training step uses."""
        return self.make_data(size, samples, seed)

    def train_batches(self, size: str, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Time to accuracy's training batches: fresh samples every step (``make_data`` with seeds 0, 1, 2, ...)."""
        return (self.make_data(size, batch_size, seed=step) for step in itertools.count())

    def make_data(self, size: str, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` NumPy arrays with learnable structure; float32 inputs.

        The task (class templates, teacher) is fixed per workload and size; ``seed``
        draws the samples, so equal seeds give equal arrays and different seeds
        different samples of the same task.

        Raises:
            ValueError: for an unknown size, ``samples < 1`` or a seed that is not an int >= 0.
        """
        return self._impl().make_data(check_size(size), samples, seed)


_WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "mnist_maxing", "000", "MNIST CNN with far more layers than it needs, to keep a GPU busy", "mnist_maxing"
        ),
        Workload("gru_stack", "001", "4 stacked GRU(512) + Dense(128): next note of a melody", "gru_stack"),
        Workload("wide_mlp", "002", "wide MLP 8000-4000-2000-500-300-1, exactly 41,157,101 parameters", "wide_mlp"),
        Workload("resnet50", "004", "ResNet50 image classifier (keras.applications, random weights)", "resnet50"),
        # the overhead models: little compute per step, so a method's fixed costs show
        Workload("mlp_head10", "", "MLP 64-512-512-10: a small step, a small gradient", "overhead:mlp_head10"),
        Workload("mlp_head8192", "", "MLP 64-512-512-8192: a small step, a 4.5M-float gradient",
                 "overhead:mlp_head8192"),
        Workload("tagger1024", "", "per-timestep tagger (32 x 32) -> 128 -> 1024 classes: outputs as large as "
                 "the step", "overhead:tagger1024"),
    )
}


def _keras(module):
    """``module``, or Keras 3's ``keras`` for None."""
    if module is None:
        import keras

        return keras
    return module


def names() -> tuple[str, ...]:
    """The workload names, in seed order. Imports no TensorFlow."""
    return tuple(_WORKLOADS)


def get(name: str, data: str | None = None) -> Workload | UserWorkload:
    """The workload called ``name``, or the user's workload ``name`` refers to (``MODULE:ATTR``, ``file.py:ATTR``).

    Args:
        name: a built-in workload's name, or a reference to a user's build function or ``harness.Workload``.
        data: ``--data``: a reference to the user's data function (user workloads only).

    Raises:
        ValueError: naming the unknown workload and the known ones; a bad reference (``InvalidValue``, ``InvalidType``
            from ``harness.bench.workloads.user.resolve``); ``data`` with a built-in workload.
    """
    if is_reference(name):
        from harness.bench.workloads.user import resolve

        return resolve(name, data)
    if data is not None:
        raise InvalidValue(f"--data {data!r} is data for a model of your own (--model {FORMS}); the built-in "
                           f"workload {name!r} makes its own")
    try:
        return _WORKLOADS[name]
    except (KeyError, TypeError):
        raise InvalidValue(f"unknown workload {name!r}; choose from {', '.join(_WORKLOADS)}") from None
