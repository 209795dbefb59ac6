"""One throughput run: config -> workload -> parallel model -> timed windows -> result.

``harness run`` makes one run, ``harness compare`` several in one process, asv
and the tuner call ``run_one`` too, so a samples/s figure means the same thing
everywhere. Per-device figures are measured where the machine can measure them:
emulated devices report their busy time, GPUs their NVML telemetry; logical CPU
devices have no per-device measurement and say so.
"""

from __future__ import annotations

import gc
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.bench.runspec import METHODS, RunHead, RunMethod, RunSpec
from harness.errors import InvalidValue, Refused

__all__ = ["RunMethod", "RunConfig", "run_one", "train_windows", "build_model", "gpu_index", "host_bound", "SOURCES"]

# How a device row's figures are derived. samples/s is the device's batch x the window's steps / the window's
# seconds for every source (its logged samples where rebalancing changed the split): no source measures it.
SOURCES = {
    "emulated": "emulated device: busy and busy sps from its own busy time (begin/end of its slice); samples/s "
                "= batch x steps / window seconds",
    "nvml": "GPU: util, memory, power, temperature and clock from NVML at 10 Hz; samples/s = batch x steps / "
            "window seconds (not measured per GPU)",
    "share": "logical CPU, no per-device measurement: samples/s = batch x steps / window seconds",
    "jax share": "JAX device, no per-device measurement: its share of the total, samples/s = rows per step x steps "
                 "/ window seconds (harness.bench.jaxbench)",
    "emulated, modelled link": "emulated device on an emulated link: as emulated, and its transfers are the link "
                               "model's sleeps (latency + bytes / bandwidth; with the overlap, the forward pass taken "
                               "as a third of the compute, an assumption): its figures are modelled, not measured",
}


@dataclass(frozen=True)
class _OnDevices(RunHead):
    """Where a ``RunConfig`` runs, after model, size and method (``harness.bench.runspec``: field order)."""

    devices: tuple[str, ...]


