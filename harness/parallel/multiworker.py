"""Mirrored across workers: one exact ratio-split step over a ``MultiWorkerMirroredStrategy`` cluster.

Every worker process runs the same program on the same global batches (the same data in the
same order: no sharding), and ``harness.use_cluster()`` (first, before other TensorFlow work)
joins it to the cluster ``TF_CONFIG`` describes, with its own devices: one, or several
(``devices=`` or ``harness launch --devices-per-worker``), and workers may differ.
``parallelize(model, cluster, ratios=...)`` then takes one ratio per device of the whole
cluster (``cluster.devices``, worker 0's first): each device trains its rows of the global
batch, and the all-reduced gradient is the single-device gradient of the whole batch, for any
split (uneven per worker and per device, partial last batches, BatchNormalization's
whole-batch statistics, sample weights).

The strategy has one replica per worker; inside it, the worker's devices run as towers
(``towers``: one graph, the worker's variable copy on its first device; BatchNormalization
layer by layer, its moments summed over the towers and then across the workers). Each
replica gathers the whole batch's predictions (its own rows live, the others' without
gradient) and computes the whole batch's loss and metrics, so every worker reports the same
loss and metrics. Collectives time out after ``use_cluster``'s ``timeout_s``: a dead peer
ends the step with an error instead of a hang. Emulated devices (``emulate=``) cover
``cluster.devices`` like the ratios; each worker emulates its own.

``ratios="auto"`` works across workers too: each worker times its own devices, and the
rebalancer gathers every device's busy time in one all-reduce, so every worker decides the same
split at the same step.
"""

from __future__ import annotations

import functools
import os
import re

import tensorflow as tf

from harness.cluster import DEVICES_VARIABLE, Cluster, read_tf_config
from harness.compat import is_keras2_model
from harness.errors import Failed, InvalidValue, Refused
from harness.parallel import layerwise, sparse
from harness.parallel.base import add_all
from harness.parallel.collective import gather_worker_rows, multiworker_strategy, sum_over_workers
from harness.parallel.mirrored import Mirrored, _replica

__all__ = ["use_cluster", "MultiWorker", "multiworker_class"]

GATHER_REASON = "multi-worker: each replica computes the whole batch's loss and metrics (the same on every worker)"


def use_cluster(timeout_s: float = 60.0, devices: int | None = None) -> Cluster:
    """Joins this process to ``TF_CONFIG``'s cluster; call it first, before other TensorFlow work.

    Args:
        timeout_s: how long a collective waits for its peers before failing the step.
        devices: how many devices this worker trains on: logical CPU devices without a GPU (made
            here), else its first N GPUs. Default: ``HARNESS_WORKER_DEVICES`` (``harness launch
            --devices-per-worker``) when set, else every GPU, or one CPU. Workers may differ.

    Returns:
        The ``Cluster``: pass it to ``parallelize`` as ``devices``.

    Raises:
        ValueError: no or a bad ``TF_CONFIG`` (``harness.cluster.read_tf_config``), a timeout <= 0, a bad
            device count (naming it), more GPUs asked for than present.

    Examples:
        >>> cluster = harness.use_cluster()           # under `harness launch --workers 2 -- ...`
        >>> parallel = harness.parallelize(model, cluster, ratios=[3, 1])
    """
    from harness.devices import gpu_count, use_logical_devices

    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise InvalidValue(f"timeout_s must be a number of seconds > 0; got {timeout_s!r}")
    count = _device_count(devices)
    config = read_tf_config()
    gpus = gpu_count()
    if count is not None and not gpus:
        use_logical_devices(count, start=False)  # before the strategy starts TensorFlow's runtime
    strategy = multiworker_strategy(float(timeout_s), gpu=bool(gpus))
    worker = strategy.extended.worker_devices[0]  # this worker's replica: /job:worker/replica:0/task:i/device:...
    kind = "GPU" if gpus else "CPU"
    present = len(tf.config.list_logical_devices(kind))
    count = present if count is None and gpus else count or 1
    if count > present:
        raise InvalidValue(f"this worker has {present} {kind} device(s); asked for devices={count}")
    prefix = worker[: worker.index("/device:")]
    local = tuple(f"{prefix}/device:{kind}:{i}" for i in range(count))
    workers = len(config["cluster"]["worker"])
    index = config["task"]["index"]
    # Every worker's count, from one all-reduce (also the workers' first contact).
    counts = tuple(int(c) for c, in gather_worker_rows(strategy, index, workers, [count]))
    devices_all = tuple(tf.DeviceSpec.from_string(prefix).replace(task=t).to_string() + f"/device:{kind}:{i}"
                        for t in range(workers) for i in range(counts[t]))
    return Cluster(index=index, workers=workers, local_devices=local, devices=devices_all, strategy=strategy,
                   addresses=tuple(config["cluster"]["worker"]), devices_per_worker=counts)


