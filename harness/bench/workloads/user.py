"""A user's own model as a workload: ``--model MODULE:ATTR`` or ``--model path/to/file.py:ATTR``.

``harness run``, ``compare``, ``tune``, ``calibrate`` and ``check`` take, wherever they take a
built-in workload's name, a reference to a user's object (docs/user-models.md):

- a zero-argument callable returning a **compiled** ``keras.Model`` (Keras 3, or a ``tf_keras``
  model): its loss, optimizer and metrics are the compiled ones, and without ``--data``
  harness makes its batches up from the model's input specs and loss
  (``harness.bench.workloads.infer``); or
- a :class:`Workload` (``harness.Workload``), the full form: the build function, real data,
  the loss, optimizer and metrics where the model is not compiled with them, validation data
  and an accuracy goal for time to accuracy (``harness.bench.convergence``).

``--data MODULE:ATTR`` (or ``file.py:ATTR``) gives real data: a callable ``(batch_size) ->``
a ``tf.data.Dataset`` of ``(x, y)`` batches of that size, or arrays ``(x, y)``.

``resolve`` turns the references into a :class:`UserWorkload`, which has the interface of the
built-in ``harness.bench.workloads.Workload`` (``build``, ``compile_args``, ``loss``,
``optimizer``, ``metrics``, ``accuracy``, ``make_data``, ``sample_bytes``, ``training_data``,
``held_out_data``, ``train_batches``), so the runner, the tuner, calibration and ``harness check``
train both alike. Looking a reference up (``harness.bench.workloads.references``) imports the
module or runs the file, once per process, but builds nothing and imports no TensorFlow of
harness' own: what the module imports is its own affair. A bad reference, a build function
that fails or returns no model, a model without a loss: one line naming it
(``InvalidValue``/``InvalidType``, exit status 2 in the CLI).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.bench.workloads import FORMS, infer, is_reference
from harness.bench.workloads.references import load_reference
from harness.errors import InvalidType, InvalidValue

__all__ = ["FORMS", "Workload", "UserWorkload", "is_reference", "load_reference", "resolve", "check_model"]

_RESOLVED: dict[tuple[str, str | None], UserWorkload] = {}


@dataclass(frozen=True)
class Workload:
    """A user's workload, in full: what ``--model MODULE:ATTR`` may name instead of a build function.

    Args:
        build: a zero-argument callable returning a new ``keras.Model`` (Keras 3 or ``tf_keras``), compiled
            or not; harness seeds the random generators before each call.
        data: ``(batch_size) -> tf.data.Dataset`` of ``(x, y)`` batches of ``batch_size`` rows, or ``-> (x, y)``
            arrays; None: batches made up from the model's input specs and loss (docs/user-models.md).
            ``--data`` replaces it.
        loss: the loss to train with (default: the compiled one; required where the model is not compiled).
        optimizer: a name, an optimizer (copied for each model) or a zero-argument factory (default: the compiled
            one, else Keras' own default, ``"rmsprop"``).
        metrics: compile's ``metrics`` (default: the compiled ones).
        validation_data: held-out data for time to accuracy, as ``data``.
        accuracy: the metric ``goal`` is measured with (a name, a metric or a factory); default: from the loss
            (sparse categorical, categorical or binary accuracy; binary at threshold 0 for logits).
        goal: the accuracy on ``validation_data`` time to accuracy trains for, in (0, 1].
        name: for the records.
        description: for the records.

    Raises:
        InvalidType: ``build``, ``data`` or ``validation_data`` not callable.
        InvalidValue: ``goal`` not in (0, 1], or without ``validation_data``.

    Example (``models/text.py``; ``harness run --model models/text.py:workload``)::

        import harness
        workload = harness.Workload(build=build_text_cnn, data=imdb_batches, validation_data=imdb_test,
                                    goal=0.85)
    """

    build: Callable[[], Any]
    data: Callable[[int], Any] | None = None
    loss: Any = None
    optimizer: Any = None
    metrics: Any = None
    validation_data: Callable[[int], Any] | None = None
    accuracy: Any = None
    goal: float | None = None
    name: str = ""
    description: str = ""

    def __post_init__(self):
        if not callable(self.build):
            raise InvalidType(f"Workload.build must be a zero-argument callable returning a keras.Model; got "
                              f"{self.build!r}")
        for field in ("data", "validation_data"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise InvalidType(f"Workload.{field} must be a callable (batch_size) -> tf.data.Dataset or (x, y); "
                                  f"got {type(value).__name__} {value!r:.80}")
        goal = self.goal
        if goal is not None and (isinstance(goal, bool) or not isinstance(goal, (int, float))
                                 or not (math.isfinite(goal) and 0 < goal <= 1)):
            raise InvalidValue(f"Workload.goal is an accuracy in (0, 1]; got goal={goal!r}")
        if goal is not None and self.validation_data is None:
            raise InvalidValue(f"Workload.goal={goal!r} is an accuracy on validation_data: give validation_data too")


def resolve(model: str, data: str | None = None) -> UserWorkload:
    """The ``UserWorkload`` of ``--model model`` and ``--data data`` (looked up once per process).

    Raises:
        InvalidValue: a bad reference (``load_reference``).
        InvalidType: ``model`` names neither a callable nor a ``Workload``; ``data`` names no callable.
    """
    key = (model, data)
    if key not in _RESOLVED:
        obj = load_reference(model, "--model")
        if isinstance(obj, Workload):
            spec = obj
        elif callable(obj):
            spec = Workload(build=obj)
        else:
            raise InvalidType(f"--model {model!r} names {type(obj).__name__} {obj!r:.60}, which is not callable: "
                              "give a zero-argument function returning a compiled keras.Model, or a harness.Workload")
        if data is not None:
            given = load_reference(data, "--data")
            if not callable(given):
                raise InvalidType(f"--data {data!r} names {type(given).__name__} {given!r:.60}, which is not callable: "
                                  "give a function (batch_size) -> tf.data.Dataset of (x, y) batches, or -> arrays "
                                  "(x, y)")
            spec = dataclasses.replace(spec, data=given)
        _RESOLVED[key] = UserWorkload(model, spec, data)
    return _RESOLVED[key]


def _call_build(build: Callable[[], Any], where: str):
    """``build()``; its error as one line naming ``where`` (a harness error as it is, the traceback with --debug)."""
    from harness.errors import HarnessError

    try:
        return build()
    except HarnessError:
        raise
    except Exception as err:  # noqa: BLE001  the user's function failed: not a bug of harness
        line = (str(err).strip().splitlines() or [""])[0]
        raise InvalidValue(f"--model {where!r}: calling its build function raised {type(err).__name__}: {line} "
                           "(it must take no arguments and return a keras.Model; --debug shows the traceback)") from err


def check_model(obj, where: str):
    """``obj`` if it is a Keras model (Keras 3 or Keras 2), told from its classes without importing Keras.

    Raises:
        InvalidValue: naming ``where`` and what it returned instead.
    """
    if any(cls.__name__ == "Model" and cls.__module__.startswith(("keras.", "tf_keras."))
           for cls in type(obj).__mro__):
        return obj
    what = type(obj)
    raise InvalidValue(f"--model {where!r} returned {what.__module__}.{what.__qualname__}, not a keras.Model: "
                       "its build function must return a new Keras 3 or tf_keras model")


class UserWorkload:
    """A user's workload behind the built-in ``Workload``'s interface (see the module's doc).

    ``name`` is the ``--model`` reference; ``source`` is ``"user"``. Sizes do not apply: the model
    is the user's, whatever ``size`` a caller passes.
    """

    source = "user"

    def __init__(self, name: str, spec: Workload, data_name: str | None = None):
        self.name = name
        self.spec = spec
        self.data_name = data_name
        self.description = spec.description or f"the user's model {spec.name or name}"
        self.goal = spec.goal
        self._plan: infer.DataPlan | None = None
        self._first: dict | None = None  # the first model's compile arguments, its optimizer a spare copy

    # -- the model ------------------------------------------------------------------------------------------
    def build(self, size: str = "tiny", seed: int = 0, keras_module=None):
        """A new model from the user's build function, Python's, NumPy's, TensorFlow's and Keras' generators seeded
        with ``seed`` first (Python's and NumPy's restored afterwards).

        Raises:
            InvalidValue: it returned no Keras model; the model has no loss (not compiled, and none given); a
                Keras module other than the model's was asked for (``keras_module``: the stock baseline across
                workers trains ``tf_keras`` models); without data, batches that cannot be inferred.
        """
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidValue(f"seed must be an integer >= 0; got seed={seed!r}")
        from harness.compat import copy_optimizer, keras_module_name, keras_module_of, set_random_seed

        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            set_random_seed(int(seed))
            model = check_model(_call_build(self.spec.build, self.name), self.name)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        if keras_module is not None and keras_module_name(model) != keras_module.__name__:
            raise InvalidValue(f"--model {self.name!r} builds a {keras_module_name(model)} model; this run trains a "
                               f"{keras_module.__name__} model (the stock baseline across workers is tf_keras' fit: "
                               "give a tf_keras model, or use --method mirrored)")
        args = self.compile_args(model)
        if self._first is None:  # a spare copy of the optimizer, made before any training
            self._first = {**args, "optimizer": copy_optimizer(args["optimizer"]), "keras": keras_module_of(model)}
        if self._plan is None and self.spec.data is None:
            self._plan = infer.plan_data(_reader(model).io_description(model), args["loss"], self.name)
        return model

    def compile_args(self, model, keras_module=None) -> dict:
        """What to compile ``model`` (built by ``build``) with: the spec's loss, optimizer and metrics where it gives
        them, else those the model was compiled with (its own optimizer object).

        Raises:
            InvalidValue: no loss: the model is not compiled, or compiled without one, and the spec gives none.
        """
        from harness.compat import keras_module_of, new_optimizer

        given = _reader(model).compile_args(model) or {}
        spec = self.spec
        loss = spec.loss if spec.loss is not None else given.get("loss")
        if loss is None:
            state = "is compiled without a loss" if given else "is not compiled"
            raise InvalidValue(f"--model {self.name!r}: the model {model.name!r} it builds {state}: compile it with "
                               "a loss in the build function, or give harness.Workload(build=..., loss=...)")
        k = keras_module or keras_module_of(model)
        optimizer = spec.optimizer if spec.optimizer is not None else given.get("optimizer") or "rmsprop"
        if spec.optimizer is not None or isinstance(optimizer, str):
            optimizer = new_optimizer(optimizer, k)
        metrics = _fresh_metrics(spec.metrics, k) if spec.metrics is not None else given.get("metrics")
        extra = {key: given.get(key) for key in ("loss_weights", "weighted_metrics")}
        return {"optimizer": optimizer, "loss": loss, "metrics": metrics,
                **{key: value for key, value in extra.items() if value is not None}}

    def _compiled(self) -> dict:
        """The first model's compile arguments (building one if none was), with its Keras module as ``keras``."""
        if self._first is None:
            self.build()
        assert self._first is not None
        return self._first

    def loss(self, keras_module=None):
        """The loss (the spec's, or the compiled one of the first model built; it builds one if none was)."""
        return self.spec.loss if self.spec.loss is not None else self._compiled()["loss"]

    def optimizer(self, keras_module=None):
        """A new optimizer, made in the current scope: the spec's, or a copy (from its config) of the first model's
        compiled one."""
        from harness.compat import copy_optimizer, new_optimizer

        first = self._compiled()
        if self.spec.optimizer is not None:
            return new_optimizer(self.spec.optimizer, keras_module or first["keras"])
        return copy_optimizer(first["optimizer"])

    def metrics(self, keras_module=None):
        """New copies of the metrics (the spec's, or the first model's compiled ones)."""
        first = self._compiled()
        metrics = self.spec.metrics if self.spec.metrics is not None else first["metrics"]
        return _fresh_metrics(metrics, keras_module or first["keras"])

    def accuracy(self, keras_module=None):
        """A new metric for ``goal``: the spec's ``accuracy``, else the accuracy that fits the loss.

        Raises:
            InvalidValue: no ``accuracy`` given and a loss with no accuracy (a regression loss, a custom one).
        """
        k = keras_module or self._compiled()["keras"]
        given = self.spec.accuracy
        if isinstance(given, str):
            return k.metrics.get(given)
        if isinstance(given, k.metrics.Metric):
            return _fresh_one(given, k)
        if given is not None:
            return given()  # a factory
        loss = self.loss(k)
        kind = infer.loss_kind(loss)
        if kind == "sparse":
            return k.metrics.SparseCategoricalAccuracy(name="accuracy")
        if kind == "one_hot":
            return k.metrics.CategoricalAccuracy(name="accuracy")
        if kind == "binary":
            logits = bool(loss.get_config().get("from_logits", False)) if hasattr(loss, "get_config") else False
            return k.metrics.BinaryAccuracy(name="accuracy", threshold=0.0 if logits else 0.5)
        raise InvalidValue(f"--model {self.name!r}: loss {infer.loss_name(loss) or loss!r} has no accuracy harness "
                           "knows: give harness.Workload(accuracy=...)")

    # -- the data -------------------------------------------------------------------------------------------
    def plan(self) -> infer.DataPlan:
        """How the synthetic batches are made (builds a model first if none was)."""
        if self._plan is None:
            if self.spec.data is not None:
                raise InvalidValue(f"--model {self.name!r} has real data ({self.data_name or 'Workload.data'}): "
                                   "no batches are inferred")
            self.build()
        assert self._plan is not None
        return self._plan

    def make_data(self, size: str = "tiny", samples: int = 256, seed: int = 0) -> tuple[Any, Any]:
        """``(x, y)`` NumPy arrays of ``samples`` rows: the first rows of the real data (repeated where it has
        fewer), or synthetic batches drawn with ``seed``."""
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
            raise InvalidValue(f"samples must be a positive integer; got samples={samples!r}")
        if self.spec.data is None:
            return self.plan().synthesize(int(samples), seed)
        from harness.bench.workloads.userdata import arrays

        return arrays(self.spec.data, int(samples), self.data_name or f"{self.name} data")

    def sample_bytes(self, size: str = "tiny") -> int:
        """Bytes of one ``(x, y)`` sample."""
        if self.spec.data is None:
            return self.plan().sample_bytes()
        x, y = self.make_data(size, 8)
        leaves = [np.asarray(a) for a in _leaves(x) + _leaves(y)]
        return max(1, sum(a.nbytes for a in leaves) // 8)

    def training_data(self, batch_size: int):
        """The real data as a ``tf.data.Dataset`` of full ``(x, y)`` batches, repeated; None without real data."""
        if self.spec.data is None:
            return None
        from harness.bench.workloads.userdata import dataset

        return dataset(self.spec.data, batch_size, self.data_name or f"{self.name} data")

    def held_out_data(self, size: str, samples: int, seed: int = 0) -> tuple[Any, Any]:
        """``samples`` rows of the validation data, for time to accuracy.

        Raises:
            InvalidValue: the workload has no validation data.
        """
        if self.spec.validation_data is None:
            raise InvalidValue(f"--model {self.name!r}: time to accuracy needs validation data: give "
                               "harness.Workload(validation_data=...)")
        from harness.bench.workloads.userdata import arrays

        return arrays(self.spec.validation_data, samples, f"{self.name} validation data")

    def train_batches(self, size: str, batch_size: int) -> Iterator[tuple[Any, Any]]:
        """The batches time to accuracy trains on, as NumPy ``(x, y)``: the real data's in order (repeated), or
        synthetic ones drawn with seeds 0, 1, 2, ..."""
        if self.spec.data is None:
            return (self.make_data(size, batch_size, seed=step) for step in itertools.count())
        from harness.bench.workloads.userdata import numpy_batches

        return numpy_batches(self.training_data(batch_size))

def _reader(model):
    """What reads ``model``'s compile arguments and inputs: a Keras 3 model on JAX without TensorFlow
    (``harness.parallel.adapters.keras3io``), any other by its adapter (TensorFlow's)."""
    from harness.compat import is_keras2_model, on_jax_backend

    if not is_keras2_model(model) and on_jax_backend():
        from harness.parallel.adapters import keras3io

        return keras3io
    from harness.parallel.adapters import adapter_for

    return adapter_for(model)


def _leaves(tree) -> list:
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def _fresh_metrics(metrics, k):
    """``metrics`` with each metric object replaced by a new one from its config (names stay as they are)."""
    if metrics is None:
        return None
    if isinstance(metrics, dict):
        return {key: _fresh_metrics(value, k) for key, value in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [_fresh_metrics(m, k) if isinstance(m, (list, tuple, dict)) else _fresh_one(m, k) for m in metrics]
    return _fresh_one(metrics, k)


def _fresh_one(metric, k):
    if isinstance(metric, k.metrics.Metric):
        return type(metric).from_config(metric.get_config())
    return metric