@dataclass(frozen=True)
class RunConfig(RunSpec, _OnDevices):
    """What one run trains (``RunSpec``: model, batches, timing, emulation, rebalancing...), on which named devices.

    ``RunConfig(model, size, method, devices, batches, seconds=..., ...)``: ``devices`` are TensorFlow device
    names, one per batch (and emulated device); ``label`` names the run. ``RunSpec`` documents the rest.
    """

    label: str = ""

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        super().__post_init__()

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field."""
        from harness.bench import workloads

        workloads.get(self.model, self.data)
        workloads.check_size(self.size)
        if self.method not in METHODS:
            raise InvalidValue(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if not self.devices:
            raise InvalidValue("a run needs at least one device")
        if self.method == RunMethod.SINGLE and len(self.devices) != 1:
            raise InvalidValue(f"method 'single' runs on exactly one device; got {len(self.devices)}: {self.devices}")
        if len(self.batches) != len(self.devices):
            raise InvalidValue(
                f"need one batch size per device: {len(self.devices)} devices {list(self.devices)} but "
                f"{len(self.batches)} batches {list(self.batches)}"
            )
        if self.emulate is not None and len(self.emulate) != len(self.devices):
            raise InvalidValue(
                f"need one emulated device per device: {len(self.devices)} devices but {len(self.emulate)} "
                f"--emulate entries"
            )
        super().validate()

    def to_json(self) -> dict:
        return {**super().to_json(), "batch": self.batch}


def run_one(
    config: RunConfig,
    *,
    telemetry=None,
    on_window: Callable[[dict], None] | None = None,
    on_step: Callable[[str | int, int, float], None] | None = None,
    check_input: bool = True,
) -> dict:
    """Trains ``config``'s workload for its windows and returns the measured result.

    Args:
        config: what to run.
        telemetry: a started ``harness.bench.nvml.TelemetrySampler`` for GPU devices.
        on_window: called with each finished window's dict (progress, saving).
        on_step: passed to ``harness.bench.measure.window_callback`` (live progress).
        check_input: also time the input pipeline alone (``result["input"]``: is training starved?); the
            tuner's verification, which reads only samples/s, leaves it out (None).

    Returns:
        ``{"config", "status" ("complete" | "oom" | "refused"), "windows", "summary", "input", "error"}``,
        plus ``"rebalance"`` (``Rebalance.history``) when rebalancing.
        Out-of-memory (real or emulated) is a result, not an exception; so is a refusal of the stock
        baseline (method ``keras``: ``harness.bench.stock``, a model it cannot emulate).
        ``summary["host_bound"]`` lists the emulated devices this host could
        not slow down to their rates (``host_bound(result)``): their figures
        are the host's speed, not the emulation's.
    """
    from harness.bench import workloads

    workload = workloads.get(config.model, config.data)
    try:
        model = build_model(config, workload)
    except Refused as err:  # the stock baseline's refusal is its row's result (harness' own raise)
        if config.method != RunMethod.KERAS:
            raise
        return {"config": config.to_json(), "status": "refused", "windows": [], "summary": None, "input": None,
                "error": str(err)}
    return train_windows(config, model, workload, telemetry=telemetry, on_window=on_window, on_step=on_step,
                         check_input=check_input)


def train_windows(
    config: RunConfig,
    model,
    workload=None,
    *,
    telemetry=None,
    on_window: Callable[[dict], None] | None = None,
    on_step: Callable[[str | int, int, float], None] | None = None,
    windows_callback: Callable[..., Any] | None = None,
    measured: Sequence[str] | None = None,
    input_options=None,
    check_input: bool = True,
) -> dict:
    """``run_one`` on a model already built and compiled for ``config`` (``build_model``, or a cluster's).

    Args:
        windows_callback: makes the callback that cuts training into windows, with
            ``harness.bench.measure.window_callback``'s keyword arguments (the default); a cluster's
            workers pass one that cuts every worker's windows at the same steps.
        measured: the devices this process measures (default: all of ``config.devices``); a cluster
            worker measures its own, and its window records list only them.
        input_options: a ``tf.data.Options`` for the workload's dataset (default none): the stock baseline
            across workers sets its auto-shard policy there.
        check_input: time the input pipeline alone after training (``run_one``).

    The callbacks are of the model's Keras (``harness.compat.keras_module_of``): a Keras 2 (``tf_keras``)
    model's ``fit`` takes only its own.
    """
    import tensorflow as tf

    from harness.bench import workloads
    from harness.bench.measure import window_callback
    from harness.bench.workloads import pipeline
    from harness.compat import keras_module_of

    workload = workloads.get(config.model, config.data) if workload is None else workload
    emulator = getattr(model, "emulator", None)  # a stock Keras model (method 'keras') has none
    k = keras_module_of(model)
    dataset = pipeline.make_dataset(workload, config.size, config.batch, seed=config.seed,
                                    input_delay_ms=config.input_delay_ms)
    if input_options is not None:
        dataset = dataset.with_options(input_options)
    result: dict[str, Any] = {"config": config.to_json(), "status": "running", "windows": [], "summary": None,
                              "input": None, "error": None}
    extra = extra_callbacks(config, model, k)
    history = extra[-1].history if config.rebalance_every is not None else None
    if history is not None:
        result["rebalance"] = history

    def finished(window):
        record = window_record(window, config, emulator, telemetry, current_batches(config, model), measured)
        if history is not None:
            seen = sum(len(w["resplits"]) for w in result["windows"])
            record.update(ratios=list(model.ratios), resplits=[e for e in history if e["resplit"]][seen:])
        result["windows"].append(record)
        if on_window is not None:
            on_window(result["windows"][-1])

    callback = (windows_callback or window_callback)(
        batch_size=config.batch, seconds=config.seconds, windows=config.windows, warmup_steps=config.warmup_steps,
        on_window=finished, on_step=on_step, keras_module=k)
    # The warm-up steps skip their emulated waits (Emulator.steps_to_skip): nothing times them. A rebalancer reads
    # every step's.
    skip = 0 if emulator is None or history is not None else emulator.steps_to_skip(config.warmup_steps)
    untimed = [untimed_steps(emulator, skip, k)] if skip else []
    try:
        with _placement(config):
            model.fit(dataset, epochs=1, steps_per_epoch=10**9, verbose=0, callbacks=[*untimed, *extra, callback],
                      shuffle=False)
    except tf.errors.ResourceExhaustedError as err:
        result.update(status="oom", error=_oom_line(err))
        return result
    finally:
        if emulator is not None:
            emulator.waiting = True
        if config.method == RunMethod.KERAS:
            # Keras' fit under a MirroredStrategy leaves its distributed input (a MultiDeviceIterator) in a
            # reference cycle: collected here, outside every window, it takes a fraction of a second; left to the
            # collector, its destruction held a later traced step 20-40 s in the test suite (tests/conftest.py).
            gc.collect()
    result["status"] = "complete"
    result["summary"] = summarize_windows(result["windows"])
    if not check_input:
        return result
    rate = pipeline.measure_input_rate(dataset, config.batch, seconds=min(0.5, config.seconds))
    train = result["summary"]["samples_per_second"]["median"]
    result["input"] = {"samples_per_second": rate.samples_per_second,
                       "starved": bool(train and pipeline.is_starved(rate.samples_per_second, train))}
    return result


def build_model(config: RunConfig, workload=None, *, cluster=None, strategy=None, keras_module=None):
    """``config``'s model, parallelized and compiled as ``run_one`` trains it (asv's step timings use it too).

    Args:
        config: what to build: model, size, method, devices, batches (the split ratios), emulated devices.
        workload: ``harness.bench.workloads.get(config.model, config.data)``, if already looked up.
        cluster: across workers, the ``harness.use_cluster()`` cluster (``config.devices`` are its devices).
        strategy: the stock baseline's strategy (method 'keras'), e.g. a stock ``MultiWorkerMirroredStrategy``
            across workers; default: a stock MirroredStrategy over ``config.devices`` (or none on one).
        keras_module: the Keras module the stock baseline (method 'keras') builds and trains in (default
            ``keras``; ``tf_keras`` across workers); harness' methods train Keras 3 models only.

    Raises:
        ValueError: ``keras_module`` with one of harness' methods.
    """
    from harness.bench import workloads
    from harness.parallel import parallelize

    workload = workloads.get(config.model, config.data) if workload is None else workload
    if config.method == RunMethod.KERAS:
        return _stock_model(config, workload, strategy, keras_module)
    if keras_module is not None:
        raise InvalidValue(f"keras_module is the stock baseline's (method 'keras'); method {config.method!r} builds "
                           "with keras")
    template = workload.build(config.size, seed=config.seed)
    compile_args = workload.compile_args(template)  # a user's model: its own compiled loss, optimizer, metrics
    method = "towers" if config.method == RunMethod.SINGLE else config.method
    model = parallelize(template, list(config.devices) if cluster is None else cluster, ratios=list(config.batches),
                        method=method, emulate=config.emulate, overlap=config.overlap)
    model.compile(**compile_args)
    return model


def _placement(config: RunConfig):
    """Where a stock model on one device runs its step (Keras places it itself otherwise)."""
    import contextlib

    import tensorflow as tf

    if config.method == RunMethod.KERAS and len(config.devices) == 1:
        return tf.device(config.devices[0])
    return contextlib.nullcontext()


def _stock_model(config: RunConfig, workload, strategy=None, keras_module=None):
    """The stock baseline (``harness.bench.stock``): the workload's model as Keras trains it, no harness in its step."""
    from harness.bench.stock import stock_model
    from harness.emulate import emulator_for

    k = keras_module
    built: dict = {}

    def build():  # in the strategy's scope: the workload's optimizer is made there
        model = built["model"] = workload.build(config.size, seed=config.seed, keras_module=k)
        return model

    def compile_model(model):  # the model itself, or its emulated wrapper
        model.compile(**workload.compile_args(built["model"], k))

    return stock_model(build, compile_model, config.devices, emulator_for(config.emulate, config.devices),
                       strategy=strategy)


