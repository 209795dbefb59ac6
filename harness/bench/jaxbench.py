"""Throughput on Keras 3's JAX backend: ``harness run --backend jax`` and ``harness compare --backend jax``.

The route of a TensorFlow run (docs/design.md) without TensorFlow: a built-in workload's model (its builder and its
NumPy data are framework-neutral) is wrapped by ``harness.parallelize`` on JAX devices (``harness.parallel.jax``,
method ``towers``: each batch cut by ratios; one device: the same wrapper on one), fed batches of the workload's
synthetic pool from memory (a Python generator, no ``tf.data``), and timed by the same window callback
(``harness.bench.measure.window_callback``: warm-up steps untimed, then windows of at least ``seconds``; a step's
end is stamped when Keras hands its logs to the host, so it follows the device work). The result has the shape of
``harness.bench.runner.run_one``'s, so the console, the records (``harness.bench.results``) and ``harness compare``'s
table and chart take it unchanged; its config says ``"backend": "jax"``.

Per-device figures are shares, as for TensorFlow's logical CPU devices: nothing measures one JAX device's busy
time here, so each device's samples/s is its rows per step x steps / the window's seconds (source ``jax share``).
JAX CPU devices of one host share its cores: their figures are overhead, not speed-up.

The stock baseline on JAX (method ``keras``) is what a user would run instead of harness: on several devices Keras'
own ``keras.distribution.DataParallel`` (the batch in even shards, one SPMD program a step), on one device plain Keras
on it (``jax.default_device``). DataParallel shards the batch evenly, so its batch is a multiple of the device count
(``stock_batches`` rounds it down and says so).

Emulated devices (``config.emulate``, ``harness.emulation``: a rate, a MAXBATCH, an overhead a step; no link) slow each
device's part of a harness step down to its rate from the host (``HostEmulator.wait_steps``: the step waits for each
device's gradient, then until the last device's emulated end). The stock rows are charged alike by a callback: each
shard of DataParallel's step (or the one device's batch) at its device's rate, from the step's start to the last
shard's end; the optimizer's update, which harness' rows run after their wait, is inside that time for Keras', so a
stock row is charged no more than harness' for the same work. Per-device figures of emulated devices are their logged
busy time (source ``emulated``), with the host-bound check of TensorFlow's emulation.

What needs TensorFlow is refused by name (``harness.errors.Refused``, reason ``jax-workload``): a user's model with
real data (``--data``, ``Workload.data``: a ``tf.data`` pipeline). Multi-worker runs are TensorFlow's; the CLI
refuses them.

Nothing here imports TensorFlow, at import or when run (tests/onjax/test_bench_jax.py runs it with TensorFlow's import
blocked); JAX and Keras are imported when a run starts, after ``select_backend`` and the devices.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import InvalidValue, Refused, Unavailable

__all__ = ["SOURCE", "STOCK", "JaxDevices", "select_backend", "gpus_possible", "setup_devices", "check_workload",
           "stock_batches", "run_one", "execute", "environment", "config_json", "out_of_memory_line"]

#: how a JAX run's per-device figures are made (``harness.bench.runner.SOURCES`` says how, for the console's legend)
SOURCE = "jax share"

#: what method ``keras`` runs on JAX, by device count (the rows' ``stock`` field)
STOCK = {"one": "plain Keras on the device", "several": "keras.distribution.DataParallel, even shards"}

_GPU_PLATFORMS = ("cuda", "gpu", "rocm")


def stock_batches(batch: int, devices: int) -> tuple[tuple[int, ...], str | None]:
    """The per-device batches of Keras' DataParallel for a global ``batch`` over ``devices``: even shards, the batch
    rounded down to a multiple of the device count, and a note saying so where it was (None where it divides).

    Raises:
        InvalidValue: fewer rows than devices (a shard would be empty).
    """
    if devices < 1 or batch < devices:
        raise InvalidValue(f"Keras' DataParallel needs a batch of at least one row per device: batch {batch} over "
                           f"{devices} device(s)")
    share = batch // devices
    note = None if share * devices == batch else (
        f"batch {batch} rounded to {share * devices}: DataParallel shards evenly, a multiple of the {devices} devices")
    return (share,) * devices, note


@dataclass(frozen=True)
class JaxDevices:
    """The devices of a JAX run: names as ``harness.parallel.jax.device_name`` gives them (``cpu:0``, ``gpu:1``),
    their kind (``logical CPU``: JAX CPU devices of one host; ``GPU``) and a note for the console."""

    devices: tuple[str, ...]
    kind: str
    note: str = ""


def select_backend() -> None:
    """Makes Keras start on JAX: sets ``KERAS_BACKEND=jax`` before Keras is imported.

    Raises:
        InvalidValue: Keras is already imported in this process with another backend (it reads the variable once).
    """
    keras = sys.modules.get("keras")
    if keras is not None:
        backend = getattr(getattr(keras, "backend", None), "backend", None)
        current = backend() if callable(backend) else "unknown"
        if current != "jax":
            raise InvalidValue(f"--backend jax: Keras is already imported in this process with the {current} backend; "
                               "set KERAS_BACKEND=jax before anything imports Keras (or run harness in a new process)")
        return
    os.environ["KERAS_BACKEND"] = "jax"


def gpus_possible() -> bool:
    """Whether JAX may find GPUs here, judged before it starts (the driver's GPUs, ``JAX_PLATFORMS``)."""
    from harness.devices import gpu_count

    platforms = [p.strip().lower() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    return gpu_count() > 0 and (not platforms or any(p in _GPU_PLATFORMS for p in platforms))


def _cpu_index(item: str) -> int | None:
    """``"2"``, ``"cpu:2"``, ``"/device:CPU:2"`` -> 2; a GPU name or anything else -> None."""
    text = item.strip().lower().removeprefix("/").removeprefix("device:")
    if text.isdigit():
        return int(text)
    if text.startswith("cpu:") and text[4:].isdigit():
        return int(text[4:])
    return None


def setup_devices(*, logical_cpus: int | None = None, devices: Sequence[str] | None = None) -> JaxDevices:
    """Starts JAX with the devices the options ask for.

    ``logical_cpus``: that many JAX CPU devices of this host (``harness.use_jax_cpu_devices``, before JAX starts).
    ``devices``: GPU ids or names (``0 1``, ``gpu:0``); without a GPU (or with ``JAX_PLATFORMS=cpu``) ids and
    ``cpu:N`` names name JAX CPU devices, as many made as the largest asks. Neither: every GPU JAX sees.

    Raises:
        InvalidValue: a bad id or name, no GPU and no device option, a GPU asked for where JAX has none.
    """
    from harness.devices import use_jax_cpu_devices

    cpu_note = (f"JAX CPU devices of one {os.cpu_count()}-core host share its cores: figures are overhead, not "
                "speed-up")
    if logical_cpus is not None:
        if isinstance(logical_cpus, bool) or not isinstance(logical_cpus, int) or logical_cpus < 1:
            raise InvalidValue(f"--logical-cpus must be >= 1; got {logical_cpus!r}")
        return JaxDevices(_names(use_jax_cpu_devices(logical_cpus)), "logical CPU", cpu_note)
    cpu_ids = [_cpu_index(d) for d in devices or ()]
    gpus_here = gpus_possible()
    named_cpus = all(i is not None and not d.strip().isdigit() for d, i in zip(devices or (), cpu_ids))
    if devices and (named_cpus or not gpus_here):  # ids name CPU devices where JAX has no GPU
        bad = next((d for d, i in zip(devices, cpu_ids) if i is None), None)
        if bad is not None:
            raise InvalidValue(f"--devices {bad}: no GPU for JAX here (JAX_PLATFORMS="
                               f"{os.environ.get('JAX_PLATFORMS')!r}); give JAX CPU device ids (0 1 ...), names "
                               "(cpu:0 cpu:1 ...) or --logical-cpus N")
        ids = [i for i in cpu_ids if i is not None]
        if len(set(ids)) != len(ids):
            raise InvalidValue(f"--devices must be distinct; got {' '.join(devices)}")
        cpus = use_jax_cpu_devices(max(ids) + 1)
        note = cpu_note if gpus_here else "no GPU here: device ids name JAX CPU devices; " + cpu_note
        return JaxDevices(_names([cpus[i] for i in ids]), "logical CPU", note)
    if not devices and not gpus_possible():
        raise InvalidValue("--backend jax without a GPU: give --logical-cpus N (N JAX CPU devices of this host), "
                           "--devices with CPU device ids, or --emulate (emulated devices)")
    import jax

    from harness.parallel.jax import resolve_jax_devices

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        raise InvalidValue("--backend jax: this JAX has no GPU backend (jax[cuda12] installs one); give "
                           "--logical-cpus N for JAX CPU devices")
    chosen = resolve_jax_devices(len(gpus) if not devices else [int(d) if d.strip().isdigit() else d.strip()
                                                                 for d in devices])
    return JaxDevices(_names(chosen), "GPU")


def _names(devices) -> tuple[str, ...]:
    from harness.parallel.jax import device_name

    return tuple(device_name(d) for d in devices)


def check_workload(model: str, data: str | None = None):
    """The workload ``model`` names, if it trains on JAX without TensorFlow.

    Raises:
        Refused: ``jax-workload``: a user's model with real data (a ``tf.data`` pipeline: ``--data`` or
            ``Workload.data``).
        InvalidValue: an unknown workload or a bad reference (``harness.bench.workloads.get``).
    """
    from harness.bench import workloads

    if data is not None:
        raise Refused("jax-workload", f"--data {data}: a model's own data goes through tf.data, which is "
                                      "TensorFlow's; on --backend jax harness trains on synthetic batches only "
                                      "(drop --data)")
    workload = workloads.get(model)
    if getattr(getattr(workload, "spec", None), "data", None) is not None:
        raise Refused("jax-workload", f"--model {model}: its Workload.data goes through tf.data, which is "
                                      "TensorFlow's; on --backend jax give a workload without data (synthetic "
                                      "batches) or run it on --backend tensorflow")
    return workload


def config_json(config) -> dict:
    """A ``RunConfig``'s JSON with ``"backend": "jax"``."""
    return {**config.to_json(), "backend": "jax"}


def environment() -> dict:
    """``harness.bench.environment.fingerprint`` without TensorFlow, with JAX's versions and devices."""
    from harness.bench.environment import fingerprint

    out = fingerprint(import_tf=False)
    out["backend"] = "jax"
    try:
        import jax
        import jaxlib

        out["jax"] = {"version": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", None),
                      "default_backend": jax.default_backend(),
                      "devices": [str(d) for d in jax.devices()]}
    except Exception as err:  # noqa: BLE001  a fingerprint never fails: what could not be found is a note
        out["notes"].append(f"JAX could not be described: {type(err).__name__}: {err}")
    return out


def _batches(workload, config) -> tuple[Iterator[tuple[Any, Any]], Callable[[], Iterator[tuple[Any, Any]]]]:
    """The training batches (an endless generator over the workload's synthetic pool, ``input_delay_ms`` per batch)
    and a maker of another such generator (to time the input alone)."""
    from harness.bench.workloads.pipeline import default_pool_size

    batch = config.batch
    samples = default_pool_size(workload, config.size, batch)
    samples -= samples % batch  # whole batches only: every step sees the same batch size
    x, y = workload.make_data(config.size, samples, seed=config.seed)
    count = samples // batch
    pool = [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(count)]
    delay = config.input_delay_ms / 1000

    def generate():
        for item in itertools.cycle(pool):
            if delay:
                time.sleep(delay)
            yield item

    return generate(), generate


def _window_record(window, config, emulator=None, batches=None) -> dict:
    if emulator is not None:  # TensorFlow's record of emulated devices; a device not emulated is a share here too
        from harness.bench.runner import window_record

        record = window_record(window, config, emulator, None, batches)
        for row in record["devices"]:
            if row["source"] == "share":
                row["source"] = SOURCE
        return record
    devices = [{"device": device, "batch": batch, "samples_per_second": batch * window.steps / window.seconds,
                "source": SOURCE} for device, batch in zip(config.devices, config.batches)]
    return {"index": window.index, "seconds": window.seconds, "steps": window.steps, "samples": window.samples,
            "samples_per_second": window.samples_per_second, "devices": devices, "host_bound": []}


def out_of_memory_line(err: BaseException) -> str | None:
    """The line of an XLA out-of-memory error (or an emulated device's, ``MemoryError``), else None."""
    if isinstance(err, MemoryError):
        return str(err)[:300]
    text = str(err)
    if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
        return None
    line = next((line for line in text.splitlines() if "RESOURCE_EXHAUSTED" in line or "memory" in line.lower()),
                text)
    return line.strip()[:300]


def run_one(config, *, on_window: Callable[[dict], None] | None = None,
            on_step: Callable[[str | int, int, float], None] | None = None, check_input: bool = True) -> dict:
    """Trains ``config``'s workload on its JAX devices for its windows (``harness.bench.runner.run_one`` on JAX).

    Args:
        config: a ``harness.bench.runner.RunConfig`` whose ``devices`` are JAX device names (``cpu:0``, ``gpu:1``;
            ``setup_devices``), method ``single`` (one device), ``towers`` or ``keras`` (the stock baseline:
            ``STOCK``; several devices need even ``batches``: ``stock_batches``); its ``batches`` are the split.
        on_window: called with each finished window's record.
        on_step: ``harness.bench.measure.window_callback``'s progress hook.
        check_input: also time the batches alone (``result["input"]``).

    Returns:
        ``{"config" (with "backend": "jax"), "status" ("complete" | "oom"), "windows", "summary", "input",
        "error"}``, and for method ``keras`` ``"stock"``: what ran (``STOCK``), and ``"weights_on"``: the devices
        that hold the model's first weight after training (DataParallel's mesh, or the one device).

    Raises:
        Refused: a workload or model the JAX path cannot train (``jax-workload``, ``jax-batchnorm``, ...), a method
            other than single, towers and keras (``jax-method``).
        Unavailable: Keras does not run on JAX in this process (``select_backend`` came too late).
    """
    import keras

    from harness.bench.runner import summarize_windows
    from harness.bench.workloads.pipeline import is_starved, measure_input_rate
    from harness.parallel import parallelize
    from harness.parallel.jax import device_name

    if keras.backend.backend() != "jax":
        raise Unavailable(f"Keras runs on {keras.backend.backend()} in this process; a JAX run needs "
                          "KERAS_BACKEND=jax before Keras is imported (harness.bench.jaxbench.select_backend)")
    if config.method not in ("single", "towers", "keras"):
        raise Refused("jax-method", f"method {config.method!r} is TensorFlow's; on Keras' JAX backend harness runs "
                                    "'towers' (several devices), 'single' (one) and the stock baseline 'keras' "
                                    "(Keras' DataParallel)")
    workload = check_workload(config.model, config.data)
    batches, more = _batches(workload, config)
    result: dict[str, Any] = {"config": config_json(config), "status": "running", "windows": [], "summary": None,
                              "input": None, "error": None}
    with _stock_scope(config) as stock:
        if stock is not None:
            result["stock"] = stock
        template = workload.build(config.size, seed=config.seed)
        if stock is not None:
            model, emulator = template, _stock_emulator(config)
        else:
            model = parallelize(template, list(config.devices), ratios=list(config.batches), method="towers",
                                emulate=config.emulate)
            emulator = model.emulator
        model.compile(**workload.compile_args(template))
        _fit(model, batches, config, result, on_window, on_step, emulator, stock is not None)
        if stock is not None:  # where Keras put the weights: every device of DataParallel's mesh, or the one
            value = model.trainable_weights[0].value
            result["weights_on"] = sorted(device_name(d) for d in value.devices())
    if result["status"] != "complete":
        return result
    result["summary"] = summarize_windows(result["windows"])
    if not check_input:
        return result
    rate = measure_input_rate(more(), config.batch, seconds=min(0.5, config.seconds))
    train = result["summary"]["samples_per_second"]["median"]
    result["input"] = {"samples_per_second": rate.samples_per_second,
                       "starved": bool(train and is_starved(rate.samples_per_second, train))}
    return result


@contextlib.contextmanager
def _stock_scope(config) -> Iterator[str | None]:
    """For method ``keras``: Keras' DataParallel over the devices (several), or the one device made JAX's default,
    while the model is built and trained; yields what runs (``STOCK``), None for harness' methods.

    Raises:
        InvalidValue: DataParallel's shards are not even (``stock_batches`` makes them so).
    """
    if config.method != "keras":
        yield None
        return
    import jax
    import keras

    from harness.parallel.jax import resolve_jax_devices

    devices = resolve_jax_devices(list(config.devices))
    if len(devices) == 1:
        with jax.default_device(devices[0]):
            yield STOCK["one"]
        return
    if len(set(config.batches)) != 1:
        raise InvalidValue(f"Keras' DataParallel shards the batch evenly; got batches {list(config.batches)} "
                           "(harness.bench.jaxbench.stock_batches)")
    distribution = keras.distribution.DataParallel(devices=list(devices))
    with distribution.scope():
        yield STOCK["several"]


def _stock_emulator(config):
    """The ``HostEmulator`` of a stock row's emulated devices (None: not emulated), keyed by the config's names."""
    if config.emulate is None:
        return None
    from harness.emulation import emulator_for

    return emulator_for(config.emulate, list(config.devices))


def _charged_alike(emulator, config, keras):
    """A callback that charges a stock step as harness' rows are charged: each device's shard (``config.batches``)
    at its emulated rate from the step's start (``HostEmulator.wait_steps``), once the step's logs are ready; an
    emulated MAXBATCH a shard exceeds raises ``MemoryError`` before the step."""
    import jax

    for device, rows in zip(config.devices, config.batches):
        emulator.check_fits(device, rows)

    class _Charged(keras.callbacks.Callback):
        started = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            emulator.wait_steps(self.started, [(device, rows, lambda: jax.block_until_ready(logs))
                                               for device, rows in zip(config.devices, config.batches)])

    return _Charged()


def _fit(model, batches, config, result: dict, on_window, on_step, emulator=None, stock: bool = False) -> None:
    """Trains ``model`` on ``batches`` for ``config``'s windows, each finished window into ``result``; an XLA out of
    memory (or an emulated one) ends it as ``"oom"`` with its line, anything else is raised. With ``emulator`` the
    warm-up steps skip their emulated waits (``harness.bench.runner.untimed_steps``), and a ``stock`` model's steps
    are charged by ``_charged_alike``."""
    import keras

    from harness.bench.measure import window_callback
    from harness.bench.runner import current_batches, extra_callbacks, untimed_steps

    extra = extra_callbacks(config, model, keras)  # --throttle, --rebalance (TensorFlow's runner's, alike)
    history = extra[-1].history if config.rebalance_every is not None else None
    if history is not None:
        result["rebalance"] = history

    def finished(window):
        record = _window_record(window, config, emulator, current_batches(config, model))
        if history is not None:
            seen = sum(len(w["resplits"]) for w in result["windows"])
            record.update(ratios=list(model.ratios), resplits=[e for e in history if e["resplit"]][seen:])
        result["windows"].append(record)
        if on_window is not None:
            on_window(result["windows"][-1])

    callback = window_callback(batch_size=config.batch, seconds=config.seconds, windows=config.windows,
                               warmup_steps=config.warmup_steps, on_window=finished, on_step=on_step)
    callbacks = [*extra, callback]
    try:
        if emulator is not None:  # before the window's callback: a step's wait ends before its stamp
            if history is None:  # a rebalancer reads every step's
                callbacks[:0] = [untimed_steps(emulator, config.warmup_steps, keras)]
            if stock:
                callbacks[:0] = [_charged_alike(emulator, config, keras)]
        model.fit(batches, epochs=1, steps_per_epoch=10**9, verbose=0, callbacks=callbacks, shuffle=False)
    except Exception as err:
        line = out_of_memory_line(err)
        if line is None:
            raise
        result.update(status="oom", error=line)
        return
    finally:
        if emulator is not None:
            emulator.waiting = True
    result["status"] = "complete"


def execute(config, out, prefix: str = "", compact: bool = False) -> dict:
    """``run_one`` with progress and the record rewritten after each window (``harness.bench.console.execute``
    running this module's ``run_one``): ``out`` is the command's ``harness.bench.console.Output``."""
    from harness.bench.console import execute as run_with_progress

    return run_with_progress(config, None, out, prefix, compact, run=run_one)
