"""Device discovery and logical devices.

TensorFlow fixes its device list the first time it initialises its runtime,
so splitting a physical device into logical ones must happen before any op.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import Failed, InvalidType, InvalidValue

__all__ = [
    "DeviceLayout",
    "use_logical_devices",
    "use_device_layout",
    "gpu_memory_limit_mb",
    "resolve_devices",
    "is_tf_initialized",
    "gpu_count",
    "use_jax_cpu_devices",
]

# Shares of one card when several processes split it (gpu_memory_limit_mb): all test processes
# together take at most GPU_MEMORY_SHARE of it, and each keeps GPU_CONTEXT_MIB outside TensorFlow's
# allocator for what the limit does not cover (its CUDA context, cuBLAS and cuDNN handles and
# workspaces: about 0.5 GiB per process on current cards).
GPU_MEMORY_SHARE = 0.9
GPU_CONTEXT_MIB = 1024
MIN_LOGICAL_GPU_MIB = 256

_DEVICE_RE = re.compile(r"^/?(?:job:[^/]+/replica:\d+/task:\d+/)?(?:device:)?(cpu|gpu):(\d+)$", re.IGNORECASE)


def gpu_count() -> int:
    """NVIDIA GPUs the driver exposes, counted without creating a TF context."""
    root = "/proc/driver/nvidia/gpus"
    try:
        count = len(os.listdir(root))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def is_tf_initialized() -> bool:
    """Whether TensorFlow's runtime (and so its device list) is already fixed."""
    import sys

    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None  # noqa: SLF001 - no public probe exists


def use_logical_devices(
    count: int,
    device_type: str = "CPU",
    memory_limits_mb: Sequence[int] | None = None,
    inter_op_threads: int | None = None,
    start: bool = True,
) -> list[str]:
    """Splits the first physical CPU or GPU into ``count`` logical devices.

    Must run before TensorFlow creates its runtime (before any op or device
    listing that initialises it). On a GPU every logical device needs a memory
    limit; NCCL is not used between logical devices of one card.

    Args:
        count: number of logical devices, ``>= 1``.
        device_type: ``"CPU"`` or ``"GPU"``.
        memory_limits_mb: for GPUs, one limit per logical device (MiB).
        inter_op_threads: at least this many threads run independent ops at
            once (emulated devices block one each while they sleep).
        start: list the devices, which starts TensorFlow's runtime; ``False``
            leaves it unstarted (for a multi-worker strategy, which must
            configure it first) and returns the names the devices will have.

    Returns:
        The logical device names, e.g. ``["/device:CPU:0", "/device:CPU:1"]``.

    Raises:
        ValueError: bad ``count``/``device_type``/limits, or no such physical device.
        RuntimeError: TensorFlow is already initialised with another device layout.

    Examples:
        >>> import harness
        >>> harness.use_logical_devices(2)
        ['/device:CPU:0', '/device:CPU:1']
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidValue(f"count must be an int >= 1; got count={count!r}")
    kind = str(device_type).upper()
    if kind not in ("CPU", "GPU"):
        raise InvalidValue(f"device_type must be 'CPU' or 'GPU'; got device_type={device_type!r}")
    limits = _check_limits(kind, count, memory_limits_mb)

    import tensorflow as tf

    _at_least_inter_op_threads(inter_op_threads)
    physical = tf.config.list_physical_devices(kind)
    if not physical:
        raise InvalidValue(f"no physical {kind} device to split; TensorFlow sees none")
    configs = [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits]
    try:
        tf.config.set_logical_device_configuration(physical[0], configs)
    except RuntimeError as err:
        current = [d.name for d in tf.config.list_logical_devices(kind)]
        if len(current) == count:
            return current  # the same layout was set up earlier in this process
        raise Failed(
            f"TensorFlow is already initialised with {len(current)} logical {kind} device(s) "
            f"{current}; use_logical_devices({count}) must run before any TensorFlow op. "
            "Call it first in the process (or run each device layout in its own process)."
        ) from err
    if not start:
        return [f"/device:{kind}:{i}" for i in range(count)]
    return [d.name for d in tf.config.list_logical_devices(kind)]


def gpu_memory_limit_mb(total_mib: int, processes: int, devices: int) -> int:
    """The memory limit of each logical GPU when ``processes`` processes each split one card into ``devices``.

    All processes together take at most ``GPU_MEMORY_SHARE`` (90%) of the card; each of them keeps
    ``GPU_CONTEXT_MIB`` (1 GiB) of its share for its CUDA context and libraries, and divides the rest
    evenly among its logical GPUs: ``(floor(0.9 * total / processes) - 1024) // devices``.

    Args:
        total_mib: the card's memory (MiB), e.g. ``harness.bench.nvml.gpus()[0].memory_total_mib``.
        processes: processes sharing the card (pytest-xdist workers).
        devices: logical GPUs each process makes of it.

    Returns:
        MiB per logical GPU, at least ``MIN_LOGICAL_GPU_MIB`` (256).

    Raises:
        ValueError: a non-positive argument, or less than 256 MiB per logical GPU.

    Examples:
        >>> gpu_memory_limit_mb(81559, processes=2, devices=3)  # an H100 80GB, pytest -n 2
        11892
    """
    for name, value in (("total_mib", total_mib), ("processes", processes), ("devices", devices)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValue(f"{name} must be an int >= 1; got {name}={value!r}")
    limit = (int(total_mib * GPU_MEMORY_SHARE) // processes - GPU_CONTEXT_MIB) // devices
    if limit < MIN_LOGICAL_GPU_MIB:
        raise InvalidValue(
            f"a {total_mib} MiB GPU shared by {processes} process(es), each splitting it into {devices} logical GPUs, "
            f"leaves {max(limit, 0)} MiB per logical GPU; at least {MIN_LOGICAL_GPU_MIB} MiB is needed: "
            "run fewer processes (pytest -n) or make fewer logical GPUs"
        )
    return limit


@dataclass(frozen=True)
class DeviceLayout:
    """The devices of this process, as ``use_device_layout`` set them up."""

    cpus: tuple[str, ...]  #: logical CPU device names
    gpus: tuple[str, ...]  #: GPU device names (logical ones first where GPU 0 was split)
    split_gpus: int  #: logical GPUs made of GPU 0; 0 where the physical GPUs are used as they are
    gpu_memory_limit_mb: int | None  #: each logical GPU's memory limit where GPU 0 was split


def _at_least_inter_op_threads(threads: int | None) -> None:
    """Raises TensorFlow's inter-op threads to ``threads`` (None: leaves them), before its runtime starts."""
    import tensorflow as tf

    if threads is not None and not is_tf_initialized():
        current = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1
        tf.config.threading.set_inter_op_parallelism_threads(max(current, int(threads)))