def _device_count(devices) -> int | None:
    if devices is None:
        text = os.environ.get(DEVICES_VARIABLE)
        if text is None or not text.strip():
            return None
        if not text.strip().isdecimal() or int(text) < 1:
            raise InvalidValue(f"{DEVICES_VARIABLE} must be an int >= 1; got {DEVICES_VARIABLE}={text!r}")
        return int(text)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise InvalidValue(f"devices must be an int >= 1 (this worker's device count); got devices={devices!r}")
    return devices


def lost_peer_message(err: Exception, cluster: Cluster) -> str:
    """One line for a collective that failed across workers: which worker was lost, and TensorFlow's reason."""
    text = str(err)
    tasks = sorted({int(t) for t in re.findall(r"/job:worker/replica:\d+/task:(\d+)", text)} - {cluster.index})
    reason = next((line.strip() for line in text.splitlines() if "Collective ops is aborted by" in line
                   or "timed out" in line), text.strip().splitlines()[0] if text.strip() else type(err).__name__)
    if tasks:
        lost = ", ".join(f"worker {t} ({cluster.addresses[t]})" if t < len(cluster.addresses) else f"worker {t}"
                         for t in tasks)
        return f"worker {cluster.index} lost {lost}: {reason}"
    return f"worker {cluster.index}: a collective across the {cluster.workers} workers failed: {reason}"


