"""Staging: each device's next slice is copied to it while the current step runs.

Without it, a step cuts its batch on the host and every device waits for its
slice to arrive before it computes: the copies sit on the step's critical path,
what seed 004 measured on PCIe boxes. A ``Stager`` is the train function of a
parallel model's ``fit`` (``ParallelCommon.make_train_function``): each call

1. takes the batch staged by the call before (the first call stages its own):
   cut by the split on the host, each slice already on its device;
2. starts staging the iterator's next batch in a background thread (its cut,
   and its copies to the devices: a tf.function of its own, so they run while
   the step computes);
3. runs the step on the staged batch (``Adapter.fit_step``: ``train_step`` as
   Keras' own train function runs it).

The step is the unstaged step given the same slices (``ParallelModel._split``
returns them instead of cutting), so exactness is unchanged. The batches train
in the iterator's order: a staged batch belongs to the iterator it came from,
and a next call with another iterator (a new epoch) drops it unused, as Keras
would never have read it. The end of the data surfaces on the call after the
last batch, as Keras' own train function raises it. A split changed by
``set_ratios`` applies from the step after the one already staged.

Emulated devices with a link pay each copy's time in an op of the staging
function (``Emulator.copy``), concurrent with the step: the step's time is the
longer of its work and the next copy, not their sum. ``overlap=False``
(``parallelize``) turns staging off: every slice then crosses its link inside
its step (the cost staging hides, measured, not assumed).

Staging applies to ``fit`` on a ``tf.data`` iterator with one step per call
(``steps_per_execution=1``); other calls (``train_on_batch``, several steps per
call, a Python generator Keras iterates itself) run Keras' own train function.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import tensorflow as tf

__all__ = ["Staged", "Stager"]


class Staged:
    """One batch's input as the step gets it: ``whole`` (on the host), its size ``n``, the per-device
    ``sizes`` and ``parts`` (each on its device)."""

    def __init__(self, whole, n, sizes, parts):
        self.whole, self.n, self.sizes, self.parts = whole, n, sizes, list(parts)

    def to_structure(self) -> dict:
        return {"whole": self.whole, "n": self.n, "sizes": self.sizes, "parts": self.parts}

    @classmethod
    def from_structure(cls, structure: dict) -> Staged:
        return cls(structure["whole"], structure["n"], structure["sizes"], structure["parts"])


class Stager:
    """The staged train function of ``model`` (``__call__(iterator)``, as Keras calls a train function).

    ``keras_function``: Keras' own train function, for the calls staging does not apply to. One per model:
    a train function made again (``make_train_function(force=True)``) keeps the batch already staged.
    """

    def __init__(self, model, keras_function):
        self.model = model
        self.keras_function = keras_function
        self._pending: tuple[Any, Future] | None = None
        self._executor: ThreadPoolExecutor | None = None  # its thread only runs _stage; _pending is the caller's
        self._stage = tf.function(self._stage_batch, reduce_retracing=True, autograph=False)
        self._step = None
        self.calls = 0  # staged steps run (tests read it)

    def retrace(self, keras_function) -> None:
        """Keras' train function made again: the staged step is traced again too, the staged batch kept."""
        self.keras_function = keras_function
        self._step = None
        self._stage = tf.function(self._stage_batch, reduce_retracing=True, autograph=False)

    def applies(self, iterator) -> bool:
        m = self.model
        return (m.overlap and m._staging_active and isinstance(iterator, tf.data.Iterator)
                and m._adapter.steps_per_execution(m) == 1)

    def __call__(self, iterator):
        if not self.applies(iterator):
            return self.keras_function(iterator)
        pending, self._pending = self._pending, None
        if pending is not None and self._belongs(pending, iterator):
            staged = pending[1].result()  # the end of the data raises here, on the call after the last batch
        else:
            if pending is not None:
                _settle(pending[1])  # another iterator's: dropped unused
            staged = self._stage(iterator)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="harness-staging")
        self._pending = (iterator, self._executor.submit(self._stage, iterator))
        if self._step is None:
            model = self.model
            self._step = tf.function(lambda structure: model._adapter.fit_step(
                model, (Staged.from_structure(structure[0]), *structure[1:])), reduce_retracing=True, autograph=False)
            # Traced once for every batch: the input as the iterator gives it, each slice of any size (as
            # the unstaged step sees them; a static size would also pass for a batch-independent lookup).
            self._step.get_concrete_function(self._signature(iterator, staged))
        self.calls += 1
        return self._step(staged)

    def _signature(self, iterator, staged) -> tuple:
        """The specs the step is traced for: the iterator's element spec, and each slice's without its size.

        Where this fit's batches are all at least the device count (``ParallelCommon._small_batches_possible``
        False: the step asserts it), the batch's own size is left out too: a later fit of another such size
        (a dataset batched by another number) runs the same trace instead of tracing the whole step again.
        """
        model = self.model
        x, y, sample_weight = model._adapter.k.utils.unpack_x_y_sample_weight(iterator.element_spec)
        if not model._small_batches_possible:
            x, y, sample_weight = (tf.nest.map_structure(_any_rows, spec) for spec in (x, y, sample_weight))
        n, sizes = (tf.TensorSpec.from_tensor(staged[0][key]) for key in ("n", "sizes"))
        parts = [tf.nest.map_structure(_any_size, part) for part in staged[0]["parts"]]
        return {"whole": x, "n": n, "sizes": sizes, "parts": parts}, y, sample_weight

    def _belongs(self, pending, iterator) -> bool:
        """Whether the batch ``pending`` staged is ``iterator``'s next: the one it was read from."""
        return pending[0] is iterator

    def drain(self) -> None:
        """Waits for a staging under way, drops what it staged and ends the staging thread (``fit`` ends): a
        process that fits many models keeps no idle thread per model (the next fit starts one again)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            _settle(pending[1])
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _stage_batch(self, iterator):
        """The iterator's next batch, its input cut and on the devices: ``(staged, y, sample_weight)``."""
        model = self.model
        x, y, sample_weight = model._adapter.k.utils.unpack_x_y_sample_weight(iterator.get_next())
        n, sizes, parts = model._split(x)
        placed = []
        for device, part in zip(model.devices, parts):
            with tf.device(device):
                part = tf.nest.map_structure(tf.identity, part, expand_composites=True)
            if model.emulator is not None:
                part = model.emulator.copy(device, part)
            placed.append(part)
        return Staged(x, n, sizes, placed).to_structure(), y, sample_weight


def _any_rows(spec):
    """``spec`` (a leaf of an element spec) with any number of rows; other specs (ragged, sparse) as they are."""
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        return tf.TensorSpec([None, *spec.shape[1:]], spec.dtype, spec.name)
    return spec


def _any_size(value):
    """The spec of ``value`` (a slice's leaf) with any number of rows."""
    if isinstance(value, tf.Tensor):
        return tf.TensorSpec([None, *value.shape[1:]], value.dtype)
    return tf.type_spec_from_value(value)


def _settle(future: Future) -> None:
    """Waits for ``future``, whatever it ends in (a staging whose batch nobody will train)."""
    try:
        future.result()
    except Exception:  # noqa: BLE001 - the end of the data, or an error the unstaged step would not have met
        pass
