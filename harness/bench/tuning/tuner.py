"""``harness.tune``: profile every device alone, choose the split, verify it.

1. Each device alone: memory ceiling (grow, then bisect) and step times at the
   batches tried (``harness.bench.tuning.probe``).
2. A step-time model per device, ``t(b) = fixed + b * per_sample``, fitted to
   those times (``harness.bench.tuning.solver``; the record keeps each fit's error).
3. The split: the fastest for ``global_batch``, or, without one, the global
   batch and split with the most samples/s, each device held to
   ``(1 - margin)`` of its ceiling.
4. Verification: each device alone at its chosen batch (the efficiency's
   denominator is measured, not fitted), then the split itself with
   ``harness.bench.runner.run_one``, and the even split of the same global batch
   (on the same model and trace, split by ``set_ratios``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.bench.tuning.splits import TUNED_MARGIN
from harness.errors import InvalidValue

__all__ = ["tune", "efficiency", "profile_devices", "usable_ceilings", "host_bound_entries"]


def efficiency(total: float | None, solo: Sequence[float | None]) -> float | None:
    """Measured total samples/s over the sum of each device's solo samples/s at its own batch."""
    measured = [s for s in solo if s is not None]
    if total is None or len(measured) < len(solo) or not solo or math.fsum(measured) <= 0:
        return None
    return total / math.fsum(measured)


def tune(
    model: str = "mnist_maxing",
    *,
    devices: Sequence[str],
    size: str = "tiny",
    emulate=None,
    global_batch: int | None = None,
    method: str = "mirrored",
    margin: float = TUNED_MARGIN,
    start: int = 32,
    limit: int = 8192,
    tolerance: float = 0.03,
    max_step_s: float = 1.0,
    verify_seconds: float = 1.0,
    verify_windows: int = 3,
    compare_even: bool = True,
    seed: int = 0,
    on_event: Callable[[str], None] | None = None,
    data: str | None = None,
    backend: str = "tensorflow",
) -> dict:
    """Finds the per-device batches with the most samples/s and measures them.

    Args:
        model: a workload name (``harness.bench.workloads.names()``), or a reference to your own model
            (``MODULE:ATTR``, ``path/to/file.py:ATTR``: docs/user-models.md).
        devices: TensorFlow device names, already set up (``use_logical_devices`` for emulated ones); on
            ``backend="jax"`` JAX device names (``cpu:0``: ``harness.bench.jaxbench.setup_devices``).
        size: ``"tiny"`` or ``"full"``.
        emulate: one ``EmulatedDevice`` per device, or None for real devices.
        global_batch: samples per step to split; None chooses it (most samples/s).
        method: ``"mirrored"`` or ``"towers"`` for the verification run (on JAX ``"towers"``).
        margin: fraction of each memory ceiling left free (fragmentation, other processes).
        start: the ceiling search's first batch size (see ``probe_device``).
        limit: the ceiling search stops here even without running out of memory (see ``probe_device``);
            with ``global_batch`` no device is grown beyond it.
        tolerance: the ceiling search bisects until within this fraction of the ceiling (see ``probe_device``).
        max_step_s: the ceiling search stops growing after a step this slow (see ``probe_device``).
        verify_seconds: timing of the verification runs: seconds per window.
        verify_windows: timing of the verification runs: windows per run.
        compare_even: also run the even split of the same global batch. (The ratio split, the global batch
            divided by the devices' measured speeds alone, is always measured beside the tuned one, and the
            faster of the two is the choice: ``verify["kept"]``, ``choice["kept"]``.)
        seed: weights and data seed.
        on_event: called with a line of progress text.
        data: a reference to your model's data function (``--data``), for a model of your own.
        backend: ``"tensorflow"``, or ``"jax"``: Keras 3 on JAX (the probes ``probe._jax_runner``, the verification
            runs ``harness.bench.jaxbench.run_one``, the stock row Keras' DataParallel), no TensorFlow.

    Returns:
        A JSON-ready record: per-device profiles and fits, the choice (batches,
        ratios, predicted samples/s), the verification (measured samples/s,
        efficiency, the even split beside it), the time tuning took, and
        ``host_bound`` (``host_bound_entries``): where emulated devices ran at
        the host's speed instead of their own, which voids the choice.

    Raises:
        ValueError: bad arguments, a device that runs out of memory at batch 1,
            or a global batch beyond what the devices hold together.

    Examples:
        >>> devices = harness.use_logical_devices(2, inter_op_threads=4)
        >>> record = harness.tune("mnist_maxing", devices=devices, emulate=parse_emulate("1345:1100,875:700"))
        >>> record["choice"]["batches"]
        [1038, 675]
    """
    from harness.bench import workloads

    began = time.perf_counter()
    say = on_event or (lambda text: None)
    workload = workloads.get(model, data)
    _check(devices, size, emulate, global_batch, method, margin, backend)
    specs = list(emulate) if emulate is not None else [None] * len(devices)
    record: dict[str, Any] = {
        "config": {"model": model, "size": size, "devices": list(devices), "method": method, "backend": backend,
                   "global_batch": global_batch, "margin": margin, "seed": seed, "data": data,
                   "emulate": None if emulate is None else [e.to_json() for e in emulate]},
        "devices": [], "choice": None, "verify": None, "seconds": {}}
    limit = limit if global_batch is None else max(1, min(limit, global_batch))
    probes, record["devices"] = profile_devices(workload, size, devices, specs, start=start, limit=limit,
                                                tolerance=tolerance, max_step_s=max_step_s, seed=seed,
                                                on_event=say, backend=backend)
    record["seconds"]["profile"] = time.perf_counter() - began
    split, models = _choose(probes, global_batch, margin, record, specs)
    say(_choice_text(record["choice"]))
    t0 = time.perf_counter()
    record["verify"] = _verify(model, size, devices, specs, probes, split, models, method, verify_seconds,
                               verify_windows, compare_even, seed, say, data, backend)
    kept = record["verify"].get("kept") or {}
    if kept.get("split") == "ratio":  # the ratio split measured faster: it is the recommendation
        choice = record["choice"]
        choice.update(tuned_batches=choice["batches"], batches=list(kept["batches"]), kept="ratio",
                      ratios=[b / choice["global_batch"] for b in kept["batches"]],
                      used=[i for i, b in enumerate(kept["batches"]) if b > 0])
    else:
        record["choice"]["kept"] = "tuned"
    record["seconds"]["verify"] = time.perf_counter() - t0
    record["seconds"]["total"] = time.perf_counter() - began
    record["host_bound"] = host_bound_entries(record)
    return record


