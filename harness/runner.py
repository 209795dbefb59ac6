"""One throughput run: config -> workload -> parallel model -> timed windows -> result.

``harness run`` makes one run, ``harness compare`` several in one process, asv
and the tuner call ``run_one`` too, so a samples/s figure means the same thing
everywhere. Per-device figures are measured where the machine can measure them:
emulated devices report their busy time, GPUs their NVML telemetry; logical CPU
devices have no per-device measurement and say so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from harness.emulate import EmulatedDevice

__all__ = ["RunMethod", "RunConfig", "run_one", "gpu_index", "SOURCES"]

SOURCES = {
    "emulated": "emulated device: its own busy time (begin/end of its slice)",
    "nvml": "NVML, sampled at 10 Hz in the background",
    "share": "share of the measured total (logical CPU: no per-device measurement)",
}


class RunMethod(str, Enum):
    """How one run spreads its batch."""

    SINGLE = "single"
    TOWERS = "towers"
    MIRRORED = "mirrored"


@dataclass(frozen=True)
class RunConfig:
    """What one run trains, where, and how long it is timed.

    ``batches`` are per-device batch sizes, as seed 000's ``--batches 820 568``;
    the global batch is their sum and the split ratios are the batches themselves.
    """

    model: str
    size: str
    method: str
    devices: tuple[str, ...]
    batches: tuple[int, ...]
    seconds: float = 5.0
    windows: int = 3
    warmup_steps: int = 2
    emulate: tuple[EmulatedDevice, ...] | None = None
    input_delay_ms: float = 0.0
    seed: int = 0
    label: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "batches", tuple(self.batches))
        if self.emulate is not None:
            object.__setattr__(self, "emulate", tuple(self.emulate))
        self.validate()

    @property
    def batch(self) -> int:
        return sum(self.batches)

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field."""
        from harness import workloads

        workloads.get(self.model)
        workloads.check_size(self.size)
        if self.method not in {m.value for m in RunMethod}:
            raise ValueError(f"unknown method {self.method!r}; choose from single, towers, mirrored")
        if not self.devices:
            raise ValueError("a run needs at least one device")
        if self.method == RunMethod.SINGLE and len(self.devices) != 1:
            raise ValueError(f"method 'single' runs on exactly one device; got {len(self.devices)}: {self.devices}")
        if len(self.batches) != len(self.devices):
            raise ValueError(
                f"need one batch size per device: {len(self.devices)} devices {list(self.devices)} but "
                f"{len(self.batches)} batches {list(self.batches)}"
            )
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"per-device batch sizes must be ints >= 1; got batches={list(self.batches)}")
        if not (isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds per window must be > 0; got seconds={self.seconds!r}")
        if isinstance(self.windows, bool) or not isinstance(self.windows, int) or self.windows < 1:
            raise ValueError(f"windows must be an int >= 1; got windows={self.windows!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be an int >= 1; got warmup_steps={self.warmup_steps!r}")
        if self.emulate is not None and len(self.emulate) != len(self.devices):
            raise ValueError(
                f"need one emulated device per device: {len(self.devices)} devices but {len(self.emulate)} "
                f"--emulate entries"
            )

    def to_json(self) -> dict:
        out = asdict(self)
        out["emulate"] = None if self.emulate is None else [e.to_json() for e in self.emulate]
        out["batch"] = self.batch
        return out


def run_one(
    config: RunConfig,
    *,
    telemetry=None,
    on_window: Callable[[dict], None] | None = None,
    on_step: Callable[[str | int, int, float], None] | None = None,
) -> dict:
    """Trains ``config``'s workload for its windows and returns the measured result.

    Args:
        config: what to run.
        telemetry: a started ``harness.nvml.TelemetrySampler`` for GPU devices.
        on_window: called with each finished window's dict (progress, saving).
        on_step: passed to ``harness.measure.window_callback`` (live progress).

    Returns:
        ``{"config", "status" ("complete" | "oom"), "windows", "summary", "input", "error"}``.
        Out-of-memory (real or emulated) is a result, not an exception.
    """
    import tensorflow as tf

    from harness import workloads
    from harness.measure import window_callback
    from harness.workloads import pipeline

    workload = workloads.get(config.model)
    model = _build(config, workload)
    dataset = pipeline.make_dataset(workload, config.size, config.batch, seed=config.seed,
                                    input_delay_ms=config.input_delay_ms)
    result = {"config": config.to_json(), "status": "running", "windows": [], "summary": None, "input": None,
              "error": None}

    def finished(window):
        result["windows"].append(_window_record(window, config, model.emulator, telemetry))
        if on_window is not None:
            on_window(result["windows"][-1])

    callback = window_callback(batch_size=config.batch, seconds=config.seconds, windows=config.windows,
                               warmup_steps=config.warmup_steps, on_window=finished, on_step=on_step)
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=10**9, verbose=0, callbacks=[callback], shuffle=False)
    except tf.errors.ResourceExhaustedError as err:
        result.update(status="oom", error=_oom_line(err))
        return result
    result["status"] = "complete"
    result["summary"] = _summary(result["windows"])
    rate = pipeline.measure_input_rate(dataset, config.batch, seconds=min(0.5, config.seconds))
    train = result["summary"]["samples_per_second"]["median"]
    result["input"] = {"samples_per_second": rate.samples_per_second,
                       "starved": bool(train and pipeline.is_starved(rate.samples_per_second, train))}
    return result


