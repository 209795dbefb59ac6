"""Towers on Keras 3's JAX backend (``KERAS_BACKEND=jax``): the ratio split without TensorFlow.

Keras' own data parallelism on JAX (``keras.distribution.DataParallel``) shards a batch evenly or not at all. Here
each training step is the single-device step of the whole batch, cut by ratios:

1. the batch is cut on the host by ``harness.split.split_batch`` (the same sizes as on TensorFlow) and each slice
   goes to its device with the weights;
2. each device runs its slice's forward pass (one XLA program per device, ``jax.jit`` of the model called in a
   ``keras.StatelessScope``) under ``jax.vjp``, which keeps what its backward pass needs on that device;
3. the outputs go to the merge device, where the loss of the whole batch is computed by Keras' own
   ``compute_loss`` (the forward pass's own losses, each device's weighted by its share of the rows, and the
   weights' regularisation once) and differentiated with respect to each device's outputs;
4. each device's cotangents go back to it and its backward pass gives its gradient; the gradients are summed on
   the merge device in device order (then the regularisation's);
5. the optimizer applies them once (``stateless_apply``, one program on the merge device) and the metrics are
   updated on the whole batch; the new weights go back to the devices at the next step.

Refused by name: BatchNormalization (whole-batch statistics are not built on JAX yet: ``jax-batchnorm``), a layer
that updates other state in training (``jax-stateful-layer``), a model with its own steps (``custom-train-step``),
``jit_compile=True`` (a whole-step program would run on one device: ``jax-jit-compile``). Random layers draw on
every device from the same seed state: equal in distribution, not in value (``harness.compat.random_layers``).

Nothing here imports TensorFlow: tests/onjax/ run it with any attempt to import it failing the test.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import keras
from keras import tree

from harness.errors import InvalidType, InvalidValue, NotSupported, Refused
from harness.parallel.adapters.jaxtrainer import (
    forward_losses,
    get_mask,
    set_mask,
    sublayers,
    update_metrics,
)
from harness.split import split_batch, validate_ratios

__all__ = ["JaxTowers", "parallelize_jax", "resolve_jax_devices", "device_name"]

_NAME = re.compile(r"^/?(?:device:)?(cpu|gpu|cuda|rocm|tpu):(\d+)$", re.IGNORECASE)


def device_name(device) -> str:
    """``"cpu:1"``, ``"gpu:0"``: a JAX device's platform and its place among that platform's devices."""
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    return f"{platform}:{jax.devices(device.platform).index(device)}"


def resolve_jax_devices(devices) -> list:
    """JAX devices from an int N (the first N GPUs; the first N CPU devices without a GPU), a list of GPU ids, of
    names (``"cpu:1"``, ``"/gpu:0"``, ``"/device:CPU:2"``, ``"cuda:0"``) or of JAX devices. A name or an id that is
    not a device raises ``InvalidValue`` naming it and the devices there are."""
    cpus = jax.devices("cpu")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # no GPU backend
        gpus = []
    there = ", ".join(device_name(d) for d in gpus + cpus)
    if isinstance(devices, bool):
        raise InvalidType(f"devices must be an int or a list of devices; got devices={devices!r}")
    if isinstance(devices, int):
        pool = gpus or cpus
        if not 1 <= devices <= len(pool):
            raise InvalidValue(f"devices={devices}: this process has {len(pool)} {'GPU' if gpus else 'CPU'} "
                               f"device(s) ({there}); use harness.use_jax_cpu_devices(n) before JAX starts for more "
                               "CPU devices")
        return pool[:devices]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
        raise InvalidType(f"devices must be an int or a non-empty list of devices; got devices={devices!r}")
    out = []
    for item in devices:
        if isinstance(item, jax.Device):
            out.append(item)
            continue
        if isinstance(item, int) and not isinstance(item, bool):
            pool, index = (gpus or cpus), item
        elif isinstance(item, str) and _NAME.match(item.strip()):
            kind, number = _NAME.match(item.strip()).groups()  # type: ignore[union-attr]
            pool, index = (cpus if kind.lower() == "cpu" else gpus), int(number)
        else:
            raise InvalidValue(f"devices: {item!r} is not a JAX device, a GPU id or a name like 'cpu:1' or 'gpu:0'")
        if not 0 <= index < len(pool):
            raise InvalidValue(f"devices: no device {item!r} in this process (it has {there})")
        out.append(pool[index])
    if len(set(out)) != len(out):
        raise InvalidValue(f"devices must be distinct; got {[device_name(d) for d in out]}")
    return out


def parallelize_jax(model, devices, ratios, method: str, sync_batchnorm: bool, merge_device, emulate):
    """``harness.parallelize`` of a Keras 3 model on the JAX backend (its checks: ``JaxTowers``)."""
    if method != "towers":
        raise Refused("jax-method", f"on Keras' JAX backend harness trains with method='towers' only (mirrored is "
                                    f"TensorFlow's MirroredStrategy); got method={method!r}")
    if emulate is not None:
        raise Refused("jax-emulate", "emulated devices are TensorFlow's (harness.emulate); on the JAX backend "
                                     "devices run at their own speed: emulate=None")
    names = resolve_jax_devices(devices)
    merge = names[0] if merge_device is None else resolve_jax_devices([merge_device])[0]
    ratios = validate_ratios([1.0] * len(names) if ratios is None else ratios, len(names))
    return JaxTowers(model, names, ratios, merge, sync_batchnorm=sync_batchnorm)


_STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss")


class _Held:
    """A value Keras does not track (devices, the template: its variables are the core model's)."""

    def __init__(self, value):
        self.value = value


def _seed_states(model) -> set[int]:
    """The ids of every seed generator state variable of ``model``'s layers (they advance alike on each device)."""
    states = set()
    for layer in [model, *sublayers(model)]:
        for value in vars(layer).values():
            if isinstance(value, keras.random.SeedGenerator):
                states.add(id(value.state))
    return states


class JaxTowers(keras.Model):
    """A Keras 3 model on the JAX backend whose steps run the template once per device on its slice of the batch,
    and compute the loss, the metrics and the gradient of the whole batch (``harness.parallel.onjax``)."""

    method = "towers"

    def __init__(self, template, devices: list, ratios: tuple[float, ...], merge_device, *,
                 sync_batchnorm: bool = True):
        from harness.compat import random_layers

        if not template.built:
            raise InvalidValue(f"model {template.name!r} is not built: give it a keras.Input or call it on data "
                               "before parallelize()")
        own = [name for name in _STEP_METHODS if getattr(type(template), name, None) is not getattr(keras.Model, name)]
        if own:
            raise NotSupported("custom-train-step",
                               f"model {template.name!r} ({type(template).__name__}) defines its own {', '.join(own)}; "
                               "on Keras' JAX backend harness does not yet split a model's own steps. Train it on "
                               "TensorFlow with method='towers'")
        batchnorm = [layer.name for layer in sublayers(template) if isinstance(layer, keras.layers.BatchNormalization)]
        if batchnorm and len(devices) > 1:
            raise Refused("jax-batchnorm",
                          f"on Keras' JAX backend harness does not yet share BatchNormalization statistics across "
                          f"devices (sync_batchnorm={sync_batchnorm}); {template.name!r} has {', '.join(batchnorm)}. "
                          "Train it on one device, or on TensorFlow (method='towers' or 'mirrored')")
        super().__init__(name=f"towers_{template.name}", dtype=template.dtype_policy)
        self._template_ref = _Held(template)
        self._devices_ref = _Held(tuple(devices))
        self._merge_ref = _Held(merge_device)
        self.ratios = validate_ratios(ratios, len(devices))
        self.sync_batchnorm = bool(sync_batchnorm)
        self.random_layers = random_layers(template)
        names = getattr(template, "output_names", None)
        if names:
            self.output_names = list(names)
        self._core_model = template  # tracked: its variables are this model's
        self._seed_ids = _seed_states(template)
        self._assigned: dict[bool, tuple[int, ...]] = {}
        # Each piece one XLA program on the device its arguments are on (jax.jit places it there).
        self._forward = jax.jit(self._stateless_forward, static_argnames=("training",))
        self._forward_vjp = jax.jit(self._forward_with_vjp)  # returns the backward pass (its residuals stay put)
        self._backward = jax.jit(lambda vjp, cotangents: vjp(cotangents)[0])
        self._merged = jax.jit(self._merged_loss, static_argnames=("training",))
        self._merged_grads = jax.jit(jax.value_and_grad(self._merged_loss, argnums=(0, 1, 2), has_aux=True))
        self._metric_update = jax.jit(self._update_metrics)
        self._apply = None

    # -- what a user sees ---------------------------------------------------------------------
    @property
    def template(self):
        """The single-device model passed in; holds the trained weights after ``fit``."""
        return self._template_ref.value

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(device_name(d) for d in self._devices_ref.value)

    @property
    def merge_device(self) -> str:
        return device_name(self._merge_ref.value)

    def set_ratios(self, ratios) -> tuple[float, ...]:
        """Splits the following batches by ``ratios`` (same global batch; every step stays exact)."""
        self.ratios = validate_ratios(ratios, len(self._devices_ref.value))
        return self.ratios

    def call(self, inputs, training=None):
        return self._core_model(inputs, training=training)

    def compile(self, *args, jit_compile="auto", **kwargs):
        """As ``Model.compile``; the step is never one jitted program (each device's part is: ``jax-jit-compile``)."""
        if jit_compile is True:
            raise Refused("jax-jit-compile",
                          "jit_compile=True makes the whole step one XLA program, which runs on one device; harness "
                          "compiles each device's part of the step itself. Use jit_compile='auto' or False")
        self._apply = None
        return super().compile(*args, jit_compile=False, **kwargs)

    def sync_to_template(self) -> None:
        """The template holds the trained weights already (its variables are this model's)."""

    def save(self, filepath, *args, **kwargs):
        """Saves the template model, loadable by ``keras.saving.load_model`` without harness."""
        return self.template.save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        return self.template.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        return self.template.load_weights(filepath, *args, **kwargs)

    def get_config(self):
        raise NotImplementedError(
            "a parallel model is not serialised itself: save() writes the single-device template model")

    # -- the pieces of a step, each one XLA program on one device -----------------------------
    def _stateless_forward(self, trainable, non_trainable, x, training: bool):
        """The template on ``x`` with these variable values: ``(outputs, losses it added, non-trainable values
        after it, the Keras mask of each output leaf or None)``; the indices of the non-trainable variables it
        assigned go to ``_assigned`` (``_check_state``)."""
        mapping = list(zip(self.trainable_variables, trainable)) + list(zip(self.non_trainable_variables,
                                                                            non_trainable))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            y = self._core_model(x, training=training)
        changed, after = [], []
        for i, (variable, value) in enumerate(zip(self.non_trainable_variables, non_trainable)):
            new = scope.get_current_value(variable)
            if new is not None:
                changed.append(i)
            after.append(value if new is None else new)
        self._assigned[training] = tuple(changed)  # at trace time: the same for every call of this trace
        return y, list(scope.losses), after, [get_mask(leaf) for leaf in tree.flatten(y)]

    def _forward_with_vjp(self, trainable, non_trainable, x):
        """The training forward pass of one device with its backward pass: ``(outputs, losses, non-trainable values
        after it, masks, vjp)``; ``vjp((output cotangents, loss cotangents))`` gives the gradient."""
        def forward(t):
            y, losses, after, masks = self._stateless_forward(t, non_trainable, x, training=True)
            return (y, losses), (after, masks)

        (y, losses), vjp, (after, masks) = jax.vjp(forward, trainable, has_aux=True)
        return y, losses, after, masks, vjp

    def _update_metrics(self, metrics_variables, unscaled, x, y, y_pred, sample_weight, masks):
        _attach(y_pred, masks)
        return update_metrics(self, metrics_variables, unscaled, x, y, y_pred, sample_weight)

    def _merged_loss(self, trainable, outputs, losses, shares, non_trainable, metrics_variables, optimizer_variables,
                     x, y, sample_weight, masks, training: bool = True):
        """The scaled loss of the whole batch from each device's outputs and losses (their rows in device order),
        with ``(unscaled loss, merged outputs, metrics variables after it, the merged outputs' masks)``: Keras'
        ``stateless_compute_loss`` (a compiled loss per output updates its metrics) and the optimizer's
        ``scale_loss``."""
        y_pred, merged_masks = _merge(outputs, masks)
        combined = []
        for j in range(len(losses[0]) if losses else 0):
            total = None
            for share, device_losses in zip(shares, losses):
                term = share * device_losses[j]
                total = term if total is None else total + term
            combined.append(total)
        with keras.StatelessScope(state_mapping=list(zip(self.trainable_variables, trainable))):
            regularisation = list(super().losses)  # the weights' regularisers (this scope ran no call)
        with forward_losses(self, combined + regularisation):
            loss, (_, _, metrics_variables) = self.stateless_compute_loss(
                trainable, non_trainable, metrics_variables, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                training=training)
        unscaled = loss
        if training and self.optimizer is not None:
            with keras.StatelessScope(state_mapping=list(zip(self.optimizer.variables, optimizer_variables))):
                loss = self.optimizer.scale_loss(loss)
        return loss, (unscaled, y_pred, metrics_variables, merged_masks)

    # -- the steps ------------------------------------------------------------------------------
    def _slices(self, x) -> list[tuple[Any, int, int]]:
        """``(device, start, stop)`` of each device with rows of this batch."""
        n = int(tree.flatten(x)[0].shape[0])
        sizes = split_batch(n, self.ratios)
        out, start = [], 0
        for device, size in zip(self._devices_ref.value, sizes):
            if size:
                out.append((device, start, start + size))
            start += size
        return out

    def _check_state(self, training: bool) -> None:
        """Refuses a model whose forward pass assigned other state than its seed generators' (by name)."""
        other = [self.non_trainable_variables[i].path for i in self._assigned.get(training, ())
                 if id(self.non_trainable_variables[i]) not in self._seed_ids]
        if other:
            raise Refused("jax-stateful-layer",
                          f"{self.template.name!r} updates {', '.join(other)} in training; on Keras' JAX backend "
                          "harness cannot yet combine such state across devices. Train it on one device or on "
                          "TensorFlow")

    def _run_devices(self, state, x, training: bool, differentiate: bool):
        trainable, non_trainable = state
        parts = []
        for device, start, stop in self._slices(x):
            x_i = jax.device_put(tree.map_structure(lambda a, s=start, e=stop: a[s:e], x), device)
            t_i, n_i = jax.device_put(trainable, device), jax.device_put(non_trainable, device)
            if differentiate:
                y_i, losses_i, after_i, masks_i, vjp_i = self._forward_vjp(t_i, n_i, x_i)
            else:
                y_i, losses_i, after_i, masks_i = self._forward(t_i, n_i, x_i, training=training)
                vjp_i = None
            parts.append(_Part(device, stop - start, y_i, losses_i, after_i, vjp_i, masks_i))
        self._check_state(training)
        return parts

    def _on_merge(self, value):
        return jax.device_put(value, self._merge_ref.value)

    def _gathered(self, parts: list[_Part]):
        """The devices' sizes as shares of the batch (weakly typed: each loss's own precision), outputs, losses and
        masks, on the merge device."""
        n = sum(p.size for p in parts)
        return ([p.size / n for p in parts], [self._on_merge(p.outputs) for p in parts],
                [self._on_merge(p.losses) for p in parts], [self._on_merge(p.masks) for p in parts])

    def train_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        trainable, non_trainable, optimizer_variables, metrics_variables = (self._on_merge(s) for s in state)
        x, y, sample_weight = (self._on_merge(d) for d in unpack_x_y_sample_weight(data))
        parts = self._run_devices((trainable, non_trainable), x, training=True, differentiate=True)
        shares, outputs, losses, masks = self._gathered(parts)

        (loss, (unscaled, y_pred, metrics_variables, merged_masks)), (own_grads, output_cts, loss_cts) = \
            self._merged_grads(trainable, outputs, losses, shares, non_trainable, metrics_variables,
                               optimizer_variables, x, y, sample_weight, masks)
        grads = [self._on_merge(self._backward(part.vjp, jax.device_put((out_ct, loss_ct), part.device)))
                 for part, out_ct, loss_ct in zip(parts, output_cts, loss_cts)]
        new_non_trainable = self._on_merge(parts[0].after)  # the seed states: each device advanced them alike
        if self._apply is None:
            self._apply = jax.jit(_summed_apply(self.optimizer))
        trainable, optimizer_variables = self._apply(optimizer_variables, grads, own_grads, trainable)
        logs, metrics_variables = self._metric_update(metrics_variables, unscaled, x, y, y_pred, sample_weight,
                                                merged_masks)
        return logs, (trainable, new_non_trainable, optimizer_variables, metrics_variables)

    def test_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        trainable, non_trainable, metrics_variables = (self._on_merge(s) for s in state)
        x, y, sample_weight = (self._on_merge(d) for d in unpack_x_y_sample_weight(data))
        parts = self._run_devices((trainable, non_trainable), x, training=False, differentiate=False)
        shares, outputs, losses, masks = self._gathered(parts)
        _, (unscaled, y_pred, metrics_variables, merged_masks) = self._merged(
            trainable, outputs, losses, shares, non_trainable, metrics_variables, [], x, y, sample_weight, masks,
            training=False)
        logs, metrics_variables = self._metric_update(metrics_variables, unscaled, x, y, y_pred, sample_weight,
                                                merged_masks)
        return logs, (trainable, non_trainable, metrics_variables)

    def predict_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        trainable, non_trainable = (self._on_merge(s) for s in state)
        x, _, _ = unpack_x_y_sample_weight(data)
        parts = self._run_devices((trainable, non_trainable), self._on_merge(x), training=False, differentiate=False)
        y_pred, _ = _merge([self._on_merge(p.outputs) for p in parts], [self._on_merge(p.masks) for p in parts])
        return y_pred, non_trainable


class _Part(NamedTuple):
    """One device's part of a step."""

    device: Any
    size: int  # its rows
    outputs: Any
    losses: list  # the losses its forward pass added (per-row means of its rows)
    after: list  # the non-trainable values after its forward pass
    vjp: Any  # its backward pass (training), else None
    masks: list  # the Keras mask of each output leaf, or None


def _merge(outputs: list, masks: list):
    """The devices' outputs (and masks, where an output has one) concatenated in device order: ``(outputs, flat
    list of masks)``, the masks attached to the outputs (a masked loss reads them)."""
    y = tree.map_structure(lambda *p: jnp.concatenate(p, axis=0), *outputs)
    merged = []
    for i, _ in enumerate(tree.flatten(y)):
        each = [m[i] for m in masks]
        merged.append(None if any(m is None for m in each) else jnp.concatenate(each, axis=0))
    _attach(y, merged)
    return y, merged


def _attach(y, masks: list) -> None:
    for leaf, mask in zip(tree.flatten(y), masks):
        if mask is not None:
            set_mask(leaf, mask)


def _summed_apply(optimizer):
    """``(optimizer variables, each device's gradient in device order, the regularisers' gradient, weights) ->
    (weights, optimizer variables)``: the gradients added in that order, then one optimizer step."""
    def apply(optimizer_variables, device_grads, own_grads, trainable):
        total = device_grads[0]
        for grads in device_grads[1:]:
            total = jax.tree_util.tree_map(jnp.add, total, grads)
        total = jax.tree_util.tree_map(jnp.add, total, own_grads)
        return optimizer.stateless_apply(optimizer_variables, total, trainable)
    return apply
