"""Emulated heterogeneous devices: logical CPU devices that work at a chosen speed.

``--emulate 1345:1100,875:700`` makes device 0 process 1345 samples/s and fail
beyond 1100 samples per step, device 1 875 samples/s up to 700 samples; a third
field adds a fixed cost per step in milliseconds (``1438:1100:49`` is the GTX 1080 Ti of
seed 000, docs/background.md: 684, 1128 and 1345 samples/s at batch 64, 256 and 1024). Each
device's slice passes a *begin* op (start time; the memory check) before its computation
and an *end* op after it, which sleeps until ``start + overhead + n / rate``.

Rates can change while a model trains (``Emulator.set_rate``: a card that
throttles), and devices may be *timed only* (``Emulator(timed=[...])``): their
begin/end ops log real busy time without sleeping, which is how the rebalancer
measures real devices.

Both ops are ``tf.numpy_function(..., stateful=False)``: stateful Python ops
are serialised by tf.function's automatic control dependencies, stateless ones
overlap across devices like real GPUs (docs/design.md, "Emulated devices"). The end op
gates the device's output, so it can be neither pruned nor skipped. A batch over the
limit raises ``MemoryError`` inside the op, which TensorFlow turns into its own
``ResourceExhaustedError`` - what a real GPU's out-of-memory raises.

Every begin/end pair is logged with its device and sample count: the device's
busy time, from which per-device figures are measured, not derived. The log
keeps the latest ``Emulator.MAX_EVENTS`` pairs (a rebalanced model logs every
step of its training), in the order they ended.

An emulation is only valid while the host computes a device's slice faster than
its emulated time: the end op can lengthen a step, never shorten it. So each
step also logs the real work time (begin to the end op's start, before it
sleeps) and whether it ran past its emulated deadline (*late*). A device late
in more than ``HOST_BOUND_SHARE`` of its steps is *host-bound*: its figures are
this host's speed, not the emulated device's (``BusyTime.host_bound``).
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from harness.errors import InvalidValue

__all__ = ["EmulatedDevice", "Emulator", "parse_emulate", "BusyTime", "Event", "HOST_BOUND_SHARE", "add_zero",
           "host_bound_text"]

# A device late in more than this share of its steps is host-bound. One step in ten may meet a busy
# moment of the host (another process, a page fault) without making the window's figure this CPU's.
HOST_BOUND_SHARE = 0.1

_ENTRY = re.compile(r"^\s*([^:\s]+)\s*(?::\s*([^:\s]*)\s*)?(?::\s*([^:\s]+)\s*)?$")


@dataclass(frozen=True)
class EmulatedDevice:
    """A device that processes ``rate`` samples/s after ``overhead_ms`` per step, at most ``max_batch`` samples."""

    rate: float
    max_batch: int | None = None
    overhead_ms: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate) and self.rate > 0):
            raise InvalidValue(f"emulated rate must be a positive number of samples/s; got rate={self.rate!r}")
        if self.max_batch is not None and (isinstance(self.max_batch, bool) or int(self.max_batch) != self.max_batch
                                           or self.max_batch < 0):
            raise InvalidValue(f"emulated MAXBATCH must be an int >= 0; got max_batch={self.max_batch!r}")
        if not (isinstance(self.overhead_ms, (int, float)) and math.isfinite(self.overhead_ms)
                and self.overhead_ms >= 0):
            raise InvalidValue(f"emulated OVERHEAD_MS must be a number >= 0; got overhead_ms={self.overhead_ms!r}")

    def __str__(self) -> str:
        return (f"{self.rate:g} sps" + (f" + {self.overhead_ms:g} ms/step" if self.overhead_ms else "")
                + (f", max batch {self.max_batch}" if self.max_batch is not None else ""))

    def step_seconds(self, batch: int) -> float:
        """The emulated time of one step on ``batch`` samples."""
        return self.overhead_ms / 1000.0 + batch / self.rate

    def to_json(self) -> dict:
        return {"rate": self.rate, "max_batch": self.max_batch, "overhead_ms": self.overhead_ms}


def parse_emulate(spec: str | Sequence[str]) -> tuple[EmulatedDevice, ...]:
    """Parses ``RATE[:MAXBATCH[:OVERHEAD_MS]],...`` (or a list of such entries) into devices.

    An empty MAXBATCH (``1000::20``) means no memory ceiling; 0 a device that
    cannot even hold the model (every step runs out of memory).

    Raises:
        ValueError: naming the bad entry: not a number, rate <= 0, MAXBATCH < 1, overhead < 0.

    Example:
        >>> parse_emulate("1345:1100,875")[1]
        EmulatedDevice(rate=875.0, max_batch=None, overhead_ms=0.0)
    """
    entries = [spec] if isinstance(spec, str) else list(spec)
    items = [part for entry in entries for part in str(entry).split(",")]
    if not items or any(not part.strip() for part in items):
        raise InvalidValue(f"--emulate wants RATE[:MAXBATCH[:OVERHEAD_MS]] entries separated by commas; got {spec!r}")
    devices = []
    for part in items:
        match = _ENTRY.match(part)
        if not match:
            raise InvalidValue(f"--emulate entry must be RATE[:MAXBATCH[:OVERHEAD_MS]]; got {part.strip()!r}")
        rate_text, max_text, overhead_text = match.groups()
        try:
            rate = float(rate_text)
        except ValueError:
            raise InvalidValue(
                f"emulated rate must be a number of samples/s; got {rate_text!r} in {part.strip()!r}"
            ) from None
        max_batch = None
        if max_text:
            try:
                max_batch = int(max_text)
            except ValueError:
                raise InvalidValue(
                    f"emulated MAXBATCH must be an integer; got {max_text!r} in {part.strip()!r}"
                ) from None
        overhead = 0.0
        if overhead_text is not None:
            try:
                overhead = float(overhead_text)
            except ValueError:
                raise InvalidValue(
                    f"emulated OVERHEAD_MS must be a number of milliseconds; got {overhead_text!r} in {part.strip()!r}"
                ) from None
        devices.append(EmulatedDevice(rate, max_batch, overhead))
    return tuple(devices)


class Event(NamedTuple):
    """One logged step of one device: its begin and end stamps (``time.perf_counter``) and what it did.

    ``work`` is the real time of the step's computation (begin to the end op's
    start, before any sleep); ``late`` says an emulated device's work ran past
    its emulated deadline (the emulation could not slow it down to its rate).
    """

    device: str
    start: float
    end: float
    samples: int
    work: float | None = None  # None: end - start (a timed device never sleeps)
    late: bool = False


@dataclass(frozen=True)
class BusyTime:
    """What one emulated or timed device did in a time range.

    ``work_seconds`` is the real computing time of those steps (all of their
    busy time for a timed device); ``late_steps`` counts the steps whose real
    work ran past the emulated deadline.
    """

    device: str
    seconds: float
    samples: int
    steps: int
    work_seconds: float = 0.0
    late_steps: int = 0

    @property
    def rate(self) -> float | None:
        """Samples per busy second: the device's own speed while it works."""
        return self.samples / self.seconds if self.seconds > 0 else None

    @property
    def host_rate(self) -> float | None:
        """Samples per second of real work: the fastest this host ran the device's slices."""
        return self.samples / self.work_seconds if self.work_seconds > 0 else None

    @property
    def late_share(self) -> float:
        """The share of steps whose real work ran past the emulated deadline."""
        return self.late_steps / self.steps if self.steps else 0.0

    @property
    def host_bound(self) -> bool:
        """Late in more than ``HOST_BOUND_SHARE`` of the steps: the figures are the host's, not the emulation's."""
        return self.late_share > HOST_BOUND_SHARE


