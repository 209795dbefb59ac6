"""Step timing: warm-up, per-step wall times, median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from harness.errors import InvalidValue

__all__ = ["StepTimes", "Window", "time_train_steps", "window_callback", "lockstep_windows"]


@dataclass(frozen=True)
class StepTimes:
    """Wall time of training steps after warm-up (seconds)."""

    steps: tuple[float, ...]
    batch_size: int

    @property
    def median(self) -> float:
        return statistics.median(self.steps)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        if len(self.steps) < 4:
            return 0.0
        q = statistics.quantiles(self.steps, n=4)
        return (q[2] - q[0]) / self.median

    @property
    def samples_per_second(self) -> float:
        return self.batch_size / self.median


def time_train_steps(model, x, y, *, batch_size: int, steps: int, warmup: int = 3) -> StepTimes:
    """Times ``steps`` training steps of a compiled model after ``warmup`` steps.

    Each step's end is stamped by a callback; Keras syncs each step's logs to
    the host, so the stamps include the device work.
    """
    import numpy as np
    import tensorflow as tf

    from harness.compat import keras_module_of

    if steps < 1 or warmup < 1:
        raise InvalidValue(f"steps and warmup must be >= 1; got steps={steps}, warmup={warmup}")
    stamps: list[float] = []

    callback: Any = keras_module_of(model).callbacks.Callback  # a tf_keras model's fit takes its own only

    class _Stamp(callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    total = steps + warmup
    reps = -(-total * batch_size // len(tf.nest.flatten(y)[0]))
    xs, ys = (tf.nest.map_structure(lambda a: np.concatenate([a] * reps)[: total * batch_size], d) for d in (x, y))
    model.fit(xs, ys, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[_Stamp()])
    deltas = [b - a for a, b in zip(stamps[warmup - 1 :], stamps[warmup:])]
    return StepTimes(tuple(deltas), batch_size)


@dataclass(frozen=True)
class Window:
    """One timed window of training steps: its bounds on ``time.perf_counter`` and what it did."""

    index: int
    start: float
    end: float
    steps: int
    samples: int

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


def window_callback(*, batch_size: int, seconds: float, windows: int, warmup_steps: int, on_window=None,
                    on_step=None, keras_module=None):
    """A Keras callback cutting training into timed windows, then stopping it.

    The first ``warmup_steps`` steps (tracing, allocation) are not timed. A
    window closes at the first step end after ``seconds``; training stops after
    ``windows`` windows. Step ends are stamped when Keras returns the step's
    logs to the host, so a stamp follows the device work of its step.

    Args:
        batch_size: global samples per step.
        seconds: minimum length of a window.
        windows: number of windows.
        warmup_steps: untimed steps first (>= 1: the first step traces).
        on_window: called with each finished ``Window``.
        on_step: called with ``(phase, steps_in_phase, elapsed_s)`` after each
            step, phase ``"warmup"`` or the window index (for progress display).
        keras_module: the Keras module of the model it trains (default ``keras``; ``tf_keras``'s ``fit``
            takes only its own callbacks).

    Returns:
        The callback; its ``windows`` attribute lists the finished windows.
    """
    _check_windows(seconds, windows, warmup_steps)

    class _Windows(_window_log(keras_module)):  # type: ignore[misc]  # keras or tf_keras
        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._start is None:
                self._warm += 1
                if on_step is not None:
                    on_step("warmup", self._warm, 0.0)
                if self._warm >= warmup_steps:
                    self._start = now
                return
            self._steps += 1
            if on_step is not None:
                on_step(len(self.windows), self._steps, now - self._start)
            if now - self._start >= seconds:
                self._close(now, batch_size, windows, on_window)

    return _Windows()


def _check_windows(seconds: float, windows: int, warmup_steps: int) -> None:
    if not seconds > 0 or windows < 1 or warmup_steps < 1:
        raise InvalidValue(
            f"need seconds > 0, windows >= 1 and warmup_steps >= 1; got seconds={seconds}, windows={windows}, "
            f"warmup_steps={warmup_steps}"
        )


def _window_log(keras_module):
    """The base of the window callbacks: the finished windows, and closing one (stopping after the last)."""

    class _WindowLog(_callback_base(keras_module)):  # keras or tf_keras
        def __init__(self):
            super().__init__()
            self.windows: list[Window] = []
            self._warm = 0
            self._start: float | None = None
            self._steps = 0

        def _close(self, now: float, batch_size: int, windows: int, on_window) -> None:
            assert self._start is not None
            window = Window(len(self.windows), self._start, now, self._steps, self._steps * batch_size)
            self.windows.append(window)
            if on_window is not None:
                on_window(window)
            self._start, self._steps = now, 0
            if len(self.windows) >= windows:
                self.model.stop_training = True

    return _WindowLog


def lockstep_windows(exchange, probe_steps: int = 3):
    """A ``window_callback`` maker for the workers of one cluster: every worker cuts its windows at the same steps.

    A synchronous cluster's workers end each step together, but each would close a timed window
    by its own clock, a step apart now and then; the last window's worker that stopped first
    would leave the others waiting in the next step's collectives. Here the windows have a
    fixed number of steps, agreed once: after the warm-up, ``probe_steps`` more untimed steps
    are timed, ``exchange`` shares each worker's mean step time, and every window takes
    ``max(1, round(seconds / slowest))`` steps. Each worker times its windows by its own clock.

    Args:
        exchange: ``exchange(step_seconds) -> [each worker's step_seconds]``; a collective that
            every worker calls at the same step.
        probe_steps: untimed steps after the warm-up whose mean time sets the window length (>= 1).

    Returns:
        A function taking ``window_callback``'s keyword arguments and returning the callback (whose
        ``windows`` lists the finished windows and ``steps_per_window`` the agreed length).
    """
    if isinstance(probe_steps, bool) or not isinstance(probe_steps, int) or probe_steps < 1:
        raise InvalidValue(f"probe_steps must be an int >= 1; got {probe_steps!r}")

    def make(*, batch_size: int, seconds: float, windows: int, warmup_steps: int, on_window=None, on_step=None,
             keras_module=None):
        _check_windows(seconds, windows, warmup_steps)

        class _Lockstep(_window_log(keras_module)):  # type: ignore[misc]  # keras or tf_keras
            def __init__(self):
                super().__init__()
                self.steps_per_window: int | None = None
                self.probe_seconds: list[float] = []  # each worker's mean probe step

            def on_train_batch_end(self, batch, logs=None):
                now = time.perf_counter()
                if self.steps_per_window is None:
                    self._warm += 1
                    if on_step is not None:
                        on_step("warmup", self._warm, 0.0)
                    if self._warm == warmup_steps:
                        self._start = now
                    elif self._warm == warmup_steps + probe_steps:
                        assert self._start is not None
                        self.probe_seconds = [float(s) for s in exchange((now - self._start) / probe_steps)]
                        self.steps_per_window = max(1, round(seconds / max(self.probe_seconds)))
                        self._start = time.perf_counter()  # after the exchange: the next step starts now
                    return
                assert self._start is not None
                self._steps += 1
                if on_step is not None:
                    on_step(len(self.windows), self._steps, now - self._start)
                if self._steps >= self.steps_per_window:
                    self._close(now, batch_size, windows, on_window)

        return _Lockstep()

    return make


def _callback_base(module) -> Any:
    """``module.callbacks.Callback``, of Keras 3's ``keras`` for None."""
    if module is None:
        import keras

        return keras.callbacks.Callback
    return module.callbacks.Callback