def host_bound_entries(record: dict) -> list[dict]:
    """Where a tuning's emulated devices were host-bound.

    A profile is host-bound when any timed point is (its curve is then the
    host's, not the emulated device's); a verification run when ``run_one`` says so.

    Returns:
        ``[{"phase", "device", "emulated_rate", "host_rate", "late_share"}, ...]``, empty when none was.
    """
    out = []
    for dev in record["devices"]:
        timed = [p for p in dev["points"] if p.get("step_seconds")]
        bound = [p for p in timed if p.get("host_bound")]
        if bound and dev.get("emulate"):
            rates = [p["host_rate"] for p in bound if p.get("host_rate")]
            late = sum(p["late_steps"] for p in timed) / sum(p["steps"] for p in timed)
            out.append({"phase": "profile", "device": dev["device"], "emulated_rate": dev["emulate"]["rate"],
                        "host_rate": max(rates) if rates else None, "late_share": late})
    verify = record.get("verify") or {}
    tuned = (verify.get("tuned") or {}).get("batches")
    for name, run in verify.items():
        if name in ("even", "ratio") and run.get("batches") == tuned:  # the tuned run's record, not a run of its own
            continue
        out += [{"phase": f"verify {name}", **entry} for entry in run.get("host_bound") or ()]
    return out


