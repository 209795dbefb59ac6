"""``harness tune``: find each device's memory ceiling and speed, choose the split, verify it.

For each device alone, the batch grows until a step runs out of memory and the
ceiling is bisected; the steps on the way are timed and fitted to
``t(b) = fixed + b / rate``. The solver then picks the per-device batches with
the most samples/s (``--max``, the default) or the fastest split of
``--global-batch``, and the choice is run for real: predicted vs measured
samples/s and the efficiency (measured total / the sum of each device alone at
its chosen batch), with the even split beside it. Prints the ``harness run``
flags to use, writes a JSON record and a PNG of the curves.

Examples:
    harness tune                                       # seed 000's emulated GPUs (docs/background.md), no GPU needed
    harness tune --gpus 0 1 --model resnet50            # your GPUs
    harness tune --emulate 1500:900,1000:600,500:300 --global-batch 1200
    harness tune --backend jax                         # the same on Keras 3's JAX backend, no TensorFlow

``--backend jax`` profiles and verifies on JAX devices (emulated ones by default without GPUs, one JAX CPU device
each; ``--logical-cpus N``; ``--gpus``) with harness' JAX towers (``--method towers``, the default there) and Keras'
own DataParallel as the stock row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.bench.tuning.splits import TUNED_MARGIN
from harness.cli import options
from harness.errors import InvalidValue
from harness.parallel import METHODS as PARALLEL_METHODS

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune", help="memory ceilings, throughput curves, the best split, verified",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_common(p, seconds=0.75, windows=3)
    options.add_backend(p)
    goal = p.add_mutually_exclusive_group()
    goal.add_argument("--global-batch", type=int, metavar="N", help="split this many samples per step")
    goal.add_argument("--max", action="store_true",
                      help="choose the global batch too: the most samples/s within the ceilings (default)")
    p.add_argument("--method", choices=PARALLEL_METHODS, default=None,
                   help="method of the verification runs (default mirrored; towers on --backend jax)")
    p.add_argument("--margin", type=float, default=TUNED_MARGIN,
                   help=f"fraction of each memory ceiling left free (default {TUNED_MARGIN:g})")
    p.add_argument("--start-batch", type=int, default=32, metavar="B", help="first batch tried (default 32)")
    p.add_argument("--max-batch", type=int, default=8192, metavar="B",
                   help="stop growing here without an out-of-memory (default 8192)")
    p.add_argument("--max-step-s", type=float, default=1.0, metavar="S",
                   help="stop growing a device's batch once one step takes this long (default 1.0)")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="bisect each ceiling to within this fraction (default 0.03)")
    p.add_argument("--no-even", action="store_true", help="do not run the even split for comparison")
    p.add_argument("--plot", metavar="PNG", help="curve chart path (default: next to the record)")
    p.set_defaults(run=run)


def _precheck(args) -> None:
    options.check_common(args)
    if args.global_batch is not None and args.global_batch < 1:
        raise InvalidValue(f"--global-batch must be >= 1; got {args.global_batch}")
    if not 0 <= args.margin < 1:
        raise InvalidValue(f"--margin must be in [0, 1); got {args.margin:g}")
    if args.start_batch < 1:
        raise InvalidValue(f"--start-batch must be >= 1; got {args.start_batch}")
    if args.max_batch < args.start_batch:
        raise InvalidValue(f"--max-batch must be >= --start-batch ({args.start_batch}); got {args.max_batch}")
    if not args.max_step_s > 0:
        raise InvalidValue(f"--max-step-s must be > 0; got {args.max_step_s:g}")
    if not 0 < args.tolerance < 1:
        raise InvalidValue(f"--tolerance must be in (0, 1); got {args.tolerance:g}")
    if args.global_batch is not None and args.emulate is not None:
        specs = options.parse_emulate(args.emulate)
        caps = [s.max_batch for s in specs if s.max_batch is not None]
        if len(caps) == len(specs) and args.global_batch > sum(caps):  # every device's memory is known
            raise InvalidValue(f"--global-batch {args.global_batch} exceeds the emulated devices' memory together "
                               f"({'+'.join(str(c) for c in caps)} = {sum(caps)})")


def run(args) -> int:
    from harness.bench.tuning.tuner import tune

    jax = getattr(args, "backend", "tensorflow") == "jax"
    if jax:
        from harness.bench import jaxbench

        options.refuse_on_jax(args, options.JAX_REFUSALS + (
            ("method", lambda v: v == "mirrored",
             "--method mirrored: TensorFlow's MirroredStrategy; on --backend jax harness splits with towers"),))
        jaxbench.select_backend()  # before anything (a model of the user's) imports Keras
    method = args.method or ("towers" if jax else "mirrored")
    _precheck(args)
    setup = options.setup_jax_devices(args) if jax else options.setup_devices(args)
    size = options.default_size(args, setup)
    out = options_output(args, setup, size)
    out.say(f"tuning {args.model} ({size}) on {len(setup.devices)} {setup.kind} device(s)")
    if setup.note:
        out.say(setup.note)

    def work():
        return tune(args.model, devices=list(setup.devices), size=size, emulate=setup.emulate,
                    global_batch=args.global_batch, method=method, margin=args.margin, start=args.start_batch,
                    limit=args.max_batch, tolerance=args.tolerance, max_step_s=args.max_step_s,
                    verify_seconds=args.seconds, verify_windows=args.windows, compare_even=not args.no_even,
                    seed=args.seed, on_event=out.say, data=args.data, backend="jax" if jax else "tensorflow")

    result = out.guard(work)
    out.record["result"] = result
    out.finish(status="complete")
    plot = options.chart("tune", lambda: _plot(args, out, result, setup))
    if args.json:
        json.dump(out.record, sys.stdout, indent=2, default=str)
        print()
        _warn_host_bound(result)
        return 0
    print("\n" + device_table(result))
    print("\n" + summary_text(result))
    if plot is not None:
        print(f"chart: {plot}")
    _warn_host_bound(result)
    return 0


def _warn_host_bound(result: dict) -> None:
    """One warning line per tuning phase whose emulated devices were host-bound."""
    from harness.emulate import host_bound_text

    phases: dict[str, list] = {}
    for entry in result.get("host_bound") or ():
        phases.setdefault(entry["phase"], []).append(entry)
    for phase, entries in phases.items():
        print(f"harness tune: warning: {phase}: {host_bound_text(entries)}", file=sys.stderr)


def options_output(args, setup, size):
    from harness.bench.console import Output

    jax = getattr(args, "backend", "tensorflow") == "jax"
    environment = None
    if jax:  # JAX's fingerprint, without TensorFlow
        from harness.bench.jaxbench import environment as jax_environment

        environment = jax_environment()
    return Output(args, "tune", {"model": args.model, "size": size, "devices": list(setup.devices),
                                 "device_kind": setup.kind, "global_batch": args.global_batch,
                                 "backend": "jax" if jax else "tensorflow",
                                 "emulate": None if setup.emulate is None else [e.to_json() for e in setup.emulate]},
                  environment=environment)


def device_table(result: dict) -> str:
    """Per device: ceiling, fitted curve, chosen batch, and its solo samples/s there."""
    from harness.bench.report import format_table

    choice, tuned = result["choice"], result["verify"]["tuned"]
    rows = []
    for i, dev in enumerate(result["devices"]):
        fit = dev["fit"]
        solo = tuned["solo_samples_per_second"][i] if tuned.get("solo_samples_per_second") else None
        bound = any(p.get("host_bound") for p in dev["points"])
        rows.append([dev["device"].replace("/device:", ""), dev["ceiling"],
                     "-" if dev["oom_at"] is None else dev["oom_at"], f"{fit['fixed_ms']:.1f}",
                     f"{fit['peak_samples_per_second']:.0f}", f"{100 * fit['max_relative_error']:.1f}%",
                     choice["batches"][i], "-" if not solo else f"{solo:.0f}", f"{dev['seconds']:.1f}",
                     "HOST-BOUND" if bound else "ok"])
    return format_table(rows, ["device", "ceiling", "OOM at", "fixed ms", "peak sps", "fit err", "chosen",
                               "alone sps", "probe s", "curve"])


def summary_text(result: dict) -> str:
    from harness.bench.report import format_table

    choice, verify = result["choice"], result["verify"]
    rows = []
    for name in ("tuned", "ratio", "even", "keras"):  # keras: the stock baseline on the even split
        v = verify.get(name)
        if v is None or v.get("status") == "not run":
            continue
        rows.append([name, "/".join(str(b) for b in v["batches"]), f"{v['predicted_samples_per_second']:.0f}",
                     "-" if v["samples_per_second"] is None else f"{v['samples_per_second']:.0f}",
                     "-" if v["efficiency"] is None else f"{v['efficiency']:.3f}",
                     f"{v['status']}: {v['error']}" if v["status"] != "complete" else
                     "HOST-BOUND" if v.get("host_bound") else "ok"])
    table = format_table(rows, ["split", "batches", "predicted sps", "measured sps", "efficiency", "status"])
    used = choice["used"]
    flags = " ".join(str(choice["batches"][i]) for i in used)
    ratios = ":".join(f"{choice['batches'][i] / choice['global_batch']:.3f}" for i in used)
    lines = [table]
    kept = verify.get("kept")
    if kept:
        lines.append(f"kept: the {kept['split']} split {'/'.join(str(b) for b in kept['batches'])} "
                     f"({kept['why']}; ratio: the global batch divided by the devices' measured speeds alone)")
    if verify.get("even", {}).get("note", "same global batch") != "same global batch":
        lines.append(f"even: {verify['even']['note']}")
    if verify.get("keras", {}).get("note"):
        lines.append(f"keras: {verify['keras']['note']}")
    if len(used) < len(choice["batches"]):
        left = [result["devices"][i]["device"] for i in range(len(choice["batches"])) if i not in used]
        lines.append(f"left out (too slow to be worth a sample): {', '.join(left)}")
    seconds = result["seconds"]
    if result.get("host_bound"):
        devices = sorted({e["device"] for e in result["host_bound"]})
        lines += [f"HOST-BOUND: {', '.join(devices)} ran at this host's speed, not their emulated rates: the curves, "
                  "the choice and the efficiency describe this CPU, not the emulated devices (see the warnings; "
                  "`harness calibrate` tells the rates this host can emulate)",
                  f"not a recommendation for the emulated devices: --batches {flags}"]
    else:
        lines.append(f"recommended: --batches {flags}   (ratios {ratios}, global batch {choice['global_batch']})")
    lines.append(f"tuning took {seconds['total']:.1f} s: profiling {seconds['profile']:.1f} s, "
                 f"verification {seconds['verify']:.1f} s")
    return "\n".join(lines)


def _plot(args, out, result, setup) -> Path | None:
    from harness.bench.report import curve_chart

    if args.no_save and args.plot is None:
        return None
    path = Path(args.plot) if args.plot else Path(out.path).with_suffix(".png")
    curves = []
    tuned = result["verify"]["tuned"]
    for i, dev in enumerate(result["devices"]):
        fit = dev["fit"]
        batch = result["choice"]["batches"][i]
        solo = (tuned.get("solo_samples_per_second") or [None] * (i + 1))[i]
        curves.append({"label": dev["device"].replace("/device:", ""),
                       "points": [(p["batch"], p["samples_per_second"]) for p in dev["points"]
                                  if p["samples_per_second"]],
                       "fit": (fit["fixed_ms"] / 1000, fit["per_sample_us"] / 1e6), "ceiling": dev["ceiling"],
                       "ceiling_label": (f"ceiling {dev['ceiling']}" if dev["stopped_by"] == "oom" else
                                         f"probed to {dev['ceiling']} ({dev['stopped_by']})"),
                       "chosen": (batch, solo) if batch and solo else None})
    config = result["config"]
    eff = tuned.get("efficiency")
    title = (f"{config['model']} ({config['size']}): chosen {'/'.join(map(str, result['choice']['batches']))}"
             + (f", efficiency {eff:.3f}" if eff else ""))
    footnote = "emulated devices: " + ", ".join(str(e) for e in setup.emulate) if setup.emulate else setup.kind
    return curve_chart(curves, path, title=title, footnote=footnote)
