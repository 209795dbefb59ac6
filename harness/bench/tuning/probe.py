"""Profiling one device alone: its memory ceiling and step times at several batch sizes.

One model per device, built on that device, trained with ``fit`` on synthetic
data of the workload. The batch grows by doubling until a step runs
out of memory (or takes longer than ``max_step_s``, or reaches ``limit``), then
the ceiling is bisected to within ``tolerance``. An out-of-memory step is caught
and recorded; TensorFlow's allocator frees the failed step's tensors, so the
next, smaller probe runs in the same process (its pool is not returned to the
driver, which is why other processes should not share the GPU while tuning).

Every successful growth probe is also timed (one untimed step for tracing and
allocation, then steps for at least ``min_seconds``): the throughput curve
comes free with the ceiling search. On an emulated device the untimed steps
(those of the bisection are all untimed) skip their emulated waits
(``harness.emulate.Emulator.waiting``): they say whether a batch fits, not how
fast (over a link, a growth probe's untimed step waits: ``Emulator.steps_to_skip``).
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Point", "DeviceProbe", "probe_device"]


@dataclass(frozen=True)
class Point:
    """One probe: a batch size, whether it fit, and its median step time.

    On an emulated device ``host_rate`` is the rate this host computed the timed
    steps at, ``late_steps`` how many ran past their emulated time, and
    ``host_bound`` says more than ``HOST_BOUND_SHARE`` of them did (the step time
    is then the host's, not the emulation's).
    """

    batch: int
    fits: bool
    step_seconds: float | None = None
    steps: int = 0
    host_rate: float | None = None
    late_steps: int = 0
    host_bound: bool = False

    def to_json(self) -> dict:
        return {"batch": self.batch, "fits": self.fits, "step_seconds": self.step_seconds, "steps": self.steps,
                "samples_per_second": None if not self.step_seconds else self.batch / self.step_seconds,
                "host_rate": self.host_rate, "late_steps": self.late_steps, "host_bound": self.host_bound}


@dataclass
class DeviceProbe:
    """A device's profile, and the live model that measured it (for the solo figures later)."""

    device: str
    points: list[Point] = field(default_factory=list)
    ceiling: int | None = None  # the largest batch that ran
    oom_at: int | None = None  # the smallest batch that ran out of memory
    stopped_by: str = ""  # "oom", "limit" or "step time"
    oom_error: str | None = None
    seconds: float = 0.0
    # What a step of this model exchanges with the merge device when it runs on another one, measured from its
    # tensors: the trained weights (bytes, tensors) in, as many gradient bytes out, and its outputs per sample.
    weight_bytes: int = 0
    weight_tensors: int = 0
    output_bytes_per_sample: float = 0.0
    _runner: Callable[[int, int, float], Point] | None = None

    def timed(self) -> list[Point]:
        return [p for p in self.points if p.fits and p.step_seconds]

    def measure(self, batch: int, min_seconds: float, max_steps: int = 20) -> Point:
        """Times this device alone at ``batch`` (after one untimed step)."""
        if self._runner is None:
            raise RuntimeError(f"the probe of {self.device} was released: its model is gone, it cannot measure")
        return self._runner(batch, max_steps, min_seconds)

    def to_json(self) -> dict:
        return {"device": self.device, "ceiling": self.ceiling, "oom_at": self.oom_at, "stopped_by": self.stopped_by,
                "oom_error": self.oom_error, "seconds": self.seconds, "points": [p.to_json() for p in self.points],
                "weight_bytes": self.weight_bytes, "weight_tensors": self.weight_tensors,
                "output_bytes_per_sample": self.output_bytes_per_sample}


def release_probes(probes: Iterable[DeviceProbe]) -> None:
    """Drops each probe's model, then one full garbage collection frees them all (Keras models are cycles): one
    walk of every object (0.3 s after ``harness tune``'s profiling here), not one per probe."""
    for probe in probes:
        probe._runner = None
    gc.collect()