def extra_callbacks(config: RunConfig, model, keras_module) -> list:
    """The throttle and rebalance callbacks a config asks for (the rebalancer last), of the model's Keras."""
    callbacks = []
    if config.throttle:
        callbacks.append(_throttle_callback(config, model, keras_module))
    if config.rebalance_every is not None:
        from harness.parallel.rebalance import Rebalance

        callbacks.append(Rebalance(every=config.rebalance_every))
    return callbacks


def untimed_steps(emulator, steps: int, keras):
    """A callback of ``keras`` for which ``emulator``'s first ``steps`` steps skip their waits
    (``harness.emulate.Emulator.waiting``): it waits again from the step after them."""
    emulator.waiting = False

    class _Untimed(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen >= steps:
                emulator.waiting = True

    return _Untimed()


def _throttle_callback(config: RunConfig, model, keras):
    pending = sorted(config.throttle, key=lambda entry: entry[2])

    class _Throttle(keras.callbacks.Callback):
        """Sets emulated rates before the configured training steps."""

        def __init__(self):
            super().__init__()
            self.step = 0

        def on_train_batch_begin(self, batch, logs=None):
            while pending and pending[0][2] <= self.step:
                index, rate, _ = pending.pop(0)
                model.emulator.set_rate(config.devices[index], rate)

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1

    return _Throttle()


def current_batches(config: RunConfig, model) -> tuple[int, ...]:
    """The per-device batches now: the configured ones, or the rebalancer's latest split."""
    if config.rebalance_every is None:
        return config.batches
    from harness.split import split_batch

    return split_batch(config.batch, model.ratios)


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


def window_record(window, config: RunConfig, emulator, telemetry, batches: Sequence[int] | None = None,
                   measured: Sequence[str] | None = None) -> dict:
    """One window's figures; ``batches``: the devices' batches at its end (default: the config's); ``measured``:
    the devices it lists (default: all).

    When the batches changed during the window (rebalancing), a device's
    samples/s counts the samples its logged steps did, not batch x steps.
    Emulated devices also report the real work behind their busy time: how many
    steps ran past their emulated deadline and the rate this host computed them
    at; ``host_bound`` lists the devices whose figures are the host's speed.
    """
    busy = emulator.busy_between(window.start, window.end) if emulator is not None else {}
    gpu_stats = telemetry.window(window.start, window.end) if telemetry is not None else {}
    moving = batches is not None and config.rebalance_every is not None
    devices = []
    for device, batch in zip(config.devices, config.batches if batches is None else batches):
        if measured is not None and device not in measured:
            continue
        samples = busy[device].samples if moving and device in busy else batch * window.steps
        row = {"device": device, "batch": batch, "samples_per_second": samples / window.seconds,
               "source": _source(device, emulator, telemetry)}
        if device in busy:
            row.update(busy_seconds=busy[device].seconds, busy_fraction=busy[device].seconds / window.seconds,
                       busy_rate=busy[device].rate)
        if row["source"] == "emulated":  # (its link, if any, below: "emulated, modelled link")
            # rows_per_step: the rows the device's slices held, as it received them (how the input was split)
            row.update(emulated_rate=emulator.devices[device].rate, logged_steps=busy[device].steps,
                       rows_per_step=busy[device].samples / busy[device].steps if busy[device].steps else None,
                       late_steps=busy[device].late_steps, host_rate=busy[device].host_rate,
                       host_bound=busy[device].host_bound)
            if emulator.devices[device].link is not None:  # what crossed its link, and the share of its busy time
                b = busy[device]
                row.update(source="emulated, modelled link", link=emulator.devices[device].link.to_json(),
                           moved_bytes_per_step=b.moved_bytes / b.steps if b.steps else None,
                           link_fraction=b.link_seconds / b.seconds if b.seconds > 0 else None)
        stats = gpu_stats.get(gpu_index(device)) if gpu_stats else None
        if stats:
            row["telemetry"] = {name: asdict(s) for name, s in stats.items()}
        devices.append(row)
    return {"index": window.index, "seconds": window.seconds, "steps": window.steps, "samples": window.samples,
            "samples_per_second": window.samples_per_second, "devices": devices,
            "host_bound": [d["device"] for d in devices if d.get("host_bound")]}


def summarize_windows(windows: Sequence[dict]) -> dict:
    """A run's summary from its window records: samples/s overall and per device (median and spread), the
    emulated devices' busy, host and link figures where the windows have them, the host-bound devices."""
    from harness.bench.results import summarize

    out: dict[str, Any] = {"samples_per_second": summarize([w["samples_per_second"] for w in windows]), "devices": []}
    for i, first in enumerate(windows[0]["devices"] if windows else []):
        rows = [w["devices"][i] for w in windows]
        # The last window's batch: the split a rebalanced run ended on (the same throughout otherwise).
        entry = {"device": first["device"], "batch": rows[-1]["batch"], "source": first["source"],
                 "samples_per_second": summarize([r["samples_per_second"] for r in rows])}
        if "busy_fraction" in first:
            entry["busy_fraction"] = summarize([r["busy_fraction"] for r in rows])
            entry["busy_rate"] = summarize([r["busy_rate"] for r in rows if r["busy_rate"] is not None])
        if "late_steps" in first:
            entry.update(_host_figures(rows))
        if "link" in first:
            entry.update(link=first["link"], moved_bytes_per_step=summarize(
                [r["moved_bytes_per_step"] for r in rows if r["moved_bytes_per_step"] is not None]),
                link_fraction=summarize([r["link_fraction"] for r in rows if r["link_fraction"] is not None]))
        out["devices"].append(entry)
    out["host_bound"] = [{"device": d["device"], "emulated_rate": d["emulated_rate"], "host_rate": d["host_rate"],
                          "late_share": d["late_share"]} for d in out["devices"] if d.get("host_bound")]
    return out


def _host_figures(rows: Sequence[dict]) -> dict:
    """An emulated device's steps over all windows: late share, the host's rate, host-bound or not."""
    from harness.emulate import HOST_BOUND_SHARE

    steps = sum(r["logged_steps"] for r in rows)
    late = sum(r["late_steps"] for r in rows) / steps if steps else 0.0
    rates = [r["host_rate"] for r in rows if r["host_rate"] is not None]
    return {"emulated_rate": rows[-1]["emulated_rate"], "late_share": late,
            "host_rate": statistics.median(rates) if rates else None, "host_bound": late > HOST_BOUND_SHARE}


def host_bound(result: dict) -> list[dict]:
    """The host-bound devices of a ``run_one`` result (empty when its figures are the emulation's)."""
    return list((result.get("summary") or {}).get("host_bound") or ())


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
