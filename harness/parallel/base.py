"""The parallel model both methods share, in both Keras generations.

A ``ParallelModel`` is compiled, fitted, evaluated and predicted with like any
Keras model. Its steps split each batch by ratios (``slicing``), run the
devices, and compute loss and metrics on the *whole* batch, so a parallel step
equals a single-device step. Where Keras 3 and Keras 2 differ, the step asks
the model's ``Adapter`` (``harness.parallel.adapters``); the concrete classes
are made per Keras module by ``towers.towers_class`` and
``mirrored.mirrored_class``. Saving writes the plain template model.

What a merged output keeps: the rows of every device in batch order, and the
mask and the logits Keras keeps on an output (a softmax's cross-entropy is
computed from its logits; masked timesteps are left out of the loss and the
metrics), merged the same way.
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf

from harness.emulate import add_zero
from harness.parallel import Method, layerwise, slicing
from harness.parallel.adapters.base import add_all
from harness.parallel.common import ParallelCommon, Untracked
from harness.parallel.staging import Staged

__all__ = ["Method", "ParallelModel", "add_all", "add_zero_where_present"]


class ParallelModel(ParallelCommon):
    """Base of the towers and mirrored models (mixed in before a Keras ``Model``); not built directly."""

    method: Method
    _adapter: Any = None  # the Adapter of the model's Keras: set on each concrete class
    optimizer: Any  # Keras sets it in compile

    def __init__(self, template, devices: list[str], ratios: tuple[float, ...], sync_batchnorm: bool,
                 merge_device: str, emulator=None):
        # The template's dtype policy: under mixed_float16, compile() then wraps the optimizer for loss
        # scaling as it does for the template on one device.
        super().__init__(name=f"{self.method.value}_{template.name}",  # type: ignore[call-arg]  # a Keras Model
                         dtype=template.dtype_policy)
        self._template_ref = Untracked(template)
        self._init_common(devices, ratios, merge_device, emulator)
        self.sync_batchnorm = bool(sync_batchnorm)
        # tf.data hands batches over on the host: slice there, ship only the slices.
        self.input_device = "/device:CPU:0"
        names = getattr(template, "output_names", None)
        if names:  # compile() matches dict losses and metrics to outputs by these names
            self.output_names = list(names)

    # -- the wrapped models -------------------------------------------------
    @property
    def template(self):
        """The single-device model passed in; holds the trained weights after ``fit``."""
        return self._template_ref.value

    @property
    def core(self):
        """The model whose variables are trained (the template, or its mirrored clone)."""
        return self._core_model

    def call(self, inputs, training=None):
        return self.core(inputs, training=training)

    # -- split and merge --------------------------------------------------------
    def _split(self, x):
        """``(n, sizes, slices)``: the batch size, per-device sizes and slices of ``x``, cut on the host (a
        staged batch's, already on their devices: ``staging``)."""
        staged = self._staged_for(x)
        if staged is not None:
            return staged.n, staged.sizes, staged.parts
        with tf.device(self.input_device):
            n = slicing.batch_size_of(x)
            sizes = slicing.split_sizes(n, self._shares_ref.value)
            return n, sizes, slicing.split_structure(x, sizes, len(self.devices))

    def _batch_sources(self, x) -> list:
        """The step's input tensors a sparse lookup may depend on (``sparse``): ``x``'s, and the slices of a
        staged batch (its slices are inputs of the step, not cut from ``x`` in it)."""
        staged = self._staged_for(x)
        return tf.nest.flatten(x) + ([] if staged is None else tf.nest.flatten(staged.parts, expand_composites=True))

    def _staged_for(self, x):
        """The staged batch whose input is ``x`` (the step being traced reads its slices), else None."""
        staged = self._staged_now
        return staged if staged is not None and x is staged.whole else None

    def _merge(self, parts):
        """The devices' output structures joined in batch order, masks and logits included."""
        with tf.device(self.merge_device):
            extras = [self._extras(p) for p in parts]
            keys = set.intersection(*(set(e) for e in extras))
            joined = {key: slicing.concat_structures([e[key] for e in extras]) for key in sorted(keys)}
            return self._attach(slicing.concat_structures(parts), joined)

    def _extras(self, structure) -> dict:
        """The masks and logits on the leaves of ``structure``: ``{"mask3": ..., "logits0": ...}``."""
        a, found = self._adapter, {}
        for i, leaf in enumerate(tf.nest.flatten(structure)):
            for kind, value in (("mask", a.get_mask(leaf)), ("logits", a.get_logits(leaf))):
                if value is not None:
                    found[f"{kind}{i}"] = value
        return found

    def _attach(self, structure, extras: dict):
        """``structure`` with ``extras`` (as ``_extras`` returns them) put back on its leaves."""
        for i, leaf in enumerate(tf.nest.flatten(structure)):
            if f"mask{i}" in extras:
                self._adapter.set_mask(leaf, extras[f"mask{i}"])
            if f"logits{i}" in extras:
                self._adapter.set_logits(leaf, extras[f"logits{i}"])
        return structure

    def _end_device(self, device: str, y, token):
        return self._attach(super()._end_device(device, y, token), self._extras(y))

    # -- towers: several devices in one graph (the towers method, and each worker across workers) --------
    def _run_towers(self, model, devices, parts, shares, training: bool, watch=None, layerwise_bn: bool = False,
                    merge_device: str | None = None, all_reduce=None, rows=None):
        """Runs ``model`` once per device on that device's slice; ``(outputs, extra, pending)``.

        ``outputs``: one output structure per device; ``extra``: the call-time losses of the whole batch
        (``shares``: each slice's n_i / N); ``pending``: the emulated devices whose end waits for their
        backward pass (``_finish_towers``). With ``watch`` (a training tape's), each emulated device's first
        input is watched for that. ``layerwise_bn``: BatchNormalization gets the whole batch's statistics
        (``layerwise``; summed over the towers on ``merge_device``, or by ``all_reduce``). ``rows``: per
        tower, its rows of the batch, where a tower may carry a borrowed row (``multiworker``): its
        statistics leave it out, and an empty tower's call-time losses count zero.
        """
        parts, tokens = zip(*(self._begin_device(d, part) for d, part in zip(devices, parts)))
        pending = []
        if watch is not None:
            for device, part, token in zip(devices, parts, tokens):
                leaf = tf.nest.flatten(part)[0]
                if token is not None and leaf.dtype.is_floating:
                    watch(leaf)
                    pending.append((device, token, leaf))
        if training and layerwise_bn:
            outputs, losses = layerwise.run_towers(self._adapter, model, list(parts), devices, merge_device,
                                                   training, all_reduce, rows)
        else:
            outputs, losses = [], []
            for device, part in zip(devices, parts):
                with tf.device(device):
                    outputs.append(model(part, training=training))
                losses.append(self._adapter.call_losses(model))
        deferred = {device for device, _, _ in pending}
        outputs = [out if d in deferred else self._end_device(d, out, token)
                   for d, out, token in zip(devices, outputs, tokens)]
        # A device off the merge device sends its outputs there (an emulated link pays for them at its end).
        sent = {d: out for d, out in zip(devices, outputs) if self._is_remote(d)}
        pending = [(d, token.sending(sent[d], d) if d in sent else token, leaf) for d, token, leaf in pending]
        with tf.device(merge_device) if merge_device else contextlib.nullcontext():
            towers = [self._as_share(tower, shares[i]) for i, tower in enumerate(losses)]
            if rows is not None:  # an empty tower's borrowed row adds nothing
                towers = [t * tf.cast(rows[i] > 0, t.dtype) for i, t in enumerate(towers)]
            extra = add_all(towers)
        return outputs, extra, pending

    def _finish_towers(self, grads, pending, input_grads, after):
        """``grads`` once each pending emulated device finished, when its backward pass reached its input (a
        device off the merge device sends its gradients there over its emulated link)."""
        if not pending:
            return grads
        zeros = [self.emulator.finish(device, token, after=after if g is None else g,
                                      sent=grads if self._is_remote(device) else None)
                 for (device, token, _), g in zip(pending, input_grads)]
        return add_zero_where_present(grads, tf.add_n(zeros))

    # -- loss -------------------------------------------------------------------
    def _call_losses(self, layer, share=None):
        """The call-time losses ``layer`` added, as a share of the whole batch's (``share``: n_i / N)."""
        return self._as_share(self._adapter.call_losses(layer), share)

    def _as_share(self, losses: list, share=None):
        """The sum of one device's call-time ``losses`` as its part of the whole batch's: Keras 2's are
        means over the slice (times ``share`` = n_i / N), Keras 3's sums."""
        total = add_all(losses)
        return total * share if share is not None and self._adapter.call_losses_are_means else total

    def _penalties(self):
        return add_all(self._adapter.weight_penalties(self.core))

    def _whole_batch_loss(self, y, y_pred, sample_weight, extra):
        """``(compiled, total)``: the compiled loss (0 without one) and compiled + call-time losses + weight
        penalties, as Keras' ``compute_loss`` on one device."""
        with tf.device(self.merge_device):
            compiled = add_all([self._adapter.loss(self, y, y_pred, sample_weight)])
            return compiled, add_all([compiled, extra])

    def _report(self, x, y, y_pred, sample_weight, extra, compiled=None):
        """Updates the loss metrics and compiled metrics once, on the whole batch.

        ``compiled``: the whole batch's compiled loss where the step computed it
        (the loss metrics then need no second computation where Keras keeps no
        per-output loss metric).
        """
        with tf.device(self.merge_device):
            self._adapter.report_loss(self, y, y_pred, sample_weight, extra, slicing.batch_size_of(x), compiled)
            return self.compute_metrics(x, y, y_pred, sample_weight)

    def _by_batch_size(self, x, parallel, single, small_possible: bool = True):
        """``parallel()`` unless the batch is smaller than the device count, then ``single()``.

        A batch smaller than the device count leaves some device an empty slice,
        and TF kernels mishandle empty batches (CPU Conv2D returns a wrongly
        shaped tensor, its gradient then fails). Such a batch runs on the merge
        device alone: the single-device step itself, so exact by definition.
        Where the trace knows the batch size (``train_on_batch``, a dataset whose
        batch dimension is fixed), the branch that size takes is traced alone:
        TensorFlow traces again for another size. Elsewhere both are, in a
        ``tf.cond``; ``small_possible=False`` (a fit whose batches are all large
        enough): ``parallel()`` alone, after asserting that the batch is.
        """
        if len(self.devices) == 1:
            return parallel()
        rows = slicing.static_batch_size_of(x)
        if rows is not None:
            return parallel() if rows >= len(self.devices) else single()
        if not small_possible:
            n = slicing.batch_size_of(x)
            check = tf.debugging.assert_greater_equal(
                n, len(self.devices), message=(
                    f"harness traced this fit's train step without the single-device path for batches smaller "
                    f"than the device count ({len(self.devices)}): fit's arrays had none, yet one arrived"))
            # Every op of the step after the check: a batch that fails it changes no weight, optimizer slot or
            # step count (without this, the optimizer's step count always moved and, once, the weights too).
            with tf.control_dependencies([check] if check is not None else []):
                return parallel()

        def carrying(branch):  # tf.cond returns new tensors: the masks and logits go through it too
            def run():
                y_pred, *rest = branch()
                return (y_pred, self._extras(y_pred), *rest)
            return run

        y_pred, extras, *rest = tf.cond(slicing.batch_size_of(x) >= len(self.devices), carrying(parallel),
                                        carrying(single))
        return (self._attach(y_pred, extras), *rest)

    def build_optimizer(self) -> None:
        """Creates the compiled optimizer's variables (its slots) for the trained weights now, as ``fit`` does."""
        with self._cross_replica():
            self._adapter.build_optimizer(self.optimizer, self.core.trainable_variables)

    # -- the single-device step (batches smaller than the device count) -----------------
    def _cross_replica(self):
        return contextlib.nullcontext()

    def _single_forward(self, x, training: bool):
        with tf.device(self.merge_device):
            y_pred = self.core(x, training=training)
            return y_pred, self._call_losses(self.core)

    def _single_train(self, x, y, sample_weight):
        """``(y_pred, extra, compiled)``: one training step of the whole batch on the merge device."""
        with self._cross_replica():
            with tf.GradientTape() as tape:
                y_pred, extra = self._single_forward(x, training=True)
                extra = extra + self._penalties()
                compiled, loss = self._whole_batch_loss(y, y_pred, sample_weight, extra)
                scaled = self._adapter.scale_loss(self.optimizer, loss)
            weights = self.core.trainable_weights
            with tf.device(self.merge_device):
                grads = tape.gradient(scaled, self._local_variables(weights))
        self._apply_whole_gradients(grads, weights)
        return y_pred, extra, compiled

    def _local_variables(self, weights):
        """What a forward pass on the merge device read: the variables themselves here."""
        return weights

    def _apply_whole_gradients(self, grads, weights):
        """Applies gradients computed outside any replica."""
        self._adapter.apply_gradients(self.optimizer, grads, weights)

    # -- the Keras steps ----------------------------------------------------------
    def train_step(self, data):
        x, y, sample_weight = self._adapter.k.utils.unpack_x_y_sample_weight(data)
        staged = x if isinstance(x, Staged) else None
        if staged is not None:  # cut and copied while the step before ran: the step reads its slices
            x = staged.whole
        self._staged_now = staged
        try:
            y_pred, extra, compiled = self._by_batch_size(
                x, lambda: self._parallel_train(x, y, sample_weight), lambda: self._single_train(x, y, sample_weight),
                small_possible=self._small_batches_possible,
            )
        finally:
            self._staged_now = None
        return self._report(x, y, y_pred, sample_weight, extra, compiled)

    def _forward(self, x):
        return self._by_batch_size(
            x, lambda: self._parallel_forward(x), lambda: self._single_forward(x, training=False)
        )

    def test_step(self, data):
        x, y, sample_weight = self._adapter.k.utils.unpack_x_y_sample_weight(data)
        y_pred, extra = self._forward(x)
        return self._report(x, y, y_pred, sample_weight, extra + self._penalties())

    def predict_step(self, data):
        x, _, _ = self._adapter.k.utils.unpack_x_y_sample_weight(data)
        return self._forward(x)[0]

    def _parallel_train(self, x, y, sample_weight):
        """One training step over all devices; returns ``(y_pred, extra, compiled)``: the merged predictions,
        the call-time losses and weight penalties and the compiled loss of the whole batch, before the update."""
        raise NotImplementedError

    def _parallel_forward(self, x):
        """Inference over all devices; returns ``(y_pred, call-time losses)``."""
        raise NotImplementedError


def add_zero_where_present(grads, zero):
    """``grads`` with an emulated device's exact ``zero`` added (None kept: a weight without gradient)."""
    return [None if g is None else add_zero(g, zero) for g in grads]
