"""Device discovery and logical devices.

TensorFlow fixes its device list the first time it initialises its runtime,
so splitting a physical device into logical ones must happen before any op.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

__all__ = ["use_logical_devices", "resolve_devices", "is_tf_initialized"]

_DEVICE_RE = re.compile(r"^/?(?:job:[^/]+/replica:\d+/task:\d+/)?(?:device:)?(cpu|gpu):(\d+)$", re.IGNORECASE)


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

    Returns:
        The logical device names, e.g. ``["/device:CPU:0", "/device:CPU:1"]``.

    Raises:
        ValueError: bad ``count``/``device_type``/limits, or no such physical device.
        RuntimeError: TensorFlow is already initialised with another device layout.

    Example:
        >>> import harness
        >>> harness.use_logical_devices(2)
        ['/device:CPU:0', '/device:CPU:1']
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1; got count={count!r}")
    kind = str(device_type).upper()
    if kind not in ("CPU", "GPU"):
        raise ValueError(f"device_type must be 'CPU' or 'GPU'; got device_type={device_type!r}")
    limits = _check_limits(kind, count, memory_limits_mb)

    import tensorflow as tf

    if inter_op_threads is not None and not is_tf_initialized():
        current = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1
        tf.config.threading.set_inter_op_parallelism_threads(max(current, int(inter_op_threads)))
    physical = tf.config.list_physical_devices(kind)
    if not physical:
        raise ValueError(f"no physical {kind} device to split; TensorFlow sees none")
    configs = [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in limits]
    try:
        tf.config.set_logical_device_configuration(physical[0], configs)
    except RuntimeError as err:
        current = [d.name for d in tf.config.list_logical_devices(kind)]
        if len(current) == count:
            return current  # the same layout was set up earlier in this process
        raise RuntimeError(
            f"TensorFlow is already initialised with {len(current)} logical {kind} device(s) "
            f"{current}; use_logical_devices({count}) must run before any TensorFlow op. "
            "Call it first in the process (or run each device layout in its own process)."
        ) from err
    return [d.name for d in tf.config.list_logical_devices(kind)]


def _check_limits(kind: str, count: int, memory_limits_mb: Sequence[int] | None) -> list[int | None]:
    if memory_limits_mb is None:
        if kind == "GPU":
            raise ValueError("memory_limits_mb is required for logical GPUs (one limit per device, in MiB)")
        return [None] * count
    limits = list(memory_limits_mb)
    if len(limits) != count or any(isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in limits):
        raise ValueError(
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
        raise TypeError(f"devices must be an int or a list of device names; got devices={devices!r}")
    if isinstance(devices, int):
        pool, kind = (gpus, "GPU") if gpus else (cpus, "CPU")
        if devices < 1 or devices > len(pool):
            raise ValueError(
                f"devices={devices} asks for {devices} {kind}s but this machine has {len(pool)}: {pool}"
            )
        return pool[:devices]
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise TypeError(f"devices must be an int or a list of device names; got devices={devices!r}")
    if not devices:
        raise ValueError("devices must name at least one device; got devices=[]")
    names = [_canonical(d, gpus, cpus) for d in devices]
    if len(set(names)) != len(names):
        raise ValueError(f"devices must not repeat a device; got devices={list(devices)!r}")
    return names


def _canonical(device: str | int, gpus: list[str], cpus: list[str]) -> str:
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"GPU:{device}"
    if not isinstance(device, str):
        raise TypeError(f"a device must be a name like '/gpu:0' or a GPU id; got {device!r}")
    match = _DEVICE_RE.match(device.strip())
    if not match:
        raise ValueError(f"malformed device name {device!r}; expected e.g. '/gpu:0' or '/cpu:1'")
    kind, index = match.group(1).upper(), int(match.group(2))
    pool = gpus if kind == "GPU" else cpus
    name = f"/device:{kind}:{index}"
    if not any(p.endswith(f"device:{kind}:{index}") for p in pool):
        raise ValueError(f"unknown device {device!r}: this process has {kind} devices {pool}")
    return name
