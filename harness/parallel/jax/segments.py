"""A device's forward pass cut wherever it needs the whole batch, and run over devices segment by segment.

A BatchNormalization in training normalises every row by the whole batch's statistics, so a device holding some of
the rows cannot finish its forward pass alone. The pass is traced once per slice shape (``jax.make_jaxpr`` of the
model called with each BatchNormalization's moments routed through ``statistics.BATCH_STATISTICS``) and its
equations cut at each of those markers into segments. Every device runs segment ``s`` as one jitted program under
``jax.vjp`` (its residuals stay on the device), the merge device combines the devices' ``(count, mean, M2)`` for the
next marker (``statistics.combine``, itself under ``jax.vjp``), each device gets the whole batch's mean and
variance, and segment ``s + 1`` runs. A model without such a layer is one segment: one program per device.

Backward, the segments run in reverse: each device pulls its cotangents back through a segment; the cotangents of
a marker's mean and variance are summed over the devices on the merge device, pulled back through the combination
to each device's ``(count, mean, M2)`` and added to that device's cotangents of the segment before. Each row's
gradient so depends on every device's rows, as on one device.

This is a cut of the traced program, not of the model's layers: it reaches a BatchNormalization inside a nested or
a subclassed model, a custom layer, a shared tower, alike. A marker the cut cannot reach (inside a ``jax.lax`` loop
or ``cond``, a ``jax.checkpoint``, a nested ``jit``) is refused by name (``Plan.__init__``). Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import DropVar, Literal

from harness.parallel.jax.statistics import BATCH_STATISTICS, combine

__all__ = ["Plan", "DeviceRun", "run_forward", "run_backward"]


def _inexact(var) -> bool:
    return jnp.issubdtype(var.aval.dtype, jnp.inexact)


def _bind(eqn, args):
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence[Any] = ()
    if isinstance(params, tuple):  # older JAX: (subfuns, params)
        subfuns, params = params
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *args, **params)
    return out if eqn.primitive.multiple_results else [out]


@dataclass
class _Segment:
    """The equations between two markers, with what flows in and out of them."""

    eqns: list
    base_reads: list[int] = field(default_factory=list)  # positions of the pass's inputs it reads
    ins: list = field(default_factory=list)  # values made before it and read in it or after
    outs: list = field(default_factory=list)  # values made up to it and read after it (the next marker included)
    finals: list[tuple[int, Any]] = field(default_factory=list)  # (output position, value) it makes
    programs: dict = field(default_factory=dict)


class Plan:
    """One device's forward pass (one slice shape, training or not) traced and cut at its markers.

    ``forward`` takes the flat inputs and returns the flat outputs; ``differentiable`` are the positions of the
    inputs to differentiate (the trainable weights)."""

    def __init__(self, forward: Callable, flat_inputs: Sequence[Any], differentiable: Sequence[int],
                 expected_markers: int = 0, refuse: Callable[[str], Exception] | None = None):
        closed, shape = jax.make_jaxpr(forward, return_shape=True)(*flat_inputs)
        self.out_tree = jax.tree_util.tree_structure(shape)
        self.jaxpr, self.consts = closed.jaxpr, list(closed.consts)
        self.differentiable = set(differentiable)
        self._base = {v: i for i, v in enumerate(self.jaxpr.invars)}
        self._const = dict(zip(self.jaxpr.constvars, self.consts))
        self.markers = [e for e in self.jaxpr.eqns if e.primitive is BATCH_STATISTICS]
        if len(self.markers) != expected_markers and refuse is not None:
            raise refuse(f"{expected_markers - len(self.markers)} of its {expected_markers} BatchNormalization "
                         "statistics are computed inside a JAX transformation of the forward pass (a jax.lax loop "
                         "or cond, jax.checkpoint, a nested jit), where harness cannot cut the pass")
        self.segments = self._cut()
        self.direct = [(p, v) for p, v in enumerate(self.jaxpr.outvars) if self._is_given(v)]

    def _is_given(self, v) -> bool:
        return isinstance(v, Literal) or v in self._base or v in self._const

    def _cut(self) -> list[_Segment]:
        # Stages: segment s is 2s, marker j (1-based) is 2j - 1. Each value: the stage that makes it, the last that
        # reads it (the pass's outputs are emitted by the segment that makes them, not carried).
        segments: list[_Segment] = [_Segment([])]
        made: dict = {}
        last: dict = {}
        order: list = []
        for eqn in self.jaxpr.eqns:
            marker = eqn.primitive is BATCH_STATISTICS
            if marker:
                segments.append(_Segment([]))
            stage = 2 * len(segments) - (3 if marker else 2)
            for v in eqn.invars:
                if isinstance(v, Literal):
                    continue
                if not self._is_given(v):
                    last[v] = max(last.get(v, -1), stage)
                elif v in self._base and not marker and self._base[v] not in segments[-1].base_reads:
                    segments[-1].base_reads.append(self._base[v])
            if not marker:
                segments[-1].eqns.append(eqn)
            for v in eqn.outvars:
                if not isinstance(v, DropVar):
                    made[v] = stage
                    order.append(v)
        for s, segment in enumerate(segments):
            segment.base_reads.sort()
            segment.ins = [v for v in order if made[v] < 2 * s and last.get(v, -1) >= 2 * s]
            segment.outs = [v for v in order if made[v] <= 2 * s and last.get(v, -1) > 2 * s]
        for p, v in enumerate(self.jaxpr.outvars):
            if self._is_given(v):
                continue
            s = (made[v] + 1) // 2  # a segment's own value, or a marker's, handed on by the segment after it
            segments[s].finals.append((p, v))
            if made[v] % 2 and v not in segments[s].ins:
                segments[s].ins.append(v)
        return segments

    def read_given(self, v, base: Sequence[Any]):
        """The value of a literal, a constant of the trace or one of the pass's inputs."""
        if isinstance(v, Literal):
            return v.val
        return base[self._base[v]] if v in self._base else self._const[v]

    # -- each segment's programs ----------------------------------------------------------------------------------
    def _evaluate(self, s: int, base_values: Sequence[Any], in_values: Sequence[Any]):
        segment = self.segments[s]
        env: dict = dict(self._const)
        env.update(zip((self.jaxpr.invars[i] for i in segment.base_reads), base_values))
        env.update(zip(segment.ins, in_values))

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in segment.eqns:
            for v, value in zip(eqn.outvars, _bind(eqn, [read(v) for v in eqn.invars])):
                if not isinstance(v, DropVar):
                    env[v] = value
        return [read(v) for v in segment.outs], [read(v) for _, v in segment.finals]

    def program(self, s: int, kind: str):
        """Segment ``s``'s jitted ``forward`` ``(base, ins) -> (outs, finals)``, ``forward_vjp`` (the same with its
        backward pass) or ``backward`` ``(vjp, out cotangents, final cotangents) -> (weight cotangents, in
        cotangents)``; a missing cotangent (None) is zero."""
        segment = self.segments[s]
        if kind not in segment.programs:
            segment.programs[kind] = jax.jit(getattr(self, f"_{kind}")(s))
        return segment.programs[kind]

    def _forward(self, s: int):
        return lambda base, ins: self._evaluate(s, base, ins)

    def _weights(self, s: int) -> list[int]:
        """Indices into segment ``s``'s base reads of the weights to differentiate."""
        return [k for k, i in enumerate(self.segments[s].base_reads) if i in self.differentiable]

    def _forward_vjp(self, s: int):
        segment = self.segments[s]
        weights, float_ins = self._weights(s), [k for k, v in enumerate(segment.ins) if _inexact(v)]
        float_outs = [k for k, v in enumerate(segment.outs) if _inexact(v)]
        float_finals = [k for k, (_, v) in enumerate(segment.finals) if _inexact(v)]

        def run(base, ins):
            def differentiated(w, i):
                b, x = list(base), list(ins)
                for k, value in zip(weights, w):
                    b[k] = value
                for k, value in zip(float_ins, i):
                    x[k] = value
                outs, finals = self._evaluate(s, b, x)
                return ([outs[k] for k in float_outs], [finals[k] for k in float_finals]), (outs, finals)

            _, vjp, (outs, finals) = jax.vjp(differentiated, [base[k] for k in weights], [ins[k] for k in float_ins],
                                             has_aux=True)
            return outs, finals, vjp

        return run

    def _backward(self, s: int):
        segment = self.segments[s]
        float_outs = [v for v in segment.outs if _inexact(v)]
        float_finals = [v for _, v in segment.finals if _inexact(v)]

        def zero_for_none(cts, avals):
            return [jnp.zeros(v.aval.shape, v.aval.dtype) if c is None else c for c, v in zip(cts, avals)]

        def run(vjp, out_cts, final_cts):
            return vjp((zero_for_none(out_cts, float_outs), zero_for_none(final_cts, float_finals)))

        return run


