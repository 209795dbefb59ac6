"""A user's real data (``--data``, ``harness.Workload(data=..., validation_data=...)``) as harness reads it.

The contract (docs/user-models.md): a callable ``(batch_size) ->`` either a ``tf.data.Dataset``
whose elements are ``(x, y)`` (or ``(x, y, sample_weight)``) batches of ``batch_size`` rows, or
NumPy-like arrays ``(x, y)`` (``x`` may be a tuple or dict of arrays, one per model input).

- ``dataset`` gives the training input of a throughput run: full batches only (every step of
  a run splits the same global batch), repeated without end. A dataset is checked on its first
  batch (it must have ``batch_size`` rows), then its partial batches are dropped; arrays are
  sliced into batches, the remainder dropped.
- ``arrays`` gives the first ``samples`` rows as arrays (repeated where the data has fewer),
  for the probes of ``harness tune``, ``harness check`` and time to accuracy's held-out set.

TensorFlow is imported by the functions, never at import, and only for a dataset: arrays are read without it.
On Keras' JAX backend the data must be arrays: a dataset is refused, naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from harness.errors import InvalidType, InvalidValue

__all__ = ["dataset", "arrays", "numpy_batches", "head"]

_WANT = "a tf.data.Dataset of (x, y) batches, or arrays (x, y)"


def _rows(x) -> int:
    from harness.compat import first_leaf

    first = first_leaf(x)
    if first.shape[0] is not None:
        return int(first.shape[0])
    import tensorflow as tf  # a tensor of a dataset whose batch axis is unknown

    return int(tf.shape(first)[0])


def _is_dataset(value) -> bool:
    """Whether ``value`` is a ``tf.data.Dataset``; without importing TensorFlow (only a process that imported it
    can hold one)."""
    data = getattr(sys.modules.get("tensorflow"), "data", None)
    return data is not None and isinstance(value, data.Dataset)


def _call(data: Callable[[int], Any], batch_size: int, where: str):
    result = data(batch_size)
    if _is_dataset(result):
        from harness.compat import on_jax_backend

        if on_jax_backend():
            raise InvalidValue(f"--data {where!r}: its function returned a tf.data.Dataset ({result!r}); Keras runs "
                               "on JAX here, where a model's data must be NumPy arrays (x, y) (x may be a tuple or "
                               "dict of arrays): return the arrays themselves (tf.data is TensorFlow's)")
        return result
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return tuple(result)
    raise InvalidType(f"--data {where!r}: its function returned {type(result).__name__}; it must return {_WANT}")


def _tuples(tree):
    """Lists as tuples: ``tf.data`` would stack a list of arrays into one tensor."""
    if isinstance(tree, dict):
        return {key: _tuples(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return tuple(_tuples(value) for value in tree)
    return tree


def dataset(data: Callable[[int], Any], batch_size: int, where: str):
    """The training batches of ``data(batch_size)``: full batches of ``batch_size`` rows, repeated.

    Raises:
        InvalidValue: the data's first batch is not ``batch_size`` rows, an empty dataset, or fewer rows of
            arrays than one batch.
        InvalidType: ``data`` returned something else than ``_WANT``.
    """
    import tensorflow as tf

    result = _call(data, batch_size, where)
    if isinstance(result, tf.data.Dataset):
        first = next(iter(result.take(1)), None)
        if first is None:
            raise InvalidValue(f"--data {where!r}: its dataset for batch size {batch_size} is empty")
        if not isinstance(first, (tuple, list)) or len(first) not in (2, 3):
            raise InvalidValue(f"--data {where!r}: its dataset's elements must be (x, y) or (x, y, sample_weight) "
                               f"batches; got {type(first).__name__}")
        rows = _rows(first[0])
        if rows != batch_size:
            raise InvalidValue(f"--data {where!r}: asked for batches of {batch_size} rows, its dataset's first batch "
                               f"has {rows}: batch the dataset with the batch_size it is given")

        def full(*element):
            return tf.shape(tf.nest.flatten(element[0])[0])[0] == batch_size

        return result.filter(full).repeat()
    x, y = _tuples(result)
    rows = _rows(x)
    if rows < batch_size:
        raise InvalidValue(f"--data {where!r}: its arrays have {rows} rows, fewer than one batch of {batch_size}")
    from harness.bench.workloads.tfdata import still_options

    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size, drop_remainder=True).with_options(
        still_options(tf))  # harness' own pipeline around the user's arrays: freed fast


def arrays(data: Callable[[int], Any], samples: int, where: str) -> tuple[Any, Any]:
    """The first ``samples`` rows of ``data`` as NumPy ``(x, y)``, repeated where it has fewer.

    Raises:
        InvalidValue: the data is empty; a dataset where Keras runs on JAX.
        InvalidType: ``data`` returned something else than ``_WANT``.
    """
    from harness.compat import map_structure

    result = _call(data, samples, where)
    if _is_dataset(result):
        import tensorflow as tf

        parts, have = [], 0
        for element in result.as_numpy_iterator():
            parts.append((element[0], element[1]))
            have += _rows(element[0])
            if have >= samples:
                break
        if not parts:
            raise InvalidValue(f"--data {where!r}: its dataset is empty")
        x = tf.nest.map_structure(lambda *a: np.concatenate(a), *[p[0] for p in parts])
        y = tf.nest.map_structure(lambda *a: np.concatenate(a), *[p[1] for p in parts])
        x, y = _tuples(x), _tuples(y)
    else:
        x, y = map_structure(np.asarray, _tuples(result))
    rows = _rows(x)
    if rows == 0:
        raise InvalidValue(f"--data {where!r}: it gave no rows")
    index = np.arange(samples) % rows
    return map_structure(lambda a: a[index], x), map_structure(lambda a: a[index], y)


def head(data, samples: int):
    """The first ``samples`` rows of an array, or of each array of a (nested) tuple, list or dict of them."""
    if isinstance(data, dict):
        return {key: head(value, samples) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(head(value, samples) for value in data)
    return data[:samples]


def numpy_batches(batches) -> Iterator[tuple[Any, Any]]:
    """``(x, y)`` of each element of a dataset of batches, as NumPy, without end (``dataset``'s repeat)."""
    for element in batches.as_numpy_iterator():
        yield element[0], element[1]
