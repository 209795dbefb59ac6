"""``harness check``: is parallel training exact here, and what does each method cost?

For each model and method it trains single-device vs parallel from the same
start (``compare_training``) and prints the worst deviation; then it times
training steps of single-device, towers and mirrored on the same devices.
A model with training-time randomness (Dropout, the Random* layers: each
device draws its own numbers) is judged with those layers off in training;
each row names them and gives the run with them on beside it (``--json``:
``random_layers``, ``with_randomness``; docs/concepts/exactness.md).

``harness check --zoo`` checks the model zoo instead (``harness.bench.zoo``): real
architectures at CPU size, each x method x split (even on 2 devices, 3:2, 5:3:2
on 3), judged against one device and a float64 run, and then the optimizer
axis: every built-in optimizer x the options people train with (clipnorm,
clipvalue, global_clipnorm, gradient accumulation, EMA, weight decay, a
schedule, loss scaling, mixed_float16) on a dense model and a causal language
model, at split 3:2 (``--zoo-splits`` for others). ``--zoo-models`` alone runs
only the model zoo, ``--zoo-optimizers``/``--zoo-options``/``--zoo-axis-models``
alone only the axis. Each case's status is a verdict of ``compare_training``
(exact, or as accurate as one device: exact in float64 and within a few times the
model's rounding floor), refused (harness names what it does not support) or FAIL,
and must meet the case's pinned outcome (harness/bench/zoo/outcomes.json;
``--pin-outcomes`` rewrites the pins of the cases run); the exit status is 1 if
any case FAILs, its traceback printed where it raised.
Progress goes to stderr. With ``--backend jax`` it checks the model zoo's Keras 3 entries
on JAX devices, method towers, without TensorFlow; their pins are keyed ``jax``, beside
TensorFlow's (the optimizer axis, mirrored and Keras 2 are TensorFlow's).

``--workers N`` (or under ``harness launch``, ``TF_CONFIG`` set) checks across N local workers
of one loopback cluster instead: each worker joins it with its devices
(``--devices-per-worker``, default one each), and method mirrored trains every model over all
of the cluster's devices (``--ratios``: one per device, worker 0's first; default n:...:2:1)
against one device; the chief prints the table, every worker exits 1 if a check fails. Step
timing is single-process only.

Examples:
    harness check                                   # 3 logical CPUs, ratios 5 3 2
    harness check --workers 2 --devices-per-worker 1 2 --ratios 3 2 1
    harness launch --workers 2 --devices-per-worker 1 2 -- harness check --ratios 3 2 1   # the same
    harness check --model models/text.py:build --logical-cpus 2 --ratios 3 2   # your own model
    harness check --backend jax --logical-cpus 3 --ratios 5 3 2   # Keras 3 on JAX, no TensorFlow
    harness check --backend jax --model mypkg.model:build --data mypkg.data:arrays   # your own model on JAX
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from harness.bench.workloads import FORMS
from harness.bench.workloads.small import EQUIVALENCE_MODELS
from harness.bench.zoo import ALL_SPLITS as ZOO_SPLITS
from harness.bench.zoo import NAMES as ZOO_MODELS
from harness.bench.zoo.optimizers import MODELS as AXIS_MODELS
from harness.bench.zoo.optimizers import OPTIMIZERS as AXIS_OPTIMIZERS
from harness.bench.zoo.optimizers import OPTIONS as AXIS_OPTIONS
from harness.cli.check_models import model_choice, precheck, subject_of
from harness.errors import InvalidValue, Refused, Unavailable
from harness.parallel import METHODS as PARALLEL_METHODS
from harness.split import split_batch, validate_ratios

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check",
        help="equivalence and step time of towers/mirrored vs one device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--devices", nargs="+", metavar="DEV",
                   help="device names (e.g. /gpu:0 /gpu:1); default: --logical-cpus logical CPUs")
    p.add_argument("--logical-cpus", type=int, default=3, metavar="N",
                   help="split the CPU into N logical devices when --devices is not given (default 3)")
    p.add_argument("--ratios", nargs="+", type=float, default=None, metavar="R",
                   help="per-device shares of each batch (default 5 3 2; across workers n ... 2 1, one per device)")
    p.add_argument("--models", "--model", nargs="+", type=model_choice, default=list(EQUIVALENCE_MODELS),
                   metavar="NAME",
                   help=f"models to check: {', '.join(EQUIVALENCE_MODELS)} (default all), or your own: "
                        f"{FORMS}, a function returning a compiled keras.Model or a harness.Workload, trained with "
                        "its compiled loss, optimizer and metrics (docs/user-models.md)")
    p.add_argument("--data", metavar="MODULE:ATTR",
                   help="your models' data (with --models MODULE:ATTR): a function (batch_size) -> tf.data.Dataset of "
                        "(x, y) batches, or -> arrays (x, y) (on --backend jax arrays only: tf.data is TensorFlow's); "
                        "default: batches made up from their inputs and loss")
    p.add_argument("--methods", nargs="+", choices=[*PARALLEL_METHODS, "keras"], default=None,
                   help="towers, mirrored (default both; across workers mirrored only) and keras: the stock "
                        "baseline, Keras fit under a stock "
                        "MirroredStrategy on an even split; its deviation is reported, never failed")
    p.add_argument("--batch-size", type=int, default=20, help="global batch size (default 20)")
    p.add_argument("--samples", type=int, default=62,
                   help="training samples; 62 at batch 20 ends on a partial batch of 2 (default 62)")
    p.add_argument("--optimizer", default=None, metavar="NAME[:KEY=VALUE,...]",
                   help="Keras optimizer name and settings, e.g. adam:global_clipnorm=0.05,learning_rate=0.01 "
                        "(default sgd; a model of your own: its compiled optimizer)")
    p.add_argument("--tol", type=float, default=1e-6, help="largest accepted deviation (default 1e-6)")
    p.add_argument("--reference", choices=["float64"], default=None,
                   help="float64: a deviation beyond --tol still passes when it is float32 rounding, as accurate as "
                        "one device (exact in float64, within 8 x the rounding floor of one device)")
    p.add_argument("--time-steps", type=int, default=20, metavar="N",
                   help="timed training steps per method, 0 to skip timing (default 20)")
    p.add_argument("--time-batch", type=int, default=256, help="global batch for timing (default 256)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--backend", choices=["tensorflow", "jax"], default="tensorflow",
                   help="tensorflow (default), or jax: Keras 3 on JAX devices without TensorFlow (--logical-cpus N JAX "
                        "CPU devices, or --devices gpu:0 cpu:0 ...), method towers, judged the same way; step timing, "
                        "the stock baseline, --workers and the zoo's optimizer axis are TensorFlow's (docs/jax.md)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="check across N local worker processes of one loopback cluster (harness launch)")
    p.add_argument("--devices-per-worker", type=int, nargs="+", metavar="N",
                   help="with --workers: devices each worker trains on, one N for all or one per worker")
    zoo = p.add_argument_group("model zoo (--zoo)")
    zoo.add_argument("--zoo", action="store_true",
                     help="model-zoo conformance: every zoo model x --methods x split against one device and float64")
    zoo.add_argument("--zoo-models", nargs="+", choices=ZOO_MODELS, metavar="NAME",
                     help=f"zoo models to check (default all): {', '.join(ZOO_MODELS)}")
    zoo.add_argument("--zoo-splits", nargs="+", choices=list(ZOO_SPLITS), metavar="SPLIT",
                     help=f"splits to check (default all): {', '.join(ZOO_SPLITS)} (7:2:1 on --backend jax)")
    zoo.add_argument("--zoo-optimizers", nargs="+", choices=list(AXIS_OPTIMIZERS), metavar="NAME",
                     help=f"optimizer axis: optimizers to check (default all): {', '.join(AXIS_OPTIMIZERS)}")
    zoo.add_argument("--zoo-options", nargs="+", choices=list(AXIS_OPTIONS), metavar="OPTION",
                     help=f"optimizer axis: options to check (default all): {', '.join(AXIS_OPTIONS)}")
    zoo.add_argument("--zoo-axis-models", nargs="+", choices=list(AXIS_MODELS), metavar="NAME",
                     help=f"optimizer axis: models to train (default all): {', '.join(AXIS_MODELS)}")
    zoo.add_argument("--fast", action="store_true", help="only the zoo's fast subset (model zoo and optimizer axis)")
    zoo.add_argument("--keras", choices=["3", "2", "both"], default="3",
                     help="Keras generation: 3, 2 (tf-keras) or both (each one installed; default 3)")
    zoo.add_argument("--format", choices=["text", "markdown", "json", "overview"], default=None,
                     help="table format (default text; --json is --format json); overview: one Markdown line per "
                          "model and the axis' counts per option, stamped with the command, commit and versions "
                          "(docs/zoo.md)")
    zoo.add_argument("--from-json", metavar="PATH",
                     help="render (and with --pin-outcomes, pin) the rows of an earlier --format json run instead of "
                          "running the cases")
    zoo.add_argument("--pin-outcomes", action="store_true",
                     help="write the outcomes of the cases run as their pins (harness/bench/zoo/outcomes.json): "
                          "refused (with the reason id) and as accurate; exact ones unpinned; refused on a FAIL. "
                          "Prints every change; a downgrade (exact -> as accurate -> refused, another refusal "
                          "reason, or an as accurate multiple raised past 1.25 x the one first pinned or 2 x the "
                          "last) is not written unless --allow-downgrade names the case (exit 1)")
    zoo.add_argument("--allow-downgrade", nargs="+", default=[], metavar="CASE",
                     help="with --pin-outcomes: cases whose downgrade may be pinned, as 'model|keras|method|split|"
                          "optimizer' (fnmatch patterns: 'convnext|3|*|*|')")
    p.set_defaults(run=run)


def _devices(args) -> list[str]:
    from harness.devices import resolve_devices, use_logical_devices

    if args.backend == "jax":  # Keras 3 on JAX: JAX's devices (harness.bench.jaxbench), no TensorFlow
        from harness.bench import jaxbench

        return list(jaxbench.setup_devices(logical_cpus=None if args.devices else args.logical_cpus,
                                           devices=args.devices).devices)
    if args.devices:
        return resolve_devices(args.devices)
    return use_logical_devices(args.logical_cpus)


def _say(args, text: str) -> None:
    if not args.json:
        print(text, flush=True)


def run(args) -> int:
    if args.backend == "jax" and (args.workers is not None or args.devices_per_worker is not None):
        raise InvalidValue("--workers: harness across workers joins TensorFlow's collectives; --backend jax checks "
                           "in one process")
    if args.workers is not None or args.devices_per_worker is not None:
        return _launch_workers(args)
    if os.environ.get("TF_CONFIG"):
        return _across_workers(args)
    if args.backend == "jax":
        _on_jax(args)
    args.methods = args.methods or list(PARALLEL_METHODS)
    if args.zoo:
        return _zoo(args)
    if args.batch_size <= 0 or args.samples <= 0:
        raise InvalidValue(f"--batch-size and --samples must be positive; got {args.batch_size}, {args.samples}")
    precheck(args)
    devices = _devices(args)
    ratios = validate_ratios(args.ratios or [5, 3, 2], len(devices))
    _say(args, f"devices {devices}, ratios {list(ratios)}: batch {args.batch_size} -> "
               f"{list(split_batch(args.batch_size, ratios))}, last batch {args.samples % args.batch_size or '-'}")
    checks = _equivalence(args, devices, ratios)
    timings = _timings(args, devices, ratios) if args.time_steps > 0 and getattr(args, "unrunnable", None) is None \
        else []
    failed = [c for c in checks if not c["passed"]]
    if args.json:
        json.dump({"devices": devices, "ratios": list(ratios), "equivalence": checks, "step_time": timings},
                  sys.stdout, indent=2)
        print()
        if getattr(args, "unrunnable", None) is not None:  # every method refused a model: its rows say why, and
            raise args.unrunnable  # the exit status is a refusal's (2), as in text
    else:
        refused = [c for c in checks if c.get("refused")]
        print(f"{len(checks) - len(failed) - len(refused)} of {len(checks) - len(refused)} checks within tol "
              f"{args.tol:g}{_or_rounding(args)}" + (f"; {len(refused)} refused" if refused else "")
              + _randomness_summary(checks))
    return 1 if failed else 0


def _on_jax(args) -> None:
    """``--backend jax``: Keras starts on JAX (refused where it already runs on another backend), method towers
    (mirrored and the stock baseline are TensorFlow's: refused by name), no step timing."""
    from harness.bench import jaxbench

    if args.zoo:
        _zoo_on_jax(args)
    if args.methods and "keras" in args.methods:
        raise InvalidValue("--methods keras: the stock baseline is Keras fit under TensorFlow's MirroredStrategy; "
                           "on --backend jax the methods are towers (mirrored is refused by name)")
    jaxbench.select_backend()
    args.methods = args.methods or ["towers"]
    if args.time_steps and not args.zoo:  # (the zoo times nothing: its tables alone on stdout)
        _say(args, "step time: not measured on --backend jax (harness compare --backend jax measures samples/s)")
        args.time_steps = 0


def _randomness_summary(checks: list[dict]) -> str:
    """Which models were judged with their random layers off in training, naming the layers; "" where none."""
    judged = {c["model"]: c["random_layers"] for c in checks if c.get("random_layers") and "with_randomness" in c}
    if not judged:
        return ""
    return "; judged with randomness off in training (each device draws its own numbers): " + "; ".join(
        f"{model}: {', '.join(names)}" for model, names in judged.items())


def _or_rounding(args) -> str:
    return " or as accurate as one device (float64 reference)" if args.reference else ""


def _launch_workers(args) -> int:
    """``--workers N``: this check, run by N local workers of one cluster (``harness launch``); their status."""
    from harness.launch import launch

    if args.workers is None:
        raise InvalidValue("--devices-per-worker needs --workers N")
    if os.environ.get("TF_CONFIG"):
        raise InvalidValue("--workers starts its own workers; this process already is one (TF_CONFIG is set)")
    command = [sys.executable, "-m", "harness", "check", "--models", *args.models, "--batch-size",
               str(args.batch_size), "--samples", str(args.samples), "--tol", str(args.tol)]
    for flag, values in (("--ratios", args.ratios), ("--methods", args.methods), ("--devices", args.devices),
                         ("--optimizer", [args.optimizer] if args.optimizer else None),
                         ("--data", [args.data] if args.data else None),
                         ("--reference", [args.reference] if args.reference else None)):
        if values:
            command += [flag, *map(str, values)]
    command += ["--zoo"] if args.zoo else []
    command += ["--json"] if args.json else []
    return launch(command, args.workers, devices_per_worker=args.devices_per_worker).status


def _across_workers(args) -> int:
    """The equivalence check over ``TF_CONFIG``'s cluster (method mirrored); the chief prints."""
    if args.zoo:
        raise InvalidValue("harness check --zoo runs in one process; start it without harness launch")
    if args.devices:
        raise InvalidValue("across workers, each worker's devices come from harness launch --devices-per-worker; "
                           f"got --devices {' '.join(args.devices)}")
    if args.batch_size <= 0 or args.samples <= 0:
        raise InvalidValue(f"--batch-size and --samples must be positive; got {args.batch_size}, {args.samples}")
    refused = [m for m in args.methods or [] if m != "mirrored"]
    if refused:
        raise InvalidValue(f"across workers harness check runs method mirrored only; got --methods {' '.join(refused)}")
    from harness.parallel.multiworker import use_cluster

    cluster = use_cluster()  # first: it starts this worker's server and the devices
    count = len(cluster.devices)
    ratios = validate_ratios(args.ratios or list(range(count, 0, -1)), count)
    as_json = args.json
    args.methods, args.json = ["mirrored"], as_json or not cluster.is_chief  # only the chief prints tables
    _say(args, f"{cluster.workers} workers, devices per worker {list(cluster.counts)}, ratios {list(ratios)}: "
               f"batch {args.batch_size} -> {list(split_batch(args.batch_size, ratios))}, "
               f"last batch {args.samples % args.batch_size or '-'}")
    checks = _equivalence(args, cluster, ratios)
    failed = [c for c in checks if not c["passed"]]
    if cluster.is_chief and as_json:
        json.dump({"workers": cluster.workers, "devices": list(cluster.devices), "ratios": list(ratios),
                   "equivalence": checks}, sys.stdout, indent=2)
        print()
    elif cluster.is_chief:
        print(f"{len(checks) - len(failed)} of {len(checks)} checks within tol {args.tol:g}{_or_rounding(args)} across "
              f"{cluster.workers} workers")
    return 1 if failed else 0


def _equivalence(args, devices, ratios) -> list[dict]:
    import keras

    from harness.bench import stock, stock_drift
    from harness.bench.workloads import is_reference as workloads_is_reference
    from harness.bench.workloads.userdata import head
    from harness.equivalence import compare_training

    w = max(10, *map(len, args.models))  # a model of the user's is named by its reference
    _say(args, f"\n{'model':<{w}} {'method':<9} {'max dev':>10} {'loss dev':>10}  result")
    rows = []
    known: dict = {}  # build -> its random layers, from a report (a row without one builds the model to name them)

    def drawing(build) -> list[str]:
        if build not in known:
            from harness.randomness import random_layers

            known[build] = list(random_layers(build()))
        return known[build]

    for name in args.models:
        subject = subject_of(args, name)
        optimizer = subject.optimizer
        optimizer()  # a bad name or setting fails here, before any training
        data = subject.data(args.samples)
        build = subject.build

        def compare(method, optimizer=optimizer, samples=args.samples, batch_size=args.batch_size, data=data,
                    build=build, subject=subject):
            x, y, sw = (None if d is None else head(d, samples) for d in data)
            baseline = method == "keras"  # even split, stock loss scaling: measured, not judged
            return compare_training(
                build, x, y, devices=devices, ratios=None if baseline else ratios,
                method=stock.keras if baseline else method, batch_size=batch_size, optimizer=optimizer,
                loss=subject.loss, metrics=subject.metrics(), loss_weights=subject.loss_weights, sample_weight=sw,
                reference=None if baseline else args.reference)

        refused = []
        for method in args.methods:
            baseline = method == "keras"
            try:
                report = compare(method)
            except Exception as err:  # noqa: BLE001  the stock baseline's own failure is its result
                if isinstance(err, Refused) and not baseline:  # a method that refuses the model: its row says why
                    refused.append(err)
                    rows.append({"model": name, "method": method, "passed": True, "baseline": False,
                                 "exact": False, "refused": err.reason, "error": str(err),
                                 "random_layers": drawing(build)})
                    _say(args, f"{name:<{w}} {method:<9} {'-':>10} {'-':>10}  refused: {err.reason}: {err}")
                    continue
                if not baseline:
                    raise
                line = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
                cause = stock_drift.fit_failure(err, optimizer, keras, samples=args.samples,
                                                batch_size=args.batch_size, replicas=len(devices))
                rows.append({"model": name, "method": method, "passed": True, "baseline": True, "exact": False,
                             "error": line, "cause": cause, "random_layers": drawing(build)})
                _say(args, f"{name:<{w}} {method:<9} {'-':>10} {'-':>10}  stock fit fails: "
                           f"{cause + ': ' if cause else ''}{line}")
                continue
            exact = report.is_equivalent(args.tol)
            judged = report.verdict(args.tol) if args.reference and not baseline else ("exact" if exact else "FAIL")
            ok = judged != "FAIL"
            row = {"model": name, "method": method, "max_deviation": report.max_deviation,
                   "max_loss_deviation": report.max_loss_deviation, "steps": report.steps,
                   "passed": ok or baseline, "baseline": baseline, "exact": exact, "verdict": judged}
            if args.reference and not baseline and not exact:
                row["why"] = report.why_not()
            row.update(_randomness(report, args.tol))
            known[build] = list(report.random_layers)
            verdict = ("ok" if exact else judged) if ok else (f"FAIL: {report.why_not()}" if args.reference else "FAIL")
            if report.random_layers:  # the verdict is of the runs with them off: said, with the runs as the model is
                verdict += f" {report.randomness_note(args.tol)}"
            if baseline and not ok:  # why stock Keras differs, each cause measured (harness.bench.stock_drift)
                drift = stock_drift.explain(
                    lambda **changes: compare("keras", **changes).max_deviation, build, optimizer,
                    samples=args.samples, batch_size=args.batch_size, replicas=len(devices),
                    deviation=report.max_deviation, tol=args.tol)
                row["drift"] = drift.to_json()
                verdict = f"stock baseline, even split: {drift.text()}"
            rows.append(row)
            _say(args, f"{name:<{w}} {method:<9} {report.max_deviation:>10.2e} {report.max_loss_deviation:>10.2e}  "
                       f"{verdict}")
            if not ok:
                _say(args, report.table(5))
        # (On JAX the built-in set's BatchNormalization model is refused by name: its row says so, the rest go on.)
        default_on_jax = args.backend == "jax" and not workloads_is_reference(name) and \
            list(args.models) == list(EQUIVALENCE_MODELS)
        if refused and len(refused) == sum(m != "keras" for m in args.methods) and not default_on_jax:
            if not args.json:
                raise refused[0]  # no method of harness' can train it: one line, exit status 2
            args.unrunnable = getattr(args, "unrunnable", None) or refused[0]  # JSON: the rows first (run)
    return rows


def _randomness(report, tol: float) -> dict:
    """A row's ``random_layers`` (class names; [] where none) and, where the model has random layers and was also
    compared as it is, ``with_randomness``: that run's verdict (float32, no reference: exact or FAIL) and max
    deviation. The row's own verdict, passed and deviations are the runs' with the random layers off."""
    found: dict = {"random_layers": list(report.random_layers)}
    other = report.with_randomness
    if other is not None:
        found["with_randomness"] = {"verdict": other.verdict(tol), "max_deviation": other.max_deviation,
                                    "max_loss_deviation": other.max_loss_deviation}
    return found


def _timings(args, devices, ratios) -> list[dict]:
    from harness.bench.measure import time_train_steps
    from harness.parallel import parallelize

    _say(args, f"\nstep time, batch {args.time_batch}, median of {args.time_steps} steps (logical devices share "
               f"the same cores: this measures overhead, not speed-up)")
    w = max(10, *map(len, args.models))
    _say(args, f"{'model':<{w}} {'single ms':>10} {'towers ms':>10} {'mirrored ms':>12} {'towers/1':>9} {'mirr/1':>7}")
    rows = []
    for name in args.models:
        subject = subject_of(args, name)
        x, y, _ = subject.data(args.time_batch)
        times: dict = {}
        for method in ("single", *PARALLEL_METHODS):
            model = subject.build()
            if method != "single":
                try:
                    model = parallelize(model, devices, ratios=ratios, method=method)
                except Refused:  # said in the equivalence rows
                    times[method] = None
                    continue
            model.compile(**subject.compile_args(model))
            times[method] = time_train_steps(model, x, y, batch_size=args.time_batch, steps=args.time_steps)
        row = {"model": name, **{f"{m}_ms": t and t.median * 1e3 for m, t in times.items()},
               **{f"{m}_spread": t and t.spread for m, t in times.items()}}
        rows.append(row)
        single = times["single"].median
        _say(args, f"{name:<{w}} {single * 1e3:>10.2f} {_ms(times['towers'], 10)} {_ms(times['mirrored'], 12)} "
                   f"{_per(times['towers'], single, 9)} {_per(times['mirrored'], single, 7)}")
    return rows


def _ms(times, width: int) -> str:
    return f"{times.median * 1e3:>{width}.2f}" if times else f"{'refused':>{width}}"


def _per(times, single: float, width: int) -> str:
    return f"{times.median / single:>{width}.2f}" if times else f"{'-':>{width}}"


def _zoo_on_jax(args) -> None:
    """``--zoo --backend jax``: the model zoo's Keras 3 entries, method towers (docs/zoo.md); what is TensorFlow's is
    refused by name: mirrored (no rows of a method that cannot run), Keras 2, the optimizer axis."""
    if args.keras != "3":
        raise InvalidValue(f"--keras {args.keras}: on --backend jax the zoo runs Keras 3 (Keras 2 is tf-keras, on "
                           "TensorFlow)")
    axis = [flag for flag, chosen in (("--zoo-optimizers", args.zoo_optimizers), ("--zoo-options", args.zoo_options),
                                      ("--zoo-axis-models", args.zoo_axis_models)) if chosen]
    if axis:
        raise InvalidValue(f"{axis[0]}: the optimizer axis runs on TensorFlow; on --backend jax --zoo checks the "
                           "model zoo (--zoo-models)")
    if args.methods and set(args.methods) - {"towers"}:
        raise InvalidValue(f"--methods {' '.join(args.methods)}: on --backend jax the zoo checks method towers "
                           "(mirrored is TensorFlow's MirroredStrategy)")


def _zoo(args) -> int:
    from harness.bench import zoo

    if args.from_json:
        from pathlib import Path

        from harness.bench.zoo import outcomes

        rows, stamp = zoo.from_json(Path(args.from_json).read_text())
        rows = outcomes.rejudged(rows, outcomes.load(), outcomes.load_multiples())  # held to today's pins
        stamp = stamp or f"the rows of {args.from_json}"
    else:
        rows, stamp = _zoo_rows(args)
    render = {"text": zoo.text_table, "markdown": zoo.markdown, "json": lambda found: zoo.to_json(found, stamp),
              "overview": lambda found: zoo.overview(found, stamp)}
    print(render["json" if args.json else args.format or "text"](rows))
    if args.pin_outcomes:  # a FAIL other than a missed pin refuses (InvalidValue): nothing is written then
        from harness.bench.zoo import outcomes

        found = outcomes.changes(rows, outcomes.load(), outcomes.load_multiples(), outcomes.load_first_multiples())
        for change in found:
            print(f"pin {outcomes.describe(change)}", file=sys.stderr)
        refused = outcomes.downgrades(found, args.allow_downgrade)
        if refused:
            print(f"harness check: not pinned: {len(refused)} case(s) moved further from one device and are not "
                  "named in --allow-downgrade (fix them, or name each one you mean to re-pin: "
                  f"--allow-downgrade '{outcomes.case_name(refused[0][0])}'); {outcomes.pins_path()} is unchanged",
                  file=sys.stderr)
            return 1
        pins = outcomes.write(rows)
        print(f"pinned the outcomes of {len(rows)} cases in {outcomes.pins_path()} ({len(pins)} pins in all; a case "
              "not pinned must be exact)", file=sys.stderr)
        return 0
    return 1 if any(row.failed for row in rows) else 0


def _zoo_rows(args) -> tuple[list, str]:
    """The zoo's cases run as ``args`` choose, with progress on stderr; and their stamp."""
    from harness.bench import zoo

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ log noise out of the progress lines
    generations = [zoo.ON_JAX] if args.backend == "jax" else _generations(args.keras)
    devices = _devices(args)
    print(f"zoo on {devices}, Keras {' and '.join(map(zoo.keras_label, generations))}, tol {args.tol:g} and a "
          "float64 reference", file=sys.stderr, flush=True)

    def progress(row, done: int, total: int) -> None:
        setting = f" {row.optimizer}" if row.optimizer else ""
        print(f"[{done}/{total}] {row.model}{setting} keras {row.keras} {row.method} {row.split}: {row.status} "
              f"({row.seconds:.1f} s)", file=sys.stderr, flush=True)

    axis_chosen = any([args.zoo_optimizers, args.zoo_options, args.zoo_axis_models])
    rows = []
    for keras in generations:
        if args.zoo_models or not axis_chosen:
            rows += zoo.run_zoo(args.zoo_models, methods=args.methods, splits=args.zoo_splits, keras=keras,
                                fast_only=args.fast, progress=progress, devices=devices, tol=args.tol)
        if (axis_chosen or not args.zoo_models) and keras != zoo.ON_JAX:  # the axis is TensorFlow's
            rows += zoo.run_optimizer_axis(args.zoo_axis_models, args.zoo_optimizers, args.zoo_options,
                                           methods=args.methods, splits=args.zoo_splits or ["3:2"], keras=keras,
                                           fast_only=args.fast, progress=progress, devices=devices, tol=args.tol)
    return rows, _stamp(devices, args.backend)


def _stamp(devices: list[str], backend: str = "tensorflow") -> str:
    """Where a zoo overview came from: the command, harness' commit (dirty or not), the versions, the devices (on
    JAX: JAX's version, TensorFlow neither imported nor named)."""
    import datetime
    from importlib import metadata

    from harness.bench.environment import fingerprint

    on_jax = backend == "jax"
    fp = fingerprint(import_tf=not on_jax)
    found = fp["harness"]
    commit = "not a git checkout" if not found["git_commit"] else (
        f"commit {found['git_commit'][:12]}" + (" with uncommitted changes" if found["git_dirty"] else ""))
    stack = (f"keras {fp['keras']['keras_package'] or '-'} on JAX {metadata.version('jax')}" if on_jax else
             f"TensorFlow {fp['tensorflow']['version']}, keras {fp['keras']['keras_package'] or '-'}, tf-keras "
             f"{fp['keras']['tf_keras_package'] or '-'}")
    return (f"`harness {' '.join(sys.argv[1:])}` at {commit}, {stack}, {len(devices)} devices ({', '.join(devices)}), "
            f"{datetime.date.today().isoformat()}.")


def _generations(keras: str) -> list[str]:
    from harness.bench import zoo

    if keras != "both":
        return [keras]
    found = []
    for generation in zoo.GENERATIONS:
        try:
            zoo.keras_module(generation)
        except Unavailable as err:
            print(f"keras {generation}: skipped: {err}", file=sys.stderr)
        else:
            found.append(generation)
    return found