def _check(devices, size, emulate, global_batch, method, margin, backend: str = "tensorflow") -> None:
    from harness.bench import workloads

    workloads.check_size(size)
    if not devices:
        raise InvalidValue("tune needs at least one device; got none")
    if emulate is not None and len(emulate) != len(devices):
        raise InvalidValue(f"need one emulated device per device: {len(devices)} devices but {len(emulate)} "
                           "--emulate entries")
    if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)
                                     or global_batch < 1):
        raise InvalidValue(f"global batch must be an int >= 1; got {global_batch!r}")
    if backend not in ("tensorflow", "jax"):
        raise InvalidValue(f"backend must be 'tensorflow' or 'jax'; got {backend!r}")
    if method not in ("mirrored", "towers") or (backend == "jax" and method != "towers"):
        raise InvalidValue(f"method must be {'towers (on JAX)' if backend == 'jax' else 'mirrored or towers'}; "
                           f"got {method!r}")
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise InvalidValue(f"margin must be a fraction in [0, 1); got {margin!r}")


def each_device(work: Callable[[int], Any], count: int, concurrent: bool = True) -> list:
    """``[work(0), ..., work(count - 1)]``, the devices at once (a thread each) or one after another.

    Each device's work is its own (its own model on its own device), so they overlap as the devices of a
    parallel step do: profiling n devices takes as long as the slowest, not their sum. At most one more
    device than the host has cores works at once: beyond, the others' Python (tracing, the emulated devices'
    ops) delays a device's steps (seven emulated devices on two cores: points three times off their curve).
    The first exception in device order is raised, after every device finished.
    """
    if not concurrent or count < 2:
        return [work(i) for i in range(count)]
    import os
    from concurrent.futures import ThreadPoolExecutor

    at_once = min(count, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="harness-device") as pool:
        futures = [pool.submit(work, i) for i in range(count)]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def profile_devices(workload, size: str, devices: Sequence[str], specs: Sequence, *, start: int = 32,
                    limit: int = 8192, tolerance: float = 0.03, max_step_s: float = 1.0, seed: int = 0,
                    on_event: Callable[[str], None] | None = None, concurrent: bool = True,
                    backend: str = "tensorflow") -> tuple[list, list[dict]]:
    """Each device alone: ceiling, timed points and fitted step model.

    With ``concurrent`` (the default) the devices are profiled at once, each in a thread of its own on its own
    model and device (``each_device``); each device's lines are said together when it is done.

    Returns:
        ``([(DeviceProbe, Fit), ...], [device record, ...])``; ``probe.release_probes`` frees the probes'
        models when they are no longer needed.

    Raises:
        ValueError: a device runs out of memory at batch 1.
    """
    import threading

    from harness.bench.tuning.probe import probe_device
    from harness.bench.tuning.solver import fit_step_model

    say = on_event or (lambda text: None)
    said = threading.Lock()

    def profile(i: int):
        device, spec = devices[i], specs[i]
        lines = [f"[{i + 1}/{len(devices)}] {device}" + (f" (emulated: {spec})" if spec else "")
                 + ": ceiling and curve"]
        if not concurrent:
            say(lines.pop())
        tell = say if not concurrent else lines.append
        probe = probe_device(workload, size, device, emulate=spec, start=start, limit=limit, tolerance=tolerance,
                             max_step_s=max_step_s, seed=seed, on_point=lambda d, p: tell(_point_text(p)),
                             backend=backend)
        try:
            if probe.ceiling is None:
                raise InvalidValue(f"{device} runs out of memory at batch 1 for {workload.name} ({size}): "
                                   f"{probe.oom_error}")
            timed = [(p.batch, p.step_seconds) for p in probe.timed() if p.step_seconds is not None]  # all of them
            fit = fit_step_model([batch for batch, _ in timed], [seconds for _, seconds in timed])
            tell(f"    ceiling {probe.ceiling} ({_stop_text(probe)}); fit {1000 * fit.model.fixed_s:.1f} ms + "
                 f"b / {fit.model.peak_rate:.0f} samples/s, worst point off by {100 * fit.max_relative_error:.1f}%; "
                 f"{probe.seconds:.1f} s")
        finally:
            with said:  # one device's block at a time
                for line in lines:
                    say(line)
        record = {**probe.to_json(), "emulate": None if spec is None else spec.to_json(), "fit": fit.to_json()}
        return (probe, fit), record

    done = each_device(profile, len(devices), concurrent)
    return [probe for probe, _ in done], [record for _, record in done]


