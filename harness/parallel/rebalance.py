"""``Rebalance``: a Keras callback that re-splits a parallel model's batch while it trains.

Each device's step is timed by the model's ``Emulator`` (emulated devices log
their emulated time, real ones their real busy time: ``ParallelModel.time_devices``).
Every ``every`` steps the callback reads each device's busy seconds and samples,
and when the devices' busy times per step drift apart by more than ``tolerance``
(a card throttles, another job shares it) it sets the ratios to the measured
samples per busy second (``harness.parallel.resplit``). The global batch never
changes and ``set_ratios`` keeps every step exact; the step function is not
traced again.

On real devices a device's busy time runs from its slice's arrival to the end
of its backward pass, waits on the others included (the loss needs every
device's output), so re-splitting converges more slowly there than on emulated
devices, to the same balanced point.

``Rebalance`` is a callback of the ``keras`` package; ``rebalance_class(k)``
makes the same callback for another Keras module (``tf_keras``, whose ``fit``
takes its own callbacks only).
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import keras

from harness.compat import callback_class
from harness.errors import InvalidType, InvalidValue
from harness.parallel.resplit import decide, describe
from harness.split import split_batch

if TYPE_CHECKING:
    from harness.emulate import Emulator

__all__ = ["Rebalance", "rebalance_class", "is_rebalance"]


class _Rebalancing:
    """What ``Rebalance`` does, apart from the Keras it is a callback of (``rebalance_class``)."""

    model: Any  # the parallel model: set by the Keras callback this is mixed into (``set_model``)

    def __init__(self, every: int = 20, tolerance: float = 0.05, warmup: int = 2, verbose: int = 0,
                 max_batches=None):
        super().__init__()
        if max_batches is not None and any(
                m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1) for m in max_batches):
            raise InvalidValue(f"Rebalance max_batches must be ints >= 1 (or None), one per device; "
                               f"got max_batches={list(max_batches)!r}")
        self.max_batches = None if max_batches is None else list(max_batches)
        for name, value, least in (("every", every, 1), ("warmup", warmup, 0), ("verbose", verbose, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidValue(f"Rebalance {name} must be an int >= {least}; got {name}={value!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < float("inf"):
            raise InvalidValue(f"Rebalance tolerance must be a number >= 0 (a fraction: 0.05 = 5%); "
                               f"got tolerance={tolerance!r}")
        self.every, self.tolerance, self.warmup, self.verbose = every, float(tolerance), warmup, verbose
        self.history: list[dict] = []
        self.steps = 0  # training steps seen, over every fit
        self._emulator: Emulator | None = None  # the model's, from on_train_begin
        self._begin = 0
        self._reset_window(skip=warmup)

    # -- checks ----------------------------------------------------------------
    def set_model(self, model):
        if not _is_parallel_model(model):
            raise InvalidType(
                f"harness.Rebalance re-splits a model made by harness.parallelize (towers or mirrored); got "
                f"{type(model).__name__} {getattr(model, 'name', '')!r}"
            )
        super().set_model(model)

    # -- the window --------------------------------------------------------------
    def _reset_window(self, skip: int) -> None:
        self._skip = skip
        self._since: float | None = None  # start of the running segment (None: not measuring)
        self._busy: dict[str, tuple[float, int, int]] = {}  # device -> (seconds, samples, steps) of finished segments
        self._window_steps = 0

    def _fold(self, now: float) -> None:
        """Adds the running segment's busy time to the window's."""
        if self._since is None or self._emulator is None:  # not measuring (the emulator is set on train begin)
            return
        for device, busy in self._emulator.busy_between(self._since, now).items():
            seconds, samples, steps = self._busy.get(device, (0.0, 0, 0))
            self._busy[device] = (seconds + busy.seconds, samples + busy.samples, steps + busy.steps)
        self._since = None

    # -- Keras hooks ----------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._emulator = self.model.time_devices()
        self._reset_window(skip=self.warmup)

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        done = max(1, batch - self._begin + 1)  # steps_per_execution > 1 runs several steps per call
        self.steps += done
        if self._skip > 0:
            self._skip -= done
            if self._skip <= 0:
                self._since = now
            return
        if self._since is None:  # warm-up of zero steps, or after evaluation
            self._since = now
            return
        self._window_steps += done
        if self._window_steps >= self.every:
            self._fold(now)
            self._measure(now)

    def on_test_begin(self, logs=None):
        # Validation inside fit runs forward passes only: keep them out of the window.
        self._fold(time.perf_counter())

    def on_test_end(self, logs=None):
        if self._emulator is not None and self._skip <= 0:
            self._since = time.perf_counter()

    # -- the decision ---------------------------------------------------------------
    def _ceilings(self) -> list[int | None]:
        """Per device: the given ceiling, else an emulated device's MAXBATCH, else None."""
        devices = self.model.devices
        if self.max_batches is not None and len(self.max_batches) != len(devices):
            raise InvalidValue(f"Rebalance max_batches has {len(self.max_batches)} entries for {len(devices)} devices "
                               f"{list(devices)}: give one per device")
        emulated = getattr(self._emulator, "devices", {})
        given = self.max_batches or [None] * len(devices)
        return [m if m is not None else getattr(emulated.get(d), "max_batch", None) for d, m in zip(devices, given)]

    def _measure(self, now: float) -> None:
        model = self.model
        rows = model.gather_device_rows([self._busy.get(d, (0.0, 0, 0)) for d in model.devices])
        seconds = [row[0] for row in rows]
        samples = [row[1] for row in rows]
        steps = [row[2] for row in rows]
        batch = round(sum(samples) / self._window_steps) if self._window_steps else 0
        previous = model.ratios
        decision = decide(previous, seconds, samples, steps, batch=max(batch, 1), tolerance=self.tolerance,
                          max_batches=self._ceilings())
        if decision.resplit:
            model.set_ratios(decision.ratios)
        entry = {"step": self.steps, "resplit": decision.resplit, "reason": decision.reason,
                 "previous": list(previous), "ratios": list(model.ratios), "devices": list(model.devices),
                 "busy_seconds": seconds, "samples": samples, "steps": steps, "rates": list(decision.rates),
                 "imbalance": decision.imbalance, "batch": batch,
                 "previous_batches": list(split_batch(batch, previous)),
                 "batches": list(split_batch(batch, model.ratios))}
        self.history.append(entry)
        if self.verbose >= 2 or (self.verbose and decision.resplit):
            print(describe(entry), flush=True)
        self._reset_window(skip=self.warmup if decision.resplit else 0)
        if not decision.resplit:
            self._since = now


