"""Cross-device arithmetic both Keras generations share (TensorFlow only, no Keras import).

The mirrored models' strategy per device set, the gathering of the whole
batch's predictions inside a replica, and the whole batch's BatchNormalization
moments from per-device parts.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence

import tensorflow as tf

from harness.parallel.slicing import restore_static_shape

__all__ = ["gather_worker_rows", "sum_over_workers", "strategy_for", "stock_strategy_for", "multiworker_strategy",
           "replica_device", "sum_replicas", "whole_batch", "global_moments", "replica_all_reduce"]

AllReduce = Callable[[list[tf.Tensor]], tf.Tensor]


# Stock strategies start their collective group keys at 1 (MirroredStrategy and
# MultiWorkerMirroredStrategy: ``_collective_key_base = 0``) and count up by one per
# device set they use. Collective groups and instances are process-wide: two
# strategies that share a group key abort each other ("Shape mismatch in the
# collective instance 100", or "joining a group with size 2, but that group has
# size 3"). harness' strategies take keys from far above any stock strategy's.
HARNESS_KEY_BASE = 1 << 28  # group keys are int32; stock ones stay in the low hundreds
KEYS_PER_STRATEGY = 1 << 16
# The stock baseline's strategies (``stock_strategy_for``): stock MirroredStrategies keyed apart from each other,
# from harness' and from a user's own (which start at 1).
STOCK_KEY_BASE = 1 << 24


class _KeyedMirroredStrategy(tf.distribute.MirroredStrategy):
    """A MirroredStrategy whose collective group keys no other strategy in this process uses."""

    def __init__(self, devices, key_base: int, cross_device_ops=None):
        self._collective_key_base = key_base
        super().__init__(devices, cross_device_ops=cross_device_ops)


@functools.cache
def strategy_for(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """One strategy per device set and process (collective groups are process-wide), Keras 3 and 2 alike."""
    index = strategy_for.cache_info().currsize
    return _KeyedMirroredStrategy(list(devices), key_base=HARNESS_KEY_BASE + KEYS_PER_STRATEGY * index,
                                  cross_device_ops=_cross_device_ops(devices))


def _cross_device_ops(devices: tuple[str, ...]):
    """How a strategy over ``devices`` sums across replicas: TensorFlow's default (NCCL, collectives) where
    there is a GPU; on CPU devices a sum on the first device, copied back.

    Logical CPU devices share the host's cores and memory: collective all-reduce runs its
    ring through copies (22 ms a step for 4.7 M float32 gradients on 2 cores, against 5 ms
    for an add on one device), where a reduction to one device adds in place.
    """
    if all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices):
        return tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0])
    return None


class _KeyedMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """A MultiWorkerMirroredStrategy (TF_CONFIG's cluster) whose collective keys no stock strategy uses."""

    def __init__(self, key_base: int, cluster_resolver=None, communication_options=None):
        self._collective_key_base = key_base
        super().__init__(cluster_resolver=cluster_resolver, communication_options=communication_options)


@functools.cache
def multiworker_strategy(timeout_s: float, gpu: bool = False) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The process' strategy over ``TF_CONFIG``'s cluster (one per process: it starts this worker's server).

    One replica per worker, on its first GPU (``gpu``) or its CPU: workers may train on
    different numbers of devices (towers inside each worker's replica), where TensorFlow's
    own resolver makes every GPU of a worker a replica and needs the same count on every
    worker (tensorflow#47203). Its collectives give up after ``timeout_s`` seconds (a dead
    peer ends the step with an error instead of a hang), and it keys them above every
    ``strategy_for`` set.
    """
    config = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Not a TFConfigClusterResolver: the strategy would count the GPUs itself.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        config.cluster_spec(), task_type=config.task_type, task_id=config.task_id, rpc_layer=config.rpc_layer or "grpc",
        num_accelerators={"GPU": 1} if gpu else {})
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_s)
    return _KeyedMultiWorkerStrategy(HARNESS_KEY_BASE + KEYS_PER_STRATEGY * MULTIWORKER_SLOT, resolver, options)


def sum_over_workers(strategy, workers: int, values: Sequence[float]) -> list[float]:
    """The sum of every worker's ``values`` (float64), in one all-reduce over the cluster (eagerly, between
    steps; each worker's replicas add its values once in all)."""
    local = strategy.num_replicas_in_sync // workers
    value = tf.constant([float(v) / local for v in values], tf.float64)

    def total():
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    return [float(v) for v in strategy.experimental_local_results(tf.function(lambda: strategy.run(total))())[0]]


def gather_worker_rows(strategy, index: int, workers: int, row: Sequence[float]) -> list[list[float]]:
    """Every worker's ``row`` of whole numbers (worker 0's first), learnt in one all-reduce over the cluster."""
    placed = [0.0] * (workers * len(row))
    placed[index * len(row):(index + 1) * len(row)] = [float(v) for v in row]
    total = sum_over_workers(strategy, workers, placed)
    return [[float(round(x)) for x in total[w * len(row):(w + 1) * len(row)]] for w in range(workers)]


MULTIWORKER_SLOT = 1 << 9  # strategy_for's sets take slots 0, 1, 2, ...; the cluster's strategy this one


@functools.cache
def stock_strategy_for(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """A stock ``MirroredStrategy`` over ``devices`` (the baseline harness measures against), one per device set.

    Stock strategies key their collectives from 1 whatever their devices: two of them over different device
    sets in one process abort each other ("joining a group with size 3, but that group has size 2"), as would a
    user's own. Each set's strategy here is TensorFlow's ``MirroredStrategy`` with its own key range, below
    harness' (``strategy_for``); nothing else differs.
    """
    index = stock_strategy_for.cache_info().currsize
    return _KeyedMirroredStrategy(list(devices), key_base=STOCK_KEY_BASE + KEYS_PER_STRATEGY * index)


def replica_device(devices, ctx) -> str:
    """The device name of replica ``ctx`` (replica ids follow the strategy's ``devices``)."""
    return devices[int(tf.get_static_value(ctx.replica_id_in_sync_group))]


def sum_replicas(strategy, value, device: str):
    """The sum of a per-replica ``value`` over the replicas, on ``device``."""
    with tf.device(device):
        return tf.add_n(list(strategy.experimental_local_results(value)))


def whole_batch(ctx, local, start, total):
    """Every replica's rows of ``local``, in batch order, with only this replica's rows live.

    Collective all-gather needs equal shapes; uneven slices are instead padded
    with zeros to the whole batch and summed (adding exact zeros is exact).
    """
    local = restore_static_shape(local)
    end = start + tf.shape(local)[0]
    pad = [[start, total - end]] + [[0, 0]] * (len(local.shape) - 1)
    gathered = tf.stop_gradient(ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.pad(local, pad)))
    return tf.concat([gathered[:start], local, gathered[end:]], axis=0)


def global_moments(
    parts: Sequence[tf.Tensor],
    axes: Sequence[int],
    all_reduce: AllReduce,
    devices: Sequence[str | None] | None = None,
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Mean and variance of the concatenation of ``parts`` over ``axes``.

    Args:
        parts: the local tensors (one per tower, or the replica's own one).
        axes: reduction axes (every axis but the channel axis).
        all_reduce: sums one tensor per part into the global total and
            returns it per part (a list of the same length).
        devices: where each part's local reductions run (``None``: anywhere).

    Returns:
        ``(means, variances)``, one per part, channel-shaped.
    """
    devices = list(devices) if devices is not None else [None] * len(parts)
    axes = list(axes)

    def local(fn, *args):
        # No device (inside a replica): the replica's own device scope. tf.device(None) would clear it,
        # leaving tensors without a device, which a multi-worker all-reduce cannot send anywhere.
        out = []
        for device, values in zip(devices, zip(*args)):
            with tf.device(device) if device is not None else contextlib.nullcontext():
                out.append(fn(*values))
        return out

    def local_sum(x):
        # TF's CPU Conv2D returns a wrongly shaped *empty* tensor for an empty batch (its
        # channel count is the input's), and static-shape rewrites keep that from being
        # patched later: flatten to [-1, channels] first, which any empty tensor satisfies.
        rank = len(x.shape)
        keep = [1 if i in axes else d for i, d in enumerate(x.shape)]
        kept = [i for i in range(rank) if i not in axes]
        moved = tf.transpose(x, list(axes) + kept) if kept != list(range(rank - len(kept), rank)) else x
        flat = tf.reshape(moved, [-1, math.prod(keep)])
        return tf.reshape(tf.reduce_sum(flat, axis=0), keep)

    sums = local(local_sum, parts)
    counts = local(lambda x: tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype), parts)
    count = all_reduce(counts)
    means = local(tf.math.divide_no_nan, all_reduce(sums), count)
    squares = local(
        lambda x, m: local_sum(tf.math.squared_difference(x, tf.stop_gradient(m))),
        parts,
        means,
    )
    variances = local(tf.math.divide_no_nan, all_reduce(squares), count)
    means = local(lambda m: tf.squeeze(m, axes), means)
    return means, local(lambda v: tf.squeeze(v, axes), variances)


def replica_all_reduce(values: list[tf.Tensor]) -> list[tf.Tensor]:
    """The ``all_reduce`` of ``global_moments`` inside a replica: the sum over all replicas."""
    ctx = tf.distribute.get_replica_context()
    return [ctx.all_reduce(tf.distribute.ReduceOp.SUM, values[0])]
