"""Emulated devices without a framework: their specs, their log of busy time, and the waits of a step driven from
the host (Keras 3 on JAX). ``harness.emulate`` adds TensorFlow's graph ops and re-exports everything here.

An emulated device processes ``rate`` samples/s after ``overhead_ms`` per step, at most ``max_batch`` samples
(``EmulatedDevice``; ``parse_emulate`` reads ``--emulate 1345:1100,875:700``). ``HostEmulator`` holds the devices and
the log of their steps (``Event``: begin and end stamps, samples, the real work time, whether it was *late*), from
which per-device figures are measured (``busy_between``, ``BusyTime``), and ends a step of several devices from the
host (``wait_steps``): it waits for each device's work, then sleeps until the last device's emulated end. Nothing
here imports TensorFlow (an import-linter contract: Keras 3 on JAX uses it).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from harness.errors import InvalidValue

__all__ = ["EmulatedDevice", "Link", "LINKS", "parse_link", "HostEmulator", "parse_emulate", "BusyTime", "Event",
           "HOST_BOUND_SHARE", "host_bound_text", "inter_op_threads", "emulator_for", "DEFAULT_LATENCY_US",
           "FORWARD_SHARE"]


# A device late in more than this share of its steps is host-bound. One step in ten may meet a busy
# moment of the host (another process, a page fault) without making the window's figure this CPU's.
HOST_BOUND_SHARE = 0.1

_ENTRY = re.compile(r"^\s*([^:\s]+)\s*(?::\s*([^:\s]*)\s*)?(?::\s*([^:\s]+)\s*)?$")


# Each PCIe lane moves 8 (3.0), 16 (4.0) or 32 (5.0) GT/s with 128b/130b encoding: 0.985, 1.97 and 3.94 GB/s
# each way. NVLink: 25 GB/s each way per link; 6 links on a V100 (2.0), 12 on an A100 (3.0), 18 on an H100
# (4.0). These are the specifications' figures each way; what a program gets is lower (give a measured figure
# as GB_PER_S). The latency per transfer is an assumption, not a measurement: set yours (LINK/LATENCY_US).
DEFAULT_LATENCY_US = 10.0
_LANE_GB_PER_S = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}


#: the forward pass' share of a training step's compute, where an emulated step overlaps its transfers: the
#: backward pass computes the gradients of the activations and of the weights, about twice the forward's
#: arithmetic (an assumption, as an emulated device's rate is: ``EmulatedDevice.overlapped_seconds``)
FORWARD_SHARE = 1 / 3


@dataclass(frozen=True)
class Link:
    """A device's link: ``gb_per_s`` (10^9 bytes per second each way) and ``latency_us`` per transfer.

    A transfer of ``b`` bytes takes ``latency_us / 1e6 + b / (gb_per_s * 1e9)`` seconds (``seconds``);
    ``name`` is the preset's (``LINKS``), if it is one.
    """

    gb_per_s: float
    latency_us: float = DEFAULT_LATENCY_US
    name: str = ""

    def __post_init__(self):
        if not (isinstance(self.gb_per_s, (int, float)) and math.isfinite(self.gb_per_s) and self.gb_per_s > 0):
            raise InvalidValue(f"a link's bandwidth must be a positive number of GB/s; got {self.gb_per_s!r}")
        if not (isinstance(self.latency_us, (int, float)) and math.isfinite(self.latency_us)
                and self.latency_us >= 0):
            raise InvalidValue(f"a link's latency must be a number of microseconds >= 0; got {self.latency_us!r}")

    def __str__(self) -> str:
        return f"{self.name + ' ' if self.name else ''}{self.gb_per_s:.3g} GB/s, {self.latency_us:g} us"

    def seconds(self, nbytes: float, transfers: int = 1) -> float:
        """The time of ``transfers`` transfers of ``nbytes`` bytes together (none: 0)."""
        if transfers <= 0 or nbytes <= 0:
            return 0.0
        return transfers * self.latency_us / 1e6 + nbytes / (self.gb_per_s * 1e9)

    def to_json(self) -> dict:
        return {"gb_per_s": self.gb_per_s, "latency_us": self.latency_us, "name": self.name}


#: named links: PCIe 3.0, 4.0 and 5.0 at 8 and 16 lanes, NVLink 2.0, 3.0 and 4.0 (each way, the specification's)
LINKS = {
    **{f"pcie{gen}x{lanes}": Link(round(lanes * lane, 2), DEFAULT_LATENCY_US, f"pcie{gen}x{lanes}")
       for gen, lane in _LANE_GB_PER_S.items() for lanes in (8, 16)},
    **{f"nvlink{gen}": Link(25.0 * links, DEFAULT_LATENCY_US, f"nvlink{gen}") for gen, links in ((2, 6), (3, 12),
                                                                                                 (4, 18))},
}


def parse_link(text: str) -> Link:
    """``NAME[/LATENCY_US]`` (a ``LINKS`` preset) or ``GB_PER_S[/LATENCY_US]``.

    Raises:
        ValueError: naming the text: an unknown name, a bandwidth or latency that is not a number or out of range.

    Example:
        >>> parse_link("pcie3x16/5")
        Link(gb_per_s=15.75, latency_us=5.0, name='pcie3x16')
    """
    body, _, latency_text = text.strip().partition("/")
    body = body.strip().lower()
    try:
        latency = DEFAULT_LATENCY_US if not latency_text.strip() else float(latency_text)
    except ValueError:
        raise InvalidValue(f"a link's latency must be a number of microseconds; got {latency_text.strip()!r} in "
                           f"{text.strip()!r}") from None
    if body in LINKS:
        return Link(LINKS[body].gb_per_s, latency, body)
    try:
        gb_per_s = float(body)
    except ValueError:
        raise InvalidValue(f"a link is one of {', '.join(LINKS)} or a bandwidth in GB/s (each with an optional "
                           f"/LATENCY_US); got {text.strip()!r}") from None
    return Link(gb_per_s, latency)


@dataclass(frozen=True)
class EmulatedDevice:
    """A device that processes ``rate`` samples/s after ``overhead_ms`` per step, at most ``max_batch`` samples.

    With a ``link``, each step also pays for the bytes it moves: in before its computation (its input slice,
    the weights it reads from another device), out after it (its gradients, or its outputs in inference).
    """

    rate: float
    max_batch: int | None = None
    overhead_ms: float = 0.0
    link: Link | None = None

    def __post_init__(self):
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate) and self.rate > 0):
            raise InvalidValue(f"emulated rate must be a positive number of samples/s; got rate={self.rate!r}")
        if self.max_batch is not None and (isinstance(self.max_batch, bool) or int(self.max_batch) != self.max_batch
                                           or self.max_batch < 0):
            raise InvalidValue(f"emulated MAXBATCH must be an int >= 0; got max_batch={self.max_batch!r}")
        if not (isinstance(self.overhead_ms, (int, float)) and math.isfinite(self.overhead_ms)
                and self.overhead_ms >= 0):
            raise InvalidValue(f"emulated OVERHEAD_MS must be a number >= 0; got overhead_ms={self.overhead_ms!r}")
        if isinstance(self.link, Mapping):  # to_json's form, read back
            object.__setattr__(self, "link", Link(**self.link))
        if self.link is not None and not isinstance(self.link, Link):
            raise InvalidValue(f"an emulated device's link is a harness.emulate.Link; got link={self.link!r}")

    def __str__(self) -> str:
        return (f"{self.rate:g} sps" + (f" + {self.overhead_ms:g} ms/step" if self.overhead_ms else "")
                + (f", max batch {self.max_batch}" if self.max_batch is not None else "")
                + (f", link {self.link}" if self.link is not None else ""))

    def step_seconds(self, batch: int, moved: Sequence[tuple[float, int]] = (), overlap: bool = False) -> float:
        """The emulated time of one step on ``batch`` samples that moves ``moved`` over its link (nothing without a
        link): ``(bytes, transfers)`` pairs, all charged one after the other and after the compute; with
        ``overlap``, exactly three (``overlapped_seconds``): the slice in, the reads, what it sends."""
        compute = self.overhead_ms / 1000.0 + batch / self.rate
        if overlap and self.link is not None:
            return self.overlapped_seconds(compute, *moved)
        return compute + self.link_seconds(moved)

    def overlapped_seconds(self, compute: float, slice_in: tuple[float, int], reads: tuple[float, int],
                           sends: tuple[float, int]) -> float:
        """A step whose transfers run beside its compute, as TensorFlow's dataflow executor runs them on a GPU:

        - the slice (not staged) arrives before the compute starts;
        - the reads (the weights) stream in from the step's start: the forward pass, ``FORWARD_SHARE`` of the
          compute, ends no sooner than the last of them arrived;
        - what it sends (outputs, gradients) streams out from the forward pass' end, the link being full duplex:
          the step ends no sooner than all of it left, nor before its last tensor (one of the average size it
          sends) left after the backward pass.
        """
        link = self.link_seconds
        start = link([slice_in])
        forward_end = max(start + FORWARD_SHARE * compute, link([reads]))
        end = forward_end + (1 - FORWARD_SHARE) * compute
        size, count = sends
        if count > 0 and size > 0:
            end = max(end + link([(size / count, 1)]), forward_end + link([sends]))
        return end

    def link_seconds(self, moved: Sequence[tuple[float, int]]) -> float:
        """The time ``moved`` (``(bytes, transfers)`` pairs) takes over the link; 0 without one."""
        return 0.0 if self.link is None else sum(self.link.seconds(b, n) for b, n in moved)

    def with_rate(self, rate: float) -> EmulatedDevice:
        """This device at another speed (a card that throttles)."""
        return EmulatedDevice(rate, self.max_batch, self.overhead_ms, self.link)

    def to_json(self) -> dict:
        out: dict[str, Any] = {"rate": self.rate, "max_batch": self.max_batch, "overhead_ms": self.overhead_ms}
        if self.link is not None:  # without one, the record reads as before links existed
            out["link"] = self.link.to_json()
        return out


def parse_emulate(spec: str | Sequence[str]) -> tuple[EmulatedDevice, ...]:
    """Parses ``RATE[:MAXBATCH[:OVERHEAD_MS]][@LINK],...`` (or a list of such entries) into devices.

    An empty MAXBATCH (``1000::20``) means no memory ceiling; 0 a device that
    cannot even hold the model (every step runs out of memory). ``@LINK`` gives
    the device a link (``parse_link``): a preset such as ``pcie3x16`` or a
    bandwidth in GB/s, each with an optional ``/LATENCY_US`` (``875@pcie3x8``,
    ``1000::5@12/8``).

    Raises:
        ValueError: naming the bad entry: not a number, rate <= 0, MAXBATCH < 1, overhead < 0, a bad link.

    Example:
        >>> parse_emulate("1345:1100,875")[1]
        EmulatedDevice(rate=875.0, max_batch=None, overhead_ms=0.0, link=None)
    """
    entries = [spec] if isinstance(spec, str) else list(spec)
    items = [part for entry in entries for part in str(entry).split(",")]
    if not items or any(not part.strip() for part in items):
        raise InvalidValue(f"--emulate wants RATE[:MAXBATCH[:OVERHEAD_MS]][@LINK] entries separated by commas; got "
                           f"{spec!r}")
    devices = []
    for item in items:
        part, at, link_text = item.partition("@")
        if at and not link_text.strip():
            raise InvalidValue(f"--emulate entry {item.strip()!r} ends in '@': name a link after it (one of "
                               f"{', '.join(LINKS)}, or GB_PER_S[/LATENCY_US])")
        link = parse_link(link_text) if at else None
        match = _ENTRY.match(part)
        if not match:
            raise InvalidValue(f"--emulate entry must be RATE[:MAXBATCH[:OVERHEAD_MS]][@LINK]; got {item.strip()!r}")
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
        devices.append(EmulatedDevice(rate, max_batch, overhead, link))
    return tuple(devices)


class Event(NamedTuple):
    """One logged step of one device: its begin and end stamps (``time.perf_counter``) and what it did.

    ``work`` is the real time of the step's computation (begin to the end op's
    start, before any sleep); ``late`` says an emulated device's work ran past
    its emulated deadline (the emulation could not slow it down to its rate).
    ``moved`` is the bytes the step moved over the device's link (in and out),
    ``link`` the seconds they were charged (0 without a link).
    """

    device: str
    start: float
    end: float
    samples: int
    work: float | None = None  # None: end - start (a timed device never sleeps)
    late: bool = False
    moved: int = 0
    link: float = 0.0
    copy: bool = False  # a staged copy of a next slice, made while a step ran: its link time hides behind it


@dataclass(frozen=True)
class BusyTime:
    """What one emulated or timed device did in a time range.

    ``work_seconds`` is the real computing time of those steps (all of their
    busy time for a timed device); ``late_steps`` counts the steps whose real
    work ran past the emulated deadline. ``moved_bytes`` and ``link_seconds``: what
    its steps moved over its link (the slices copied to it while its steps ran, ``Emulator.copy``, included)
    and the time the link added to its steps (part of ``seconds``).
    """

    device: str
    seconds: float
    samples: int
    steps: int
    work_seconds: float = 0.0
    late_steps: int = 0
    moved_bytes: int = 0
    link_seconds: float = 0.0

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


class HostEmulator:
    """Emulated and timed devices and the log of their busy time; a step driven from the host ends with
    ``wait_steps`` (Keras 3 on JAX). ``harness.emulate.Emulator`` adds TensorFlow's begin/end ops.

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
        # False: the end and copy ops neither sleep nor log (steps nobody times; see the module's doc). Read by
        # each op as it runs: set between two steps, it applies from the next.
        self.waiting = True

    @contextlib.contextmanager
    def untimed(self):
        """Steps run inside skip their emulated waits and are not logged (``waiting`` False), then wait again."""
        self.waiting = False
        try:
            yield self
        finally:
            self.waiting = True

    def steps_to_skip(self, untimed: int, timed_after: bool = True) -> int:
        """How many of ``untimed`` steps that start a run may skip their waits (``waiting`` False): all of them,
        unless timed steps follow over an emulated link. Then the last one waits: a step's next slice is copied
        while it runs (``harness.parallel.staging``), so the first timed step's copy overlaps a whole step, as
        every later one's does (after a step that skipped its wait, the first timed step would wait for its copy)."""
        if timed_after and untimed > 0 and any(d.link is not None for d in self.devices.values()):
            return untimed - 1
        return untimed

    def __repr__(self) -> str:
        timed = f"; timed {', '.join(self.timed)}" if self.timed else ""
        return f"Emulator({', '.join(f'{d}: {e}' for d, e in self.devices.items())}{timed})"

    def set_rate(self, device: str, rate: float) -> None:
        """Changes an emulated device's speed from its next step on (a card that throttles or recovers)."""
        if device not in self.devices:
            raise InvalidValue(f"{device!r} is not an emulated device; emulated: {sorted(self.devices)}")
        self.devices[device] = self.devices[device].with_rate(rate)

    def add_timed(self, devices: Sequence[str]) -> None:
        """Times these devices too (those not emulated or timed yet); step functions traced before miss them."""
        self.timed += tuple(d for d in dict.fromkeys(devices) if d not in self.logged)

    @property
    def logged(self) -> tuple[str, ...]:
        """Every device whose busy time is logged: emulated, then timed."""
        return tuple(self.devices) + self.timed

    def check_fits(self, device: str, samples: int) -> None:
        """Raises ``MemoryError`` (emulated out of memory, the device and its MAXBATCH named) where ``samples`` rows
        exceed the emulated device's ``max_batch``."""
        spec = self.devices.get(device)
        if spec is not None and spec.max_batch is not None and samples > spec.max_batch:
            raise MemoryError(f"emulated out of memory on {device}: batch slice of {samples} samples exceeds its "
                              f"MAXBATCH {spec.max_batch}")

    # -- host-side steps (Keras 3 on JAX: harness.parallel.jax, harness.bench.jaxbench) ---------------------------
    def wait_steps(self, started: float, slices: Sequence[tuple[str, int, Any]]) -> None:
        """Ends one step of several devices that all began at ``started`` (``time.perf_counter``), from the host:
        ``slices`` holds each device's ``(name, rows, ready)``, ``ready`` a callable that returns once the device's
        work of the step is done (``jax.block_until_ready`` on its results).

        Each logged device's step ends at its emulated deadline (``started`` + ``EmulatedDevice.step_seconds`` of
        its rows; no link is modelled here) or when its work was ready, if later (then it is *late*: the host could
        not keep up); a timed device's (not emulated) when its work was ready. The devices work side by side, as
        real ones do: this sleeps once, until the last device's end, and logs each device's step as the graph ops
        do. The devices are waited on in the order of their deadlines, so each one's readiness is stamped as soon
        as it can be from one host thread (a device's stamp can follow its real end by the time an earlier one
        took beyond it). While ``waiting`` is False nothing sleeps or is logged; the work is still waited for.
        """
        ends = []
        for name, rows, ready in sorted(slices, key=lambda s: self._deadline(s[0], started, s[1])):
            ready()
            if name not in self.logged:
                continue
            now = time.perf_counter()
            deadline = self._deadline(name, started, rows)
            late = name in self.devices and now > deadline
            ends.append((max(now, deadline), name, rows, now - started, late))
        if not self.waiting or not ends:
            return
        last = max(end for end, *_ in ends)
        now = time.perf_counter()
        if last > now:
            time.sleep(last - now)
        with self._lock:
            for end, name, rows, work, late in sorted(ends):
                self._events.append(Event(name, started, end, rows, work, late))
            if len(self._events) > self.MAX_EVENTS:
                del self._events[: len(self._events) // 2]

    def _deadline(self, device: str, started: float, rows: int) -> float:
        spec = self.devices.get(device)
        return started if spec is None else started + spec.step_seconds(rows)

    # -- the log -------------------------------------------------------------
    def busy_between(self, t0: float, t1: float) -> dict[str, BusyTime]:
        """Busy time, real work and samples per device of the work that ended in ``(t0, t1]``."""
        totals = {d: BusyTime(d, 0.0, 0, 0) for d in self.logged}
        with self._lock:
            events = self._events[_first_ending_after(self._events, t0):]
        for event in events:
            if event.end <= t1:
                t = totals[event.device]
                if event.copy:  # made while a step ran: moved bytes, no busy time of its own
                    totals[event.device] = replace(t, moved_bytes=t.moved_bytes + event.moved)
                    continue
                work = event.end - event.start if event.work is None else event.work  # whole: with its samples
                totals[event.device] = BusyTime(event.device, t.seconds + (event.end - max(event.start, t0)),
                                                t.samples + event.samples, t.steps + 1, t.work_seconds + work,
                                                t.late_steps + int(event.late), t.moved_bytes + event.moved,
                                                t.link_seconds + event.link)
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



def inter_op_threads(devices: int) -> int:
    """The inter-op threads a run of ``devices`` emulated devices needs: each may sleep in two ops at once (its
    step's end and the copy of its next slice, ``Emulator.copy``), and two more run everything else."""
    return 2 * int(devices) + 2



def emulator_for(emulate, devices: Sequence[str], cls: type[HostEmulator] = HostEmulator) -> HostEmulator | None:
    """The emulator (a ``cls``) of an ``emulate=`` argument over ``devices``: None, an emulator (kept), a spec
    string (``parse_emulate``) or one ``EmulatedDevice`` per device.

    Raises:
        ValueError: not one emulated device per device.
    """
    if emulate is None or isinstance(emulate, HostEmulator):
        return emulate
    specs = parse_emulate(emulate) if isinstance(emulate, str) else tuple(emulate)
    if len(specs) != len(devices) or not all(isinstance(s, EmulatedDevice) for s in specs):
        raise InvalidValue(
            f"emulate needs one EmulatedDevice (or RATE[:MAXBATCH] entry) per device; got {len(specs)} for "
            f"{len(devices)} devices {list(devices)}: {emulate!r}"
        )
    return cls(dict(zip(devices, specs)))
