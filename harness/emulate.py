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

Steps nobody times (the first step of a run, which traces; warm-up steps; a
probe that only asks whether a batch fits) need not wait: while
``Emulator.waiting`` is False the end and copy ops return at once and log
nothing. The memory check still applies, the host still computes every slice.
What a run measures is unchanged; the waits it skips were emulated seconds of
nothing (``harness.bench.runner.train_windows``, ``harness.bench.tuning.probe``;
over a link the last untimed step waits: ``Emulator.steps_to_skip``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

from harness.emulation import (  # re-exported: harness.emulate is where users and the TensorFlow paths find them
    DEFAULT_LATENCY_US,
    FORWARD_SHARE,
    HOST_BOUND_SHARE,
    LINKS,
    BusyTime,
    EmulatedDevice,
    Event,
    HostEmulator,
    Link,
    host_bound_text,
    inter_op_threads,
    parse_emulate,
    parse_link,
)
from harness.emulation import emulator_for as _emulator_for
from harness.errors import InvalidValue

__all__ = ["EmulatedDevice", "Link", "LINKS", "parse_link", "Emulator", "parse_emulate", "BusyTime", "Event",
           "HOST_BOUND_SHARE", "Token", "nbytes", "variable_bytes", "add_zero", "host_bound_text", "HostEmulator",
           "inter_op_threads", "emulator_for", "DEFAULT_LATENCY_US", "FORWARD_SHARE"]


class Emulator(HostEmulator):
    """Inserts the begin/end ops of emulated devices into TensorFlow graphs and logs their busy time; its devices,
    timed devices (arguments), log and host-side waits are ``harness.emulation.HostEmulator``'s."""

    # -- graph ops -----------------------------------------------------------
    def begin(self, device: str, x, reads: tuple[int, int] = (0, 0), staged: bool = False, overlap: bool = False):
        """Gates ``x`` (a device's input slice) on the begin op; returns ``(x, token)``.

        The step moves ``x`` in over the device's link (its bytes measured from the tensors; not with
        ``staged``: a slice ``copy`` put there while the step before ran) and ``reads``: ``(bytes, transfers)``
        it reads from another device (the weights). ``overlap``: the reads and what the step sends run beside
        its compute (``finish``); else each waits for the other.
        """
        import numpy as np  # here, not at the top: the asv suites' discovery imports this module
        import tensorflow as tf

        if device not in self.logged:
            return x, None
        leaf = tf.nest.flatten(x)[0]
        if staged:
            size, count = tf.constant(0, tf.int64), 0
        else:
            with tf.device(device):
                size, count = nbytes(x)
        moved_in = (size, count)

        def start(batch):
            self.check_fits(device, len(batch))  # TensorFlow raises its MemoryError as ResourceExhaustedError
            return time.perf_counter(), np.float32(0.0)

        with tf.device(device):
            # The op reads the slice itself: with an input known at trace time (its static size),
            # Grappler would constant-fold the op, running it once while optimising the graph.
            started, zero = tf.numpy_function(start, [leaf], (tf.float64, tf.float32), stateful=False,
                                              name="emulate_begin")
            started.set_shape(())
            zero.set_shape(())
            x = add_zero(x, zero)
        return x, Token(started, tf.shape(leaf)[0], moved_in, (tf.constant(0, tf.int64), 0), tuple(reads), overlap)

    def end(self, device: str, y, token, sends: bool = False):
        """Gates ``y`` (the device's output) on the end op, which sleeps out the emulated time; ``sends``: the
        output leaves the device over its link (to the device that merges the outputs)."""
        import tensorflow as tf

        if token is None:
            return y
        return add_zero(y, self.finish(device, token, after=tf.nest.flatten(y)[0], sent=y if sends else None))

    def finish(self, device: str, token, after, sent=None):
        """The end op: runs once ``after`` exists, sleeps until the emulated end, returns an exact 0.

        Training steps pass the device's last backward result as ``after`` and
        add the zero to the gradients, so the emulated time covers the device's
        forward and backward work, as a real device's step time does. ``sent``:
        what the step moves out over the device's link after computing (its
        gradients), as well as what the token says it sends (``Token.sending``).
        """
        import numpy as np
        import tensorflow as tf

        if sent is not None:
            token = token.sending(sent, device)
        started, n = token.started, token.samples
        (in_bytes, in_count), (out_bytes, out_count) = token.moved_in, token.moved_out
        read_bytes, read_count = token.reads
        overlap = token.overlap

        def finish(t0, count, got, sends, _after):
            if not self.waiting:  # a step nobody times: no wait, no log
                return np.float32(0.0)
            t0, count, got, sends = float(t0), int(count), int(got), int(sends)
            spec = self.devices.get(device)  # read per step: set_rate applies from the next step
            if spec is None:
                deadline, link = t0, 0.0
            else:
                deadline = t0 + spec.step_seconds(count, [(got, in_count), (read_bytes, read_count),
                                                          (sends, out_count)], overlap)
                link = deadline - t0 - spec.step_seconds(count)  # what the link added to the step
            got += read_bytes
            now = time.perf_counter()
            if deadline > now:
                time.sleep(deadline - now)
            late = spec is not None and now > deadline  # the host could not keep up with the emulated rate
            with self._lock:  # stamped under the lock: the log stays in order of end time
                self._events.append(Event(device, t0, time.perf_counter(), count, now - t0, late, got + sends, link))
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
            zero = tf.numpy_function(finish, [started, n, in_bytes, out_bytes, probe], tf.float32, stateful=False,
                                     name="emulate_end")
            zero.set_shape(())
        return zero

    def copy(self, device: str, x):
        """``x`` (a next step's slice, just copied to ``device``) once its emulated copy over the device's link
        ended: bytes / bandwidth + latency per tensor, slept while the step before runs (``staging``).

        Logged as a copy (``Event.copy``): its bytes count as the device's moved bytes, its time not as busy
        time. A device without a link, or not emulated, copies for free.
        """
        import numpy as np
        import tensorflow as tf

        spec = self.devices.get(device)
        if spec is None or spec.link is None:
            return x
        with tf.device(device):
            size, count = nbytes(x)

        def copied(got, _probe):
            if not self.waiting:  # a copy for a step nobody times
                return np.float32(0.0)
            t0, got = time.perf_counter(), int(got)
            spec = self.devices.get(device)
            seconds = spec.link_seconds([(got, count)]) if spec is not None else 0.0
            time.sleep(seconds)
            with self._lock:
                self._events.append(Event(device, t0, time.perf_counter(), 0, 0.0, False, got, seconds, True))
            return np.float32(0.0)

        with tf.device(device):
            # Stateless, as the end op (a stateful one would be ordered after the other devices' copies):
            # it reads the slice itself and feeds it an exact zero, so no optimiser can drop or fold it.
            probe = tf.reshape(tf.nest.flatten(x)[0], [-1])[:1]
            zero = tf.numpy_function(copied, [size, probe], tf.float32, stateful=False, name="emulate_copy")
            zero.set_shape(())
        return add_zero(x, zero)



class Token(NamedTuple):
    """What a device's begin op hands its end op: the start stamp, the slice's samples, and the bytes (an int64
    tensor) and transfers (an int) the step moves: its slice in (``moved_in``), what it reads from another device
    (``reads``: the weights) and what it sends (``moved_out``: outputs, gradients); ``overlap``: those
    transfers run beside the compute (``Emulator.finish``)."""

    started: object
    samples: object
    moved_in: tuple
    moved_out: tuple
    reads: tuple = (0, 0)
    overlap: bool = False

    def sending(self, structure, device: str | None = None) -> Token:
        """This token, the step also moving ``structure`` out over the link after computing."""
        import tensorflow as tf

        with tf.device(device) if device else contextlib.nullcontext():
            size, count = nbytes(structure)
        return self._replace(moved_out=(self.moved_out[0] + size, self.moved_out[1] + count))


def nbytes(structure) -> tuple:
    """``(bytes, tensors)`` of a structure of tensors: the bytes an int64 tensor measured from them (their
    dynamic sizes; sparse and ragged ones by their components, strings by their lengths), the count an int."""
    import tensorflow as tf

    sizes = []
    for leaf in tf.nest.flatten(structure, expand_composites=True):
        if leaf is None:
            continue
        leaf = tf.convert_to_tensor(leaf)
        if leaf.dtype == tf.string:
            sizes.append(tf.reduce_sum(tf.cast(tf.strings.length(leaf), tf.int64)))
        else:
            sizes.append(tf.size(leaf, out_type=tf.int64) * leaf.dtype.size)
    return (tf.add_n(sizes) if sizes else tf.constant(0, tf.int64)), len(sizes)


def variable_bytes(variables) -> tuple[int, int]:
    """``(bytes, tensors)`` of variables, from their static shapes (what reading them all moves). Keras 3's
    variables give their shape as a tuple and their dtype as a name, Keras 2's as TensorFlow's."""
    import tensorflow as tf

    variables = list(variables)
    return (sum(math.prod(int(d) for d in tuple(v.shape)) * tf.as_dtype(v.dtype).size for v in variables),
            len(variables))


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
    string (``parse_emulate``) or one ``EmulatedDevice`` per device (``harness.emulation.emulator_for``).

    Raises:
        ValueError: not one emulated device per device.
    """
    made = _emulator_for(emulate, devices, Emulator)
    if made is not None and not isinstance(made, Emulator):
        raise InvalidValue(f"emulate: on TensorFlow an emulator is a harness.emulate.Emulator (its graph ops); got "
                           f"{type(made).__name__}")
    return made