def usable_ceilings(probes, margin: float) -> list[int]:
    """Each probed ceiling less the margin (at least 1): ``splits.usable_ceilings`` of the probes."""
    from harness.bench.tuning.splits import usable_ceilings as usable

    # Every probe has a ceiling (profile_devices refuses a device that runs out of memory at batch 1): unbounded is
    # never used here.
    return usable([probe.ceiling for probe, _ in probes], unbounded=1, margin=margin)


def _stop_text(probe) -> str:
    if probe.stopped_by == "oom":
        return f"out of memory at {probe.oom_at}"
    return f"no out-of-memory up to {probe.ceiling}: stopped by {probe.stopped_by}"


def _point_text(point) -> str:
    if not point.fits:
        return f"    batch {point.batch:>6}: out of memory"
    if point.step_seconds is None:
        return f"    batch {point.batch:>6}: fits"
    return f"    batch {point.batch:>6}: {1000 * point.step_seconds:8.1f} ms/step, " \
           f"{point.batch / point.step_seconds:8.0f} samples/s" + \
           (f" -- HOST-BOUND (this host computes {point.host_rate:.0f})" if point.host_bound else "")


def linked_models(probes, specs, overlap: bool = True) -> tuple[list, list[dict | None]]:
    """Each device's step model in the parallel run: its solo fit (which paid for its input slices over its link as
    the parallel run does: copied while the step before ran, ``harness.parallel.staging``), plus, on a device other
    than the first (the merge device), what crosses its emulated link each step: the trained weights in, as many
    gradient bytes out (a transfer per tensor each way), its outputs per sample.

    With ``overlap`` those transfers run beside the compute as the emulated step runs them
    (``EmulatedDevice.overlapped_seconds``): the step is the slowest of the compute (and the last tensor out),
    the weights in before the forward pass ends, and everything out after it (a ``solver.Slowest``); without,
    they add to the step.

    Returns:
        ``(models, links)``: ``links[i]`` is None without a link (real GPUs: their link is not measured), else
        ``{"link", "exchange_ms", "per_sample_us", "overlap"}``: the exchange's time per step and per sample.
    """
    from harness.bench.tuning.solver import Slowest, StepModel
    from harness.emulate import FORWARD_SHARE

    models, links = [], []
    for i, ((probe, fit), spec) in enumerate(zip(probes, specs)):
        link = getattr(spec, "link", None)
        if link is None or i == 0:
            models.append(fit.model)
            links.append(None if link is None else {"link": link.to_json(), "exchange_ms": 0.0, "per_sample_us": 0.0,
                                                    "overlap": overlap})
            continue
        reads = link.seconds(probe.weight_bytes, probe.weight_tensors)
        sends = link.seconds(probe.weight_bytes, probe.weight_tensors) + link.latency_us / 1e6  # gradients, outputs
        per_sample = probe.output_bytes_per_sample / (link.gb_per_s * 1e9)
        links.append({"link": link.to_json(), "exchange_ms": 1000 * (reads + sends), "per_sample_us": 1e6 * per_sample,
                      "overlap": overlap})
        compute = fit.model
        if not overlap:
            models.append(StepModel(compute.fixed_s + reads + sends, compute.per_sample_s + per_sample))
            continue
        last = link.seconds(probe.weight_bytes / max(1, probe.weight_tensors), 1)  # the last gradient out
        backward = 1 - FORWARD_SHARE
        models.append(Slowest((
            StepModel(compute.fixed_s + last, compute.per_sample_s),
            StepModel(reads + backward * compute.fixed_s + last, backward * compute.per_sample_s),
            StepModel(FORWARD_SHARE * compute.fixed_s + sends, FORWARD_SHARE * compute.per_sample_s + per_sample),
            StepModel(reads + sends, per_sample),
        )))
    return models, links