class DeviceRun:
    """One device's pass through a ``Plan``: its inputs (on the device), the values between segments, the backward
    passes, and the cotangents and gradients gathered backward."""

    def __init__(self, plan: Plan, device, base: Sequence[Any], index: int):
        self.plan, self.device, self.base, self.index = plan, device, list(base), index
        self.env: dict = {}
        self.finals: dict[int, Any] = {p: plan.read_given(v, self.base) for p, v in plan.direct}
        self.vjps: dict[int, Any] = {}
        self.cts: dict = {}
        self.weight_cts: dict[int, list] = {}

    def read(self, v):
        return self.env[v] if v in self.env else self.plan.read_given(v, self.base)

    def forward(self, s: int, differentiate: bool) -> None:
        segment = self.plan.segments[s]
        base = [self.base[i] for i in segment.base_reads]
        ins = [self.read(v) for v in segment.ins]
        if differentiate:
            outs, finals, self.vjps[s] = self.plan.program(s, "forward_vjp")(base, ins)
        else:
            outs, finals = self.plan.program(s, "forward")(base, ins)
        self.env = dict(zip(segment.outs, outs))
        self.finals.update((p, value) for (p, _), value in zip(segment.finals, finals))

    def marker_inputs(self, j: int) -> list:
        """The ``(count, mean, M2)`` this device gives marker ``j`` (1-based)."""
        return [self.read(v) for v in self.plan.markers[j - 1].invars]

    def receive(self, j: int, values: Sequence[Any]) -> None:
        """Marker ``j``'s whole-batch statistics, on this device."""
        self.env.update(zip(self.plan.markers[j - 1].outvars, values))

    def outputs(self):
        """The pass's outputs (its output tree), once every segment ran."""
        return jax.tree_util.tree_unflatten(self.plan.out_tree, [self.finals[p] for p in range(len(self.finals))])

    def backward(self, s: int, final_cts: Sequence[Any]) -> None:
        """Segment ``s``'s backward pass; ``final_cts``: a cotangent (or None) for each of the pass's outputs."""
        segment = self.plan.segments[s]
        out_cts = [self.cts.get(v) for v in segment.outs if _inexact(v)]
        fin_cts = [final_cts[p] for p, v in segment.finals if _inexact(v)]
        weight_cts, in_cts = self.plan.program(s, "backward")(self.vjps.pop(s), out_cts, fin_cts)
        for k, ct in zip(self.plan._weights(s), weight_cts):
            self.weight_cts.setdefault(segment.base_reads[k], []).append(ct)
        self.cts = dict(zip([v for v in segment.ins if _inexact(v)], in_cts))

    def marker_output_cts(self, j: int) -> list:
        """The cotangents of marker ``j``'s mean and variance on this device (after segment ``j``'s backward)."""
        return [self.cts.pop(v, None) for v in self.plan.markers[j - 1].outvars]

    def add_marker_input_cts(self, j: int, cts: Sequence[Any]) -> None:
        for v, ct in zip(self.plan.markers[j - 1].invars, cts):
            if isinstance(v, Literal) or v in self.plan._base or v in self.plan._const or not _inexact(v):
                continue
            self.cts[v] = ct if v not in self.cts else self.cts[v] + ct


