"""``harness.bench.calibrate``: the highest emulated rate this host sustains, per workload.

An emulated device is only an emulation while the host computes its slice
faster than the emulated time (``harness.emulate``). Calibration measures that
limit where emulation runs: every device of the layout at once (they share the
host's cores as emulated devices do), each on ``batch_per_device`` samples per
step, emulated so fast that every step is late: their busy time is then the
real work, and ``samples / work`` is the rate this host computes a slice at.

The result per workload: each device's host rate, ``sustained_rate`` (the
slowest device's: the highest rate every device can be emulated at, at this
batch, on this host as loaded now), and ``outside_ms``: the host's work per
step outside the devices (loss, optimizer, input, Python), which every
emulated step adds to its emulated time. Rule of thumb: emulated rates well
below ``sustained_rate`` (the test suite uses a quarter of it) and steps long
next to ``outside_ms``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from harness.errors import Failed, InvalidValue

__all__ = ["calibrate", "UNBOUNDED_RATE"]

# An emulated rate no host reaches: every step is late, so the busy time is the real work.
UNBOUNDED_RATE = 1e12


def calibrate(
    models: Sequence[str] | None = None,
    *,
    devices: Sequence[str],
    size: str = "tiny",
    batch_per_device: int = 128,
    seconds: float = 0.5,
    windows: int = 3,
    seed: int = 0,
    on_event: Callable[[str], None] | None = None,
    data: str | None = None,
) -> dict:
    """Measures the rate this host computes each device's slice at, for each workload.

    Args:
        models: workload names (default: every workload), or references to models of your own
            (``MODULE:ATTR``, ``path/to/file.py:ATTR``: docs/user-models.md).
        devices: logical CPU devices, already set up (``use_logical_devices``
            with an inter-op thread per device and two more, as emulation needs).
        size: ``"tiny"`` or ``"full"``.
        batch_per_device: samples per device per step.
        seconds, windows: timing of each workload's run.
        seed: weights and data seed.
        on_event: called with a line of progress text.
        data: a reference to the data function of your own model (``--data``), for every model given.

    Returns:
        ``{"config", "workloads": [{"model", "batch_per_device", "devices":
        [{"device", "host_rate"}], "sustained_rate", "outside_ms",
        "samples_per_second"}], "seconds"}``.

    Raises:
        ValueError: no devices, a bad batch or an unknown workload.

    Example:
        >>> devices = harness.use_logical_devices(2, inter_op_threads=4)
        >>> calibrate(["mnist_maxing"], devices=devices)["workloads"][0]["sustained_rate"]
        10873.2
    """
    from harness.bench import workloads
    from harness.bench.runner import RunConfig, run_one
    from harness.emulate import EmulatedDevice

    began = time.perf_counter()
    say = on_event or (lambda text: None)
    names = list(models) if models else workloads.names()
    for name in names:
        workloads.get(name, data)
    if not devices:
        raise InvalidValue("calibrate needs at least one device; got none")
    if isinstance(batch_per_device, bool) or not isinstance(batch_per_device, int) or batch_per_device < 1:
        raise InvalidValue(f"batch per device must be an int >= 1; got {batch_per_device!r}")
    record: dict = {"config": {"models": names, "size": size, "devices": list(devices),
                               "batch_per_device": batch_per_device, "seconds": seconds, "windows": windows,
                               "seed": seed, "data": data},
                    "workloads": []}
    for i, name in enumerate(names):
        say(f"[{i + 1}/{len(names)}] {name} ({size}): {len(devices)} device(s) at once, "
            f"{batch_per_device} samples each")
        config = RunConfig(name, size, "towers" if len(devices) > 1 else "single", tuple(devices),
                           (batch_per_device,) * len(devices), seconds=seconds, windows=windows, seed=seed,
                           emulate=(EmulatedDevice(UNBOUNDED_RATE),) * len(devices), data=data)
        result = run_one(config)
        if result["status"] != "complete":
            raise Failed(f"calibrating {name}: {result['status']}: {result['error']}")
        entry = _entry(name, batch_per_device, result)
        say(f"    sustains {entry['sustained_rate']:.0f} samples/s per device; "
            f"{entry['outside_ms']:.1f} ms per step outside the devices")
        record["workloads"].append(entry)
    record["seconds"] = time.perf_counter() - began
    return record


def _entry(name: str, batch: int, result: dict) -> dict:
    """One workload's calibration from its ``run_one`` result."""
    summary = result["summary"]
    rates = [d["host_rate"] for d in summary["devices"]]
    # Per window: the step's wall time not covered by its busiest device (host work outside the devices).
    outside = [w["seconds"] / w["steps"] * (1 - max(d["busy_fraction"] for d in w["devices"]))
               for w in result["windows"]]
    return {"model": name, "batch_per_device": batch,
            "devices": [{"device": d["device"], "host_rate": d["host_rate"]} for d in summary["devices"]],
            "sustained_rate": min(rates), "outside_ms": 1000 * max(0.0, statistics.median(outside)),
            "samples_per_second": summary["samples_per_second"]["median"]}
