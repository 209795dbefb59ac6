"""``JaxTowers``: a Keras 3 model on the JAX backend whose steps are the single-device step of the whole batch, cut
by ratios over devices (``harness.parallel.jax``, where the step is described)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from keras import tree

from harness.errors import InvalidValue, NotSupported, Refused
from harness.parallel.adapters.jaxtrainer import (
    batches_on_host,
    batchnorm_layers,
    drawing_per_device,
    forward_losses,
    get_mask,
    own_moments,
    seed_generators,
    set_mask,
    update_metrics,
    whole_batch_moments,
)
from harness.parallel.jax.devices import device_name, put
from harness.parallel.jax.seeds import device_seed
from harness.parallel.jax.segments import DeviceRun, Plan, run_backward, run_forward
from harness.parallel.jax.statistics import local_moments
from harness.split import split_batch, validate_ratios

__all__ = ["JaxTowers"]

_STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss")


class _Held:
    """A value Keras does not track (devices, the template: its variables are the core model's)."""

    def __init__(self, value):
        self.value = value


class JaxTowers(keras.Model):
    """A Keras 3 model on the JAX backend whose steps run the template once per device on its slice of the batch,
    and compute the loss, the metrics and the gradient of the whole batch (``harness.parallel.jax``)."""

    method = "towers"

    def __init__(self, template, devices: list, ratios: tuple[float, ...], merge_device, *,
                 sync_batchnorm: bool = True, emulator=None):
        from harness.randomness import random_layers

        if not template.built:
            raise InvalidValue(f"model {template.name!r} is not built: give it a keras.Input or call it on data "
                               "before parallelize()")
        own = [name for name in _STEP_METHODS if getattr(type(template), name, None) is not getattr(keras.Model, name)]
        if own:
            raise NotSupported("custom-train-step",
                               f"model {template.name!r} ({type(template).__name__}) defines its own {', '.join(own)}; "
                               "on Keras' JAX backend harness does not yet split a model's own steps. Train it on "
                               "TensorFlow with method='towers'")
        batchnorm = batchnorm_layers(template)
        synced = bool(sync_batchnorm) and len(devices) > 1
        own_stats = [layer.name for layer in batchnorm if own_moments(layer)]
        if synced and own_stats:
            raise Refused("jax-batchnorm",
                          f"{template.name!r} has BatchNormalization layers that compute their moments their own way "
                          f"({', '.join(own_stats)}: a subclass's _moments); harness shares Keras' own moments across "
                          "devices. Train it on one device, with sync_batchnorm=False, or on TensorFlow")
        super().__init__(name=f"towers_{template.name}", dtype=template.dtype_policy)
        self._template_ref = _Held(template)
        self._devices_ref = _Held(tuple(devices))
        self._merge_ref = _Held(merge_device)
        self._emulator_ref = _Held(emulator)  # harness.emulation.HostEmulator: emulated or timed devices, or None
        self._rebalancer_ref = _Held(None)  # ratios="auto": harness.Rebalance, added to every fit's callbacks
        self.ratios = validate_ratios(ratios, len(devices))
        self.sync_batchnorm = bool(sync_batchnorm)
        self.random_layers = random_layers(template)
        names = getattr(template, "output_names", None)
        if names:
            self.output_names = list(names)
        self._core_model = template  # tracked: its variables are this model's
        self._batchnorm_ref = _Held(batchnorm if synced else [])
        self._generators_ref = _Held(seed_generators(template))
        own_state = {id(s.state) for s in self._generators_ref.value}
        own_state |= {id(v) for layer in batchnorm for v in layer.non_trainable_variables}
        self._own_state = own_state  # state a forward pass may update: seeds, BatchNormalization's moving statistics
        self._metrics_read_x = type(template).compute_metrics is not keras.Model.compute_metrics
        self._assigned: dict[bool, tuple[int, ...]] = {}
        self._plans: dict = {}
        self._merged = jax.jit(self._merged_loss, static_argnames=("training",))
        self._merged_grads = jax.jit(self._merged_loss_grads_metrics)
        self._metric_update = jax.jit(self._update_metrics)
        self._gradient = jax.jit(_summed_terms, static_argnames=("like",))
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

    # -- emulated and timed devices (harness.emulation; what harness.Rebalance reads) -----------------------------
    @property
    def emulator(self):
        """The ``harness.emulation.HostEmulator`` slowing the devices down or timing them, or None."""
        return self._emulator_ref.value

    @property
    def rebalancer(self):
        """The built-in ``Rebalance`` of ``ratios="auto"``, else None."""
        return self._rebalancer_ref.value

    def time_devices(self):
        """Logs every device's busy time in training steps; returns the ``HostEmulator`` that holds the log. A model
        built without ``emulate`` gets ``HostEmulator({}, timed=devices)``: each step then waits for each device's
        gradient from the host and stamps it (``Emulator.wait_steps``), which also ends the step's overlap with
        the next one's dispatch."""
        from harness.emulation import HostEmulator

        if self.emulator is None:
            self._emulator_ref.value = HostEmulator({}, timed=self.devices)
        else:
            self.emulator.add_timed(list(self.devices))
        return self.emulator

    def gather_device_rows(self, rows: list) -> list:
        """Every device's ``(busy seconds, samples, steps)`` (``Rebalance``): one process measures them all."""
        return rows

    def compile(self, *args, jit_compile="auto", **kwargs):
        """As ``Model.compile``; the step is never one jitted program (each device's part is: ``jax-jit-compile``)."""
        if jit_compile is True:
            raise Refused("jax-jit-compile",
                          "jit_compile=True makes the whole step one XLA program, which runs on one device; harness "
                          "compiles each device's part of the step itself. Use jit_compile='auto' or False")
        self._apply = None
        return super().compile(*args, jit_compile=False, **kwargs)

    # Keras' loops, each with the batches left where they are (NumPy on the host): each slice goes to its device.
    def fit(self, *args, **kwargs):
        if self.rebalancer is not None:
            callbacks = list(kwargs.get("callbacks") or [])
            if not any(c is self.rebalancer for c in callbacks):
                kwargs["callbacks"] = [self.rebalancer, *callbacks]
        with batches_on_host():
            return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        with batches_on_host():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with batches_on_host():
            return super().predict(*args, **kwargs)

    def train_on_batch(self, *args, **kwargs):
        with batches_on_host():
            return super().train_on_batch(*args, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        with batches_on_host():
            return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        with batches_on_host():
            return super().predict_on_batch(*args, **kwargs)

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

    # -- one device's forward pass, traced and cut (segments.Plan) ----------------------------
    def _forward(self, training: bool, asked: list):
        """The template's forward pass on one device's slice: ``(trainable, non-trainable, x, device index) ->
        (outputs, losses it added, non-trainable values after it, the Keras mask of each output leaf or None)``;
        the indices of the non-trainable variables it assigned go to ``_assigned`` (``_check_state``)."""
        def forward(trainable, non_trainable, x, index):
            mapping = list(zip(self.trainable_variables, trainable)) + list(zip(self.non_trainable_variables,
                                                                                non_trainable))
            with contextlib.ExitStack() as stack:
                stack.enter_context(drawing_per_device(self._generators_ref.value, lambda s: device_seed(s, index)))
                statistics = stack.enter_context(whole_batch_moments(self._batchnorm_ref.value, local_moments))
                scope = stack.enter_context(keras.StatelessScope(state_mapping=mapping, collect_losses=True))
                before = [scope.get_current_value(v) for v in self.non_trainable_variables]
                y = self._core_model(x, training=training)
            asked.extend(statistics)  # the layers whose whole-batch statistics the pass asked for, in order
            after = [scope.get_current_value(v) for v in self.non_trainable_variables]
            changed = [i for i, (old, new) in enumerate(zip(before, after)) if new is not old]  # assigned in the pass
            self._assigned[training] = tuple(changed)  # at trace time: the same for every call of this trace
            return y, list(scope.losses), after, [get_mask(leaf) for leaf in tree.flatten(y)]
        return forward

    def _plan(self, training: bool, args: tuple) -> Plan:
        """The traced and cut pass for these arguments' shapes (one per slice shape and mode)."""
        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = (training, treedef, tuple((a.shape, str(a.dtype)) for a in leaves))
        if key not in self._plans:
            asked: list = []
            forward = self._forward(training, asked)

            def flat(*values):
                return forward(*jax.tree_util.tree_unflatten(treedef, values))

            plan = Plan(flat, leaves, range(len(args[0])))
            if len(plan.markers) != len(asked):
                names = ", ".join(dict.fromkeys(layer.name for layer in asked))
                raise Refused("jax-batchnorm",
                              f"{self.template.name!r} computes the statistics of BatchNormalization {names} inside "
                              "a JAX transformation of its forward pass (a jax.lax loop or cond, jax.checkpoint, a "
                              "nested jit), where harness cannot share them across devices. Train it on one device, "
                              "with sync_batchnorm=False, or on TensorFlow")
            self._plans[key] = plan
        return self._plans[key]

    def _check_state(self, training: bool) -> None:
        """Refuses a model whose forward pass assigned other state than its seed generators' and its
        BatchNormalization's moving statistics (by name)."""
        other = [self.non_trainable_variables[i].path for i in self._assigned.get(training, ())
                 if id(self.non_trainable_variables[i]) not in self._own_state]
        if other:
            raise Refused("jax-stateful-layer",
                          f"{self.template.name!r} updates {', '.join(other)} in training; on Keras' JAX backend "
                          "harness cannot yet combine such state across devices. Train it on one device or on "
                          "TensorFlow")

    def _slices(self, x) -> list[tuple[int, Any, int, int]]:
        """``(index, device, start, stop)`` of each device with rows of this batch."""
        n = int(tree.flatten(x)[0].shape[0])
        sizes = split_batch(n, self.ratios)
        out, start = [], 0
        for index, (device, size) in enumerate(zip(self._devices_ref.value, sizes)):
            if size:
                out.append((index, device, start, start + size))
            start += size
        return out

    def _runs(self, trainable, non_trainable, x, training: bool) -> list[DeviceRun]:
        """Each device with rows: its slice sent from where the batch is (the host, for NumPy data) straight to it,
        the weights and its index beside it, and its traced pass."""
        runs = []
        for index, device, start, stop in self._slices(x):
            if self.emulator is not None:
                self.emulator.check_fits(device_name(device), stop - start)
            args = put((trainable, non_trainable, tree.map_structure(lambda a, s=start, e=stop: a[s:e], x),
                        np.int32(index)), device)
            runs.append(DeviceRun(self._plan(training, args), device, jax.tree_util.tree_leaves(args), index))
        return runs

    def _on_merge(self, value):
        return put(value, self._merge_ref.value)

    def _gathered(self, runs: list[DeviceRun], passes: list):
        """The devices' sizes as shares of the batch (weakly typed: each loss's own precision), outputs, losses and
        masks, on the merge device."""
        sizes = [int(tree.flatten(p[0])[0].shape[0]) for p in passes]
        n = sum(sizes)
        return ([size / n for size in sizes], [self._on_merge(p[0]) for p in passes],
                [self._on_merge(p[1]) for p in passes], [self._on_merge(p[3]) for p in passes])

    def _merged_x(self, x):
        """What the loss and the metrics get as ``x``: the batch where the model's own ``compute_metrics`` reads it,
        else an empty array of its rows (Keras' loss tracker reads the batch size from it)."""
        if self._metrics_read_x:
            return self._on_merge(x)
        return np.zeros((int(tree.flatten(x)[0].shape[0]), 0), np.float32)

    # -- the steps ------------------------------------------------------------------------------
    def _update_metrics(self, metrics_variables, unscaled, x, y, y_pred, sample_weight, masks):
        _attach(y_pred, masks)
        return update_metrics(self, metrics_variables, unscaled, x, y, y_pred, sample_weight)

    def _merged_loss_grads_metrics(self, trainable, outputs, losses, shares, non_trainable, metrics_variables,
                                   optimizer_variables, x, y, sample_weight, masks):
        """One program on the merge device: the scaled loss of the whole batch, its gradients with respect to the
        weights (the regularisers'), the devices' outputs and losses, and the metrics updated with it:
        ``((weights' gradient, outputs' cotangents, losses' cotangents), logs, metrics variables)``."""
        (_, (unscaled, y_pred, metrics_variables, merged_masks)), cts = jax.value_and_grad(
            self._merged_loss, argnums=(0, 1, 2), has_aux=True)(
            trainable, outputs, losses, shares, non_trainable, metrics_variables, optimizer_variables, x, y,
            sample_weight, masks)
        logs, metrics_variables = self._update_metrics(metrics_variables, unscaled, x, y, y_pred, sample_weight,
                                                       merged_masks)
        return cts, logs, metrics_variables

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

    def _passes(self, trainable, non_trainable, x, training: bool, differentiate: bool):
        runs = self._runs(trainable, non_trainable, x, training)
        combined = run_forward(runs, self._merge_ref.value, differentiate)
        self._check_state(training)
        return runs, combined, [run.outputs() for run in runs]

    def train_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        started = time.perf_counter()  # each device's step begins here (emulated and timed devices)
        trainable, non_trainable, optimizer_variables, metrics_variables = (self._on_merge(s) for s in state)
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        y, sample_weight = self._on_merge(y), self._on_merge(sample_weight)
        runs, combined, passes = self._passes(trainable, non_trainable, x, training=True, differentiate=True)
        shares, outputs, losses, masks = self._gathered(runs, passes)
        merged_x = self._merged_x(x)

        (own_grads, output_cts, loss_cts), logs, metrics_variables = self._merged_grads(
            trainable, outputs, losses, shares, non_trainable, metrics_variables, optimizer_variables, merged_x, y,
            sample_weight, masks)
        final_cts = []
        for run, out_ct, loss_ct in zip(runs, output_cts, loss_cts):
            cts = put(jax.tree_util.tree_leaves((out_ct, loss_ct)), run.device)
            final_cts.append(cts + [None] * (run.plan.out_tree.num_leaves - len(cts)))
        run_backward(runs, self._merge_ref.value, combined, final_cts)
        like = tuple((tuple(t.shape), str(t.dtype)) for t in trainable)
        grads = [self._device_gradient(run, like) for run in runs]
        if self.emulator is not None:  # a device's step ends when its gradient is ready, or at its emulated end
            self.emulator.wait_steps(started, [
                (device_name(run.device), int(tree.flatten(p[0])[0].shape[0]), lambda g=g: jax.block_until_ready(g))
                for run, p, g in zip(runs, passes, grads)])
        grads = [self._on_merge(g) for g in grads]
        new_non_trainable = self._on_merge(passes[0][2])  # seeds, moving statistics: alike on every device
        if self._apply is None:
            self._apply = jax.jit(_summed_apply(self.optimizer))
        trainable, optimizer_variables = self._apply(optimizer_variables, grads, own_grads, trainable)
        return logs, (trainable, new_non_trainable, optimizer_variables, metrics_variables)

    def _device_gradient(self, run: DeviceRun, like: tuple) -> list:
        """One device's gradient: per weight the sum of its segments' parts (``_summed_terms``), with no program
        where every weight got exactly one part (a model of one segment: the sum is that part)."""
        terms = [run.weight_cts.get(i) for i in range(len(like))]
        single = [parts[0] for parts in terms if parts is not None and len(parts) == 1]
        return single if len(single) == len(terms) else self._gradient(terms, like=like)

    def test_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        trainable, non_trainable, metrics_variables = (self._on_merge(s) for s in state)
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        y, sample_weight = self._on_merge(y), self._on_merge(sample_weight)
        runs, _, passes = self._passes(trainable, non_trainable, x, training=False, differentiate=False)
        shares, outputs, losses, masks = self._gathered(runs, passes)
        merged_x = self._merged_x(x)
        _, (unscaled, y_pred, metrics_variables, merged_masks) = self._merged(
            trainable, outputs, losses, shares, non_trainable, metrics_variables, [], merged_x, y, sample_weight,
            masks, training=False)
        logs, metrics_variables = self._metric_update(metrics_variables, unscaled, merged_x, y, y_pred, sample_weight,
                                                      merged_masks)
        return logs, (trainable, self._on_merge(passes[0][2]), metrics_variables)

    def predict_step(self, state, data):
        from keras.utils import unpack_x_y_sample_weight

        trainable, non_trainable = (self._on_merge(s) for s in state)
        x, _, _ = unpack_x_y_sample_weight(data)
        _, _, passes = self._passes(trainable, non_trainable, x, training=False, differentiate=False)
        y_pred, _ = _merge([self._on_merge(p[0]) for p in passes], [self._on_merge(p[3]) for p in passes])
        return y_pred, self._on_merge(passes[0][2])  # a layer drawing in inference too moved its seed on


def _summed_terms(terms: list, like: tuple):
    """One device's gradient: per weight, the sum of what each segment gave it (0 where none did)."""
    out = []
    for parts, (shape, dtype) in zip(terms, like):
        if not parts:
            out.append(jnp.zeros(shape, dtype))
            continue
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        out.append(total)
    return out


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