def use_device_layout(cpus: int, split_gpus: int = 0, gpu_memory_limit_mb: int | None = None,
                      inter_op_threads: int | None = None) -> DeviceLayout:
    """Sets up logical CPUs and, optionally, logical GPUs on GPU 0, all at once before TensorFlow starts.

    ``use_logical_devices`` splits one kind of device; a process that needs both (a test
    process running CPU and GPU tests) must set both up before the first op, which this does.

    Args:
        cpus: logical CPU devices to make of the CPU, ``>= 1``.
        split_gpus: logical GPUs to make of GPU 0 (each limited to ``gpu_memory_limit_mb``); 0 uses
            the physical GPUs as they are, with memory growth on, so that processes can share them.
        gpu_memory_limit_mb: MiB per logical GPU; required when ``split_gpus`` > 0 (see ``gpu_memory_limit_mb``).
        inter_op_threads: at least this many threads run independent ops at once (``use_logical_devices``).

    Returns:
        The ``DeviceLayout``.

    Raises:
        ValueError: bad counts or limit, or ``split_gpus`` > 0 where TensorFlow sees no GPU.
        RuntimeError: TensorFlow is already initialised with another device layout.

    Examples:
        >>> layout = use_device_layout(4, split_gpus=3, gpu_memory_limit_mb=11892)  # a one-GPU machine
        >>> layout.gpus
        ('/device:GPU:0', '/device:GPU:1', '/device:GPU:2')
    """
    for name, value in (("cpus", cpus), ("split_gpus", split_gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "cpus" else 0):
            raise InvalidValue(f"{name} must be an int >= {1 if name == 'cpus' else 0}; got {name}={value!r}")
    limit = gpu_memory_limit_mb
    if split_gpus and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise InvalidValue(f"gpu_memory_limit_mb must be a positive int (MiB) when split_gpus > 0; "
                           f"got gpu_memory_limit_mb={limit!r}")

    import tensorflow as tf

    _at_least_inter_op_threads(inter_op_threads)
    physical = tf.config.list_physical_devices("GPU")
    if split_gpus and not physical:
        raise InvalidValue(f"no physical GPU to split into {split_gpus} logical GPUs; TensorFlow sees none")
    wanted_gpus = split_gpus + len(physical) - 1 if split_gpus else len(physical)
    try:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration() for _ in range(cpus)])
        if split_gpus:
            tf.config.set_logical_device_configuration(
                physical[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit) for _ in range(split_gpus)])
        else:
            for gpu in physical:
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:
        have_cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        have_gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        if len(have_cpus) != cpus or len(have_gpus) != wanted_gpus:
            split = f", GPU 0 as {split_gpus} logical GPUs" if split_gpus else ""
            raise Failed(
                f"TensorFlow is already initialised with CPU devices {have_cpus} and GPU devices {have_gpus}; "
                f"the layout ({cpus} logical CPUs{split}) must be set up before any TensorFlow op. "
                "Set it up first in the process (or run each device layout in its own process)."
            ) from err
        # The same layout was set up earlier in this process.
    return DeviceLayout(
        cpus=tuple(d.name for d in tf.config.list_logical_devices("CPU")),
        gpus=tuple(d.name for d in tf.config.list_logical_devices("GPU")),
        split_gpus=split_gpus, gpu_memory_limit_mb=limit if split_gpus else None,
    )


