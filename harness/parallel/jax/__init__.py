"""Towers on Keras 3's JAX backend (``KERAS_BACKEND=jax``): the ratio split without TensorFlow.

Keras' own data parallelism on JAX (``keras.distribution.DataParallel``) shards a batch evenly or not at all. Here
each training step is the single-device step of the whole batch, cut by ratios (``towers.JaxTowers``):

1. the batch is cut by ``harness.split.split_batch`` (the same sizes as on TensorFlow) where it is (the host, for
   NumPy data) and each slice goes straight to its device, with the weights and the device's index;
2. each device runs its slice's forward pass under ``jax.vjp``, which keeps what its backward pass needs on that
   device: one XLA program per device, or, where the pass needs the whole batch's BatchNormalization statistics,
   one program per segment between them, the statistics combined on the merge device in between
   (``segments``, ``statistics``);
3. the outputs go to the merge device, where the loss of the whole batch is computed by Keras' own
   ``compute_loss`` (the forward pass's own losses, each device's weighted by its share of the rows, and the
   weights' regularisation once) and differentiated with respect to each device's outputs;
4. each device's cotangents go back to it and its backward pass gives its gradient (segment by segment, the
   statistics' cotangents summed over the devices); the gradients are summed on the merge device in device order
   (then the regularisation's);
5. the optimizer applies them once (``stateless_apply``, one program on the merge device) and the metrics are
   updated on the whole batch; the new weights go to the devices at the next step.

Random layers draw on each device from a stream of its own (``seeds``). Refused by name: a BatchNormalization the
cut cannot reach or whose moments are its own (``jax-batchnorm``), a layer that updates other state in training
(``jax-stateful-layer``), a model with its own steps (``custom-train-step``), ``jit_compile=True``
(``jax-jit-compile``). The one home of private Keras here is ``harness.parallel.adapters.jaxtrainer``.

Nothing here imports TensorFlow (an import-linter contract, and tests/onjax/ run it with any attempt failing).
"""

from __future__ import annotations

from harness.emulation import emulator_for
from harness.errors import Refused
from harness.parallel.jax.devices import device_name, resolve_jax_devices
from harness.parallel.jax.towers import JaxTowers
from harness.split import validate_ratios

__all__ = ["JaxTowers", "parallelize_jax", "resolve_jax_devices", "device_name"]


def parallelize_jax(model, devices, ratios, method: str, sync_batchnorm: bool, merge_device, emulate):
    """``harness.parallelize`` of a Keras 3 model on the JAX backend (its checks: ``JaxTowers``): ``emulate`` as on
    TensorFlow (``harness.emulation``: rate, MAXBATCH, overhead; no link); ``ratios="auto"`` starts even (the caller
    adds ``harness.Rebalance``, ``JaxTowers.rebalancer``)."""
    if method != "towers":
        raise Refused("jax-method", f"on Keras' JAX backend harness trains with method='towers' only (mirrored is "
                                    f"TensorFlow's MirroredStrategy); got method={method!r}")
    names = resolve_jax_devices(devices)
    merge = names[0] if merge_device is None else resolve_jax_devices([merge_device])[0]
    auto = isinstance(ratios, str)  # "auto" (harness.parallelize checked it)
    ratios = validate_ratios([1.0] * len(names) if ratios is None or auto else ratios, len(names))
    emulator = emulator_for(emulate, [device_name(d) for d in names])
    linked = [name for name, spec in (emulator.devices.items() if emulator is not None else ()) if spec.link]
    if linked:
        raise Refused("jax-emulated-link", f"emulated links ({', '.join(linked)}) are modelled on TensorFlow's "
                                           "towers and mirrored; on the JAX backend an emulated device has a rate, "
                                           "a MAXBATCH and an overhead: drop the link")
    return JaxTowers(model, names, ratios, merge, sync_batchnorm=sync_batchnorm, emulator=emulator)
