"""A run's specification: what is trained and how it is timed, declared, checked and written as JSON once.

``RunSpec`` is the base of the two forms a throughput run takes: ``harness.bench.runner.RunConfig``, the spec on
named devices in one process, and ``harness.bench.cluster_run.ClusterPlan``, the spec on a cluster's workers
(their device counts, known before TensorFlow). A new run option is one field of ``RunSpec``, checked in its
``validate`` and written by its ``to_json``: both classes take it by keyword, have it as an attribute and write it
in their JSON, and ``from_spec`` carries it from one to the other (the parent's ``RunConfig`` into its plan, the
plan into each worker's ``RunConfig``).

Field order, for positional construction: ``model, size, method`` (``RunHead``), then where the run is (``devices``
or ``counts``), then ``batches`` and the options with defaults, then the class's own options. Dataclasses lay
fields out base by base in reverse method resolution order, a field already laid out keeping its place, so each
class declares its placement on a subclass of ``RunHead`` and lists it after ``RunSpec`` among its bases::

    @dataclass(frozen=True)
    class _OnDevices(RunHead):
        devices: tuple[str, ...]

    @dataclass(frozen=True)
    class RunConfig(RunSpec, _OnDevices):  # model, size, method, devices, batches, seconds, ..., data, label
        label: str = ""

Each class checks its own fields, and how they match the spec's (one batch per device), then calls
``RunSpec.validate``. Framework-neutral: imports no TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, TypeVar

from harness.emulate import EmulatedDevice
from harness.errors import InvalidValue
from harness.parallel import METHODS as METHODS_OF_PARALLEL
from harness.parallel import Method

__all__ = ["RunHead", "RunSpec", "RunMethod", "METHODS", "PARALLEL_METHODS", "check_throttle"]


class RunMethod(str, Enum):
    """How one run spreads its batch: ``single`` (harness' model on one device), the parallel methods
    (``harness.parallel.Method``), and ``keras``, the stock baseline (Keras fit alone on one device, or
    under a MirroredStrategy on an even split)."""

    SINGLE = "single"
    TOWERS = Method.TOWERS.value
    MIRRORED = Method.MIRRORED.value
    KERAS = "keras"


# RunMethod names Method's members one by one (so that type checkers see them): it must list them all, in order.
if tuple(m.value for m in RunMethod)[1:-1] != tuple(m.value for m in Method):
    raise AssertionError(f"RunMethod {[m.value for m in RunMethod]} must list every harness.parallel.Method "
                         f"{[m.value for m in Method]} between 'single' and 'keras'")

#: the methods a parallel run can use (several devices), and every method of a run
PARALLEL_METHODS = METHODS_OF_PARALLEL
METHODS = tuple(m.value for m in RunMethod)

_Spec = TypeVar("_Spec", bound="RunSpec")


@dataclass(frozen=True)
class RunHead:
    """The first fields of every run: the workload, its size and the method (see the module's doc for why a class)."""

    model: str
    size: str
    method: str


@dataclass(frozen=True)
class RunSpec(RunHead):
    """What one run trains and how it is timed, wherever it runs (``RunConfig``, ``ClusterPlan``).

    ``model`` is a built-in workload's name or a reference to the user's model (``MODULE:ATTR``,
    ``path/to/file.py:ATTR``; docs/user-models.md); ``data`` is ``--data``, a reference to the user's
    data function (None: the workload's own or inferred batches). ``method`` is a ``RunMethod``.

    ``batches`` are per-device batch sizes, as seed 000's (docs/background.md) ``--batches 820 568``;
    the global batch is their sum and the split ratios are the batches themselves. ``emulate`` has
    one ``EmulatedDevice`` per device (None: real devices).

    Each of ``windows`` timed windows lasts about ``seconds``, after ``warmup_steps`` untimed steps;
    ``input_delay_ms`` slows the input pipeline per batch; ``seed`` seeds the model and its data;
    ``notes`` are lines for the record (the stock baseline across workers: which Keras, its input).

    ``rebalance_every`` trains with ``harness.Rebalance(every=...)``: the batches
    are then the starting split, and each window records the devices' batches
    at its end. ``throttle`` entries ``(device_index, rate, at_step)`` change an
    emulated device's rate (samples/s) before training step ``at_step``
    (counted from 0, warm-up steps included): a card that throttles mid-run.
    ``overlap``: harness' methods copy each device's next slice while the step runs
    (``harness.parallel.staging``); False copies it inside the step (the stock baseline has Keras' own input).
    """

    batches: tuple[int, ...]
    seconds: float = 5.0
    windows: int = 3
    warmup_steps: int = 2
    emulate: tuple[EmulatedDevice, ...] | None = None
    input_delay_ms: float = 0.0
    seed: int = 0
    notes: tuple[str, ...] = ()
    rebalance_every: int | None = None
    throttle: tuple[tuple[int, float, int], ...] = ()
    data: str | None = None
    overlap: bool = True

    def __post_init__(self):
        object.__setattr__(self, "batches", tuple(self.batches))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "throttle", tuple(
            tuple(entry) if isinstance(entry, (list, tuple)) else entry for entry in self.throttle or ()))
        if self.emulate is not None:  # EmulatedDevice.to_json's dicts too (a plan read back)
            object.__setattr__(self, "emulate", tuple(EmulatedDevice(**e) if isinstance(e, Mapping) else e
                                                      for e in self.emulate))
        self.validate()

    @property
    def batch(self) -> int:
        return sum(self.batches)

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field of the spec.

        A subclass checks its own fields first, and that the spec has one batch (and emulated device) per
        device; the checks here count the devices by ``batches``.
        """
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise InvalidValue(f"per-device batch sizes must be ints >= 1; got batches={list(self.batches)}")
        if not (isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds) and self.seconds > 0):
            raise InvalidValue(f"seconds per window must be > 0; got seconds={self.seconds!r}")
        if isinstance(self.windows, bool) or not isinstance(self.windows, int) or self.windows < 1:
            raise InvalidValue(f"windows must be an int >= 1; got windows={self.windows!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise InvalidValue(f"warmup_steps must be an int >= 1; got warmup_steps={self.warmup_steps!r}")
        if not isinstance(self.overlap, bool):
            raise InvalidValue(f"overlap must be true or false; got overlap={self.overlap!r}")
        self._validate_rebalance()
        self._validate_stock()

    def _validate_rebalance(self) -> None:
        every = self.rebalance_every
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise InvalidValue(f"rebalance_every must be an int >= 1 (steps per window); got rebalance_every="
                                   f"{every!r}")
            if self.method not in PARALLEL_METHODS:
                raise InvalidValue(f"rebalance_every needs a parallel method (towers or mirrored); got method "
                                   f"{self.method!r}")
        for entry in self.throttle:
            check_throttle(entry, len(self.batches))
            if self.emulate is None:
                raise InvalidValue(f"throttle changes an emulated device's rate: it needs emulate=...; got "
                                   f"throttle={[list(t) for t in self.throttle]} without emulated devices")

    def _validate_stock(self) -> None:
        if self.method != RunMethod.KERAS:
            return
        if len(set(self.batches)) > 1:
            even = sum(self.batches) // len(self.batches)
            raise InvalidValue(
                f"method 'keras' splits the global batch evenly (stock MirroredStrategy); got batches "
                f"{list(self.batches)}: use {len(self.batches)} equal batches such as {[even] * len(self.batches)}")

    def to_json(self) -> dict:
        """Every field, the subclass's too: emulated devices as ``EmulatedDevice.to_json``'s dicts, throttle
        entries as ``{"device", "rate", "at_step"}``."""
        out = asdict(self)
        out["emulate"] = None if self.emulate is None else [e.to_json() for e in self.emulate]
        out["throttle"] = [{"device": i, "rate": rate, "at_step": step} for i, rate, step in self.throttle]
        return out

    @classmethod
    def from_spec(cls: type[_Spec], spec: RunSpec, **changes: Any) -> _Spec:
        """This class with ``spec``'s spec (its ``RunSpec`` fields) and ``changes``: this class's own fields,
        and any spec field to change. ``ClusterPlan.from_spec(config, counts=..., kind=...)`` is a run config's
        plan; ``RunConfig.from_spec(plan, devices=...)`` is a worker's config of the plan."""
        return cls(**{**{f.name: getattr(spec, f.name) for f in fields(RunSpec)}, **changes})

def check_throttle(entry, devices: int) -> tuple[int, float, int]:
    """Checks one ``(device_index, rate, at_step)`` throttle entry for ``devices`` devices; returns it.

    Raises:
        ValueError: naming the entry: not three values, index out of range, rate not positive, step < 0.
    """
    if not isinstance(entry, tuple) or len(entry) != 3:
        raise InvalidValue(f"a throttle entry is (device_index, rate, at_step); got {entry!r}")
    index, rate, step = entry
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < devices:
        raise InvalidValue(f"throttle device index must be 0..{devices - 1} ({devices} devices); got {index!r} in "
                           f"{entry!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (math.isfinite(rate) and rate > 0):
        raise InvalidValue(f"throttle rate must be a positive number of samples/s; got {rate!r} in {entry!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidValue(f"throttle step must be an int >= 0; got {step!r} in {entry!r}")
    return entry