def host_bound_text(entries) -> str:
    """One line naming host-bound devices: ``entries`` of ``{"device", "emulated_rate", "host_rate", "late_share"}``.

    Example:
        ``host_bound_text([{"device": "/device:CPU:0", "emulated_rate": 40000.0, "host_rate": 9800.0,
        "late_share": 1.0}])`` is ``"host-bound: /device:CPU:0 emulates 40000 samples/s but this host
        computes its slices at 9800 (late in 100% of steps): these figures are the host's speed, ..."``
    """
    parts = [f"{e['device']} emulates {e['emulated_rate']:.0f} samples/s but this host computes its slices at "
             f"{'?' if e['host_rate'] is None else format(e['host_rate'], '.0f')} "
             f"(late in {100 * e['late_share']:.0f}% of steps)" for e in entries]
    return "host-bound: " + "; ".join(parts) + ": these figures are the host's speed, not the emulated devices'"


class Emulator:
    """Inserts the begin/end ops of emulated devices and logs their busy time.

    Args:
        devices: device name -> its ``EmulatedDevice``. Devices not in the
            mapping run at their real speed.
        timed: devices (not emulated) whose begin/end ops only log their real
            busy time: what ``harness.Rebalance`` measures on real GPUs. The end
            op reads one element of the device's last result, so its stamp
            follows the device's work (a GPU tensor is copied to the host).
    """

    MAX_EVENTS = 100_000  # the oldest half is dropped beyond this: windows read recent work only

    def __init__(self, devices: Mapping[str, EmulatedDevice], timed: Sequence[str] = ()):
        self.devices = dict(devices)
        self.timed = tuple(d for d in timed if d not in self.devices)
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def __repr__(self) -> str:
        timed = f"; timed {', '.join(self.timed)}" if self.timed else ""
        return f"Emulator({', '.join(f'{d}: {e}' for d, e in self.devices.items())}{timed})"

    def set_rate(self, device: str, rate: float) -> None:
        """Changes an emulated device's speed from its next step on (a card that throttles or recovers)."""
        if device not in self.devices:
            raise InvalidValue(f"{device!r} is not an emulated device; emulated: {sorted(self.devices)}")
        old = self.devices[device]
        self.devices[device] = EmulatedDevice(rate, old.max_batch, old.overhead_ms)

    def add_timed(self, devices: Sequence[str]) -> None:
        """Times these devices too (those not emulated or timed yet); step functions traced before miss them."""
        self.timed += tuple(d for d in dict.fromkeys(devices) if d not in self.logged)

    @property
    def logged(self) -> tuple[str, ...]:
        """Every device whose busy time is logged: emulated, then timed."""
        return tuple(self.devices) + self.timed

    # -- graph ops -----------------------------------------------------------
    def begin(self, device: str, x):
        """Gates ``x`` (a device's input slice) on the begin op; returns ``(x, token)``."""
        import tensorflow as tf

        if device not in self.logged:
            return x, None
        leaf = tf.nest.flatten(x)[0]

        def start(batch):
            n = len(batch)
            spec = self.devices.get(device)
            if spec is not None and spec.max_batch is not None and n > spec.max_batch:
                # TensorFlow raises MemoryError from a Python op as ResourceExhaustedError (its OOM type).
                raise MemoryError(
                    f"emulated out of memory on {device}: batch slice of {n} samples exceeds its "
                    f"MAXBATCH {spec.max_batch}"
                )
            return time.perf_counter(), np.float32(0.0)

        with tf.device(device):
            # The op reads the slice itself: with an input known at trace time (its static size),
            # Grappler would constant-fold the op, running it once while optimising the graph.
            started, zero = tf.numpy_function(start, [leaf], (tf.float64, tf.float32), stateful=False,
                                              name="emulate_begin")
            started.set_shape(())
            zero.set_shape(())
            x = add_zero(x, zero)
        return x, (started, tf.shape(leaf)[0])

    def end(self, device: str, y, token):
        """Gates ``y`` (the device's output) on the end op, which sleeps out the emulated time."""
        import tensorflow as tf

        if token is None:
            return y
        return add_zero(y, self.finish(device, token, after=tf.nest.flatten(y)[0]))

    def finish(self, device: str, token, after):
        """The end op: runs once ``after`` exists, sleeps until the emulated end, returns an exact 0.

        Training steps pass the device's last backward result as ``after`` and
        add the zero to the gradients, so the emulated time covers the device's
        forward and backward work, as a real device's step time does.
        """
        import tensorflow as tf

        started, n = token

        def finish(t0, count, _after):
            t0, count = float(t0), int(count)
            spec = self.devices.get(device)  # read per step: set_rate applies from the next step
            deadline = t0 + spec.step_seconds(count) if spec is not None else t0
            now = time.perf_counter()
            if deadline > now:
                time.sleep(deadline - now)
            late = spec is not None and now > deadline  # the host could not keep up with the emulated rate
            with self._lock:  # stamped under the lock: the log stays in order of end time
                self._events.append(Event(device, t0, time.perf_counter(), count, now - t0, late))
                if len(self._events) > self.MAX_EVENTS:
                    del self._events[: len(self._events) // 2]
            return np.float32(0.0)

        with tf.device(device):
            # Grappler drops control edges to stateless ops: the end op must feed the result as data
            # (an exact zero it returns, which no optimiser can know) and read ``after`` itself - one
            # element of it, so a GPU result costs a 4-byte copy, not the whole tensor.
            leaf = tf.nest.flatten(after)[0]
            if isinstance(leaf, tf.IndexedSlices):
                leaf = leaf.values
            probe = tf.reshape(leaf, [-1])[:1]
            zero = tf.numpy_function(finish, [started, n, probe], tf.float32, stateful=False, name="emulate_end")
            zero.set_shape(())
        return zero

    # -- the log -------------------------------------------------------------
    def busy_between(self, t0: float, t1: float) -> dict[str, BusyTime]:
        """Busy time, real work and samples per device of the work that ended in ``(t0, t1]``."""
        totals = {d: BusyTime(d, 0.0, 0, 0) for d in self.logged}
        with self._lock:
            events = self._events[_first_ending_after(self._events, t0):]
        for event in events:
            if event.end <= t1:
                t = totals[event.device]
                work = event.end - event.start if event.work is None else event.work  # whole: with its samples
                totals[event.device] = BusyTime(event.device, t.seconds + (event.end - max(event.start, t0)),
                                                t.samples + event.samples, t.steps + 1, t.work_seconds + work,
                                                t.late_steps + int(event.late))
        return totals

    def host_bound_between(self, t0: float, t1: float) -> list[dict]:
        """The emulated devices host-bound in ``(t0, t1]``, as ``host_bound_text`` takes them (empty: none)."""
        return [{"device": d, "emulated_rate": self.devices[d].rate, "host_rate": b.host_rate,
                 "late_share": b.late_share}
                for d, b in self.busy_between(t0, t1).items() if d in self.devices and b.host_bound]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()


def _first_ending_after(events: list, t0: float) -> int:
    """Index of the first event ending after ``t0`` in a log ordered by end time."""
    ends = _EndTimes(events)
    return bisect.bisect_right(ends, t0)


class _EndTimes:
    """A read-only view of the events' end times, for ``bisect`` (whose ``key=`` needs Python 3.10)."""

    def __init__(self, events: list):
        self._events = events

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i: int) -> float:
        return self._events[i][2]