def _marker_count(runs: Sequence[DeviceRun]) -> int:
    counts = {len(run.plan.markers) for run in runs}
    if len(counts) != 1:
        raise RuntimeError(f"the devices' forward passes reach different numbers of statistics ({sorted(counts)})")
    return counts.pop()


_COMBINE: dict[bool, Any] = {}


def _combination(masked: bool):
    if masked not in _COMBINE:
        _COMBINE[masked] = (jax.jit(lambda stats: jax.vjp(lambda s: combine(s, masked), stats)),
                            jax.jit(lambda vjp, ct: vjp(ct)[0]), jax.jit(lambda stats: combine(stats, masked)))
    return _COMBINE[masked]


def run_forward(runs: Sequence[DeviceRun], merge, differentiate: bool) -> dict[int, Any]:
    """Every segment on every device, the statistics combined on ``merge`` between them (JAX dispatches each
    device's program without waiting: the devices run at once). Returns each marker's combination's backward pass
    (``differentiate``)."""
    combined = {}
    k = _marker_count(runs)
    for s in range(k + 1):
        for run in runs:
            run.forward(s, differentiate)
        if s == k:
            break
        j = s + 1
        masked = bool(runs[0].plan.markers[j - 1].params["masked"])
        with_vjp, _, plain = _combination(masked)
        stats = [tuple(jax.device_put(run.marker_inputs(j), merge)) for run in runs]
        if differentiate:
            statistics, combined[j] = with_vjp(stats)
        else:
            statistics = plain(stats)
        for run in runs:
            run.receive(j, jax.device_put(list(statistics), run.device))
    return combined


def run_backward(runs: Sequence[DeviceRun], merge, combined: dict[int, Any], final_cts: Sequence[Sequence[Any]]):
    """The segments' backward passes in reverse on every device, the statistics' cotangents summed over the devices
    on ``merge`` and pulled back to each device's ``(count, mean, M2)``. ``final_cts``: per device, a cotangent (or
    None) for each of its pass's outputs."""
    k = _marker_count(runs)
    for s in range(k, -1, -1):
        for run, cts in zip(runs, final_cts):
            run.backward(s, cts)
        if s == 0:
            break
        masked = bool(runs[0].plan.markers[s - 1].params["masked"])
        _, backward, _ = _combination(masked)
        total: list = []
        for run in runs:
            cts = [jnp.zeros(v.aval.shape, v.aval.dtype) if c is None else c
                   for c, v in zip(run.marker_output_cts(s), run.plan.markers[s - 1].outvars)]
            cts = jax.device_put(cts, merge)
            total = [a + b for a, b in zip(total, cts)] if total else cts  # summed in device order
        per_device = backward(combined[s], tuple(total))
        for run, cts in zip(runs, per_device):
            run.add_marker_input_cts(s, jax.device_put(list(cts), run.device))
