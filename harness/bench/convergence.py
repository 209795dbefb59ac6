"""Time to accuracy: train a workload until its held-out accuracy reaches a target, or a step budget runs out.

Samples/s alone misses the failure seed 001 describes (docs/background.md): multi-GPU
training that runs at full speed but converges to half the accuracy. This trains a
``harness.bench.runner.RunConfig`` (built by ``runner.build_model``, as ``harness run``
builds it: the same model, method, devices, split and emulated devices) with
``train_on_batch`` on the workload's learnable synthetic data, and evaluates the
held-out accuracy every ``Goal.every`` steps:

- **data**: training step ``s`` (from 0) trains on ``make_data(size, global batch,
  seed=s)``: fresh samples every step, the same ones for every method and split;
  the held-out set is ``make_data(size, Goal.held_out, seed=HELD_OUT_SEED)``, a seed
  no training step uses. The initial weights are the workload's for ``config.seed``,
  so single, even and ratio runs of one global batch train the same model (harness'
  steps are exact: their curves agree up to float rounding).
- **accuracy**: ``Workload.accuracy()`` on the logits of the trained single-device
  model (``model.template`` after ``sync_to_template``) over the held-out set, on the
  host's default device: evaluation never runs on the emulated devices and is off
  the clock.
- **steps**: the first evaluated step count at which the accuracy is ``>= target``.
- **seconds**: the wall time of those training steps (each ``train_on_batch``
  returns NumPy, so the host has waited for the step). The first step traces the
  step function, seconds of graph building that say nothing about training: it
  counts at the median time of the others (``trace_seconds`` keeps what it took).
- **final accuracy**: the held-out accuracy where the run stopped: the first
  evaluation at or above the target, or the last one of the budget.

A user's workload (``RunConfig(model="file.py:workload")``, docs/user-models.md) trains on its own
data instead: the batches of ``harness.Workload(data=...)`` in order, the held-out set its
``validation_data``, the accuracy its ``accuracy`` metric (or the one that fits its loss), and
``goal=None`` trains for its ``goal``.

A run that never reaches the target has finite figures that are clearly worse, never
NaN (asv records NaN as skipped, which would hide the regression):
``steps_figure = UNREACHED_FACTOR x budget`` and ``seconds_figure = UNREACHED_FACTOR x``
the seconds the whole budget took.

Example:
    >>> import harness
    >>> from harness.bench.convergence import Goal, train_to_accuracy
    >>> from harness.bench.runner import RunConfig
    >>> devices = harness.use_logical_devices(2)
    >>> config = RunConfig("mnist_maxing", "tiny", "towers", tuple(devices), (80, 40))
    >>> result = train_to_accuracy(config, Goal(target=0.9, budget=120, held_out=512))
    >>> result.steps_figure, round(result.final_accuracy, 3)
    (59.0, 0.959)

Nothing here imports TensorFlow at module import time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.bench.runner import RunConfig, RunMethod
from harness.errors import InvalidValue

__all__ = ["Goal", "ConvergenceResult", "train_to_accuracy", "HELD_OUT_SEED", "UNREACHED_FACTOR", "CONVERGENCE_METHODS",
           "USER_BUDGET", "USER_EVERY"]

HELD_OUT_SEED = 2**31 - 1  # the held-out set's sample seed: no training step (seeds 0 .. budget - 1) draws it
EVAL_BATCH = 512  # held-out samples per forward pass of the evaluation
UNREACHED_FACTOR = 2.0  # a run that misses the target: its figures are this times the whole budget's
CONVERGENCE_METHODS = (RunMethod.SINGLE.value, RunMethod.TOWERS.value, RunMethod.MIRRORED.value)
USER_BUDGET, USER_EVERY = 1000, 10  # a user workload's goal without a Goal: at most this many steps, evaluated every


@dataclass(frozen=True)
class Goal:
    """What a run trains for: a held-out accuracy, the most steps it may take, how often it is evaluated.

    Attributes:
        target: held-out accuracy to reach, in (0, 1].
        budget: most training steps, >= 1.
        every: evaluate every this many steps (and after the last step of the budget).
        held_out: samples in the held-out set.
    """

    target: float
    budget: int
    every: int = 1
    held_out: int = 1024

    def __post_init__(self):
        if isinstance(self.target, bool) or not isinstance(self.target, (int, float)) or not 0 < self.target <= 1:
            raise InvalidValue(f"target must be an accuracy in (0, 1]; got target={self.target!r}")
        for name in ("budget", "every", "held_out"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValue(f"{name} must be an int >= 1; got {name}={value!r}")

    def to_json(self) -> dict:
        return {"target": self.target, "budget": self.budget, "every": self.every, "held_out": self.held_out}


@dataclass(frozen=True)
class ConvergenceResult:
    """One run of ``train_to_accuracy``.

    Attributes:
        config: the run's ``RunConfig.to_json()``.
        goal: the ``Goal`` it trained for.
        steps: the first evaluated step count with accuracy >= target; None if the budget ran out first.
        seconds: the wall time of those steps (the first at the median step time); None if not reached.
        final_accuracy: the held-out accuracy where the run stopped.
        steps_run: the training steps it ran (``steps``, or the whole budget).
        seconds_run: their wall time, counted as ``seconds``.
        trace_seconds: what the first step took (tracing included).
        curve: ``(step, seconds, accuracy)`` at each evaluation.
        host_bound: the emulated devices this host could not slow down to their rates
            (``harness.bench.runner.host_bound``'s entries): ``seconds`` is then the host's speed.
    """

    config: dict
    goal: Goal
    steps: int | None
    seconds: float | None
    final_accuracy: float
    steps_run: int
    seconds_run: float
    trace_seconds: float
    curve: tuple[tuple[int, float, float], ...]
    host_bound: tuple[dict, ...] = field(default=())

    @property
    def reached(self) -> bool:
        """Whether the held-out accuracy reached the target within the budget."""
        return self.steps is not None

    @property
    def steps_figure(self) -> float:
        """Steps to the target; ``UNREACHED_FACTOR x budget`` when it was not reached (finite, never NaN)."""
        return float(self.steps) if self.steps is not None else UNREACHED_FACTOR * self.goal.budget

    @property
    def seconds_figure(self) -> float:
        """Seconds to the target; ``UNREACHED_FACTOR x`` the whole budget's seconds when it was not reached."""
        return self.seconds if self.seconds is not None else UNREACHED_FACTOR * self.seconds_run

    def to_json(self) -> dict:
        return {"config": self.config, "goal": self.goal.to_json(), "steps": self.steps, "seconds": self.seconds,
                "final_accuracy": self.final_accuracy, "steps_run": self.steps_run, "seconds_run": self.seconds_run,
                "trace_seconds": self.trace_seconds, "curve": [list(point) for point in self.curve],
                "host_bound": list(self.host_bound), "reached": self.reached, "steps_figure": self.steps_figure,
                "seconds_figure": self.seconds_figure}


def train_to_accuracy(config: RunConfig, goal: Goal | None = None,
                      on_evaluation: Callable[[int, float, float], None] | None = None) -> ConvergenceResult:
    """Trains ``config``'s workload from its initial weights until the held-out accuracy reaches ``goal.target``.

    Args:
        config: the model, size, method (``single``, ``towers``, ``mirrored``), devices, per-device batches,
            emulated devices and weight seed, as ``harness run`` takes them; its timing fields are not used.
        goal: target accuracy, step budget, evaluation interval, held-out size; None: a user workload's own
            ``goal`` (``harness.Workload(goal=...)``) within ``USER_BUDGET`` steps, evaluated every ``USER_EVERY``.
        on_evaluation: called with ``(step, seconds, accuracy)`` after each evaluation (progress).

    Returns:
        The ``ConvergenceResult``: steps, seconds and final accuracy, the curve.

    Raises:
        ValueError: ``config.method`` is the stock baseline ``keras``, which is not measured here; no ``goal``
            and a workload without one.
    """
    import tensorflow as tf

    from harness.bench import workloads
    from harness.bench.runner import build_model

    if config.method not in CONVERGENCE_METHODS:
        raise InvalidValue(f"time to accuracy trains harness' methods {', '.join(CONVERGENCE_METHODS)}; got method="
                           f"{config.method!r}")
    workload = workloads.get(config.model, config.data)
    if goal is None:
        if workload.goal is None:
            raise InvalidValue(f"time to accuracy of {config.model!r} needs a goal: pass Goal(target=...), or give "
                               "harness.Workload(goal=..., validation_data=...)")
        goal = Goal(target=workload.goal, budget=USER_BUDGET, every=USER_EVERY)
    model = build_model(config, workload)
    held_out = workload.held_out_data(config.size, goal.held_out, seed=HELD_OUT_SEED)
    evaluate = _evaluator(model, workload, held_out)
    times: list[float] = []
    curve: list[tuple[int, float, float]] = []
    batches = workload.train_batches(config.size, config.batch)
    began = time.perf_counter()
    for step in range(goal.budget):
        x, y = (tf.nest.map_structure(tf.constant, part) for part in next(batches))
        start = time.perf_counter()
        model.train_on_batch(x, y)  # returns NumPy: the host has waited for the step
        times.append(time.perf_counter() - start)
        done = step + 1
        if done % goal.every and done != goal.budget:
            continue
        accuracy = evaluate()
        curve.append((done, _clock(times), accuracy))
        if on_evaluation is not None:
            on_evaluation(*curve[-1])
        if accuracy >= goal.target:
            break
    ended = time.perf_counter()
    emulator = getattr(model, "emulator", None)
    late = () if emulator is None else tuple(emulator.host_bound_between(began, ended))
    steps_run, seconds_run, final = curve[-1]
    reached = final >= goal.target
    return ConvergenceResult(config=config.to_json(), goal=goal, steps=steps_run if reached else None,
                             seconds=seconds_run if reached else None, final_accuracy=final, steps_run=steps_run,
                             seconds_run=seconds_run, trace_seconds=times[0], curve=tuple(curve), host_bound=late)


def _clock(times: list[float]) -> float:
    """The steps' wall time so far, the first (tracing) counted at the median time of the others."""
    if len(times) == 1:
        return times[0]
    return math.fsum(times[1:]) + statistics.median(times[1:])


def _evaluator(model, workload, held_out) -> Callable[[], float]:
    """A function returning the held-out accuracy of ``model``'s current weights, computed on its template."""
    import tensorflow as tf

    from harness.compat import keras_module_of

    x, y = held_out
    template: Any = model.template
    metric = workload.accuracy(keras_module_of(template))
    rows = len(tf.nest.flatten(y)[0])
    # One traced forward pass (half an eager call's time here), reading the template's variables as they are now.
    forward = tf.function(lambda xs: template(xs, training=False), reduce_retracing=True)

    def evaluate() -> float:
        model.sync_to_template()  # mirrored trains a clone; towers' template holds the trained weights already
        metric.reset_state()
        for start in range(0, rows, EVAL_BATCH):
            part = slice(start, start + EVAL_BATCH)
            xs, ys = (tf.nest.map_structure(lambda a, part=part: a[part], d) for d in (x, y))
            metric.update_state(ys, forward(xs))
        return float(metric.result())

    return evaluate
