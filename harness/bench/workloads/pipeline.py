"""Input pipelines for the workloads, and the check that they can feed the model (seed 003, tip 3).

Seed 003's third tip (a public blog post of five multi-GPU tips, docs/background.md): a GPU
waits for data when preprocessing is CPU-bound, and adding GPUs then buys nothing.
``make_dataset`` builds the pipeline every benchmark trains from, with an optional emulated
per-batch preprocessing cost; ``measure_input_rate`` times the pipeline alone; ``is_starved``
compares that with the training rate, so a throughput figure is never read as the model's
when it was the input's.

TensorFlow is imported inside ``make_dataset`` only: ``is_starved`` and
``InputRate`` stay usable without it.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.bench.workloads import Workload, check_size, get
from harness.errors import InvalidValue

if TYPE_CHECKING:
    from harness.bench.workloads.user import UserWorkload

__all__ = ["POOL_BYTES", "InputRate", "default_pool_size", "make_dataset", "measure_input_rate", "is_starved"]

POOL_BYTES = 256 * 2**20  # cap on the synthetic sample pool held in memory
_POOL_BATCHES = 4  # distinct batches in the default pool, when they fit under POOL_BYTES
_WARMUP_BATCHES = 2


@dataclass(frozen=True)
class InputRate:
    """How fast a dataset yields samples on its own."""

    samples_per_second: float
    batches: int
    seconds: float

    @property
    def batches_per_second(self) -> float:
        return self.batches / self.seconds


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidValue(f"{name} must be a positive integer; got {name}={value!r}")
    return int(value)


def _positive_number(name: str, value, *, zero_ok: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        allowed = "a finite number >= 0" if zero_ok else "a positive finite number"
        raise InvalidValue(f"{name} must be {allowed}; got {name}={value!r}")
    return float(value)


def default_pool_size(workload: Workload | UserWorkload, size: str, batch_size: int) -> int:
    """Samples in the default pool: a few distinct batches, at most ``POOL_BYTES``, at least one batch."""
    fit = POOL_BYTES // workload.sample_bytes(size)
    return max(batch_size, min(_POOL_BATCHES * batch_size, fit))


def make_dataset(
    workload: Workload | UserWorkload | str,
    size: str,
    batch_size: int,
    *,
    samples: int | None = None,
    seed: int = 0,
    input_delay_ms: float = 0.0,
    repeat: bool = True,
):
    """A ``tf.data.Dataset`` of ``(x, y)`` batches of the workload's synthetic data.

    A pool of deterministic samples (``make_data(size, samples, seed)``) is sliced,
    repeated, batched with ``drop_remainder=True`` (every step sees the same
    batch size, seed 003 tip 2), optionally delayed, and prefetched. A user's
    workload with real data (``--data``) gives its own batches instead
    (``workload.training_data``: full batches, repeated), delayed and prefetched alike,
    unless ``samples`` or ``repeat=False`` ask for a pool.

    Args:
        workload: a ``Workload`` or its name.
        size: ``"full"`` or ``"tiny"``.
        batch_size: samples per batch.
        samples: pool size; default ``default_pool_size`` (a few batches, capped at ``POOL_BYTES``).
        seed: draws the pool's samples.
        input_delay_ms: emulated CPU-bound preprocessing per batch, in milliseconds. Batches
            pass through it one at a time, so the pipeline yields at most ``1000 / input_delay_ms``
            batches/s; prefetching overlaps it with training, as real preprocessing would.
        repeat: cycle the pool forever; ``False`` gives ``samples // batch_size`` batches.

    Returns:
        The dataset; each element is ``(x, y)`` with a static batch dimension.

    Raises:
        ValueError: for an unknown workload or size, or a bad number (repeating the value).

    Example:
        >>> ds = make_dataset("mnist_maxing", "tiny", 256, input_delay_ms=5.0)
        >>> model.fit(ds, steps_per_epoch=20)
    """
    if isinstance(workload, str):
        workload = get(workload)
    check_size(size)
    batch_size = _positive_int("batch_size", batch_size)
    delay_s = _positive_number("input_delay_ms", input_delay_ms, zero_ok=True) / 1000.0
    import tensorflow as tf

    from harness.bench.workloads.tfdata import still_options

    dataset = workload.training_data(batch_size) if repeat and samples is None else None
    if dataset is None:  # a pool of synthetic samples
        samples = default_pool_size(workload, size, batch_size) if samples is None else \
            _positive_int("samples", samples)
        x, y = workload.make_data(size, samples, seed)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if repeat:
            dataset = dataset.repeat()
        dataset = dataset.batch(batch_size, drop_remainder=True).with_options(still_options(tf))
    if delay_s > 0:
        dataset = dataset.map(_delay_fn(tf, delay_s))
        # One batch at a time (see input_delay_ms): tf.data would otherwise parallelise a map of
        # stateless ops, and sleeps overlap without limit where real CPU work would share the cores.
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        dataset = dataset.with_options(options)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _delay_fn(tf, delay_s: float):
    def _sleep(x):
        time.sleep(delay_s)
        return x

    def delay(x, *rest):
        # The batch goes through the sleep, so the op feeds the output and is never pruned;
        # stateful=False lets TensorFlow overlap it with other work (DESIGN: emulated devices).
        # A model of several inputs: the first goes through it. rest: y (and a user's sample weights).
        leaves = tf.nest.flatten(x)
        delayed = tf.numpy_function(_sleep, [leaves[0]], leaves[0].dtype, stateful=False)
        leaves[0] = tf.ensure_shape(delayed, leaves[0].shape)
        return (tf.nest.pack_sequence_as(x, leaves), *rest)

    return delay


def measure_input_rate(
    dataset: Iterable, batch_size: int, *, seconds: float = 1.0, max_batches: int | None = None
) -> InputRate:
    """Time a dataset on its own: samples per second it can deliver, with nothing consuming them.

    Two batches are drawn first (building the pipeline, filling the prefetch buffer
    is start-up, not rate); then batches are drawn until ``seconds`` have passed,
    ``max_batches`` were drawn, or the dataset ends.

    Args:
        dataset: any iterable of batches, usually from ``make_dataset``.
        batch_size: samples per batch (batches are not inspected).
        seconds: how long to time.
        max_batches: stop after this many timed batches.

    Raises:
        ValueError: for a bad argument, or a dataset that ended before one batch was timed.
    """
    batch_size = _positive_int("batch_size", batch_size)
    seconds = _positive_number("seconds", seconds)
    if max_batches is not None:
        _positive_int("max_batches", max_batches)
    iterator = iter(dataset)
    for _ in range(_WARMUP_BATCHES):
        if next(iterator, None) is None:
            break
    batches = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds and (max_batches is None or batches < max_batches):
        if next(iterator, None) is None:
            break
        batches += 1
        elapsed = time.perf_counter() - start
    if batches == 0:
        raise InvalidValue(f"the dataset yielded no batch to time after {_WARMUP_BATCHES} warm-up batches")
    return InputRate(samples_per_second=batches * batch_size / elapsed, batches=batches, seconds=elapsed)


def is_starved(input_sps: float, train_sps: float, margin: float = 1.1) -> bool:
    """Whether the input pipeline cannot feed training with headroom: ``input_sps < margin * train_sps``.

    Args:
        input_sps: samples/s the pipeline delivers alone (``measure_input_rate``).
        train_sps: samples/s the model trains at when fed from memory.
        margin: headroom the pipeline needs over training (1.1: 10% faster).

    Raises:
        ValueError: unless all three are positive finite numbers.

    Example:
        >>> is_starved(input_sps=1000.0, train_sps=950.0)
        True
    """
    input_sps = _positive_number("input_sps", input_sps)
    train_sps = _positive_number("train_sps", train_sps)
    margin = _positive_number("margin", margin)
    return input_sps < margin * train_sps