def _build(config: RunConfig, workload):
    from harness.parallel import parallelize

    template = workload.build(config.size, seed=config.seed)
    method = "towers" if config.method == RunMethod.SINGLE else config.method
    model = parallelize(template, list(config.devices), ratios=list(config.batches), method=method,
                        emulate=config.emulate)
    model.compile(optimizer=workload.optimizer(), loss=workload.loss())
    return model


def _source(device: str, emulator, telemetry) -> str:
    if emulator is not None and device in emulator.devices:
        return "emulated"
    if telemetry is not None and gpu_index(device) is not None:
        return "nvml"
    return "share"


def gpu_index(device: str) -> int | None:
    """The CUDA index in a GPU device name (`/device:GPU:1` -> 1), else None."""
    match = re.search(r"GPU:(\d+)$", device, re.IGNORECASE)
    return int(match.group(1)) if match else None


def _window_record(window, config: RunConfig, emulator, telemetry) -> dict:
    busy = emulator.busy_between(window.start, window.end) if emulator is not None else {}
    gpu_stats = telemetry.window(window.start, window.end) if telemetry is not None else {}
    devices = []
    for device, batch in zip(config.devices, config.batches):
        row = {"device": device, "batch": batch, "samples_per_second": batch * window.steps / window.seconds,
               "source": _source(device, emulator, telemetry)}
        if device in busy:
            row.update(busy_seconds=busy[device].seconds, busy_fraction=busy[device].seconds / window.seconds,
                       busy_rate=busy[device].rate)
        stats = gpu_stats.get(gpu_index(device)) if gpu_stats else None
        if stats:
            row["telemetry"] = {name: asdict(s) for name, s in stats.items()}
        devices.append(row)
    return {"index": window.index, "seconds": window.seconds, "steps": window.steps, "samples": window.samples,
            "samples_per_second": window.samples_per_second, "devices": devices}


def _summary(windows: Sequence[dict]) -> dict:
    from harness.results import summarize

    out = {"samples_per_second": summarize([w["samples_per_second"] for w in windows]), "devices": []}
    for i, first in enumerate(windows[0]["devices"] if windows else []):
        rows = [w["devices"][i] for w in windows]
        entry = {"device": first["device"], "batch": first["batch"], "source": first["source"],
                 "samples_per_second": summarize([r["samples_per_second"] for r in rows])}
        if "busy_fraction" in first:
            entry["busy_fraction"] = summarize([r["busy_fraction"] for r in rows])
            entry["busy_rate"] = summarize([r["busy_rate"] for r in rows if r["busy_rate"] is not None])
        out["devices"].append(entry)
    return out


def _oom_line(err: Exception) -> str:
    """The useful line of an out-of-memory error (TensorFlow wraps it in pages of context)."""
    text = str(getattr(err, "message", "") or err)
    match = re.search(r"emulated out of memory[^\n]*", text)
    if match:
        return match.group(0).strip()
    for line in text.splitlines():
        if "OOM" in line or "out of memory" in line.lower():
            return line.strip()
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__
