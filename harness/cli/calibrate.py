"""``harness calibrate``: the highest emulated rate this host sustains, per workload.

An emulated device (``--emulate``) is only an emulation while this host computes
its slice faster than the emulated time; beyond that its figures are the host's
speed, and ``harness run/compare/tune`` mark them HOST-BOUND. This command
measures the limit: all devices busy at once, as emulated devices are, each on
``--batch`` samples per step. Choose emulated rates well below the sustained
rate (the test suite takes a quarter of it) and steps long next to the time the
host spends outside the devices.

Examples:
    harness calibrate                                  # every workload, 2 devices, 128 samples each
    harness calibrate --model mnist_maxing --batch 300
    harness calibrate --devices 3 --json
    harness calibrate --model models/text.py:build    # your own model (docs/user-models.md)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from harness.bench import workloads
from harness.errors import InvalidValue

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="the highest emulated rate this host sustains, per workload",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", metavar="NAME", dest="models",
                   help=f"workloads to calibrate: {', '.join(workloads.names())} (default all), or your own models: "
                        f"{workloads.FORMS} (docs/user-models.md)")
    p.add_argument("--data", metavar="MODULE:ATTR",
                   help="your models' data (with --model MODULE:ATTR): a function (batch_size) -> tf.data.Dataset of "
                        "(x, y) batches, or -> arrays (x, y); default: batches made up from their inputs and loss")
    p.add_argument("--size", default="tiny", metavar="SIZE", help="full or tiny (default tiny)")
    p.add_argument("--devices", type=int, default=2, metavar="N",
                   help="logical devices busy at once, as in an emulated run (default 2)")
    p.add_argument("--batch", type=int, default=128, metavar="B", help="samples per device per step (default 128)")
    p.add_argument("--seconds", type=float, default=0.5, help="seconds per timing window (default 0.5)")
    p.add_argument("--windows", type=int, default=3, help="timing windows per workload (default 3)")
    p.add_argument("--seed", type=int, default=0, help="weights and synthetic data seed (default 0)")
    p.add_argument("--results-dir", metavar="DIR",
                   help="where the JSON record goes (default $HARNESS_RESULTS_DIR or ~/.cache/harness/results)")
    p.add_argument("--no-save", action="store_true", help="do not write a result record")
    p.add_argument("--json", action="store_true", help="print the record as JSON instead of a table")
    p.set_defaults(run=run)


def _precheck(args) -> None:
    if args.data is not None and not args.models:
        raise InvalidValue(f"--data {args.data!r} is data for a model of your own: give --model {workloads.FORMS}")
    for name in args.models or ():
        workloads.get(name, args.data)
    workloads.check_size(args.size)
    if args.devices < 1:
        raise InvalidValue(f"--devices must be >= 1; got {args.devices}")
    if args.batch < 1:
        raise InvalidValue(f"--batch must be >= 1; got {args.batch}")
    if not args.seconds > 0:
        raise InvalidValue(f"--seconds must be > 0; got {args.seconds:g}")
    if args.windows < 1:
        raise InvalidValue(f"--windows must be >= 1; got {args.windows}")


def run(args) -> int:
    from harness.bench.calibrate import calibrate
    from harness.bench.console import Output

    _precheck(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from harness.devices import use_logical_devices
    from harness.emulate import inter_op_threads

    devices = use_logical_devices(args.devices, inter_op_threads=inter_op_threads(args.devices))
    out = Output(args, "calibrate", {"models": args.models or workloads.names(), "size": args.size,
                                     "devices": devices, "batch_per_device": args.batch})
    out.say(f"calibrating emulation on {len(devices)} logical CPU device(s), {args.batch} samples per device per step")

    def work():
        return calibrate(args.models, devices=devices, size=args.size, batch_per_device=args.batch,
                         seconds=args.seconds, windows=args.windows, seed=args.seed, on_event=out.say,
                         data=args.data)

    result = out.guard(work)
    out.record["result"] = result
    out.finish(status="complete")
    if args.json:
        json.dump(out.record, sys.stdout, indent=2, default=str)
        print()
    else:
        print("\n" + table(result))
        print(f"emulated rates above 'sustains' (samples/s per device, at {args.batch} samples per device) are "
              "host-bound here: keep them well below it (the test suite uses a quarter)")
    return 0


def table(result: dict) -> str:
    """One row per workload: each device's host rate, the sustained rate, the host's time outside the devices."""
    from harness.bench.report import format_table

    names = [d["device"].replace("/device:", "") for d in result["workloads"][0]["devices"]]
    rows = [[w["model"], w["batch_per_device"], *(f"{d['host_rate']:.0f}" for d in w["devices"]),
             f"{w['sustained_rate']:.0f}", f"{w['outside_ms']:.1f}"] for w in result["workloads"]]
    return format_table(rows, ["workload", "batch", *(f"{n} host sps" for n in names), "sustains",
                               "outside ms/step"])
