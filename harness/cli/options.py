"""Options ``harness run`` and ``harness compare`` share, and turning them into devices.

Device choice, in order: ``--emulate`` (emulated devices on logical CPUs),
``--logical-cpus N``, ``--devices``/``--gpus``; with none of them, every GPU,
or, on a machine without one, seed 000's two emulated GPUs (docs/background.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.bench import workloads
from harness.emulate import EmulatedDevice, inter_op_threads, parse_emulate
from harness.errors import InvalidValue

__all__ = ["SEED_000_EMULATE", "BACKENDS", "DeviceSetup", "add_common", "add_backend", "setup_devices",
           "setup_jax_devices", "refuse_on_jax", "check_common", "default_size", "expected_device_count", "chart"]

# Seed 000: a GTX 1080 Ti alone at 1345 samples/s, a GTX 1080 at 875; the 1080 ran out of memory at 710.
SEED_000_EMULATE = "1345:1100,875:700"
BATCH_PER_DEVICE = 694  # two devices: 1388 samples, seed 000's best global batch (820 + 568)
BACKENDS = ("tensorflow", "jax")


@dataclass(frozen=True)
class DeviceSetup:
    devices: tuple[str, ...]
    emulate: tuple[EmulatedDevice, ...] | None
    kind: str  # "emulated", "logical CPU", "GPU"
    note: str = ""


def ratio(text: str) -> float:
    """An argparse type: one ``--ratios`` entry, a positive finite number (the one check of each value; the count is
    checked against the devices once they are known)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"a ratio must be a positive finite number; got {text!r}")
    return value


def add_common(p, *, seconds: float, windows: int) -> None:
    """Adds the model, device, timing and output options to a subcommand parser."""
    p.add_argument("--model", default="mnist_maxing", metavar="NAME",
                   help=f"workload: {', '.join(workloads.names())} (default mnist_maxing), or your own model: "
                        f"{workloads.FORMS}, a function returning a compiled keras.Model or a harness.Workload "
                        "(docs/user-models.md)")
    p.add_argument("--data", metavar="MODULE:ATTR",
                   help="your model's data (with --model MODULE:ATTR): a function (batch_size) -> tf.data.Dataset of "
                        "(x, y) batches, or -> arrays (x, y); default: batches made up from its inputs and loss")
    p.add_argument("--size", default=None, metavar="SIZE",
                   help="full or tiny (default: full with GPUs, tiny on emulated or CPU devices)")
    p.add_argument("--devices", "--gpus", nargs="+", metavar="DEV", dest="devices",
                   help="GPU ids or device names, e.g. --gpus 0 1 (without a GPU, ids name logical CPUs)")
    p.add_argument("--logical-cpus", type=int, metavar="N", help="split the CPU into N logical devices")
    p.add_argument("--emulate", metavar="RATE[:MAXBATCH[:MS]][@LINK],...",
                   help="emulated devices on logical CPUs: samples/s, optional memory ceiling (samples per step), "
                        "fixed cost per step in ms and link (pcie3x8, pcie3x16, pcie4x16, ..., nvlink3, or GB/s; "
                        f"/LATENCY_US), e.g. 1345,875 or {SEED_000_EMULATE} or 1438:1100:49@pcie3x16 "
                        f"(default without GPUs: {SEED_000_EMULATE})")
    p.add_argument("--seconds", type=float, default=seconds, help=f"seconds per timing window (default {seconds:g})")
    p.add_argument("--windows", type=int, default=windows, help=f"timing windows (default {windows})")
    p.add_argument("--warmup-steps", type=int, default=2, metavar="N", help="untimed first steps (default 2)")
    p.add_argument("--input-delay-ms", type=float, default=0.0, metavar="MS",
                   help="emulate a CPU-bound input pipeline: this much preprocessing per batch (default 0)")
    p.add_argument("--seed", type=int, default=0, help="weights and synthetic data seed (default 0)")
    p.add_argument("--results-dir", metavar="DIR",
                   help="where the JSON record goes (default $HARNESS_RESULTS_DIR or ~/.cache/harness/results)")
    p.add_argument("--no-save", action="store_true", help="do not write a result record")
    p.add_argument("--json", action="store_true", help="print the result record as JSON instead of tables")