def add_zero(structure, zero):
    """``structure`` with ``zero`` added to every numeric leaf: a data dependency that changes nothing."""
    import tensorflow as tf

    def add(t):
        t = tf.convert_to_tensor(t)
        return t + tf.cast(zero, t.dtype) if (t.dtype.is_floating or t.dtype.is_integer) else t

    # tf.nest, not keras.tree: TF 2.15's Keras 2 has no keras.tree (same structures here: lists, tuples, dicts).
    return tf.nest.map_structure(add, structure)


def emulator_for(emulate, devices: Sequence[str]) -> Emulator | None:
    """The ``Emulator`` of an ``emulate=`` argument over ``devices``: None, an ``Emulator`` (kept), a spec
    string (``parse_emulate``) or one ``EmulatedDevice`` per device.

    Raises:
        ValueError: not one emulated device per device.
    """
    if emulate is None or isinstance(emulate, Emulator):
        return emulate
    specs = parse_emulate(emulate) if isinstance(emulate, str) else tuple(emulate)
    if len(specs) != len(devices) or not all(isinstance(s, EmulatedDevice) for s in specs):
        raise InvalidValue(
            f"emulate needs one EmulatedDevice (or RATE[:MAXBATCH] entry) per device; got {len(specs)} for "
            f"{len(devices)} devices {list(devices)}: {emulate!r}"
        )
    return Emulator(dict(zip(devices, specs)))