def _choose(probes, global_batch, margin, record, specs=None):
    from harness.bench.tuning.solver import best_split, predict, solve_split

    models, links = linked_models(probes, specs or [None] * len(probes))
    usable = usable_ceilings(probes, margin)
    if global_batch is None:
        split = best_split(models, usable)
    else:
        if global_batch > sum(usable):
            unsure = [f"{p.device} probed only up to {p.ceiling} ({p.stopped_by})" for p, _ in probes
                      if p.stopped_by != "oom"]
            raise InvalidValue(
                f"--global-batch {global_batch} does not fit: the devices hold {sum(usable)} together "
                f"(ceilings {[p.ceiling for p, _ in probes]} less the {100 * margin:g}% margin: {usable})"
                + (f"; {', '.join(unsure)}: raise --max-step-s to probe further" if unsure else ""))
        split = solve_split(models, usable, global_batch)
    even = _even(split.global_batch, _memory_ceilings(probes, split.global_batch))
    record["choice"] = {"mode": "most samples/s" if global_batch is None else "global batch",
                        "usable_ceilings": usable, **split.to_json(),
                        "ratios": [b / split.global_batch for b in split.batches],
                        "used": list(split.used), "even": predict(models, even).to_json()}
    if any(link is not None for link in links):
        record["choice"]["links"] = links
    return split, models


def _choice_text(choice: dict) -> str:
    links = [f"device {i} {entry['exchange_ms']:.2f} ms/step" + (" beside its compute" if entry.get("overlap") else "")
             for i, entry in enumerate(choice.get("links") or []) if entry and entry["exchange_ms"]]
    return (f"choice ({choice['mode']}): batches {choice['batches']} (global {choice['global_batch']}), predicted "
            f"{choice['samples_per_second']:.0f} samples/s; even split predicted "
            f"{choice['even']['samples_per_second']:.0f}"
            + (f"; links counted (weights in, gradients out): {', '.join(links)}" if links else ""))


