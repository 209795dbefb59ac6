"""Mirrored across workers: one exact ratio-split step over a ``MultiWorkerMirroredStrategy`` cluster.

Every worker process runs the same program on the same global batches (the same data in the
same order: no sharding), and ``harness.use_cluster()`` (first, before other TensorFlow work)
joins it to the cluster ``TF_CONFIG`` describes. ``parallelize(model, cluster, ratios=...)``
then takes one ratio per replica of the whole cluster (``cluster.devices``, worker 0's first):
each replica trains its rows of the global batch, and the all-reduced gradient is the
single-device gradient of the whole batch, for any split (uneven per worker, partial last
batches, BatchNormalization's whole-batch statistics, sample weights).

Across workers each replica gathers the whole batch's predictions (its own rows live, the
others' without gradient) and computes the whole batch's loss and metrics, so every worker
reports the same loss and metrics; the decomposed per-replica loss of ``Mirrored`` stays
within one process. Collectives time out after ``use_cluster``'s ``timeout_s``: a dead peer
ends the step with an error instead of a hang.

Limits (for now): TensorFlow's strategy takes the same devices on every worker (one CPU, or
every GPU, per worker); emulated devices are not supported across workers.
"""

from __future__ import annotations

import functools
import re

import tensorflow as tf

from harness.cluster import Cluster, read_tf_config
from harness.parallel.collective import multiworker_strategy, replica_device
from harness.parallel.mirrored import Mirrored, _replica

__all__ = ["use_cluster", "MultiWorker", "multiworker_class"]

GATHER_REASON = "multi-worker: each replica computes the whole batch's loss and metrics (the same on every worker)"


def use_cluster(timeout_s: float = 60.0) -> Cluster:
    """Joins this process to ``TF_CONFIG``'s cluster; call it first, before other TensorFlow work.

    Args:
        timeout_s: how long a collective waits for its peers before failing the step.

    Returns:
        The ``Cluster``: pass it to ``parallelize`` as ``devices``.

    Raises:
        ValueError: no or a bad ``TF_CONFIG`` (``harness.cluster.read_tf_config``), a timeout <= 0.

    Example:
        >>> cluster = harness.use_cluster()           # under `harness launch --workers 2 -- ...`
        >>> parallel = harness.parallelize(model, cluster, ratios=[3, 1])
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a number of seconds > 0; got {timeout_s!r}")
    config = read_tf_config()
    strategy = multiworker_strategy(float(timeout_s))
    local = tuple(strategy.extended.worker_devices)
    workers = len(config["cluster"]["worker"])
    index = config["task"]["index"]
    devices = tuple(tf.DeviceSpec.from_string(d).replace(task=t).to_string() for t in range(workers) for d in local)
    return Cluster(index=index, workers=workers, local_devices=local, devices=devices, strategy=strategy,
                   addresses=tuple(config["cluster"]["worker"]))


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


def refuse_across_workers(model, adapter) -> None:
    """What does not train exactly across workers yet is refused, by name (never a silent drift).

    Keras 2 BatchNormalization: its moving averages drift across workers (a 2-worker 1:2 run:
    0.0094 from one device, the trainable weights and the loss exact).

    Raises:
        NotImplementedError: naming the layers.
    """
    from harness.compat import is_keras2_model

    if not is_keras2_model(model):
        return
    layers = [m.name for m in model.submodules if isinstance(m, adapter.k.layers.BatchNormalization)]
    if layers:
        raise NotImplementedError(
            f"across workers, Keras 2 (tf_keras) BatchNormalization layers {layers} of model {model.name!r} are not "
            "exact yet (their moving averages drift); use a Keras 3 model, or train this one on one worker")


class MultiWorker(Mirrored):
    """A mirrored model whose replicas span the workers of a ``Cluster``."""

    def __init__(self, template, cluster: Cluster, ratios, sync_batchnorm, merge_device, emulator=None):
        if emulator is not None:
            raise NotImplementedError("emulated devices are not supported across workers yet")
        self._cluster = cluster
        super().__init__(template, list(cluster.devices), ratios, sync_batchnorm, merge_device, None)

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def fit(self, *args, **kwargs):
        """As ``Model.fit``; a lost or stuck peer ends it with a ``RuntimeError`` naming that worker."""
        try:
            return super().fit(*args, **kwargs)
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError) as err:
            raise RuntimeError(lost_peer_message(err, self._cluster)) from err

    def _make_strategy(self):
        return self._cluster.strategy

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        self.gather_reason = self._loss_reason = GATHER_REASON

    def _local_loss_reason(self, y, y_local) -> str | None:
        return GATHER_REASON

    def _by_batch_size(self, x, parallel, single, small_possible=True):
        # A batch smaller than the replica count runs the parallel step too (some replicas get no rows):
        # the single-device path inside tf.cond hangs the cluster's collectives (TF 2.21: both workers
        # take the branch, yet its all-reduce times out), while eagerly it is exact.
        return parallel()

    def _sum_replicas(self, value):
        # Every replica of every worker: an all-reduce across the cluster.
        with self.strategy.scope(), tf.device(self.merge_device):
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    def _parallel_forward(self, x):
        n, _, starts, shares, x_parts = self._distribute(x)

        def replica_forward(x_local):
            ctx = tf.distribute.get_replica_context()
            replica = ctx.replica_id_in_sync_group
            with tf.device(replica_device(self.devices, ctx)):
                y_local = self.core(x_local, training=False)
                whole = self._gather(ctx, y_local, tf.gather(starts, replica), n)
            return whole, self._extras(whole), self._call_losses(self.core, tf.gather(shares, replica))

        y_pred, extras, extra = self.strategy.run(replica_forward, args=(x_parts,))
        return self._attach(_replica(self.strategy, y_pred, 0), _replica(self.strategy, extras, 0)), \
            self._sum_replicas(extra)


@functools.cache
def multiworker_class(adapter):
    """The multi-worker model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("MultiWorkerModel", (MultiWorker, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