class Rebalance(_Rebalancing, keras.callbacks.Callback):
    """Re-splits a ``harness.parallelize`` model's batch from measured device step times.

    A callback of the ``keras`` package (Keras 3; Keras 2 on TF <= 2.15). For a
    Keras 2 model of ``tf_keras`` use ``rebalance_class(tf_keras)``, the same
    callback for that Keras (``ratios="auto"`` builds it by itself).

    Args:
        every: training steps per measurement window.
        tolerance: re-split only when the slowest device is busy longer per
            step than the fastest by more than this fraction.
        warmup: steps not measured at the start of each ``fit`` (tracing) and
            after each re-split (new shapes).
        verbose: 1 prints a line per re-split, 2 also every measured window.
        max_batches: per-device memory ceilings (e.g. ``harness tune``'s) that a
            re-split never crosses; emulated devices' MAXBATCH applies by itself.

    Attributes:
        history: one dict per measured window: ``step`` (training steps seen),
            ``resplit``, ``reason``, ``previous`` and ``ratios`` (the split before
            and after), per-device ``busy_seconds``, ``samples``, ``rates``
            (samples per busy second), ``imbalance``, the window's global
            ``batch`` and the resulting per-device ``batches``.

    Raises:
        TypeError: when training starts, if the model is not a harness parallel model.

    Examples:
        >>> parallel = harness.parallelize(model, 2, method="towers")
        >>> parallel.compile(optimizer="sgd", loss="mse")
        >>> rebalance = harness.Rebalance(every=20)
        >>> parallel.fit(x, y, batch_size=256, callbacks=[rebalance])
        >>> rebalance.history[-1]["batches"]
    """


@functools.cache
def rebalance_class(k) -> type:
    """``Rebalance`` as a callback of Keras module ``k`` (``keras``, or ``tf_keras`` for its models).

    A ``tf_keras`` ``fit`` takes ``tf_keras`` callbacks only; the class is made
    once per module and process.

    Args:
        k: a Keras module, e.g. ``harness.compat.keras_module_of(model)``.

    Returns:
        ``Rebalance`` itself for ``keras``, else a subclass of ``k.callbacks.Callback`` that does the same.

    Examples:
        >>> import tf_keras
        >>> rebalance = rebalance_class(tf_keras)(every=20)
    """
    return callback_class(Rebalance, _Rebalancing, k)


def is_rebalance(callback) -> bool:
    """True for a ``Rebalance`` of any Keras (``rebalance_class``)."""
    return isinstance(callback, _Rebalancing)


def _is_parallel_model(model) -> bool:
    """A model of ``harness.parallelize``, Keras 3 or Keras 2 (``common.ParallelCommon``: it imports this module)."""
    return all(callable(getattr(model, name, None)) for name in ("set_ratios", "time_devices"))