def _verify(model, size, devices, specs, probes, split, models, method, seconds, windows, compare_even, seed, say,
            data=None, backend: str = "tensorflow"):
    from harness.bench.tuning.probe import release_probes
    from harness.bench.tuning.solver import predict

    ceilings = _memory_ceilings(probes, split.global_batch)
    say("verifying: each device alone at its batch")
    alone_bound: list[dict] = []  # an emulated device host-bound alone: the efficiency divides by the host's speed
    tuned_solo = _solo(probes, split.batches, seconds, say, specs=specs, bound=alone_bound)
    even, even_solo = _even_solo(probes, split, ceilings, seconds, say) if compare_even else (split.batches, None)
    release_probes(probe for probe, _ in probes)  # free the probe models before the parallel ones take the memory
    # The tuned, the ratio and the even split train one model, each split set by set_ratios: its step runs the tuned
    # one's trace (staging: a step traced for any batch of at least the device count), not a trace of its own.
    shared: dict | None = {} if all(b > 0 for b in (*even, *split.batches)) and backend != "jax" else None
    out = {"tuned": _parallel(model, size, devices, specs, split.batches, method, seconds, windows, seed, say,
                              split.samples_per_second, tuned_solo, data, shared, backend)}
    if alone_bound:
        out["tuned"]["host_bound"] = [*(out["tuned"]["host_bound"] or []), *alone_bound]
    if out["tuned"]["status"] != "complete":
        shared = None  # a model whose run failed (out of memory): the even split gets one of its own
    if compare_even and tuple(even) == tuple(split.batches):
        out["even"] = dict(out["tuned"])  # the tuned split is the even one: measured once
    elif compare_even:
        out["even"] = _parallel(model, size, devices, specs, even, method, seconds, windows, seed, say,
                                predict(models, even).samples_per_second, even_solo, data, shared, backend)
    _verify_ratio(out, model, size, devices, specs, split, models, ceilings, method, seconds, windows, seed, say,
                  even_solo or tuned_solo, data, shared, backend)
    shared = None  # its model's memory is the stock baseline's
    if compare_even:
        out["even"]["note"] = ("same global batch" if sum(even) == split.global_batch else
                               f"the even split of {split.global_batch} exceeds a memory ceiling "
                               f"({ceilings}): the largest even split that fits")
        if len(devices) > 1:  # the stock baseline (Keras fit, MirroredStrategy) on it
            # Keras splits a global batch into equal parts: one that does not divide loses its remainder here.
            stock = (sum(even) // len(even),) * len(even)
            out["keras"] = _parallel(model, size, devices, specs, stock, "keras", seconds, windows, seed, say,
                                     predict(models, stock).samples_per_second,
                                     even_solo if tuple(stock) == tuple(even) else None, data, backend=backend)
            if tuple(stock) != tuple(even):
                out["keras"]["note"] = (f"global batch {sum(stock)}: Keras' even split needs a multiple of "
                                        f"{len(even)} devices ({sum(even)} less its remainder)")
    return out


def _verify_ratio(out: dict, model, size, devices, specs, split, models, ceilings, method, seconds, windows, seed, say,
                  solo, data, shared, backend: str = "tensorflow") -> None:
    """Measures the split a user without the tuner would take, the global batch divided by the devices' measured
    speeds alone (``solo``: at the even split, else at the tuned one), beside the tuned split; ``out["kept"]`` is
    the faster of the two by measured samples/s, with how much faster, and ``out["ratio"]`` the ratio split's
    run (or why it was not run: a device's speed unknown, a slice beyond its memory ceiling)."""
    from harness.bench.tuning.solver import predict
    from harness.split import split_batch

    tuned = out["tuned"]
    rates = [r for r in solo or ()]
    if len(rates) != len(split.batches) or any(r is None or not r > 0 for r in rates):
        out["ratio"] = {"batches": None, "status": "not run", "note": "a device's speed alone is unknown"}
        out["kept"] = {"split": "tuned", "batches": list(split.batches), "why": out["ratio"]["note"]}
        return
    ratio = tuple(split_batch(split.global_batch, rates))
    if any(b > c for b, c in zip(ratio, ceilings)):
        note = f"the ratio split {list(ratio)} exceeds a memory ceiling ({ceilings})"
        out["ratio"] = {"batches": list(ratio), "status": "not run", "note": note}
        out["kept"] = {"split": "tuned", "batches": list(split.batches), "why": note}
        return
    if ratio == tuple(split.batches):
        out["ratio"] = {**tuned, "note": "the tuned split is the ratio split"}
        out["kept"] = {"split": "tuned", "batches": list(split.batches), "why": "the tuned split is the ratio split"}
        return
    out["ratio"] = _parallel(model, size, devices, specs, ratio, method, seconds, windows, seed, say,
                             predict(models, ratio).samples_per_second, solo, data,
                             shared if tuned["status"] == "complete" else None, backend)
    mine, theirs = tuned.get("samples_per_second"), out["ratio"].get("samples_per_second")
    if not mine or not theirs:
        kept = "ratio" if theirs and not mine else "tuned"
        out["kept"] = {"split": kept, "batches": out[kept]["batches"], "why": "the other split's run did not complete"}
    else:
        kept, other = ("ratio", "tuned") if theirs > mine else ("tuned", "ratio")
        faster = max(mine, theirs) / min(mine, theirs)
        out["kept"] = {"split": kept, "batches": out[kept]["batches"], "over": other, "faster": faster,
                       "why": f"{faster:.3f}x the {other} split's measured samples/s"}
    say(f"    kept: the {out['kept']['split']} split {out['kept']['batches']} ({out['kept']['why']})")


def _memory_ceilings(probes, global_batch: int) -> list[int]:
    """Ceilings that are out-of-memory limits; a device not grown to one is not limited by it."""
    return [probe.ceiling if probe.stopped_by == "oom" else max(probe.ceiling, global_batch) for probe, _ in probes]


def _even(global_batch: int, ceilings: Sequence[int]) -> tuple[int, ...]:
    """The even split of ``global_batch``, or the largest even split within the ceilings."""
    from harness.split import split_batch

    n = len(ceilings)
    batch = global_batch
    while batch > n and any(b > c for b, c in zip(split_batch(batch, [1.0] * n), ceilings)):
        batch = min(batch - 1, n * min(ceilings))
    return split_batch(batch, [1.0] * n)


def _even_solo(probes, split, ceilings: list[int], seconds, say) -> tuple[tuple[int, ...], list[float | None] | None]:
    """The even split (within ``ceilings``) and each device's rate alone at it; None if it is the tuned split.

    A device whose probe stopped growing before it ran out of memory (step time, limit) has no known
    ceiling, so its even slice may still run out of memory here: its ceiling (in ``ceilings``, updated)
    becomes the largest batch it was seen to fit, and the even split shrinks to fit it.
    """
    from harness.bench.tuning.probe import _OutOfMemory

    while True:
        even = _even(split.global_batch, ceilings)
        if tuple(even) == tuple(split.batches):
            return even, None
        try:
            return even, _solo(probes, even, seconds, say)
        except _OutOfMemory as oom:
            index = oom.device_index
            if index is None:  # _solo names the device; without it there is nothing to learn
                raise
            (probe, _), batch = probes[index], even[index]
            known = probe.ceiling or 0
            if known >= batch:  # it fitted this batch while probed: nothing to learn, a failure
                raise
            say(f"    {probe.device} ran out of memory alone at {batch} (it fitted {known} while probed): "
                f"the even split shrinks to fit it")
            ceilings[index] = known


def _solo(probes, batches, seconds, say, concurrent: bool = True, specs=None,
          bound: list | None = None) -> list[float | None]:
    """Each device's samples/s alone at its batch (each on its own model and device: at once, as profiling).
    ``bound``: where an emulated device alone was host-bound, its entry is appended (``host_bound_entries``'
    form): the efficiency would divide by this host's speed, not the emulated device's."""
    from harness.bench.tuning.probe import _OutOfMemory

    def alone(i: int) -> float | None:
        (probe, _), batch = probes[i], batches[i]
        if batch < 1:
            return 0.0
        try:
            point = probe.measure(batch, min_seconds=seconds / 2)
        except _OutOfMemory as oom:
            oom.device_index = i  # which device: the caller may learn its ceiling
            raise
        if point.host_bound and bound is not None and specs is not None and specs[i] is not None:
            bound.append({"device": probe.device, "emulated_rate": specs[i].rate, "host_rate": point.host_rate,
                          "late_share": point.late_steps / point.steps if point.steps else None, "alone": True})
        return batch / point.step_seconds

    rates = each_device(alone, len(probes), concurrent)
    for (probe, _), batch, rate in zip(probes, batches, rates):
        if batch >= 1:
            say(f"    {probe.device} alone at {batch}: {rate:.0f} samples/s")
    return rates


def _parallel(model, size, devices, specs, batches, method, seconds, windows, seed, say, predicted, solo, data=None,
              shared: dict | None = None, backend: str = "tensorflow"):
    """Measures ``batches`` in parallel on a model of its own (``run_one``; on JAX ``jaxbench.run_one``), or with
    ``shared`` (a dict, TensorFlow) on the model kept there: the first such run builds it, the next ones split it by
    ``set_ratios``."""
    from harness.bench import jaxbench
    from harness.bench.runner import RunConfig, build_model, host_bound, run_one, train_windows

    run = jaxbench.run_one if backend == "jax" else run_one

    used = [i for i, b in enumerate(batches) if b > 0]  # the devices with rows (one alone: method 'single')
    config = RunConfig(model, size, method if len(used) > 1 else "single", tuple(devices[i] for i in used),
                       tuple(batches[i] for i in used), seconds=seconds, windows=windows, seed=seed,
                       emulate=None if specs[0] is None else tuple(specs[i] for i in used), data=data)
    say(f"verifying: {config.method} with batches {list(batches)}")
    if shared is not None:
        if "model" not in shared:
            shared["model"] = build_model(config)
        shared["model"].set_ratios(list(config.batches))
        result = train_windows(config, shared["model"], check_input=False)  # samples/s is all the verification reads
    else:
        result = run(config, check_input=False)
    measured = result["summary"]["samples_per_second"]["median"] if result["status"] == "complete" else None
    eff = efficiency(measured, [solo[i] for i in used]) if solo is not None else None
    line = f"    measured {measured:.0f} samples/s (predicted {predicted:.0f})" if measured else \
        f"    {result['status']}: {result['error']}"
    say(line + (f", efficiency {eff:.3f}" if eff is not None else "")
        + (" -- HOST-BOUND" if host_bound(result) else ""))
    return {"batches": list(batches), "status": result["status"], "error": result["error"],
            "predicted_samples_per_second": predicted, "samples_per_second": measured,
            "spread": None if measured is None else result["summary"]["samples_per_second"]["spread"],
            "solo_samples_per_second": solo, "efficiency": eff, "windows": result["windows"],
            "host_bound": host_bound(result)}