class MultiWorker(Mirrored):
    """A mirrored model whose replicas are the workers of a ``Cluster``, each worker's devices its towers."""

    _staging_supported = False  # each worker cuts the whole batch its own pipeline gives it (``staging``: not here)

    def __init__(self, template, cluster: Cluster, ratios, sync_batchnorm, merge_device, emulator=None):
        uses_layerwise, synced_layers = self._check_towers(template, cluster, sync_batchnorm)  # before TF work
        self._cluster = cluster
        super().__init__(template, list(cluster.devices), ratios, sync_batchnorm, merge_device, emulator)
        self.local_devices = tuple(cluster.local_devices)
        self._layerwise = uses_layerwise
        # A device without rows (a batch smaller than the cluster's device count) runs on one borrowed
        # row instead, cut off after: TensorFlow's CPU Conv2D mis-shapes an empty batch. Not where the
        # synchronised layers compute BatchNormalization's moments inside the call (they would count it).
        self._borrow = not synced_layers

    @classmethod
    def _check_towers(cls, template, cluster: Cluster, sync_batchnorm: bool) -> tuple[bool, bool]:
        """``(layer by layer, synced layers)``: how whole-batch BatchNormalization runs; what cannot is refused.

        Layer by layer (``layerwise``, the moments summed over the towers and then across the
        workers) for every Functional or Sequential model with BatchNormalization: where a worker
        runs towers it must, and Keras 2's synchronised layer drifts across workers (its moving
        averages: 0.0094 from one device on a 2-worker 1:2 split, the trainable weights exact; layer
        by layer 2.4e-07). A subclassed Keras 3 model with one device per worker keeps the
        synchronised layers (``SyncBatchNormalization``) instead.

        Raises:
            ValueError: naming the model and why.
        """
        a = cls._adapter
        several = max(cluster.counts) > 1  # some worker runs towers
        keras2 = is_keras2_model(template)
        batchnorm = bool(sync_batchnorm) and layerwise.has_batchnorm(a, template)
        functional = a.graph_of(template) is not None
        if batchnorm and not functional and (several or keras2):
            fix = "Give each worker one device" if several and not keras2 else \
                "Use a Keras 3 model with one device per worker"
            raise Refused(
                "subclassed-batchnorm",
                f"across workers ({list(cluster.counts)} devices per worker), whole-batch BatchNormalization of "
                f"a {'Keras 2 ' if keras2 else ''}model needs a Functional or Sequential model; got a subclassed "
                f"{type(template).__name__} {template.name!r}. {fix}, or sync_batchnorm=False")
        refused = a.towers_refusal(template) if several else []
        if several and batchnorm:
            refused += [r for r in (a.batchnorm_refusal(layer, "towers") for layer in a.sublayers(template)
                                    if a.is_batchnorm(layer)) if r]
        if refused:
            raise Refused("towers-unsupported-layer",
                          f"across workers with several devices on a worker, the towers inside each worker "
                          f"cannot run {'; '.join(refused)}. Give each worker one device")
        return batchnorm and functional, batchnorm and not functional

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def fit(self, *args, **kwargs):
        """As ``Model.fit``; a lost or stuck peer ends it with a ``RuntimeError`` naming that worker."""
        try:
            return super().fit(*args, **kwargs)
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError) as err:
            raise Failed(lost_peer_message(err, self._cluster)) from err

    def _make_strategy(self):
        return self._cluster.strategy

    def gather_device_rows(self, rows):
        """Every device's ``(busy seconds, samples, steps)``: each worker measured its own devices (zeros for the
        others'); summed over the workers in one all-reduce (one non-zero term per entry: exact, the same on
        every worker, so every worker's ``Rebalance`` decides the same split)."""
        mine = self._cluster.worker_slice()
        flat = [value for i, row in enumerate(rows) for value in (row if mine.start <= i < mine.stop else (0, 0, 0))]
        total = sum_over_workers(self.strategy, self._cluster.workers, flat)
        return [(total[3 * i], int(round(total[3 * i + 1])), int(round(total[3 * i + 2]))) for i in range(len(rows))]

    def save(self, filepath, *args, **kwargs):
        """The chief saves the plain single-device model (``ParallelCommon.save``); other workers write nothing
        (every worker may call it: one file, not one per worker racing on shared storage). Returns what
        Keras' ``save`` returns on the chief, None elsewhere."""
        self.sync_to_template()  # every worker: the template holds the trained weights on each
        return super().save(filepath, *args, **kwargs) if self._cluster.is_chief else None

    def save_weights(self, filepath, *args, **kwargs):
        """As ``save``: the chief writes the template's weights, other workers nothing."""
        self.sync_to_template()
        return super().save_weights(filepath, *args, **kwargs) if self._cluster.is_chief else None

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        self.gather_reason = self._loss_reason = GATHER_REASON

    def _local_loss_reason(self, y, y_local) -> str | None:
        return GATHER_REASON

    def _by_batch_size(self, x, parallel, single, small_possible=True):
        # A batch smaller than the device count runs the parallel step too (some devices get no rows):
        # the single-device path inside tf.cond hangs the cluster's collectives (TF 2.21: both workers
        # take the branch, yet its all-reduce times out), while eagerly it is exact.
        return parallel()

    def _sum_replicas(self, value):
        # Every replica of every worker: an all-reduce across the cluster.
        with self.strategy.scope(), tf.device(self.merge_device):
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    def _cut(self, x):
        """``(n, mine, starts, shares, rows, parts)``: the batch cut over the cluster's devices; ``mine`` is this
        worker's slice of them; ``rows`` and ``parts`` are only its devices' (an empty part borrows the
        batch's first row where ``_borrow``)."""
        n, sizes, parts = self._split(x)
        mine = self._cluster.worker_slice()
        with tf.device(self.input_device):
            starts = tf.cumsum(sizes, exclusive=True)
            shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
            rows = [sizes[i] for i in range(mine.start, mine.stop)]
            parts = parts[mine]
            if self._borrow:
                parts = [tf.nest.map_structure(lambda p, w, r=r: tf.concat([p, w[:1]], 0)[:tf.maximum(r, 1)], part, x)
                         for part, r in zip(parts, rows)]
        return n, mine, starts, shares, rows, parts

    def _worker_towers(self, ctx, parts, shares, rows, training, watch=None):
        """This worker's devices on its rows: ``(merged outputs, extra, pending)`` (``_run_towers``), the
        BatchNormalization moments summed over its towers and then across the workers."""

        def all_reduce(values):
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.add_n(values) if len(values) > 1 else values[0])
            return [total] * len(values)

        outputs, extra, pending = self._run_towers(self.core, self.local_devices, parts, shares, training, watch,
                                                   self._layerwise, all_reduce=all_reduce,
                                                   rows=rows if self._borrow else None)
        if self._borrow:  # the borrowed rows cut off, masks and logits too
            outputs = [self._attach(tf.nest.map_structure(lambda t, r=r: t[:r], out),
                                    {k: v[:r] for k, v in self._extras(out).items()})
                       for out, r in zip(outputs, rows)]
        return self._merge(outputs), extra, pending

    @staticmethod
    def _sum_over_workers(ctx, grads, sources, towers: int, weights) -> list:
        """Inside the worker's replica: the whole cluster's gradients (sparse ones as ``sparse.Rows`` with the
        single device's rows: this worker's towers' first, then across the workers), the same on every worker."""
        grads = [sparse.rows_of(g, sources, towers, w) for g, w in zip(grads, weights)]
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, sparse.Rows)]
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in dense]) if dense else []
        out = [sparse.all_reduce_rows(ctx, g) if isinstance(g, sparse.Rows) else g for g in grads]
        for i, g in zip(dense, summed):
            out[i] = g
        return out

    def _parallel_train(self, x, y, sample_weight):
        n, mine, starts, shares, rows, parts = self._cut(x)
        replicas = float(self.strategy.num_replicas_in_sync)
        a = self._adapter
        sources = tf.nest.flatten(x)  # a sparse gradient's lookup depends on the batch, or not (``sparse``)

        def replica_step():
            ctx = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                y_local, extra, pending = self._worker_towers(ctx, parts, shares[mine], rows, True, tape.watch)
                y_pred = self._gather(ctx, y_local, starts[mine.start], n)
                main = add_all([a.loss(self, y, y_pred, sample_weight)])
                # Weight penalties are the same on every worker; their gradients are summed once per worker.
                penalty = self._penalties()
                scaled = a.scale_loss(self.optimizer, main + extra + penalty / replicas)
            weights = self.core.trainable_weights
            grads = tape.gradient(scaled, weights + [leaf for _, _, leaf in pending])
            grads, input_grads = grads[: len(weights)], grads[len(weights):]
            grads = self._finish_towers(grads, pending, input_grads, after=y_local)
            return y_pred, self._extras(y_pred), extra, penalty, main, self._sum_over_workers(ctx, grads, sources,
                                                                                             len(parts), weights)

        with a.untracked_losses(self):
            y_pred, extras, extra, penalty, main, grads = self.strategy.run(replica_step)
        # Every worker steps its own optimizer on the whole batch's gradient, outside the replicas: clipping,
        # accumulation, EMA and loss scaling see what they see on one device (docs/design.md, "Optimizer steps").
        grads = [sparse.join([g]) if isinstance(g, sparse.Rows) else g for g in _replica(self.strategy, grads, 0)]
        self._apply_whole_gradients(grads, self.core.trainable_weights)
        y_pred = self._attach(_replica(self.strategy, y_pred, 0), _replica(self.strategy, extras, 0))
        extra = self._sum_replicas(extra) + _replica(self.strategy, penalty, 0)
        return y_pred, extra, _replica(self.strategy, main, 0)

    def _parallel_forward(self, x):
        n, mine, starts, shares, rows, parts = self._cut(x)

        def replica_forward():
            ctx = tf.distribute.get_replica_context()
            y_local, extra, _ = self._worker_towers(ctx, parts, shares[mine], rows, False)
            whole = self._gather(ctx, y_local, starts[mine.start], n)
            return whole, self._extras(whole), extra

        y_pred, extras, extra = self.strategy.run(replica_forward)
        return self._attach(_replica(self.strategy, y_pred, 0), _replica(self.strategy, extras, 0)), \
            self._sum_replicas(extra)


@functools.cache
def multiworker_class(adapter):
    """The multi-worker model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("MultiWorkerModel", (MultiWorker, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
