"""``harness compare``: one workload, every way of spreading it, side by side.

Runs, in one process and on the same devices: each device alone, then the
even, ratio and tuned splits with towers and mirrored, then prints samples/s
with the ratio to the best, writes a PNG bar chart and a JSON record. The ratio
split is ``--ratios`` if given, else the devices' own measured single-device
speeds; the tuned split is ``harness tune``'s for the same global batch (each
device profiled alone: memory ceiling, step-time curve; ``--no-tune`` skips it).

The stock rows (``--no-stock`` leaves them out) are plain Keras on the first device and Keras ``fit``
under a stock MirroredStrategy on the even split; the latter's status also says how far stock
training lands from one device on this workload (two whole batches, its own optimizer) and, where
it drifts, why, each cause measured by taking it away (``harness.bench.stock_drift``).

With no arguments on a machine without GPUs it replays seed 000's story (docs/background.md) on two
emulated devices (a GTX 1080 Ti at 1345 samples/s and a GTX 1080 at 875): even
split vs ratio split at the seed's global batch of 1388.

``--workers N [--devices-per-worker ...]`` compares across N local workers of one loopback
cluster (each row one ``harness run --workers``): the stock baseline (Keras 2's ``fit`` under a
stock MultiWorkerMirroredStrategy, even split, where every worker has one device), harness
even, harness at ``--ratios`` (default: the emulated devices' rates) and harness starting even
and re-splitting while it trains (``--rebalance``; ``--no-tune`` leaves it out).

Examples:
    harness compare                                   # seed 000, emulated
    harness compare --gpus 0 1 --batch 1388          # your GPUs
    harness compare --model gru_stack --emulate 1000,500,250 --batch 700
    harness compare --workers 2 --emulate 2000,1000 --batch 300
    harness compare --backend jax --logical-cpus 3 --batch 300   # Keras 3 on 3 JAX CPU devices
    harness compare --backend jax                     # seed 000 on Keras 3's JAX backend, emulated

``--backend jax`` runs Keras 3 on JAX devices (emulated ones: ``--emulate``, by default without GPUs seed 000's
pair on two JAX CPU devices; ``--logical-cpus N`` JAX CPU devices; or ``--gpus``), no TensorFlow in the process:
each device alone, the whole batch on the first (harness' wrapper, then plain Keras), Keras' own
``keras.distribution.DataParallel`` on the even split (the stock rows: even shards, the batch rounded down to a
multiple of the device count where it does not divide, the row saying so; on emulated devices each shard charged at
its device's rate, as harness' rows are: ``harness.bench.jaxbench``), the even and the ratio split with towers. The
tuned split is left out (a note says so: ``harness tune --backend jax`` finds it); ``--workers``, ``--methods
mirrored``, ``--overlap`` and an emulated link are refused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from harness.bench.console import Output
from harness.cli import options
from harness.errors import InvalidValue, Refused
from harness.parallel import METHODS as PARALLEL_METHODS

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("compare", help="single vs even vs ratio split, towers vs mirrored, in one run",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_common(p, seconds=1.5, windows=3)
    options.add_backend(p)
    p.add_argument("--batch", type=int, help=f"global batch size (default {options.BATCH_PER_DEVICE} per device)")
    p.add_argument("--ratios", nargs="+", type=options.ratio, metavar="R",
                   help="ratio split to compare (default: the devices' measured single-device samples/s)")
    p.add_argument("--methods", nargs="+", choices=PARALLEL_METHODS, default=list(PARALLEL_METHODS),
                   help="parallel methods to compare (default both)")
    p.add_argument("--no-tune", action="store_true", help="leave out the tuned split (saves the profiling time)")
    p.add_argument("--no-stock", action="store_true",
                   help="leave out the stock Keras rows (plain Keras on the first device, Keras fit under a stock "
                        "MirroredStrategy on the even split; on --backend jax Keras' own DataParallel)")
    p.add_argument("--overlap", choices=("on", "off", "both"),
                   help="harness' steps copy each device's next slice while the step runs (on), inside it (off), "
                        "or both: the last split's rows again without the overlap, its gain measured in this run "
                        "(default: both where an emulated device has a link, else on; across workers on or off)")
    p.add_argument("--plot", metavar="PNG", help="bar chart path (default: next to the record)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="compare across N local worker processes of one loopback cluster (see above)")
    p.add_argument("--devices-per-worker", type=int, nargs="+", metavar="N",
                   help="with --workers: devices each worker trains on, one N for all or one per worker")
    p.add_argument("--rebalance", type=int, default=10, metavar="EVERY",
                   help="with --workers: steps per measurement of the re-splitting row (default 10)")
    p.set_defaults(run=run)


def _rows(args, setup, size: str, batch: int):
    """(label, RunConfig) of the single-device runs; the parallel ones follow their results."""
    from harness.bench.runner import RunConfig

    common = dict(seconds=args.seconds, windows=args.windows, warmup_steps=args.warmup_steps,
                  input_delay_ms=args.input_delay_ms, seed=args.seed, data=args.data, overlap=_overlaps(args, setup)[0])
    share = max(1, batch // len(setup.devices))
    singles = []
    for i, device in enumerate(setup.devices):
        emulate = None if setup.emulate is None else (setup.emulate[i],)
        singles.append((f"{_short(device)} alone", RunConfig(args.model, size, "single", (device,), (share,),
                                                              emulate=emulate, **common)))
    return singles, common


def _short(device: str) -> str:
    return device.replace("/device:", "").replace("/job:localhost/replica:0/task:0", "")


def _sized(args, setup) -> tuple[int, str, int]:
    """``(devices, workload size, global batch)`` of a comparison on ``setup``'s devices; ``--ratios`` checked
    against them (each value was checked by argparse: ``options.ratio``)."""
    n = len(setup.devices)
    if args.ratios is not None and len(args.ratios) != n:
        raise InvalidValue(f"--ratios needs one ratio per device ({n}: {', '.join(setup.devices)}); got "
                           f"{len(args.ratios)}: {' '.join(f'{r:g}' for r in args.ratios)}")
    size = options.default_size(args, setup)
    batch = options.BATCH_PER_DEVICE * n if args.batch is None else args.batch
    if batch < n:
        raise InvalidValue(f"--batch must be at least the device count ({n}); got {batch}")
    return n, size, batch


def run(args) -> int:
    if getattr(args, "backend", "tensorflow") == "jax":
        return _compare_jax(args)
    if args.workers is not None or args.devices_per_worker is not None:
        return _compare_cluster(args)
    from harness.bench.runner import RunConfig
    from harness.bench.tuning.splits import split_batches

    options.check_common(args)
    if args.batch is not None and args.batch < 1:
        raise InvalidValue(f"--batch must be >= 1; got {args.batch}")
    setup = options.setup_devices(args)
    n, size, batch = _sized(args, setup)
    singles, common = _rows(args, setup, size, batch)
    out = Output(args, "compare", {"model": args.model, "size": size, "devices": list(setup.devices),
                                   "batch": batch, "device_kind": setup.kind,
                                   "emulate": None if setup.emulate is None else [e.to_json() for e in setup.emulate]})
    out.say(f"{args.model} ({size}) on {n} {setup.kind} device(s), global batch {batch}; "
            f"{args.windows} windows of {args.seconds:g} s per configuration")
    if setup.note:
        out.say(setup.note)
    rows = out.record.setdefault("rows", [])

    def measure(label, config, total):
        out.say(f"\n[{len(rows) + 1}/{total}] {label}: {config.method}, batches {list(config.batches)}")
        result = _execute(config, setup, out)
        rows.append({"label": label, **result})
        out.save()
        return result

    stock = not args.no_stock
    overlaps = _overlaps(args, setup)
    out.record["overlap"] = args.overlap or ("both" if len(overlaps) > 1 else "on")

    def work():
        total = (n + (2 if args.no_tune else 3) * len(args.methods) + (3 if stock and n > 1 else 2 * stock)
                 + (len(overlaps) - 1) * len(args.methods))
        solo = [measure(label, config, total) for label, config in singles]
        if stock:  # the whole batch on the first device: harness' single-device wrapper, then plain Keras
            first = singles[0][1]
            whole = dict(common, emulate=first.emulate)
            name = _short(first.devices[0])
            measure(f"{name} whole", RunConfig(args.model, size, "single", first.devices, (batch,), **whole), total)
            measure(f"{name} keras", RunConfig(args.model, size, "keras", first.devices, (batch,), **whole), total)
        ratios, source = _ratio_split(args, solo)
        out.record["ratio_source"] = source
        splits = [(kind, split_batches(kind, batch, n, ratios=ratios)) for kind in ("even", "ratio")]
        if not args.no_tune:
            splits.append(("tuned", _tuned_split(args, setup, size, batch, out)))
        last = [name for name, split in splits if split is not None][-1]
        for name, split in splits:
            if split is None:
                continue
            used = [i for i, b in enumerate(split) if b > 0]  # the tuned split may leave a slow device out
            emulate = None if setup.emulate is None else tuple(setup.emulate[i] for i in used)
            if stock and name == "even" and n > 1:
                done = measure("even keras", RunConfig(args.model, size, "keras", setup.devices, tuple(split),
                                                       emulate=setup.emulate, **common), total)
                if done["status"] == "complete":  # how far stock training lands from one device, and why
                    rows[-1]["fidelity"] = stock_fidelity(args.model, size, batch, setup.devices, args.data)
                    out.say(f"  stock Keras vs one device: {fidelity_text(rows[-1]['fidelity'])}")
                    out.save()
            for overlap in overlaps if name == last else overlaps[:1]:
                for method in args.methods:
                    config = RunConfig(args.model, size, method if len(used) > 1 else "single",
                                       tuple(setup.devices[i] for i in used), tuple(split[i] for i in used),
                                       emulate=emulate, **dict(common, overlap=overlap))
                    measure(f"{name} {method}" + ("" if overlap or len(overlaps) == 1 else " no overlap"), config,
                            total)

    out.guard(work)
    return _report(args, out, rows, setup)


_JAX_REFUSALS = (
    ("methods", lambda v: v is not None and "mirrored" in v and list(v) != list(PARALLEL_METHODS),
     "--methods mirrored: TensorFlow's MirroredStrategy; on --backend jax harness splits with towers"),
    ("overlap", lambda v: v is not None,
     "--overlap: copying the next slice beside the step is harness' TensorFlow staging; on --backend jax each "
     "slice is copied inside its step"),
)


def _compare_jax(args) -> int:
    """``harness compare --backend jax``: each device alone, the whole batch on the first (harness' wrapper, then
    plain Keras), Keras' own DataParallel on the even split (the stock rows, ``--no-stock`` leaves them out), even
    and ratio towers, on JAX devices (``harness.bench.jaxbench``); no tuned split (TensorFlow's: a note says so)."""
    from harness.bench import jaxbench
    from harness.bench.runner import RunConfig
    from harness.bench.tuning.splits import split_batches

    options.refuse_on_jax(args, options.JAX_REFUSALS + _JAX_REFUSALS)
    jaxbench.select_backend()
    jaxbench.check_workload(args.model, args.data)
    options.check_common(args)
    if args.batch is not None and args.batch < 1:
        raise InvalidValue(f"--batch must be >= 1; got {args.batch}")
    if args.ratios is not None and args.logical_cpus is not None and len(args.ratios) != args.logical_cpus:
        raise InvalidValue(f"--ratios needs one ratio per device ({args.logical_cpus}); got {len(args.ratios)}: "
                           f"{' '.join(f'{r:g}' for r in args.ratios)}")
    setup = options.setup_jax_devices(args)
    n, size, batch = _sized(args, setup)
    common = dict(seconds=args.seconds, windows=args.windows, warmup_steps=args.warmup_steps,
                  input_delay_ms=args.input_delay_ms, seed=args.seed, data=args.data, overlap=False)
    share = max(1, batch // n)
    specs = setup.emulate

    def emulated(indices) -> tuple | None:  # the emulated devices of a row's devices (None: not emulated)
        return None if specs is None else tuple(specs[i] for i in indices)

    singles = [(f"{device} alone", RunConfig(args.model, size, "single", (device,), (share,), emulate=emulated([i]),
                                             **common))
               for i, device in enumerate(setup.devices)]
    out = Output(args, "compare", {"model": args.model, "size": size, "devices": list(setup.devices), "batch": batch,
                                   "device_kind": setup.kind, "backend": "jax",
                                   "emulate": None if specs is None else [e.to_json() for e in specs]},
                 environment=jaxbench.environment())
    out.record["backend"] = "jax"
    out.say(f"{args.model} ({size}) on {n} JAX {setup.kind} device(s), global batch {batch}; {args.windows} "
            f"windows of {args.seconds:g} s per configuration")
    if setup.note:
        out.say(setup.note)
    left_out = []
    stock = not args.no_stock
    if not args.no_tune:
        left_out.append("the tuned split (harness tune --backend jax finds it)")
    if list(args.methods) == list(PARALLEL_METHODS):
        left_out.append("mirrored (TensorFlow's MirroredStrategy)")
    if left_out:
        out.record["left_out"] = left_out
        out.say("on --backend jax, left out: " + "; ".join(left_out))
    out.record["overlap"] = "off"
    rows = out.record.setdefault("rows", [])
    total = n + 1 + 2 * (n > 1) + stock * (1 + (n > 1))

    def measure(label, config, note=None):
        what = {"keras": jaxbench.STOCK["several" if len(config.devices) > 1 else "one"]}.get(config.method,
                                                                                                config.method)
        out.say(f"\n[{len(rows) + 1}/{total}] {label}: {what}, batches {list(config.batches)} on "
                f"{', '.join(config.devices)}" + (f" ({note})" if note else ""))
        try:
            result = jaxbench.execute(config, out, prefix="  ", compact=True)
        except Refused as err:  # a model this path cannot split (jax-batchnorm, ...): that row's result
            result = {"config": jaxbench.config_json(config), "status": "refused", "windows": [], "summary": None,
                      "input": None, "error": str(err)}
            out.say(f"  refused: {err}")
        rows.append({"label": label, **result, **({"note": note} if note else {})})
        out.save()
        return result

    def work():
        solo = [measure(label, config) for label, config in singles]
        first = setup.devices[0]
        measure(f"{first} whole", RunConfig(args.model, size, "single", (first,), (batch,), emulate=emulated([0]),
                                            **common))
        if stock:  # plain Keras on the first device, the whole batch
            measure(f"{first} keras", RunConfig(args.model, size, "keras", (first,), (batch,), emulate=emulated([0]),
                                                **common))
        ratios, source = _ratio_split(args, solo)
        out.record["ratio_source"] = source
        if n > 1:
            if stock:  # Keras' own DataParallel: even shards, the batch a multiple of the device count
                shards, rounded = jaxbench.stock_batches(batch, n)
                measure("even keras", RunConfig(args.model, size, "keras", tuple(setup.devices), shards,
                                                emulate=emulated(range(n)), **common), rounded)
            for kind in ("even", "ratio"):
                split = split_batches(kind, batch, n, ratios=ratios)
                used = [i for i, b in enumerate(split) if b > 0]
                measure(f"{kind} towers", RunConfig(args.model, size, "towers" if len(used) > 1 else "single",
                                                    tuple(setup.devices[i] for i in used),
                                                    tuple(split[i] for i in used), emulate=emulated(used), **common))

    out.guard(work)
    return _report(args, out, rows, setup)


def _overlaps(args, setup) -> tuple[bool, ...]:
    """The overlap settings of the parallel rows: ``--overlap``, by default both where a link is emulated."""
    chosen = args.overlap
    if chosen is None:
        chosen = "both" if any(e.link is not None for e in setup.emulate or ()) else "on"
    return {"on": (True,), "off": (False,), "both": (True, False)}[chosen]


def _report(args, out, rows: list[dict], setup) -> int:
    """The comparison table, harness over stock, the chart; the record finished."""
    for row in rows:  # how the link model made the row's figure (None: measured as it ran, no link modelled)
        row["modelled"] = charging(row)
    out.record["versus_stock"] = versus_stock(rows)
    out.record["overlap_gain"] = overlap_gain(rows)
    out.finish(status="complete")
    table = comparison_table(rows)
    plot = options.chart("compare", lambda: _plot(args, out, rows, setup))
    if args.json:
        json.dump(out.record, sys.stdout, indent=2, default=str)
        print()
    else:
        print("\n" + table)
        print(f"ratio split from {out.record['ratio_source']}")
        for entry in out.record["versus_stock"]:
            if entry["ratio"] is None:
                print(f"{entry['row']} / {entry['baseline']}: not compared: {entry['withheld']}")
            else:
                print(f"{entry['row']} / {entry['baseline']}: {entry['ratio']:.2f}x"
                      + (" (modelled links)" if entry["modelled"] else ""))
        for entry in out.record["overlap_gain"]:
            print(f"overlap: {entry['row']} / {entry['baseline']}: {entry['ratio']:.2f}x"
                  + (" (modelled: the link model's gain)" if entry["modelled"] else ""))
        if plot is not None:
            print(f"chart: {plot}")
    _warn_host_bound(rows)
    return 0


def _warn_host_bound(rows: list[dict]) -> None:
    """One warning line for all configurations whose emulated devices were host-bound (each device's best host rate)."""
    from harness.bench.runner import host_bound
    from harness.emulate import host_bound_text

    bound = [row for row in rows if host_bound(row)]
    if not bound:
        return
    merged: dict[str, dict] = {}
    for entry in (e for row in bound for e in host_bound(row)):
        seen = merged.setdefault(entry["device"], dict(entry))
        seen["host_rate"] = max(seen["host_rate"] or 0.0, entry["host_rate"] or 0.0) or None
        seen["late_share"] = max(seen["late_share"], entry["late_share"])
    labels = ", ".join(row["label"] for row in bound)
    print(f"harness compare: warning: {len(bound)} of {len(rows)} configurations ({labels}): "
          f"{host_bound_text(list(merged.values()))}", file=sys.stderr)


def _tuned_split(args, setup, size: str, batch: int, out) -> tuple[int, ...] | None:
    """``harness tune``'s split of ``batch``: profile each device alone, then ``splits.split_batches("tuned")``."""
    from harness.bench import workloads
    from harness.bench.tuning.probe import release_probes
    from harness.bench.tuning.splits import TUNED_MARGIN, split_batches, usable_ceilings
    from harness.bench.tuning.tuner import host_bound_entries, linked_models, profile_devices
    from harness.errors import Refused

    out.say("\ntuned split: profiling each device alone (memory ceiling, step-time curve)")
    specs = setup.emulate or [None] * len(setup.devices)
    quiet = lambda text: None if text.startswith("    batch") else out.say(text)  # noqa: E731
    # Grown up to the batch whatever a step takes (no step-time stop: the rows train this batch anyway), so a
    # probe's ceiling is the batch or where its device ran out of memory, never a guess from a slow step.
    probes, records = profile_devices(workloads.get(args.model, args.data), size, setup.devices, specs, limit=batch,
                                      max_step_s=math.inf, seed=args.seed, on_event=quiet)
    release_probes(probe for probe, _ in probes)
    ceilings = [probe.ceiling for probe, _ in probes]
    out.record["tuning"] = {"devices": records, "usable_ceilings": usable_ceilings(ceilings, batch, TUNED_MARGIN),
                            "host_bound": host_bound_entries({"devices": records})}
    if out.record["tuning"]["host_bound"]:
        from harness.emulate import host_bound_text

        text = host_bound_text(out.record["tuning"]["host_bound"])
        print(f"harness compare: warning: tuned split's profiles: {text}", file=sys.stderr)
    # An emulated link's exchange with the merge device counted, beside the compute where the rows overlap it.
    models, links = linked_models(probes, specs, overlap=_overlaps(args, setup)[0])
    if any(links):
        out.record["tuning"]["links"] = links
    try:
        split = split_batches("tuned", batch, len(ceilings), models=models, ceilings=ceilings)
    except Refused as err:
        out.record["tuning"]["error"] = str(err)
        out.say(out.record["tuning"]["error"])
        return None
    out.record["tuning"]["split"] = {"batches": list(split)}
    return split


def _compare_cluster(args) -> int:
    """``--workers N``: each row one run across the cluster (``harness.cli.run.cluster_plan``)."""
    from harness.bench.cluster_run import stock_keras_name
    from harness.bench.console import execute_cluster
    from harness.cli.run import cluster_plan

    if args.rebalance < 1:
        raise InvalidValue(f"--rebalance must be >= 1 (steps per measurement); got {args.rebalance}")
    if args.methods != list(PARALLEL_METHODS) and args.methods != ["mirrored"]:
        raise InvalidValue("across workers harness trains with method mirrored; "
                           f"got --methods {' '.join(args.methods)}")

    if args.overlap == "both":
        raise InvalidValue("across workers each row is one cluster run: give --overlap on or off, not both")

    def plan(label: str, **changes):
        row = argparse.Namespace(**{**vars(args), "method": "mirrored", "batches": None, "throttle": None,
                                     "rebalance": None, "ratios": None, "no_overlap": args.overlap == "off",
                                     **changes})
        return (label, *cluster_plan(row))

    even = plan("even mirrored")
    _, base, config, setup = even
    ratios = args.ratios or ([e.rate for e in setup.emulate] if setup.emulate is not None else None)
    plans = [even]
    if not args.no_stock and max(base.counts) == 1 and stock_keras_name() is not None:
        plans.insert(0, plan("even keras", method="keras"))
    if ratios is not None:
        plans.append(plan("ratio mirrored", ratios=ratios))
    if not args.no_tune:
        plans.append(plan("auto mirrored", rebalance=args.rebalance))
    out = Output(args, "compare", {"model": config.model, "size": config.size, "devices": list(setup.devices),
                                   "batch": config.batch, "device_kind": setup.kind,
                                   "cluster": {"workers": base.workers, "devices_per_worker": list(base.counts)},
                                   "emulate": None if setup.emulate is None else [e.to_json() for e in setup.emulate]})
    out.say(f"{config.model} ({config.size}) across {base.workers} workers with {list(base.counts)} device(s), "
            f"global batch {config.batch}; {config.windows} windows of ~{config.seconds:g} s per configuration")
    if setup.note:
        out.say(setup.note)
    out.record["ratio_source"] = "even (no --ratios, no emulated rates)" if ratios is None else (
        f"--ratios {' '.join(f'{r:g}' for r in args.ratios)}" if args.ratios else
        "the emulated rates " + ":".join(f"{r:g}" for r in ratios))
    rows = out.record.setdefault("rows", [])

    def work():
        for label, row_plan, row_config, _ in plans:
            what = "stock tf_keras fit" if row_plan.method == "keras" else "harness mirrored"
            extra = f", re-splitting every {row_config.rebalance_every} steps" if row_config.rebalance_every else ""
            out.say(f"\n[{len(rows) + 1}/{len(plans)}] {label}: {what}, batches {list(row_config.batches)}{extra}")
            rows.append({"label": label, **execute_cluster(row_plan, row_config, out, prefix="  ", compact=True)})
            out.save()

    out.guard(work)
    return _report(args, out, rows, setup)


def _execute(config, setup, out):
    from harness.bench.console import execute

    return execute(config, setup, out, prefix="  ", compact=True)


def _ratio_split(args, solo: list[dict]) -> tuple[list[float], str]:
    if args.ratios is not None:
        return list(args.ratios), f"--ratios {' '.join(f'{r:g}' for r in args.ratios)}"
    rates = [r["summary"]["samples_per_second"]["median"] if r["status"] == "complete" else None for r in solo]
    measured = [rate for rate in rates if rate is not None]
    if len(measured) < len(rates) or any(rate <= 0 for rate in measured):
        return [1.0] * len(solo), "even (a device failed alone, so its speed is unknown)"
    return measured, "measured single-device speeds " + ":".join(f"{r:.0f}" for r in measured)


def comparison_table(rows: list[dict]) -> str:
    """Label, per-device batches, samples/s (median, spread), ratio to the best, status."""
    from harness.bench.report import format_table, ratio_to_best

    values = [_median(r) for r in rows]
    best = ratio_to_best(values)
    table = []
    for row, value, rel in zip(rows, values, best):
        cfg = row["config"]
        spread = (row.get("summary") or {}).get("samples_per_second", {}).get("spread")
        busy = [d.get("busy_fraction", {}).get("median") for d in (row.get("summary") or {}).get("devices", [])]
        table.append([row["label"], "/".join(str(b) for b in cfg["batches"]),
                      "-" if value is None else f"{value:.0f}",
                      "n/a" if spread is None else f"{100 * spread:.1f}%",
                      "-" if rel is None else f"{rel:.2f}",
                      " ".join(f"{100 * b:.0f}%" for b in busy if b is not None) or "-",
                      _status(row)])
    return format_table(table, ["configuration", "batches", "samples/s", "spread", "vs best", "busy", "status"])


def versus_stock(rows: list[dict]) -> list[dict]:
    """harness' rows over the stock Keras rows, measured in this run (rows that did not complete left out).

    - the single-device wrapper over plain Keras, the whole batch on the same device (its overhead);
    - each even split over Keras ``fit`` under a stock MirroredStrategy (the same split: what harness'
      exact step costs or gains), and over plain Keras on one device.

    On emulated links a pair whose two rows the link model charges differently (``charging``: harness' rows
    overlap their copies with the step, the stock baseline's are inside its step) has no ratio: ``ratio`` None,
    ``withheld`` saying why. A ratio of rows charged alike on links is ``modelled``.
    """
    by_label = {row["label"]: _median(row) for row in rows}
    rows_by_label = {row["label"]: row for row in rows}
    one = next((row["label"] for row in rows if row["config"]["method"] == "keras"
                and len(row["config"]["devices"]) == 1), None)
    pairs = []
    for row in rows:
        label, method = row["label"], row["config"]["method"]
        if method == "single" and label.endswith(" whole") and one is not None:
            pairs.append((label, one))
        elif method != "keras" and label.startswith("even "):
            pairs += [(label, "even keras"), (label, one)]
    out = []
    for label, base in pairs:
        if base is None or not by_label.get(label) or not by_label.get(base):
            continue
        mine, theirs = charging(rows_by_label[label]), charging(rows_by_label[base])
        if mine != theirs:
            out.append({"row": label, "baseline": base, "ratio": None,
                        "withheld": f"modelled links charged unequally ({label}: {mine or 'no link'}; "
                                    f"{base}: {theirs or 'no link'})"})
        else:
            out.append({"row": label, "baseline": base, "ratio": by_label[label] / by_label[base],
                        "modelled": mine is not None})
    return out


def overlap_gain(rows: list[dict]) -> list[dict]:
    """Each row with the overlap over its twin without it (``--overlap both``), measured in this run; on emulated
    links the gain is the link model's (``modelled``)."""
    by_label = {row["label"]: _median(row) for row in rows}
    linked = {row["label"]: charging(row) is not None for row in rows}
    return [{"row": label, "baseline": f"{label} no overlap", "ratio": value / by_label[f"{label} no overlap"],
             "modelled": linked[label]}
            for label, value in by_label.items() if value and by_label.get(f"{label} no overlap")]


def charging(row: dict) -> str | None:
    """How the link model charges ``row``'s transfers, where an emulated device has a link (None: no link, the
    figure is measured, not modelled): ``serial`` (every copy inside the step, one after the other: the stock
    baseline, and harness' rows without the overlap) or ``overlapped`` (the next slice copied beside the step,
    the weights in and the gradients out beside the compute, the forward pass taken as ``FORWARD_SHARE`` of it:
    an assumption)."""
    config = row["config"]
    if not any(isinstance(e, dict) and e.get("link") for e in config.get("emulate") or ()):
        return None
    if config["method"] == "keras" or not config.get("overlap", True):
        return "serial"
    return "overlapped"


def _modelled(row: dict) -> str:
    """The status' note of a row whose figure the link model makes."""
    how = charging(row)
    if how is None:
        return ""
    if how == "serial":
        return "; modelled links: copies inside the step"
    from harness.emulate import FORWARD_SHARE

    return f"; modelled links: copies beside the step (forward share {FORWARD_SHARE:.2g}, assumed)"


def stock_fidelity(model: str, size: str, batch: int, devices, data: str | None = None) -> dict:
    """How far the stock baseline's training lands from one device on this workload: two whole batches of its
    data, its optimizer and loss, the stock MirroredStrategy's even split over ``devices`` (their emulated speed
    does not matter here); where it drifts, the causes, each measured (``harness.bench.stock_drift``)."""
    from harness.bench import stock, stock_drift, workloads
    from harness.bench.workloads.userdata import head  # a user's model may take several inputs
    from harness.equivalence import compare_training

    workload, samples, tol = workloads.get(model, data), 2 * batch, 1e-6
    x, y = workload.make_data(size, samples)

    def build():
        return workload.build(size)

    def measure(optimizer=workload.optimizer, samples=samples, batch_size=batch):
        return compare_training(build, head(x, samples), head(y, samples), devices=list(devices), method=stock.keras,
                                batch_size=batch_size, optimizer=optimizer, loss=workload.loss()).max_deviation

    deviation = measure()
    if deviation <= tol:
        return {"deviation": deviation, "causes": [], "unexplained": None}
    return stock_drift.explain(measure, build, workload.optimizer, samples=samples, batch_size=batch,
                               replicas=len(devices), deviation=deviation, tol=tol).to_json()


def fidelity_text(fidelity: dict) -> str:
    """``exact (2.3e-08 from one device)``, or the drift and its causes (``StockDrift.text``)."""
    from harness.bench.stock_drift import Cause, StockDrift

    if fidelity["deviation"] <= 1e-6:
        return f"exact ({fidelity['deviation']:.1e} from one device)"
    causes = tuple(Cause(c["what"], c["remaining"]) for c in fidelity["causes"])
    return StockDrift(fidelity["deviation"], causes, fidelity["unexplained"]).text()


def _status(row: dict) -> str:
    from harness.bench.runner import host_bound

    if row["status"] != "complete":
        return f"{row['status']}: {row['error']}"
    bound = host_bound(row)
    status = "ok" if not bound else "HOST-BOUND: " + ", ".join(_short(d["device"]) for d in bound)
    status += _modelled(row)
    status += "".join(f"; {row[key]}" for key in ("stock", "note") if row.get(key))  # on JAX: what stock ran
    return status if "fidelity" not in row else f"{status}; stock Keras {fidelity_text(row['fidelity'])}"


def _median(row: dict):
    summary = row.get("summary")
    return None if not summary else summary["samples_per_second"]["median"]


def _plot(args, out, rows, setup) -> Path | None:
    from harness.bench.report import bar_chart
    from harness.bench.runner import host_bound

    if args.no_save and args.plot is None:
        return None
    path = Path(args.plot) if args.plot else Path(out.path).with_suffix(".png")
    labels = [f"{r['label']}\n{'/'.join(str(b) for b in r['config']['batches'])}" for r in rows]
    notes = [r["status"].upper() if r["status"] != "complete" else "HOST-BOUND" if host_bound(r) else None
             for r in rows]
    spreads = [None if _median(r) is None else (r["summary"]["samples_per_second"]["iqr"] or 0) / 2 for r in rows]
    config = out.record["config"]
    title = f"{config['model']} ({config['size']}), global batch {config['batch']}"
    footnote = "emulated devices: " + ", ".join(str(e) for e in setup.emulate) if setup.emulate else setup.kind
    if out.record.get("backend") == "jax":
        import os

        footnote = f"Keras on JAX: {setup.kind} devices" + (
            f" of one {os.cpu_count()}-core host (shares of its cores)" if setup.kind != "GPU" else "")
    return bar_chart(labels, [_median(r) for r in rows], path, title=title, notes=notes, errors=spreads,
                     footnote=footnote)
