"""A step watchdog: a training step that never finishes becomes a reported failure, not a hung job.

A collective that never completes (a replica crashed, a device hung, two
strategies sharing collective keys) blocks inside TensorFlow's C++ runtime,
where no Python exception can reach it. So the watchdog does not try to
interrupt the step: past the limit it prints what was running (the step, the
limit, every thread's stack) and ends the process with a distinct status, so
CI reports a failure within the timeout instead of hanging until the job's own
limit.

Example:
    >>> model.fit(x, y, callbacks=[harness.step_watchdog(timeout_s=60)])
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

from harness.errors import InvalidValue

__all__ = ["Watchdog", "step_watchdog", "EXIT_STATUS"]

EXIT_STATUS = 124  # as `timeout(1)`: the step took too long


def _exit_process(status: int) -> None:
    os._exit(status)  # not sys.exit: the main thread is stuck in C++ and would never unwind


class Watchdog:
    """Arms per step; past ``timeout_s`` reports and calls ``on_timeout`` (default: exit the process).

    Args:
        timeout_s: the longest a step may take.
        first_timeout_s: the limit of the first step, which traces and compiles
            (default: 10 x ``timeout_s``).
        on_timeout: called with the report text instead of exiting (tests).
        stream: where the report goes (default ``sys.stderr``).
    """

    def __init__(self, timeout_s: float, first_timeout_s: float | None = None,
                 on_timeout: Callable[[str], None] | None = None, stream=None):
        if not timeout_s > 0:
            raise InvalidValue(f"timeout_s must be positive; got timeout_s={timeout_s!r}")
        if first_timeout_s is not None and not first_timeout_s > 0:
            raise InvalidValue(f"first_timeout_s must be positive; got first_timeout_s={first_timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.first_timeout_s = float(first_timeout_s) if first_timeout_s is not None else 10 * self.timeout_s
        self._on_timeout = on_timeout
        self._stream = stream
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._step: int | None = None
        self._started = 0.0
        self._armed_steps = 0
        self._closed = False
        self.fired = False
        self._thread = threading.Thread(target=self._watch, name="harness-step-watchdog", daemon=True)
        self._thread.start()

    def arm(self, step: int) -> None:
        """A step starts: it must end (``disarm``) within the limit."""
        with self._cond:
            limit = self.first_timeout_s if self._armed_steps == 0 else self.timeout_s
            self._armed_steps += 1
            self._step, self._started = step, time.monotonic()
            self._deadline = self._started + limit
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(timeout=left)
                    continue
                self._fire()
                return

    def _fire(self) -> None:
        self.fired = True
        elapsed = time.monotonic() - self._started
        limit = self.first_timeout_s if self._armed_steps == 1 else self.timeout_s
        text = (f"harness watchdog: training step {self._step} has not finished after {elapsed:.1f} s "
                f"(limit {limit:g} s). A step that never ends is usually a collective that never completes: "
                "a replica crashed or hung, a device stopped, or two strategies share collective keys. "
                f"Stacks of every thread follow; exiting with status {EXIT_STATUS}.")
        stream = self._stream or sys.stderr
        print(text, file=stream, flush=True)
        if self._on_timeout is not None:
            self._on_timeout(text)
            return
        try:
            faulthandler.dump_traceback(file=stream, all_threads=True)
        except (AttributeError, ValueError, OSError):  # a stream without a file descriptor
            pass
        stream.flush()
        _exit_process(EXIT_STATUS)


def step_watchdog(timeout_s: float, first_timeout_s: float | None = None, on_timeout=None, *, model=None):
    """A Keras callback that ends the process when one training step runs past ``timeout_s``.

    Args:
        timeout_s: the longest a training step may take, in seconds.
        first_timeout_s: the first step's limit (tracing, compiling); default 10 x ``timeout_s``.
        on_timeout: called with the report instead of exiting (for tests of the callback itself).
        model: the model to be fitted, when it is a Keras 2 model (``tf_keras``): the callback is
            then a ``tf_keras`` callback. Default: a callback of the ``keras`` package.

    Returns:
        A ``keras.callbacks.Callback`` for ``fit(callbacks=[...])``.
    """
    if model is None:
        import keras
    else:
        from harness.compat import keras_module_of

        keras = keras_module_of(model)

    class StepWatchdog(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.watchdog: Watchdog | None = None
            self._step = 0

        def on_train_begin(self, logs=None):
            self.watchdog = Watchdog(timeout_s, first_timeout_s, on_timeout)

        def on_train_batch_begin(self, batch, logs=None):
            self._step += 1
            self.watchdog.arm(self._step)

        def on_train_batch_end(self, batch, logs=None):
            self.watchdog.disarm()

        def on_train_end(self, logs=None):
            self.watchdog.close()

    return StepWatchdog()
