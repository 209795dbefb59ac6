"""Step timing: warm-up, per-step wall times, median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

__all__ = ["StepTimes", "time_train_steps"]


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
    import keras
    import numpy as np

    if steps < 1 or warmup < 1:
        raise ValueError(f"steps and warmup must be >= 1; got steps={steps}, warmup={warmup}")
    stamps: list[float] = []

    class _Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    total = steps + warmup
    reps = -(-total * batch_size // len(y))
    xs = keras.tree.map_structure(lambda a: np.concatenate([a] * reps)[: total * batch_size], x)
    ys = np.concatenate([y] * reps)[: total * batch_size]
    model.fit(xs, ys, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[_Stamp()])
    deltas = [b - a for a, b in zip(stamps[warmup - 1 :], stamps[warmup:])]
    return StepTimes(tuple(deltas), batch_size)
