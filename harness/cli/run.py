"""``harness run``: train one workload on your devices and print samples/s per window.

The ``test_GPUs.py`` of seed 000 (docs/background.md) on modern Keras: every window prints each device's
batch and samples/s and the total. Per-device figures are measured, and each
says how: emulated devices by their busy time, GPUs by NVML telemetry sampled
at 10 Hz; logical CPU devices only by their share of the total. Every run is
kept as one JSON record (written after each window, so a killed run keeps its
finished windows).

Examples:
    harness run                                   # seed 000's emulated GPUs without a GPU
    harness run --gpus 0 1 --batches 820 568      # the seed's best split on real GPUs
    harness run --emulate 1345,875 --ratios 3 2 --batch 1000 --method mirrored
    harness run --logical-cpus 2 --batch 512 --method keras   # stock Keras fit under MirroredStrategy
    harness run --emulate 1000,1000 --batch 200 --rebalance 10 --throttle 1:400@40 --windows 6
                                                  # device 1 throttles at step 40; the split follows it
    harness run --workers 2 --emulate 2000,1000 --ratios 2 1 --batch 300
                                                  # across 2 local worker processes, one device each
    harness run --workers 2 --emulate 2000,1000 --method keras   # stock tf_keras fit, MultiWorkerMirroredStrategy
    harness run --workers 2 --devices-per-worker 1 2 --emulate 1000,500,500 --ratios 2 1 1
    harness run --model models/text.py:build --logical-cpus 2 --batch 256
                                                  # your own model (docs/user-models.md)
    harness run --backend jax --logical-cpus 3 --ratios 5 3 2 --batch 300
                                                  # Keras 3 on JAX: 3 JAX CPU devices, towers

With --backend jax, Keras runs on JAX (KERAS_BACKEND=jax, no TensorFlow in the process) on emulated
devices (--emulate; by default without GPUs seed 000's pair, one JAX CPU device each), JAX CPU devices
(--logical-cpus N) or GPUs (--gpus); an emulated device's samples/s is its logged busy time, another's its
share of the total. --rebalance, --throttle and --method keras (Keras' DataParallel) run there too;
--workers, --method mirrored and an emulated link are TensorFlow's.

Across workers (--workers N), harness launches N local workers of one loopback cluster
(harness launch); each runs this command in worker mode, joins the cluster with
harness.use_cluster and trains the same global batches (--method mirrored, the default;
--method keras: Keras 2's fit (tf_keras) under a stock MultiWorkerMirroredStrategy, one
replica per worker, its even split and its own input handling; Keras 3.15's fit cannot run
under that strategy, keras-team/keras#20585). --emulate, --ratios and --batches cover every
device of the cluster, worker by worker. Each window prints every device, each worker's
samples/s (its rows per step over its step time) and the total; the chief's figures are
the run's record.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import replace

from harness.bench.console import Output, execute, execute_cluster, summary_text, warn_host_bound
from harness.bench.runspec import METHODS
from harness.cli import options
from harness.errors import InvalidValue, Unavailable

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="samples/s of one workload on your devices, per window",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_common(p, seconds=5.0, windows=3)
    options.add_backend(p)
    p.add_argument("--method", choices=METHODS,
                   help="default: towers on several devices, single on one; keras: the stock baseline (Keras fit "
                        "alone, or under a stock MirroredStrategy with an even split)")
    p.add_argument("--batches", nargs="+", type=int, metavar="B", help="per-device batch sizes, e.g. 820 568")
    p.add_argument("--ratios", nargs="+", type=float, metavar="R", help="split ratios, with --batch (default even)")
    p.add_argument("--batch", type=int, help=f"global batch size (default {options.BATCH_PER_DEVICE} per device)")
    p.add_argument("--rebalance", type=int, metavar="EVERY",
                   help="re-split the batch while training from measured device step times, measuring every "
                        "EVERY steps (harness.Rebalance); the global batch stays the same")
    p.add_argument("--throttle", nargs="+", metavar="INDEX:RATE@STEP",
                   help="emulated device INDEX drops (or rises) to RATE samples/s from training step STEP on, "
                        "e.g. 1:400@40 (needs --emulate)")
    p.add_argument("--no-overlap", action="store_true",
                   help="copy each device's slice inside its step, not while the step before runs (harness' "
                        "methods; what the overlap saves)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="train across N local worker processes of one loopback cluster (harness launch, "
                        "harness.use_cluster; --method keras: tf_keras fit under a stock "
                        "MultiWorkerMirroredStrategy); --emulate, --ratios and --batches then cover every device of "
                        "the cluster, worker by worker")
    p.add_argument("--devices-per-worker", type=int, nargs="+", metavar="N",
                   help="with --workers: devices each worker trains on, one N for all or one per worker "
                        "(default 1; logical CPU devices, emulated or not; with GPUs each worker gets its own)")
    p.set_defaults(run=run)


_THROTTLE = re.compile(r"^\s*(\d+)\s*:\s*([^@\s]+)\s*@\s*(\d+)\s*$")


def parse_throttle(entries, count: int | None = None) -> tuple[tuple[int, float, int], ...]:
    """``["1:400@40"]`` -> ``((1, 400.0, 40),)``; ``count`` devices, when known, bounds INDEX.

    Raises:
        ValueError: naming the bad entry.
    """
    out = []
    for entry in entries or ():
        match = _THROTTLE.match(entry)
        if not match:
            raise InvalidValue(f"--throttle wants INDEX:RATE@STEP entries such as 1:400@40; got {entry!r}")
        index, step = int(match.group(1)), int(match.group(3))
        try:
            rate = float(match.group(2))
        except ValueError:
            raise InvalidValue(f"--throttle RATE must be a number of samples/s; got {match.group(2)!r} in "
                               f"{entry!r}") from None
        if not (math.isfinite(rate) and rate > 0):
            raise InvalidValue(f"--throttle RATE must be a positive number of samples/s; got {entry!r}")
        if count is not None and index >= count:
            raise InvalidValue(f"--throttle INDEX must name one of the {count} devices (0..{count - 1}); got {entry!r}")
        out.append((index, rate, step))
    return tuple(out)


def _spec_options(args) -> dict:
    """The run's options from the command line, for ``RunConfig`` (``harness.bench.runspec.RunSpec``'s fields)."""
    return dict(seconds=args.seconds, windows=args.windows, warmup_steps=args.warmup_steps,
                input_delay_ms=args.input_delay_ms, seed=args.seed, rebalance_every=args.rebalance,
                throttle=parse_throttle(args.throttle), data=args.data, overlap=not args.no_overlap)


def _batches(args, devices) -> tuple[int, ...]:
    from harness.split import split_batch

    if args.batches is not None:
        if args.ratios is not None or args.batch is not None:
            raise InvalidValue("give either --batches or --ratios/--batch, not both")
        if len(args.batches) != len(devices):
            raise InvalidValue(f"--batches has {len(args.batches)} sizes {args.batches} for {len(devices)} devices "
                               f"{list(devices)}: give one per device")
        return tuple(args.batches)  # each >= 1: _precheck
    batch = options.BATCH_PER_DEVICE * len(devices) if args.batch is None else args.batch
    if batch < len(devices):
        raise InvalidValue(f"--batch must be at least the device count ({len(devices)}); got {batch}")
    return split_batch(batch, [1.0] * len(devices) if args.ratios is None else args.ratios)


def _precheck(args, count: int | None = None) -> None:
    """Checks the options before TensorFlow starts; ``count``: the devices, when the caller knows them."""
    options.check_common(args)
    count = options.expected_device_count(args) if count is None else count
    if args.batches is not None and count is not None and len(args.batches) != count:
        raise InvalidValue(f"--batches has {len(args.batches)} sizes {args.batches} for {count} devices: give one "
                           "per device")
    if args.ratios is not None and count is not None and len(args.ratios) != count:
        raise InvalidValue(f"--ratios has {len(args.ratios)} values {args.ratios} for {count} devices: give one "
                           "per device")
    if args.method == "single" and count not in (None, 1):
        raise InvalidValue(f"--method single runs on one device; got {count} devices")
    if args.batches is not None and any(b < 1 for b in args.batches):
        raise InvalidValue(f"--batches must be >= 1 each; got {args.batches}")
    if args.batch is not None and args.batch < 1:
        raise InvalidValue(f"--batch must be >= 1; got {args.batch}")
    if args.ratios is not None:
        from harness.split import validate_ratios

        validate_ratios(args.ratios, len(args.ratios))
    _precheck_rebalance(args, count)


def _precheck_rebalance(args, count: int | None) -> None:
    if args.rebalance is not None:
        if args.rebalance < 1:
            raise InvalidValue(f"--rebalance must be >= 1 (steps per measurement); got {args.rebalance}")
        if args.method == "single" or count == 1:
            raise InvalidValue("--rebalance re-splits the batch over several devices; got one device")
    throttle = parse_throttle(args.throttle, count)
    if throttle and args.emulate is None and (args.devices or args.logical_cpus is not None):
        raise InvalidValue("--throttle changes an emulated device's rate: use it with --emulate")


def run(args) -> int:
    from harness.bench.cluster_run import WORKER_VARIABLE
    from harness.bench.runner import RunConfig

    if os.environ.get(WORKER_VARIABLE):
        return _worker(os.environ[WORKER_VARIABLE])
    if getattr(args, "backend", "tensorflow") == "jax":
        return run_jax(args)
    if args.workers is not None or args.devices_per_worker is not None:
        return run_cluster(args)
    _precheck(args)
    setup = options.setup_devices(args)
    method = args.method or ("towers" if len(setup.devices) > 1 else "single")
    config = RunConfig(args.model, options.default_size(args, setup), method, setup.devices,
                       _batches(args, setup.devices), emulate=setup.emulate, **_spec_options(args))
    out = Output(args, "run", {"run": config.to_json(), "device_kind": setup.kind})
    out.say(f"{config.model} ({config.size}), {config.method} on {len(config.devices)} device(s), batch "
            f"{config.batch} = {list(config.batches)}; {config.windows} windows of {config.seconds:g} s"
            + ("; no overlap (each slice copied inside its step)" if not config.overlap else ""))
    if setup.note:
        out.say(setup.note)
    if config.rebalance_every or config.throttle:
        out.say("; ".join([f"rebalancing every {config.rebalance_every} steps"] * bool(config.rebalance_every)
                          + [f"device {i} to {rate:g} samples/s at step {step}" for i, rate, step in config.throttle]))
    result = out.guard(lambda: execute(config, setup, out))
    return _finish(args, out, result, setup)


#: what ``harness run --backend jax`` refuses besides the shared options (``options.JAX_REFUSALS``)
_JAX_REFUSALS = (
    ("method", lambda v: v == "mirrored",
     "--method mirrored: TensorFlow's MirroredStrategy; on --backend jax harness splits with towers (the default)"),
)


def run_jax(args) -> int:
    """``harness run --backend jax``: Keras 3 on JAX devices (``harness.bench.jaxbench``), no TensorFlow."""
    from harness.bench import jaxbench
    from harness.bench.runner import RunConfig

    options.refuse_on_jax(args, options.JAX_REFUSALS + _JAX_REFUSALS)
    jaxbench.select_backend()  # before anything (a model of the user's) imports Keras
    jaxbench.check_workload(args.model, args.data)
    options.check_common(args)
    setup = options.setup_jax_devices(args)
    _precheck(args, len(setup.devices))
    method = args.method or ("towers" if len(setup.devices) > 1 else "single")
    spec = dict(_spec_options(args), overlap=False)  # on JAX each slice is copied inside its step
    batches, rounded = _batches(args, setup.devices), None
    if method == "keras" and len(setup.devices) > 1:  # Keras' DataParallel: even shards
        even, rounded = jaxbench.stock_batches(sum(batches), len(setup.devices))
        if tuple(batches) != even and rounded is None:
            rounded = f"batches {list(batches)} trained as {list(even)}: DataParallel shards evenly"
        batches = even
    if method == "keras" and args.rebalance is not None:
        raise InvalidValue("--rebalance re-splits harness' towers; --method keras (the stock baseline) has no split "
                           "to change")
    config = RunConfig(args.model, options.default_size(args, setup), method, setup.devices, batches,
                       emulate=setup.emulate, **spec)
    out = Output(args, "run", {"run": jaxbench.config_json(config), "device_kind": setup.kind, "backend": "jax"},
                 environment=jaxbench.environment())
    out.record["backend"] = "jax"
    out.say(f"{config.model} ({config.size}), {config.method} on {len(config.devices)} JAX device(s) "
            f"{', '.join(config.devices)}, batch {config.batch} = {list(config.batches)}; {config.windows} windows "
            f"of {config.seconds:g} s")
    if method == "keras":
        out.say("the stock baseline: " + jaxbench.STOCK["several" if len(setup.devices) > 1 else "one"]
                + (f"; {rounded}" if rounded else ""))
        out.record["note"] = rounded
    if setup.note:
        out.say(setup.note)
    result = out.guard(lambda: jaxbench.execute(config, out))
    return _finish(args, out, result, setup)


def _finish(args, out, result: dict, setup) -> int:
    """Keeps the record, prints the summary (or the record as JSON) and the failure; the exit status."""
    out.finish(result=result, status="complete" if result["status"] == "complete" else "failed",
               error=result["error"])
    if args.json:
        json.dump(out.record, sys.stdout, indent=2, default=str)
        print()
    elif result["status"] == "complete":
        print(summary_text(result, setup))
    warn_host_bound(result)
    if result["status"] != "complete":
        print(f"harness run: {result['status']}: {result['error']}", file=sys.stderr)
        return 1
    return 0


def _worker(plan_json: str) -> int:
    """Worker mode: one worker of ``harness run --workers`` (its plan in the environment, from the parent)."""
    from harness.bench.cluster_run import ClusterPlan, run_worker

    return run_worker(ClusterPlan.from_json(json.loads(plan_json)))


def cluster_plan(args):
    """``(ClusterPlan, RunConfig, DeviceSetup)`` of ``harness run --workers``: the options checked before any
    worker starts (no TensorFlow), device names as the cluster will give them.

    Raises:
        ValueError: naming the option: a bad worker or device count, options that do not run across workers
            (--devices, --logical-cpus, --method single/towers), several devices per worker with
            --method keras, --emulate/--ratios/--batches that do not give one entry per device of the cluster.
    """
    from harness.bench.cluster_run import CLUSTER_METHODS, ClusterPlan, task_device
    from harness.bench.runner import RunConfig
    from harness.devices import gpu_count
    from harness.emulate import parse_emulate
    from harness.launch import device_counts

    if args.workers is None:
        raise InvalidValue("--devices-per-worker needs --workers N")
    if args.workers < 1:
        raise InvalidValue(f"--workers must be >= 1; got {args.workers}")
    try:
        counts = device_counts(args.devices_per_worker, args.workers) or [1] * args.workers
    except ValueError as err:
        raise InvalidValue(f"--devices-per-worker: {err}") from None
    if args.devices or args.logical_cpus is not None:
        raise InvalidValue("with --workers each worker makes its own devices: give --devices-per-worker (and "
                           "--emulate), not --devices/--gpus or --logical-cpus")
    method = args.method or "mirrored"
    if args.rebalance is not None and method == "keras":
        raise InvalidValue("--rebalance re-splits harness' model; the stock baseline (--method keras) keeps Keras' "
                           "even split")
    if method not in CLUSTER_METHODS:
        raise InvalidValue(f"--workers trains with --method mirrored (harness across workers, the default) or keras "
                           f"(the stock MultiWorkerMirroredStrategy); got --method {method}")
    if method == "keras" and max(counts) > 1:
        several = ", ".join(str(w) for w, c in enumerate(counts) if c > 1)
        raise InvalidValue(f"--method keras --workers {args.workers} is Keras 2's fit (tf_keras) under a stock "
                           f"MultiWorkerMirroredStrategy, one replica per worker: worker {several} with several "
                           f"devices (--devices-per-worker {' '.join(map(str, args.devices_per_worker))}) cannot be "
                           "one. Give each worker one device, or use --method mirrored")
    total = sum(counts)
    options.check_common(args)
    gpus = 0 if args.emulate is not None else gpu_count()
    emulate = args.emulate if args.emulate is not None or gpus else options.SEED_000_EMULATE
    specs = parse_emulate(emulate) if emulate is not None else None
    if specs is not None and len(specs) != total:
        what = f"--emulate {emulate}" if args.emulate is not None else \
            f"without GPUs and --emulate, seed 000's emulated cards {emulate}"
        hint = "" if args.devices_per_worker else " (--devices-per-worker gives a worker several)"
        raise InvalidValue(f"{what} has {len(specs)} devices; the cluster has {total} ({args.workers} workers with "
                           f"{counts} devices{hint}): give one --emulate entry per device, worker by worker")
    if specs is None and total > gpus:
        raise InvalidValue(f"the cluster needs {total} GPUs ({counts} per worker); this machine has {gpus}")
    if args.throttle and specs is None:
        raise InvalidValue("--throttle changes an emulated device's rate: use it with --emulate")
    _precheck(args, total)
    kind = "CPU" if specs is not None else "GPU"
    names = tuple(task_device(w, i, kind) for w, count in enumerate(counts) for i in range(count))
    batches = _batches(args, names)
    setup = options.DeviceSetup(names, specs, "emulated" if specs is not None else "GPU",
                                "" if specs is None else "emulated devices, each worker its own: " + "; ".join(
                                    f"{n.split('/', 3)[-1]} = {spec}" for n, spec in zip(names, specs)))
    config = RunConfig(args.model, options.default_size(args, setup), method, names, batches, emulate=specs,
                       **_spec_options(args))
    if method == "keras":  # which Keras, and how its fit feeds the global batch: in the record and the output
        from harness.bench.cluster_run import stock_input_text, stock_keras_name, stock_note, stock_refusal_text

        if stock_keras_name() is None:  # after every option is checked: a bad value is named wherever it runs
            raise Unavailable(stock_refusal_text())  # no tf_keras here

        config = replace(config, notes=(stock_note(), stock_input_text(batches)))
    return ClusterPlan.from_spec(config, counts=tuple(counts), kind=kind), config, setup


def run_cluster(args) -> int:
    """``harness run --workers N``: launches the workers, prints each merged window, keeps the record."""
    from harness.bench.environment import fingerprint

    plan, config, setup = cluster_plan(args)
    out = Output(args, "run", {"run": config.to_json(), "device_kind": setup.kind,
                               "cluster": {"workers": plan.workers, "devices_per_worker": list(plan.counts)}},
                 environment=fingerprint(import_tf=False))
    what = "Keras 2 (tf_keras) fit under a stock MultiWorkerMirroredStrategy (even split)" \
        if plan.method == "keras" else "harness mirrored"
    out.say(f"{config.model} ({config.size}), {what} across {plan.workers} workers with {list(plan.counts)} "
            f"device(s), batch {config.batch} = {list(config.batches)}; {config.windows} windows of "
            f"~{config.seconds:g} s (the same steps on every worker)")
    if setup.note:
        out.say(setup.note)
    for note in plan.notes:
        out.say(note)
    if config.throttle:
        out.say("; ".join(f"device {i} to {rate:g} samples/s at step {step}" for i, rate, step in config.throttle))
    result = execute_cluster(plan, config, out)
    return _finish(args, out, result, setup)