def add_backend(p) -> None:
    """Adds ``--backend {tensorflow,jax}`` (``harness run``, ``harness compare`` and ``harness tune``)."""
    p.add_argument("--backend", choices=BACKENDS, default="tensorflow",
                   help="tensorflow (default), or jax: Keras 3 on JAX devices (harness.bench.jaxbench; emulated "
                        "devices, by default without GPUs; --logical-cpus N JAX CPU devices; or --gpus); --workers, "
                        "mirrored and emulated links are TensorFlow's")


def refuse_on_jax(args, refusals) -> None:
    """With ``--backend jax``: raises ``InvalidValue`` (exit 2, one line) for the first option of ``refusals`` that
    is set: ``(attribute, is_set(value), message)``, the message naming the option and why."""
    for attribute, is_set, message in refusals:
        if is_set(getattr(args, attribute, None)):
            raise InvalidValue(message)


#: the options ``harness run`` and ``harness compare`` refuse with ``--backend jax``: (attribute, set?, why)
JAX_REFUSALS = (
    ("workers", lambda v: v is not None,
     "--workers: harness across workers joins TensorFlow's collectives (harness.use_cluster); --backend jax runs "
     "in one process"),
    ("devices_per_worker", lambda v: v is not None,
     "--devices-per-worker: harness across workers joins TensorFlow's collectives; --backend jax runs in one "
     "process"),
)


def setup_jax_devices(args) -> DeviceSetup:
    """``--backend jax``: Keras on JAX (``KERAS_BACKEND=jax``, refused where Keras already runs on another backend),
    then JAX's devices: emulated ones (``--emulate``, or seed 000's pair where no GPU is found and no device option
    is given: one JAX CPU device each), ``--logical-cpus N`` or ``--devices``/``--gpus`` (``harness.bench.jaxbench``).

    Raises:
        InvalidValue: an emulated device with a link (not modelled on JAX), or a bad device option.
    """
    from harness.bench import jaxbench

    jaxbench.select_backend()
    emulate = getattr(args, "emulate", None)
    if emulate is None and not args.devices and args.logical_cpus is None and not jaxbench.gpus_possible():
        emulate = SEED_000_EMULATE
    if emulate is not None:
        specs = parse_emulate(emulate)
        linked = [str(spec) for spec in specs if spec.link is not None]
        if linked:
            raise InvalidValue(f"--emulate {emulate}: on --backend jax an emulated device has no link (links are "
                               f"modelled on TensorFlow's towers and mirrored); drop @LINK from {', '.join(linked)}")
        if args.devices or args.logical_cpus is not None:
            raise InvalidValue("--emulate makes its own devices (one JAX CPU device each); drop --devices, --gpus "
                               "and --logical-cpus")
        found = jaxbench.setup_devices(logical_cpus=len(specs))
        note = "emulated devices: " + ", ".join(f"{d} = {s}" for d, s in zip(found.devices, specs))
        return DeviceSetup(found.devices, specs, "emulated", note)
    found = jaxbench.setup_devices(logical_cpus=args.logical_cpus, devices=args.devices)
    return DeviceSetup(found.devices, None, found.kind, found.note)


