"""JAX devices by name: ``cpu:1``, ``gpu:0``, as harness names them, from whatever a user gives ``parallelize``."""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax

from harness.errors import InvalidType, InvalidValue

__all__ = ["device_name", "resolve_jax_devices", "put"]

_NAME = re.compile(r"^/?(?:device:)?(cpu|gpu|cuda|rocm|tpu):(\d+)$", re.IGNORECASE)


def device_name(device) -> str:
    """``"cpu:1"``, ``"gpu:0"``: a JAX device's platform and its place among that platform's devices."""
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    return f"{platform}:{jax.devices(device.platform).index(device)}"


def resolve_jax_devices(devices) -> list:
    """JAX devices from an int N (the first N GPUs; the first N CPU devices without a GPU), a list of GPU ids, of
    names (``"cpu:1"``, ``"/gpu:0"``, ``"/device:CPU:2"``, ``"cuda:0"``) or of JAX devices. A name or an id that is
    not a device raises ``InvalidValue`` naming it and the devices there are."""
    cpus = jax.devices("cpu")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # no GPU backend
        gpus = []
    there = ", ".join(device_name(d) for d in gpus + cpus)
    if isinstance(devices, bool):
        raise InvalidType(f"devices must be an int or a list of devices; got devices={devices!r}")
    if isinstance(devices, int):
        pool = gpus or cpus
        if not 1 <= devices <= len(pool):
            raise InvalidValue(f"devices={devices}: this process has {len(pool)} {'GPU' if gpus else 'CPU'} "
                               f"device(s) ({there}); use harness.use_jax_cpu_devices(n) before JAX starts for more "
                               "CPU devices")
        return pool[:devices]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
        raise InvalidType(f"devices must be an int or a non-empty list of devices; got devices={devices!r}")
    out = []
    for item in devices:
        if isinstance(item, jax.Device):
            out.append(item)
            continue
        if isinstance(item, int) and not isinstance(item, bool):
            pool, index = (gpus or cpus), item
        elif isinstance(item, str) and _NAME.match(item.strip()):
            kind, number = _NAME.match(item.strip()).groups()  # type: ignore[union-attr]
            pool, index = (cpus if kind.lower() == "cpu" else gpus), int(number)
        else:
            raise InvalidValue(f"devices: {item!r} is not a JAX device, a GPU id or a name like 'cpu:1' or 'gpu:0'")
        if not 0 <= index < len(pool):
            raise InvalidValue(f"devices: no device {item!r} in this process (it has {there})")
        out.append(pool[index])
    if len(set(out)) != len(out):
        raise InvalidValue(f"devices must be distinct; got {[device_name(d) for d in out]}")
    return out


_SHARDINGS: dict = {}


def put(value, device):
    """``jax.device_put(value, device)`` for the leaves that are not there already: an array committed to ``device``
    alone is kept as it is (the same values), the others are sent in one call. A step's state, gradients and
    cotangents are mostly where they are needed; ``jax.device_put`` of such a leaf still costs ~17 us of Python
    (10 weights of a 256-wide MLP: 169 us a call where the check takes 6 us, JAX 0.10 on a 2-core host), which
    was a quarter of a towers step on 3 CPU devices."""
    sharding = _SHARDINGS.get(device)
    if sharding is None:
        sharding = _SHARDINGS[device] = jax.sharding.SingleDeviceSharding(device)
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):  # inside a trace (a jitted predict): no placement
        return jax.device_put(value, device)
    moving = [i for i, leaf in enumerate(leaves)
              if not (isinstance(leaf, jax.Array) and leaf.committed and leaf.sharding == sharding)]
    if moving:
        for i, leaf in zip(moving, jax.device_put([leaves[i] for i in moving], device)):
            leaves[i] = leaf
    return jax.tree_util.tree_unflatten(treedef, leaves)
