"""Exact data parallelism for Keras models: ``parallelize`` and ``multi_gpu_model``."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from harness.cluster import Cluster
from harness.emulate import emulator_for
from harness.errors import InvalidType, InvalidValue, Refused
from harness.split import validate_ratios

__all__ = ["parallelize", "multi_gpu_model", "Method", "METHODS"]


class Method(str, Enum):
    """How the batch is spread over devices (the one list of parallel methods; light: no TensorFlow)."""

    TOWERS = "towers"
    MIRRORED = "mirrored"


METHODS = tuple(m.value for m in Method)



def parallelize(
    model,
    devices: int | Sequence[str | int] | Cluster,
    ratios: Sequence[float] | str | None = None,
    method: str | None = None,
    sync_batchnorm: bool = True,
    merge_device: str | None = None,
    emulate=None,
    overlap: bool = True,
):
    """Wraps a built Keras model so each batch is split over devices by ratios.

    The returned model is compiled, fitted, evaluated and predicted with like
    any Keras model; every step equals the single-device step on the whole
    batch (dropout and other randomness aside). ``model`` keeps the trained
    weights after ``fit``, and saving writes it as a plain Keras model.

    Args:
        model: a built ``keras.Model`` (Functional, Sequential or subclassed). A
            Keras 2 model (``tf_keras``, or TF <= 2.15's ``keras``) gets the
            same steps through its adapter (``harness.parallel.adapters``);
            layers it cannot train exactly raise
            ``harness.compat.Keras2NotSupported``. A model with its own
            ``train_step``/``test_step``/``compute_loss`` runs them unchanged with
            ``method="towers"``, its model calls split over the devices
            (``harness.parallel.custom``); other methods refuse it
            (``harness.errors.NotSupported``, a ``NotImplementedError``).
        devices: device names (``["/gpu:0", "/gpu:1"]``), GPU ids, or an int N
            for the first N GPUs (the first N logical CPUs without a GPU); or the
            ``harness.use_cluster()`` of a multi-worker run (``method="mirrored"``;
            ``ratios`` and ``emulate`` then have one entry per device of
            ``cluster.devices``, worker by worker, worker 0's first:
            ``harness.parallel.multiworker``).
        ratios: one positive number per device; ``None`` splits evenly.
            ``"auto"`` starts even and tunes the split while it trains: every
            ``fit`` gets a built-in ``harness.Rebalance`` (``model.rebalancer``)
            that times each device's step (``model.time_devices()``) and, after
            the first few steps and whenever the devices drift apart by more
            than 5%, re-splits in proportion to their measured samples per
            busy second. The global batch never changes and every step stays
            exact whatever the split; ``model.ratios`` is the current split.
            Loops of ``train_on_batch`` are not rebalanced.
        method: ``"mirrored"`` (``tf.distribute.MirroredStrategy``, the default) or
            ``"towers"`` (one graph, variables on one device). On Keras 3's JAX
            backend only ``"towers"`` (the default there): ``harness.parallel.jax``.
        sync_batchnorm: BatchNormalization statistics and moving averages of
            the whole batch, weighted by sample counts (exact). ``False`` keeps
            per-device statistics.
        merge_device: where tower outputs are merged and the loss is computed;
            defaults to the first device.
        emulate: make the devices emulated heterogeneous devices: one
            ``harness.emulate.EmulatedDevice`` per device, a spec string
            ``"1345:1100,875"``, or an ``Emulator`` shared by several models. On
            Keras 3's JAX backend each step waits from the host for each device's
            work and its emulated end (no link: ``jax-emulated-link``).
        overlap: ``fit`` copies each device's next slice to it while the
            current step runs (``harness.parallel.staging``); ``False`` copies
            each slice inside its step (what the overlap saves, measured).
            Across workers, each worker's slices are cut in its step.

    Returns:
        A ``keras.Model`` to ``compile`` and ``fit``.

    Raises:
        harness.errors.InvalidType: ``model`` is not a Keras model, or ``devices``/``ratios`` have the wrong
            type (a ``TypeError``).
        harness.errors.InvalidValue: unbuilt model, unknown method or devices, invalid ratios (a ``ValueError``).
        harness.errors.Refused: what ``method`` cannot train exactly, by name (a ``ValueError``): a
            BatchNormalization layer it cannot synchronise (``harness.compat.Keras2NotSupported``, also a
            ``RuntimeError``, on Keras 2), a layer towers cannot run.
        harness.errors.NotSupported: the model defines its own ``train_step``, ``test_step`` or ``compute_loss``
            and ``method`` is not ``"towers"`` (a ``Refused`` and a ``NotImplementedError``).

    Examples:
        >>> import harness, keras
        >>> devices = harness.use_logical_devices(2)
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> parallel = harness.parallelize(model, devices, ratios=[3, 2])
        >>> parallel.compile(optimizer="sgd", loss="mse")
        >>> tuned = harness.parallelize(model, devices, ratios="auto")  # split tuned while training
    """
    from harness.compat import is_keras2_model
    from harness.devices import resolve_devices
    from harness.parallel.adapters import adapter_for

    if method is not None and method not in METHODS:
        raise InvalidValue(f"method must be one of {list(METHODS)}; got method={method!r}")
    if not is_keras2_model(model):  # tf_keras (TF_USE_LEGACY_KERAS=1) or TF <= 2.15's keras
        import keras

        if not isinstance(model, keras.Model):
            raise InvalidType(f"model must be a keras.Model; got {type(model).__name__}")
        if keras.backend.backend() == "jax":  # harness.parallel.jax: no TensorFlow on this path
            method = method or "towers"
            if isinstance(devices, Cluster):
                raise Refused("jax-cluster", "across workers harness trains on TensorFlow's "
                                             "MultiWorkerMirroredStrategy; on Keras' JAX backend give local devices")
            from harness.parallel.jax import parallelize_jax

            auto = _is_auto(ratios)
            parallel = parallelize_jax(model, devices, "auto" if auto else ratios, method, sync_batchnorm,
                                       merge_device, emulate)
            if auto:  # each device's busy time logged from the host, re-split as on TensorFlow
                from harness.parallel.rebalance import Rebalance

                parallel.time_devices()
                parallel._rebalancer_ref.value = Rebalance(every=AUTO_EVERY, warmup=AUTO_WARMUP)
            return parallel
    method = method or "mirrored"
    if not model.built:
        raise InvalidValue(
            f"model {model.name!r} is not built: give it a keras.Input or call it on data before parallelize()"
        )
    cluster = devices if isinstance(devices, Cluster) else None
    _refuse_own_steps(model, method, cluster is not None)
    if cluster is not None and method != "mirrored":
        raise InvalidValue(f"across workers (a harness.use_cluster() cluster as devices) method must be 'mirrored'; "
                           f"got method={method!r}")
    names = list(devices.devices) if isinstance(devices, Cluster) else resolve_devices(devices)
    auto = _is_auto(ratios)  # True for "auto", False for None or a sequence; raises for any other str
    ratios = validate_ratios([1.0] * len(names) if ratios is None or isinstance(ratios, str) else ratios, len(names))
    if cluster is not None:
        merge = cluster.local_devices[0] if merge_device is None else merge_device
    else:
        merge = names[0] if merge_device is None else resolve_devices([merge_device])[0]
    adapter = adapter_for(model)
    refused = adapter.unsupported(model, method, sync_batchnorm)
    if refused:
        raise adapter.unsupported_error(model, method, refused)
    if cluster is not None:
        from harness.parallel.multiworker import multiworker_class as make
    elif method == "towers":
        from harness.parallel.towers import towers_class as make
    else:
        from harness.parallel.mirrored import mirrored_class as make
    parallel = make(adapter)(model, cluster or names, ratios, sync_batchnorm, merge, emulator_for(emulate, names))
    parallel.overlap = overlap
    if auto:
        from harness.compat import keras_module_of
        from harness.parallel.rebalance import rebalance_class

        parallel.time_devices()
        parallel._rebalancer_ref.value = rebalance_class(keras_module_of(model))(every=AUTO_EVERY, warmup=AUTO_WARMUP)
    return parallel


AUTO_EVERY = 10  # ratios="auto": steps per measurement window
AUTO_WARMUP = 2  # ... and steps ignored first (tracing) and after each re-split


def _refuse_own_steps(model, method: str, across_workers: bool) -> None:
    """A model with its own ``train_step``/``test_step``/``compute_loss`` runs them on towers (``custom``);
    every other method refuses it, by name."""
    from harness.parallel import custom

    own = custom.own_steps(model)
    if own and (method != "towers" or across_workers):
        where = "across workers, method='mirrored'" if across_workers else f"method={method!r}"
        raise custom.refusal(model, own, where)


def _is_auto(ratios) -> bool:
    if not isinstance(ratios, str):
        return False
    if ratios != "auto":
        raise InvalidValue(f"ratios must be a list of numbers, None (even) or 'auto'; got ratios={ratios!r}")
    return True


def multi_gpu_model(model, gpus, ratios=None, cpu_merge: bool = True, cpu_relocation: bool = False):
    """Drop-in for Keras 2.2's ``multi_gpu_model`` and the ratio version of seed 000 (jinkos/multi-gpus,
    docs/background.md).

    Builds the towers design (one graph, variables on one device). Without a
    GPU, ``gpus`` counts logical CPU devices instead, so the same code runs on
    a CPU-only machine.

    Args:
        model: a built Keras model.
        gpus: an int N >= 2 (GPUs 0..N-1) or a list of GPU ids ``[0, 1]``.
        ratios: per-GPU shares of each batch, e.g. ``[3, 2]``; ``None`` is even.
        cpu_merge: merge tower outputs (and compute the loss) on the CPU.
        cpu_relocation: accepted for compatibility; variables already live
            with ``model`` (on the device it was built on).

    Returns:
        The parallel model.

    Raises:
        ValueError: ``gpus`` below 2, more GPUs than present, bad ratios.

    Examples:
        >>> parallel = harness.multi_gpu_model(model, gpus=[0, 1], ratios=[3, 2])
    """
    import tensorflow as tf

    from harness.devices import resolve_devices

    del cpu_relocation  # variables are never copied: they stay where the template built them
    has_gpu = bool(tf.config.list_logical_devices("GPU"))
    if isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple)):
        raise InvalidType(f"gpus must be an int or a list of GPU ids; got gpus={gpus!r}")
    if isinstance(gpus, int):
        if gpus < 2:
            raise InvalidValue(f"gpus must be >= 2 (for one device, use the model itself); got gpus={gpus}")
        devices = resolve_devices(gpus)
    else:
        kind = "GPU" if has_gpu else "CPU"
        devices = resolve_devices([f"/{kind}:{int(g)}" for g in gpus])
    return parallelize(
        model, devices, ratios=ratios, method="towers", merge_device="/cpu:0" if cpu_merge else devices[0]
    )