def probe_device(
    workload,
    size: str,
    device: str,
    *,
    emulate=None,
    start: int = 32,
    limit: int = 8192,
    tolerance: float = 0.03,
    min_seconds: float = 0.25,
    max_step_s: float = 1.0,
    seed: int = 0,
    on_point: Callable[[str, Point], None] | None = None,
    backend: str = "tensorflow",
) -> DeviceProbe:
    """Finds ``device``'s memory ceiling for ``workload`` and times it at the batches it tried.

    Args:
        workload: a ``harness.bench.workloads.Workload``.
        size: its size, ``"tiny"`` or ``"full"``.
        device: a TensorFlow device name (on ``backend="jax"`` a JAX one: ``cpu:0``, ``gpu:1``).
        emulate: the device's ``EmulatedDevice``, if emulated.
        start: first batch size tried.
        limit: the search stops here even without running out of memory.
        tolerance: bisect until ``(oom_at - ceiling) / ceiling <= tolerance``.
        min_seconds: timed steps per growth probe last at least this long.
        max_step_s: growing stops after a step this slow (the curve is known by then).
        seed: weights and data seed.
        on_point: called with ``(device, point)`` after each probe (progress).
        backend: ``"tensorflow"`` or ``"jax"`` (Keras 3 on JAX: ``_jax_runner``, no TensorFlow).

    Returns:
        The ``DeviceProbe``; ``ceiling`` is None when even batch 1 ran out of memory.
    """
    began = time.perf_counter()
    probe = DeviceProbe(device)
    runner = _jax_runner if backend == "jax" else _runner
    run = probe._runner = runner(workload, size, device, emulate, seed, probe)

    def attempt(batch: int, timed: bool) -> Point:
        try:
            point = run(batch, 20, min_seconds) if timed else run(batch, 0, 0.0)
        except _OutOfMemory as oom:
            point = Point(batch, False)
            probe.oom_error = probe.oom_error or str(oom)
        probe.points.append(point)
        if on_point is not None:
            on_point(device, point)
        return point

    good, bad, batch = 0, None, max(1, min(start, limit))
    while True:  # grow
        point = attempt(batch, timed=True)
        if not point.fits:
            bad = batch
            break
        good = batch
        if batch >= limit:
            probe.stopped_by = "limit"
            break
        if point.step_seconds is not None and point.step_seconds >= max_step_s:  # timed: it has a step time
            probe.stopped_by = "step time"
            break
        batch = min(2 * batch, limit)
    if bad is not None:
        probe.stopped_by = "oom"
        while bad - good > max(1, tolerance * good):  # bisect: ceiling in [good, bad)
            mid = (good + bad) // 2
            if attempt(mid, timed=False).fits:
                good = mid
            else:
                bad = mid
        probe.oom_at = bad
    probe.ceiling = good or None
    probe.seconds = time.perf_counter() - began
    return probe


_BUILDING = threading.Lock()


def _stamps(model, times: list[float], max_steps: int, min_seconds: float):
    """A callback of ``model``'s Keras appending each step's seconds to ``times`` (the first step ends the untimed
    wait for its slice) until ``max_steps`` of them, or ``min_seconds`` together, then stopping the fit."""
    from harness.compat import keras_module_of

    class Stamps(keras_module_of(model).callbacks.Callback):  # type: ignore[misc]
        last: float | None = None
        started: float | None = None  # the end of the first (untimed) step: the timed steps' start

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()  # logs reached the host: the step's device work is done
            if self.last is not None:
                times.append(now - self.last)
            else:
                self.started = now
                emulator = getattr(model, "emulator", None)
                if emulator is not None:  # the untimed step skipped its emulated wait (_runner's run); these wait
                    emulator.waiting = True
                # What exists now (the traced step's graphs among it) is left out of the garbage collector's
                # scans until the run ends: a full collection walking TensorFlow's graphs took seconds, and
                # one inside the timed steps made them look slow (not late: a host pause outside the steps).
                gc.freeze()
            self.last = now
            if len(times) >= max_steps or (times and sum(times) >= min_seconds):
                self.model.stop_training = True

    return Stamps()


class _OutOfMemory(Exception):
    device_index: int | None = None  # set by the tuner's solo runs: which of its devices


