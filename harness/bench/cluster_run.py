"""One throughput run across the workers of a loopback cluster (``harness run --workers N``).

The parent (``launch_run``) starts N local workers with ``harness.launch.launch``; each runs
``python -m harness run`` in worker mode: ``WORKER_VARIABLE`` holds the run's ``ClusterPlan``
as JSON, resolved once by the parent (model, method, devices per worker, per-device batches,
emulated devices, timings). A worker (``run_worker``):

1. joins the cluster first, before other TensorFlow work: ``harness.use_cluster`` for harness'
   model (method ``mirrored``), a stock ``tf.distribute.MultiWorkerMirroredStrategy`` for the
   stock baseline (method ``keras``: one replica per worker, its even split, no harness in
   the step);
2. builds the workload's model over every device of the cluster, worker by worker
   (``harness.bench.runner.build_model``), each worker emulating its own devices;
3. trains it on the same global batches as every other worker, in timed windows cut at the
   same steps on every worker (``harness.bench.measure.lockstep_windows``: a worker that
   stopped a step early would leave the others waiting in a collective), and measures its
   own devices (``harness.bench.runner.train_windows``);
4. prints one line per event for the parent, ``MARK`` and JSON: ``start`` (the chief adds the
   run's config and its environment fingerprint), each ``window`` (its own devices' figures),
   and ``end`` (status, error, input rate).

The parent reads those lines (``Collector``, the launch's ``out``), merges each window of all
workers into one (``merge_window``: every device, and each worker's samples/s: its rows per
step over its step time; the total is the chief's) and builds the run's result
(``cluster_result``) from the chief's, with per-worker figures. Other worker output is passed
on, prefixed ``[worker i]``. A failing worker ends the run (the launch stops the others) and
the result names it.

The stock baseline is Keras 2's: the workload built with ``tf_keras`` (``stock_keras``) and
trained by tf_keras' own ``fit``, because Keras 3's ``fit`` cannot run under a stock
``MultiWorkerMirroredStrategy`` (keras-team/keras#20585: Keras 3.15.1 reduces the first batch's
PerReplica values and each step's scalar logs across workers, which the strategy refuses), and
users who train across workers today do it with tf_keras. Its input is tf_keras' own: ``fit``
distributes the dataset of global batches with the strategy (``stock_input_text``), so each
step takes one global batch of the run's size, split evenly over the workers' replicas; the
dataset's auto-shard policy is set to DATA (what TensorFlow's AUTO falls back to for an
in-memory dataset, without its warning). Without tf_keras the run is refused, with the reason
(``stock_refusal_text``).

Framework-neutral at import: TensorFlow is imported by the worker's functions only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, cast

from harness.bench.runspec import RunHead, RunSpec
from harness.cluster import worker_slice
from harness.errors import Failed, InvalidValue, Unavailable

__all__ = ["WORKER_VARIABLE", "MARK", "ClusterPlan", "task_device", "run_worker", "Collector", "merge_window",
           "cluster_result", "launch_run", "CLUSTER_METHODS", "one_line", "STOCK_REFUSED", "STOCK_ISSUE",
           "stock_keras", "stock_keras_name", "stock_note", "stock_input_text", "stock_refusal_text"]

WORKER_VARIABLE = "HARNESS_RUN_WORKER"  # set by the parent: this process is a worker of `harness run --workers`
MARK = "HARNESS-RUN "  # a worker's line for the parent: MARK + JSON
STOCK_REFUSED = "does not run under a stock MultiWorkerMirroredStrategy"  # in stock_refusal_text
STOCK_ISSUE = "keras-team/keras#20585"  # Keras 3's fit under a stock MultiWorkerMirroredStrategy
CLUSTER_METHODS = ("mirrored", "keras")  # harness' model across workers; the stock MultiWorkerMirroredStrategy


@dataclass(frozen=True)
class _OnWorkers(RunHead):
    """Where a ``ClusterPlan`` runs, after model, size and method (``harness.bench.runspec``: field order)."""

    counts: tuple[int, ...]


@dataclass(frozen=True)
class ClusterPlan(RunSpec, _OnWorkers):
    """What every worker of a cluster run trains: a run's spec (``RunSpec``) on the workers' devices, by count.

    A ``RunConfig`` without device names, known before TensorFlow: ``ClusterPlan.from_spec(config, counts=...)``
    in the parent, ``RunConfig.from_spec(plan, devices=...)`` on each worker. ``counts`` are the workers'
    device counts; ``batches`` and ``emulate`` have one entry per device of the cluster, worker 0's first.
    ``kind`` is ``"CPU"`` (logical CPU devices, emulated or not) or ``"GPU"`` (each worker sees its own GPUs:
    ``gpu_blocks``); ``timeout_s`` is how long a collective waits for a peer; ``probe_steps`` are the untimed steps
    after the warm-up whose mean time sets the windows' length in steps (``harness.bench.measure.lockstep_windows``).
    ``rebalance_every``: every worker re-splits alike.
    """

    kind: str = "CPU"
    timeout_s: float = 60.0
    probe_steps: int = 3

    def __post_init__(self):
        object.__setattr__(self, "counts", tuple(self.counts))
        super().__post_init__()

    @property
    def workers(self) -> int:
        return len(self.counts)

    def worker_slice(self, worker: int) -> slice:
        """Where worker ``worker``'s devices sit in ``batches`` and ``emulate`` (``harness.cluster.worker_slice``)."""
        return worker_slice(self.counts, worker)

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field.

        No workload is looked up here (a user's model would be imported): a worker reads its plan before it
        joins the cluster, its first TensorFlow work.
        """
        if self.method not in CLUSTER_METHODS:
            raise InvalidValue(f"across workers the method is {' or '.join(CLUSTER_METHODS)}; got {self.method!r}")
        if not self.counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.counts):
            raise InvalidValue(f"each worker needs an int >= 1 devices; got devices per worker {list(self.counts)}")
        if self.method == "keras" and max(self.counts) > 1:
            several = [w for w, c in enumerate(self.counts) if c > 1]
            raise InvalidValue(
                f"the stock baseline across workers (method 'keras') is Keras 2's fit under a stock "
                f"MultiWorkerMirroredStrategy: one replica per worker, so one device per worker; got devices per "
                f"worker {list(self.counts)} (worker {', '.join(map(str, several))} with several)")
        devices = sum(self.counts)
        if len(self.batches) != devices:
            raise InvalidValue(f"need one batch per device of the cluster ({devices}: {list(self.counts)} per worker); "
                               f"got {len(self.batches)} batches {list(self.batches)}")
        if self.emulate is not None and len(self.emulate) != devices:
            raise InvalidValue(f"need one emulated device per device of the cluster ({devices}: {list(self.counts)} "
                               f"per worker); got {len(self.emulate)}")
        if self.kind not in ("CPU", "GPU"):
            raise InvalidValue(f"kind must be 'CPU' or 'GPU'; got {self.kind!r}")
        if not self.timeout_s > 0:
            raise InvalidValue(f"timeout_s must be > 0; got {self.timeout_s!r}")
        super().validate()  # model and size too are checked where a RunConfig is made: cluster_plan, each worker

    def gpu_blocks(self) -> list[str]:
        """Each worker's ``CUDA_VISIBLE_DEVICES``: consecutive GPU ids, as many as its device count."""
        starts = [sum(self.counts[:w]) for w in range(self.workers)]
        return [",".join(str(s + i) for i in range(c)) for s, c in zip(starts, self.counts)]

    def to_json(self) -> dict:
        """``RunSpec.to_json``, with throttle entries as ``[device, rate, at_step]`` lists (a plan's as always)."""
        return {**super().to_json(), "throttle": [list(t) for t in self.throttle]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterPlan:
        return cls(**data)


def task_device(worker: int, index: int, kind: str = "CPU") -> str:
    """The name of worker ``worker``'s device ``index`` in a cluster, as the strategies name it."""
    return f"/job:worker/replica:0/task:{worker}/device:{kind}:{index}"


# -- the worker --------------------------------------------------------------------------------------------------

def one_line(err: BaseException) -> str:
    """``Type: message`` on one line; of TensorFlow's "in user code:" pages, the last line (the error itself)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return f"{type(err).__name__}: {lines[-1] if lines[0].endswith(':') and len(lines) > 1 else lines[0]}"


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def stock_keras_name() -> str | None:
    """The Keras 2 module the stock baseline across workers trains with, found without importing it: ``"keras"``
    where the keras package is Keras 2 (TensorFlow <= 2.15), else ``"tf_keras"`` where it is installed, else None."""
    import importlib.util

    keras = _package_version("keras")
    if keras is not None and keras.split(".")[0] == "2":
        return "keras"
    return "tf_keras" if importlib.util.find_spec("tf_keras") is not None else None


def _stock_keras_text(name: str | None) -> str:
    if name == "keras":
        return f"keras {_package_version('keras')} (Keras 2)"
    return f"tf_keras {_package_version('tf-keras') or _package_version('tf_keras') or '?'} (Keras 2)"


def stock_keras():
    """The Keras 2 module of the stock baseline across workers (``stock_keras_name``), imported.

    Raises:
        RuntimeError: ``stock_refusal_text()``: no Keras 2 here.
    """
    import importlib

    name = stock_keras_name()
    if name is None:
        raise Unavailable(stock_refusal_text())
    return importlib.import_module(name)


def stock_note() -> str:
    """One line: the stock baseline across workers is Keras 2's ``fit``, and why (the parent prints it)."""
    name, keras = stock_keras_name(), _package_version("keras")
    what = (f"the stock baseline across workers is {_stock_keras_text(name)} fit under a stock "
            "MultiWorkerMirroredStrategy")
    return what if name == "keras" else f"{what}: Keras {keras or '3'}'s fit {STOCK_REFUSED} ({STOCK_ISSUE})"


def stock_input_text(batches: Sequence[int]) -> str:
    """How the stock baseline across workers feeds its global batch (``batches``: the workers' even shares)."""
    batch = sum(batches)
    return (f"input: Keras 2's fit distributes the dataset of global batches ({batch} rows) with the strategy "
            f"(tf.data auto-shard policy DATA): every worker reads the same pipeline, each step takes one global "
            f"batch and gives each worker's replica its share ({' + '.join(map(str, batches))}); samples/s counts "
            f"{batch} samples per step")


def stock_refusal_text() -> str:
    """Why the stock baseline cannot run across workers here: no Keras 2 (checked on Keras 3.15.1, TensorFlow 2.21)."""
    keras = _package_version("keras")
    return (f"the stock baseline across workers (--method keras) is Keras 2's fit (tf_keras) under a stock "
            f"MultiWorkerMirroredStrategy, and tf_keras is not installed here: Keras {keras or '3'}'s fit "
            f"{STOCK_REFUSED} (it reduces the first batch, a structure of PerReplica values, and each step's scalar "
            f"logs across workers, which the strategy refuses: {STOCK_ISSUE}, tensorflow/tensorflow#72388). "
            "Install tf-keras (the version of your TensorFlow), or use --method mirrored (harness across workers)")


def _emit(event: str, **fields) -> None:
    print(MARK + json.dumps({"event": event, **fields}, default=str), flush=True)


def _exchange(strategy, index: int, workers: int) -> Callable[[float], list[float]]:
    """``exchange(value) -> every worker's value``: one all-reduce over the cluster (every worker at the same step)."""
    from harness.parallel.collective import sum_over_workers

    def exchange(value: float) -> list[float]:
        placed = [0.0] * workers
        placed[index] = float(value)
        return sum_over_workers(strategy, workers, placed)

    return exchange


def _data_sharding():
    """``tf.data.Options`` sharding a dataset by its elements across workers (see the module's doc)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options


def _join(plan: ClusterPlan):
    """Joins the cluster (the process' first TensorFlow work): ``(index, devices, local, strategy, cluster)``."""
    import tensorflow as tf

    index = int(os.environ.get("HARNESS_WORKER_INDEX", "0"))
    if plan.emulate is not None:  # each emulated device sleeps on one inter-op thread: leave threads for the work
        current = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1
        tf.config.threading.set_inter_op_parallelism_threads(max(current, plan.counts[index] + 2))
    if plan.method == "keras":
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=plan.timeout_s)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        index = strategy.cluster_resolver.task_id
        local = tuple(strategy.extended.worker_devices)
        spec = tf.DeviceSpec.from_string(local[0])
        devices = tuple(task_device(w, 0, spec.device_type) for w in range(plan.workers))
        return index, devices, (devices[index],), strategy, None
    from harness.parallel.multiworker import use_cluster

    cluster = use_cluster(timeout_s=plan.timeout_s, devices=plan.counts[index])
    if tuple(cluster.counts) != plan.counts:
        raise Failed(f"the cluster's devices per worker {list(cluster.counts)} are not the plan's "
                     f"{list(plan.counts)}")
    return cluster.index, tuple(cluster.devices), tuple(cluster.local_devices), cluster.strategy, cluster


def run_worker(plan: ClusterPlan) -> int:
    """One worker of a cluster run (``harness run`` in worker mode); returns its exit status (0: complete).

    Its figures go to the parent as ``MARK`` lines; an error is reported in its ``end`` line,
    then raised (its traceback in the worker's output).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    index = int(os.environ.get("HARNESS_WORKER_INDEX", "0"))
    try:
        index, devices, local, strategy, cluster = _join(plan)
        from harness.bench import workloads
        from harness.bench.environment import fingerprint
        from harness.bench.measure import lockstep_windows
        from harness.bench.runner import RunConfig, build_model, train_windows

        config = RunConfig.from_spec(plan, devices=devices)
        start: dict[str, Any] = {"worker": index, "devices": list(local)}
        if index == 0:
            start.update(config=config.to_json(), environment=fingerprint(import_tf=True))
        _emit("start", **start)
        workload = workloads.get(plan.model, plan.data)
        if cluster is None:  # the stock baseline: Keras 2's model, fit and input handling
            model = build_model(config, workload, strategy=strategy, keras_module=stock_keras())
            input_options = _data_sharding()
        else:
            model, input_options = build_model(config, workload, cluster=cluster), None
        result = train_windows(config, model, workload, measured=local, input_options=input_options,
                               on_window=lambda window: _emit("window", worker=index, window=window),
                               windows_callback=lockstep_windows(_exchange(strategy, index, plan.workers),
                                                                 plan.probe_steps))
    except BaseException as err:
        _emit("end", worker=index, status="failed", error=one_line(err))
        raise
    _emit("end", worker=index, status=result["status"], error=result["error"], input=result["input"],
          config=result["config"] if index == 0 else None)
    return 0 if result["status"] == "complete" else 1


# -- the parent --------------------------------------------------------------------------------------------------

class Collector:
    """The launch's ``out``: takes the workers' ``[worker i] MARK{...}`` lines, passes the others on.

    ``on_event(worker, event)`` gets each event (a dict with ``"event"``); ``relay`` (default
    ``sys.stderr``) gets every other line as the launch wrote it. Thread-safe: the launch writes
    from one thread per worker, under its own lock.
    """

    def __init__(self, on_event: Callable[[int, dict], None], relay: TextIO | None = None):
        self.on_event = on_event
        self.relay = relay
        self._lock = threading.Lock()
        self._pending = ""

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        (self.relay or sys.stderr).flush()

    def _line(self, line: str) -> None:
        prefix, sep, text = line.partition("] ")
        if sep and prefix.startswith("[worker ") and text.startswith(MARK):
            try:
                event = json.loads(text[len(MARK):])
                worker = int(prefix[len("[worker "):])
            except ValueError:
                event = None
            if isinstance(event, dict) and "event" in event:
                self.on_event(worker, event)
                return
        relay = self.relay or sys.stderr
        relay.write(line + "\n")
        relay.flush()


def merge_window(records: Sequence[Mapping[str, Any]]) -> dict:
    """One window of the cluster from each worker's record of it (worker 0's first).

    Every device's row as its worker measured it; the window's steps and time are the chief's
    (a synchronous cluster's workers end each step together); ``workers`` holds each worker's
    figures: its devices, its rows per step (``batch``), its window time and samples/s (its rows
    per step over its step time).

    Raises:
        ValueError: the workers disagree on the window's index or steps (their windows must be cut at
            the same steps).
    """
    chief = records[0]
    steps = {r["steps"] for r in records}
    if len({r["index"] for r in records}) > 1 or len(steps) > 1:
        raise InvalidValue(f"the workers' windows differ: index {[r['index'] for r in records]}, steps "
                           f"{[r['steps'] for r in records]}")
    workers = []
    for worker, record in enumerate(records):
        rows = sum(d["batch"] for d in record["devices"])
        workers.append({"worker": worker, "devices": [d["device"] for d in record["devices"]], "batch": rows,
                        "seconds": record["seconds"], "step_seconds": record["seconds"] / record["steps"],
                        "samples_per_second": rows * record["steps"] / record["seconds"]})
    return {"index": chief["index"], "seconds": chief["seconds"], "steps": chief["steps"], "samples": chief["samples"],
            "samples_per_second": chief["samples_per_second"],
            "devices": [d for r in records for d in r["devices"]],
            "host_bound": [d for r in records for d in r.get("host_bound") or ()], "workers": workers,
            # Re-splits (--rebalance): every worker decides the same from the same gathered busy times.
            **{key: chief[key] for key in ("ratios", "resplits") if key in chief}}


def cluster_result(plan: ClusterPlan, windows: Sequence[dict], ends: Mapping[int, dict], launch_status: int,
                   first_failure: int | None, reason: str, config: dict | None = None) -> dict:
    """The run's result, as ``run_one``'s: the merged windows, their summary, the chief's input rate, and
    ``workers`` (each worker's status, samples/s summary and input rate) and ``cluster``.

    ``ends``: each worker's ``end`` event; ``launch_status``, ``first_failure``, ``reason``: how the
    launch ended (``harness.launch.LaunchResult``). The status is ``"complete"`` when every worker
    completed, else the first failing worker's (``"oom"`` or ``"failed"``) with an error naming it.
    """
    from harness.bench.results import summarize
    from harness.bench.runner import summarize_windows

    result: dict[str, Any] = {"config": config, "status": "complete", "windows": list(windows), "summary": None,
                              "input": (ends.get(0) or {}).get("input"), "error": None,
                              "cluster": {"workers": plan.workers, "devices_per_worker": list(plan.counts),
                                          "launch_status": launch_status, "launch": reason}}
    result["workers"] = [{"worker": w, "devices": (windows[0]["workers"][w]["devices"] if windows else None),
                          "batch": sum(plan.batches[plan.worker_slice(w)]),
                          "status": (ends.get(w) or {}).get("status", "stopped"),
                          "error": (ends.get(w) or {}).get("error"), "input": (ends.get(w) or {}).get("input"),
                          "samples_per_second": summarize([x["workers"][w]["samples_per_second"] for x in windows])
                          if windows else None}
                         for w in range(plan.workers)]
    if all((ends.get(w) or {}).get("status") == "complete" for w in range(plan.workers)) and launch_status == 0:
        result["summary"] = summarize_windows(windows)
        result["summary"]["workers"] = [w["samples_per_second"] for w in result["workers"]]
        return result
    failed = first_failure if first_failure is not None else next(
        (w for w in range(plan.workers) if (ends.get(w) or {}).get("status") != "complete"), None)
    end = (ends.get(failed) or {}) if failed is not None else {}
    status = "oom" if end.get("status") == "oom" else "failed"
    if failed is None:
        why = f"the launch ended: {reason} (status {launch_status})"
    else:
        if end.get("status") not in (None, "stopped", "complete"):
            why = f"worker {failed} {end['status']}: {end.get('error')}"
        elif reason == "failed":
            why = f"worker {failed} exited with status {launch_status}" + (
                " after it reported" if end.get("status") == "complete" else " before it reported")
        else:
            why = f"worker {failed} did not finish: the launch {reason} (status {launch_status})"
    result.update(status=status, error=why)
    return result


def launch_run(plan: ClusterPlan, *, on_event: Callable[[int, dict], None] | None = None,
               on_window: Callable[[dict], None] | None = None, relay: TextIO | None = None,
               command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
               timeout_s: float | None = None, grace_s: float = 5.0):
    """Runs ``plan`` on ``plan.workers`` local workers; returns ``(LaunchResult, ends, problems)``.

    Args:
        on_event: called with ``(worker, event)`` for each worker event (``start``, ``window``, ``end``) as it
            arrives, from the launch's reader threads.
        on_window: called with each window of the cluster once every worker's has arrived (``merge_window``).
            An error in it or in the callbacks (the workers disagreeing on a window) is kept in ``problems``
            (one line each) instead of ending the reader thread, which would leave a worker blocked on its output.
        relay: where the workers' other output lines go (default ``sys.stderr``).
        command: each worker's command (default ``python -m harness run``, which reads the plan from
            ``WORKER_VARIABLE``).
        env: the workers' environment (default this process's).
        timeout_s: stop every worker after this many seconds.
    """
    from harness.launch import launch

    ends: dict[int, dict] = {}
    pending: dict[int, dict[int, dict]] = {}  # window index -> worker -> its record of the window
    problems: list[str] = []
    lock = threading.Lock()

    def event(worker: int, data: dict) -> None:
        with lock:
            try:
                if data["event"] == "end":
                    ends[worker] = data
                if on_event is not None:
                    on_event(worker, data)
                if on_window is not None and data["event"] == "window":
                    arrived = pending.setdefault(data["window"]["index"], {})
                    arrived[worker] = data["window"]
                    if len(arrived) == plan.workers:
                        del pending[data["window"]["index"]]
                        on_window(merge_window([arrived[w] for w in range(plan.workers)]))
            except Exception as err:  # noqa: BLE001 - a reader thread must go on reading
                problems.append(f"{type(err).__name__}: {err}")
                (relay or sys.stderr).write(f"harness run: {problems[-1]}\n")

    base = dict(os.environ if env is None else env)
    base.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    base[WORKER_VARIABLE] = json.dumps(plan.to_json())
    blocks = plan.gpu_blocks() if plan.kind == "GPU" else None
    if plan.kind == "CPU":
        base["CUDA_VISIBLE_DEVICES"] = "-1"  # logical CPU devices: keep TensorFlow off any GPU
    result = launch(list(command or [sys.executable, "-m", "harness", "run"]), plan.workers, env=base,
                    worker_env=(lambda w: {"CUDA_VISIBLE_DEVICES": blocks[w]}) if blocks else None,
                    devices_per_worker=list(plan.counts), out=cast(TextIO, Collector(event, relay)),
                    err=relay or sys.stderr,
                    timeout_s=timeout_s, grace_s=grace_s)
    return result, ends, problems