def check_common(args) -> None:
    """Validates the shared options before devices are set up; raises ``ValueError`` naming the bad value.

    A model of the user's (``--model MODULE:ATTR``) is looked up here: its module is imported (or its file run),
    which may import TensorFlow, but nothing is built before the devices are set up."""
    workloads.get(args.model, args.data)
    if args.size is not None:
        workloads.check_size(args.size)
    if not args.seconds > 0:
        raise InvalidValue(f"--seconds must be > 0; got {args.seconds:g}")
    if args.windows < 1:
        raise InvalidValue(f"--windows must be >= 1; got {args.windows}")
    if args.warmup_steps < 1:
        raise InvalidValue(f"--warmup-steps must be >= 1; got {args.warmup_steps}")
    if args.input_delay_ms < 0:
        raise InvalidValue(f"--input-delay-ms must be >= 0; got {args.input_delay_ms:g}")
    if args.logical_cpus is not None and args.logical_cpus < 1:
        raise InvalidValue(f"--logical-cpus must be >= 1; got {args.logical_cpus}")
    if args.emulate is not None:
        specs = parse_emulate(args.emulate)
        if args.devices:
            raise InvalidValue(f"--emulate runs on logical CPU devices; drop --devices {' '.join(args.devices)}")
        if args.logical_cpus is not None and args.logical_cpus != len(specs):
            raise InvalidValue(f"--emulate has {len(specs)} devices but --logical-cpus is {args.logical_cpus}")


def expected_device_count(args) -> int | None:
    """How many devices the options will give, when that is known before TensorFlow starts."""
    if args.emulate is not None:
        return len(parse_emulate(args.emulate))
    if args.logical_cpus is not None:
        return args.logical_cpus
    if args.devices:
        return len(args.devices)
    return len(parse_emulate(SEED_000_EMULATE)) if _gpu_count() == 0 else None


def chart(command: str, draw: Callable[[], Path | None]) -> Path | None:
    """``draw()``'s chart, or, without matplotlib, one line on stderr naming the extra and no chart.

    Drawn with the objects of the training before it frozen out of the garbage collector: matplotlib allocates
    enough to start a full collection, which spent 16 s walking and freeing TensorFlow's traced graphs after
    ``harness tune`` (the chart itself takes 0.1 s).
    """
    import gc

    from harness.extras import MissingExtra

    gc.freeze()
    try:
        return draw()
    except MissingExtra as err:
        print(f"harness {command}: chart skipped: {err}", file=sys.stderr)
        return None
    finally:
        gc.unfreeze()


def _gpu_count() -> int:
    from harness.devices import gpu_count

    return gpu_count()


def setup_devices(args) -> DeviceSetup:
    """Creates the devices the options ask for (TensorFlow starts here)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ log noise out of the tables
    from harness.devices import resolve_devices, use_logical_devices

    emulate = args.emulate
    if emulate is None and not args.devices and args.logical_cpus is None and _gpu_count() == 0:
        emulate = SEED_000_EMULATE
    if emulate is not None:
        specs = parse_emulate(emulate)
        # Each emulated device sleeps on one inter-op thread: leave threads for the real work.
        names = use_logical_devices(len(specs), inter_op_threads=inter_op_threads(len(specs)))
        note = "emulated devices: " + ", ".join(f"{d} = {s}" for d, s in zip(names, specs))
        return DeviceSetup(tuple(names), specs, "emulated", note)
    if args.logical_cpus is not None:
        return DeviceSetup(tuple(use_logical_devices(args.logical_cpus)), None, "logical CPU",
                           "logical CPU devices share the same cores: figures are overhead, not speed-up")
    if args.devices:
        if _gpu_count() == 0:
            ids = [_cpu_id(d) for d in args.devices]
            use_logical_devices(max(ids) + 1)
            return DeviceSetup(tuple(resolve_devices([f"/cpu:{i}" for i in ids])), None, "logical CPU",
                               "no GPU here: device ids name logical CPU devices")
        return DeviceSetup(tuple(resolve_devices(args.devices)), None, "GPU")
    return DeviceSetup(tuple(resolve_devices(_gpu_count())), None, "GPU")


def _cpu_id(device: str) -> int:
    text = device.lower().removeprefix("/").removeprefix("device:").removeprefix("cpu:").removeprefix("gpu:")
    if not text.isdigit():
        raise InvalidValue(f"without a GPU, --devices takes ids of logical CPU devices (0 1 ...); got {device!r}")
    return int(text)


def default_size(args, setup: DeviceSetup) -> str:
    return args.size or ("full" if setup.kind == "GPU" else "tiny")