def _runner(workload, size: str, device: str, emulate, seed: int, probe: DeviceProbe | None = None):
    """A function ``(batch, max_steps, min_seconds) -> Point`` training the device's own model; sets ``probe``'s
    traffic figures (``DeviceProbe.weight_bytes``...)."""
    import tensorflow as tf

    from harness.bench.runner import _oom_line
    from harness.bench.workloads.tfdata import still_options
    from harness.parallel import parallelize

    with _BUILDING:  # the tuner profiles devices in threads: Keras' layer naming and seeding are process-wide
        with tf.device(device):
            template = workload.build(size, seed=seed)
        compile_args = workload.compile_args(template)
        model = parallelize(template, [device], method="towers", emulate=None if emulate is None else [emulate])
        model.compile(**compile_args)
        pool_x, pool_y = workload.make_data(size, 256, seed=seed)  # a user's model may take several inputs
    pool = len(tf.nest.flatten(pool_y)[0])
    if probe is not None:
        from harness.emulate import variable_bytes

        probe.weight_bytes, probe.weight_tensors = variable_bytes(template.trainable_weights)
        with tf.device(device):
            outputs = template(tf.nest.map_structure(lambda a: tf.constant(a[:2]), pool_x), training=False)
        probe.output_bytes_per_sample = sum(np.asarray(t).nbytes for t in tf.nest.flatten(outputs)) / 2

    def run(batch: int, max_steps: int, min_seconds: float) -> Point:
        """One untimed step (tracing, allocation: enough to see an OOM), then ``max_steps`` at most, timed: steps
        of ``fit``, as the parallel run takes them (each next slice copied while a step runs:
        ``harness.parallel.staging``), one batch of the pool over and over. Every batch size runs the one trace
        of fit's train function (its batch dimension unknown): a ``train_on_batch`` step first cost a trace of its
        own for each new size, on every device, before a single timed step (seconds per device here)."""
        index = np.arange(batch) % pool
        x, y = (tf.nest.map_structure(lambda a: tf.constant(a[index]), d) for d in (pool_x, pool_y))
        times: list[float] = []
        began = time.perf_counter()
        # The first, untimed step (a trace, or only whether the batch fits) skips its emulated wait; the timed ones
        # wait (_stamps). Over a link, one that timed steps follow waits too (Emulator.steps_to_skip).
        if model.emulator is not None and model.emulator.steps_to_skip(1, timed_after=max_steps > 0):
            model.emulator.waiting = False
        try:
            # Batched after repeat: every batch full, its size unknown to the trace (one trace per model).
            batches = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
            batches = batches.with_options(still_options(tf))  # freed fast (tfdata.still_options)
            stamps = _stamps(model, times, max_steps, min_seconds)
            model.fit(batches, steps_per_epoch=max_steps + 1, epochs=1, verbose=0, shuffle=False,
                      callbacks=[stamps])
            # The first step traced fit's train function (late, as any trace) or allocated for the new size: not
            # one of the timed steps whose lateness says the host is too slow for the emulated rate.
            began = stamps.started or began
        except tf.errors.ResourceExhaustedError as err:
            raise _OutOfMemory(_oom_line(err)) from None
        finally:
            gc.unfreeze()
            if model.emulator is not None:
                model.emulator.waiting = True
            del x, y
        busy = model.emulator.busy_between(began, time.perf_counter())[device] if emulate and times else None
        return Point(batch, True, statistics.median(times) if times else None, len(times),
                     host_rate=busy.host_rate if busy else None, late_steps=busy.late_steps if busy else 0,
                     host_bound=bool(busy and busy.host_bound))

    return run


def _jax_runner(workload, size: str, device: str, emulate, seed: int, probe: DeviceProbe | None = None):
    """``_runner`` on Keras 3's JAX backend (no TensorFlow): the device's own model (``harness.parallelize`` on the
    one JAX device, emulated or not), ``fit`` on a generator of one batch of the pool, the same untimed first step
    and stamps; an emulated device's MAXBATCH (``MemoryError``) or XLA's out of memory is ``_OutOfMemory``."""
    import keras

    from harness.bench.jaxbench import out_of_memory_line
    from harness.parallel import parallelize

    with _BUILDING:  # the tuner profiles devices in threads: Keras' layer naming and seeding are process-wide
        template = workload.build(size, seed=seed)
        compile_args = workload.compile_args(template)
        model = parallelize(template, [device], method="towers", emulate=None if emulate is None else [emulate])
        model.compile(**compile_args)
        pool_x, pool_y = workload.make_data(size, 256, seed=seed)
    pool = len(keras.tree.flatten(pool_y)[0])
    if probe is not None:
        probe.weight_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                                 for v in template.trainable_weights)
        probe.weight_tensors = len(template.trainable_weights)
        outputs = template(keras.tree.map_structure(lambda a: a[:2], pool_x), training=False)
        probe.output_bytes_per_sample = sum(np.asarray(t).nbytes for t in keras.tree.flatten(outputs)) / 2

    def run(batch: int, max_steps: int, min_seconds: float) -> Point:
        index = np.arange(batch) % pool
        x, y = (keras.tree.map_structure(lambda a: a[index], d) for d in (pool_x, pool_y))

        def batches():
            while True:
                yield x, y

        times: list[float] = []
        began = time.perf_counter()
        if model.emulator is not None:  # the first, untimed step skips its emulated wait; the timed ones wait
            model.emulator.waiting = False
        try:
            stamps = _stamps(model, times, max_steps, min_seconds)
            model.fit(batches(), steps_per_epoch=max_steps + 1, epochs=1, verbose=0, shuffle=False,
                      callbacks=[stamps])
            began = stamps.started or began
        except Exception as err:
            line = out_of_memory_line(err)
            if line is None:
                raise
            raise _OutOfMemory(line) from None
        finally:
            gc.unfreeze()
            if model.emulator is not None:
                model.emulator.waiting = True
        busy = model.emulator.busy_between(began, time.perf_counter())[device] if emulate and times else None
        return Point(batch, True, statistics.median(times) if times else None, len(times),
                     host_rate=busy.host_rate if busy else None, late_steps=busy.late_steps if busy else 0,
                     host_bound=bool(busy and busy.host_bound))

    return run