def _check_limits(kind: str, count: int, memory_limits_mb: Sequence[int] | None) -> list[int | None]:
    if memory_limits_mb is None:
        if kind == "GPU":
            raise InvalidValue("memory_limits_mb is required for logical GPUs (one limit per device, in MiB)")
        return [None] * count
    limits: list[int | None] = list(memory_limits_mb)
    if len(limits) != count or any(isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in limits):
        raise InvalidValue(
            f"memory_limits_mb must hold {count} positive ints (MiB); got memory_limits_mb={memory_limits_mb!r}"
        )
    return limits


def resolve_devices(devices: int | Sequence[str | int]) -> list[str]:
    """Turns ``devices`` into canonical TensorFlow device names.

    Args:
        devices: an int N (the first N GPUs, or the first N logical CPUs when
            there is no GPU), or a list of names (``"/gpu:1"``, ``"GPU:0"``) or
            GPU ids (``[0, 1]``).

    Returns:
        Names such as ``"/device:GPU:0"``, in the given order.

    Raises:
        TypeError: ``devices`` has the wrong type.
        ValueError: empty, duplicated, malformed or unknown devices.
    """
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if isinstance(devices, bool):
        raise InvalidType(f"devices must be an int or a list of device names; got devices={devices!r}")
    if isinstance(devices, int):
        pool, kind = (gpus, "GPU") if gpus else (cpus, "CPU")
        if devices < 1 or devices > len(pool):
            raise InvalidValue(
                f"devices={devices} asks for {devices} {kind}s but this machine has {len(pool)}: {pool}"
            )
        return pool[:devices]
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise InvalidType(f"devices must be an int or a list of device names; got devices={devices!r}")
    if not devices:
        raise InvalidValue("devices must name at least one device; got devices=[]")
    names = [_canonical(d, gpus, cpus) for d in devices]
    if len(set(names)) != len(names):
        raise InvalidValue(f"devices must not repeat a device; got devices={list(devices)!r}")
    return names


def _canonical(device: str | int, gpus: list[str], cpus: list[str]) -> str:
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"GPU:{device}"
    if not isinstance(device, str):
        raise InvalidType(f"a device must be a name like '/gpu:0' or a GPU id; got {device!r}")
    match = _DEVICE_RE.match(device.strip())
    if not match:
        raise InvalidValue(f"malformed device name {device!r}; expected e.g. '/gpu:0' or '/cpu:1'")
    kind, index = match.group(1).upper(), int(match.group(2))
    pool = gpus if kind == "GPU" else cpus
    name = f"/device:{kind}:{index}"
    if not any(p.endswith(f"device:{kind}:{index}") for p in pool):
        raise InvalidValue(f"unknown device {device!r}: this process has {kind} devices {pool}")
    return name


def use_jax_cpu_devices(count: int) -> list:
    """Makes JAX's host platform show ``count`` CPU devices and returns them (Keras 3 on JAX: ``harness.parallelize``
    over them). Call it before JAX creates its backends (the first ``jax.devices()`` or array): it sets
    ``jax_num_cpu_devices`` (``XLA_FLAGS=--xla_force_host_platform_device_count`` before JAX 0.4.38).

    Raises:
        harness.errors.InvalidValue: ``count`` is not a positive int.
        harness.errors.Failed: JAX already started with another number of CPU devices.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidValue(f"count must be a positive int; got count={count!r}")
    import sys

    started = "jax" in sys.modules
    if not started:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", count)
    except (AttributeError, RuntimeError):  # an older JAX (XLA_FLAGS serves), or its backends already started
        pass
    devices = jax.devices("cpu")
    if len(devices) != count:
        raise Failed(f"JAX already started with {len(devices)} CPU device(s); call use_jax_cpu_devices({count}) "
                     "before anything creates a JAX array or lists its devices")
    return list(devices)
