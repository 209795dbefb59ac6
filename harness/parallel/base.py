"""The parallel model both methods share: a Keras model around a template.

A ``ParallelModel`` is compiled, fitted, evaluated and predicted with like any
Keras model. Its steps split each batch by ratios (``slicing``), run the
devices, and compute loss and metrics on the *whole* batch, so a parallel step
equals a single-device step. Saving writes the plain template model.
"""

from __future__ import annotations

import contextlib
from enum import Enum

import keras
import tensorflow as tf
from keras import tree

from harness.parallel import Untracked, slicing
from harness.split import shares, validate_ratios

__all__ = ["Method", "ParallelModel"]


class Method(str, Enum):
    """How the batch is spread over devices."""

    TOWERS = "towers"
    MIRRORED = "mirrored"


class ParallelModel(keras.Model):
    """Base of the towers and mirrored models; not built directly."""

    method: Method

    def __init__(self, template: keras.Model, devices: list[str], ratios: tuple[float, ...], sync_batchnorm: bool,
                 merge_device: str, emulator=None):
        super().__init__(name=f"{self.method.value}_{template.name}")
        self._template_ref = Untracked(template)
        self._emulator_ref = Untracked(emulator)
        self._rebalancer_ref = Untracked(None)
        self.devices = tuple(devices)
        self.ratios = validate_ratios(ratios, len(self.devices))
        self.sync_batchnorm = bool(sync_batchnorm)
        self.merge_device = merge_device
        # tf.data hands batches over on the host: slice there, ship only the slices.
        self.input_device = "/device:CPU:0"
        # The split the step functions read: a variable, so set_ratios needs no retrace. Untracked:
        # it is no weight of the model (saving and get_weights never see it).
        with tf.init_scope(), tf.device(self.input_device):
            shares_var = tf.Variable(shares(self.ratios), dtype=tf.float64, trainable=False, name="split_shares")
        self._shares_ref = Untracked(shares_var)

    # -- the wrapped models -------------------------------------------------
    @property
    def template(self) -> keras.Model:
        """The single-device model passed in; holds the trained weights after ``fit``."""
        return self._template_ref.value

    @property
    def core(self) -> keras.Model:
        """The model whose variables are trained (the template, or its mirrored clone)."""
        return self._core_model

    def call(self, inputs, training=None):
        return self.core(inputs, training=training)

    def sync_to_template(self) -> None:
        """Copies trained weights into the template (no-op when they are shared).

        ``fit`` and the save methods call it; after ``train_on_batch`` loops call
        it yourself (not per step: for mirrored models it copies every weight).
        """

    # -- the split ---------------------------------------------------------------
    def set_ratios(self, ratios) -> tuple[float, ...]:
        """Splits the following batches by ``ratios``: same global batch, no retrace, still exact.

        The step functions read the split from a variable, so this takes effect
        from the next step, also between the steps of a running ``fit`` (what
        ``harness.Rebalance`` does). The in-graph split stays the one of
        ``harness.split.split_batch`` bit for bit.

        Args:
            ratios: one positive finite number per device.

        Returns:
            The ratios as floats (also ``self.ratios``).

        Raises:
            TypeError, ValueError: as ``harness.split.validate_ratios``.

        Example:
            >>> parallel.set_ratios([1000, 400])  # device 1 throttled to 400 samples/s
        """
        values = validate_ratios(ratios, len(self.devices))
        self._shares_ref.value.assign(shares(values))
        self.ratios = values
        return values

    @property
    def rebalancer(self):
        """The built-in ``harness.tuning.rebalance.Rebalance`` of ``ratios="auto"``, else None."""
        return self._rebalancer_ref.value

    # -- emulated and timed devices ---------------------------------------------
    @property
    def emulator(self):
        """The ``harness.emulate.Emulator`` slowing devices down or timing them, or None."""
        return self._emulator_ref.value

    def time_devices(self):
        """Logs every device's busy time; returns the ``Emulator`` that holds the log.

        A model built without ``emulate`` gets ``Emulator({}, timed=devices)``:
        its devices run at their own speed, their begin/end ops only stamp the
        time (what ``Rebalance`` measures). Adding devices to the log rebuilds
        the step functions once, so call it before training or from a
        callback's ``on_train_begin``.
        """
        from harness.emulate import Emulator

        emulator = self.emulator
        missing = [d for d in self.devices if emulator is None or d not in emulator.logged]
        if not missing:
            return emulator
        if emulator is None:
            self._emulator_ref.value = Emulator({}, timed=self.devices)
        else:
            emulator.add_timed(missing)
        # The step functions are traced with or without the begin/end ops: trace them again.
        if self.train_function is not None:
            self.make_train_function(force=True)
        self.test_function = None
        self.predict_function = None
        return self.emulator

    def _begin_device(self, device: str, x):
        """``(x, token)``: the device's slice, gated on its emulated start (if emulated)."""
        return (x, None) if self.emulator is None else self.emulator.begin(device, x)

    def _end_device(self, device: str, y, token):
        """The device's output, gated on its emulated finish (if emulated)."""
        return y if token is None else self.emulator.end(device, y, token)

    # -- persistence: always the plain single-device model -------------------
    def save(self, filepath, *args, **kwargs):
        """Saves the template model, loadable by ``keras.models.load_model`` without harness."""
        self.sync_to_template()
        return self.template.save(filepath, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        self.sync_to_template()
        return self.template.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        self.template.load_weights(filepath, *args, **kwargs)
        self._sync_from_template()

    def _sync_from_template(self) -> None:
        """Copies template weights into the trained model (no-op when shared)."""

    def get_config(self):
        raise NotImplementedError(
            "a parallel model is not serialised itself: save() writes the single-device template model"
        )

    # -- compile: never XLA -----------------------------------------------------
    def compile(self, *args, jit_compile="auto", **kwargs):
        """As ``keras.Model.compile``, without XLA: ``"auto"`` means off, ``True`` is refused.

        Keras 3's ``"auto"`` turns XLA on wherever a GPU is visible. The split
        sizes are tensors (partial batches, ``set_ratios``), which XLA needs as
        compile-time constants, and XLA cannot read variables placed on other
        devices (keras-team/keras#19005): the step would fail on the first GPU box.
        """
        if jit_compile is True:
            raise ValueError(
                "parallel models cannot be compiled with jit_compile=True: the ratio split's sizes change per "
                "batch (partial batches, set_ratios) and XLA needs them as compile-time constants, and XLA cannot "
                "read variables placed on other devices; use jit_compile=False (what 'auto' means here)"
            )
        super().compile(*args, jit_compile=False, **kwargs)

    # -- training entry points keep the template current ----------------------
    def fit(self, *args, **kwargs):
        if self.rebalancer is not None:
            args, kwargs = self._with_rebalancer(args, kwargs)
        try:
            return super().fit(*args, **kwargs)
        finally:
            self.sync_to_template()

    _CALLBACKS_POSITION = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)

    def _with_rebalancer(self, args, kwargs):
        """``fit``'s arguments with the built-in rebalancer added, unless the caller passed a ``Rebalance``."""
        from harness.tuning.rebalance import Rebalance

        args = list(args)
        positional = len(args) > self._CALLBACKS_POSITION
        given = args[self._CALLBACKS_POSITION] if positional else kwargs.get("callbacks")
        if isinstance(given, keras.callbacks.CallbackList):
            if not any(isinstance(c, Rebalance) for c in given.callbacks):
                given.callbacks.append(self.rebalancer)
                self.rebalancer.set_model(self)
            return tuple(args), kwargs
        given = list(given or [])
        if not any(isinstance(c, Rebalance) for c in given):
            given.append(self.rebalancer)
        if positional:
            args[self._CALLBACKS_POSITION] = given
        else:
            kwargs["callbacks"] = given
        return tuple(args), kwargs

    # -- shared step pieces ---------------------------------------------------
    def _split(self, x):
        """Per-device sizes and slices of ``x``, cut on the host by the current split."""
        with tf.device(self.input_device):
            n = slicing.batch_size_of(x)
            sizes = slicing.split_sizes(n, self._shares_ref.value)
            return n, sizes, slicing.split_structure(x, sizes, len(self.devices))

    def _merge(self, parts):
        with tf.device(self.merge_device):
            return slicing.concat_structures(parts)

    def _report(self, x, y, y_pred, sample_weight, loss):
        """Updates the loss tracker and compiled metrics on the whole batch."""
        self._loss_tracker.update_state(loss, sample_weight=slicing.batch_size_of(x))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _whole_batch_loss(self, y, y_pred, sample_weight, extra, scale=1.0):
        """Compiled loss (times ``scale``) + layer losses + weight penalties, as Keras' ``compute_loss``."""
        with tf.device(self.merge_device):
            main = [] if self._compile_loss is None else [self._compile_loss(y, y_pred, sample_weight) * scale]
            return add_all(main + [extra] + weight_losses(self.core))

    def _by_batch_size(self, x, parallel, single):
        """``parallel()`` unless the batch is smaller than the device count, then ``single()``.

        A batch smaller than the device count leaves some device an empty slice,
        and TF kernels mishandle empty batches (CPU Conv2D returns a wrongly
        shaped tensor, its gradient then fails). Such a batch runs on the merge
        device alone: the single-device step itself, so exact by definition.
        """
        if len(self.devices) == 1:
            return parallel()
        return tf.cond(slicing.batch_size_of(x) >= len(self.devices), parallel, single)

    # In the strategy's scope Keras scales mean losses by 1/replicas; the mirrored model undoes it.
    _in_scope_loss_scale = 1.0

    def _cross_replica(self):
        return contextlib.nullcontext()

    def _single_forward(self, x, training: bool):
        with tf.device(self.merge_device):
            y_pred = self.core(x, training=training)
            return y_pred, add_all(own_losses(self.core))

    def _single_train(self, x, y, sample_weight):
        with self._cross_replica():
            with tf.GradientTape() as tape:
                y_pred, extra = self._single_forward(x, training=True)
                loss = self._whole_batch_loss(y, y_pred, sample_weight, extra, self._in_scope_loss_scale)
                scaled = self.optimizer.scale_loss(loss)
            weights = self.core.trainable_weights
            with tf.device(self.merge_device):
                grads = tape.gradient(scaled, self._local_variables(weights))
            self._apply_whole_gradients(grads, weights)
        return loss, y_pred

    def _local_variables(self, weights):
        """What a forward pass on the merge device read: the variables themselves here."""
        return weights

    def _apply_whole_gradients(self, grads, weights):
        """Applies gradients computed outside any replica."""
        self.optimizer.apply_gradients(zip(grads, weights))

    # -- the Keras steps ----------------------------------------------------------
    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred = self._by_batch_size(
            x, lambda: self._parallel_train(x, y, sample_weight), lambda: self._single_train(x, y, sample_weight)
        )
        return self._report(x, y, y_pred, sample_weight, loss)

    def _forward(self, x):
        return self._by_batch_size(
            x, lambda: self._parallel_forward(x), lambda: self._single_forward(x, training=False)
        )

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, extra = self._forward(x)
        return self._report(x, y, y_pred, sample_weight, self._whole_batch_loss(y, y_pred, sample_weight, extra))

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._forward(x)[0]

    def _parallel_train(self, x, y, sample_weight):
        """One training step over all devices; returns ``(loss, y_pred)``."""
        raise NotImplementedError

    def _parallel_forward(self, x):
        """Inference over all devices; returns ``(y_pred, layer_losses)``."""
        raise NotImplementedError


def own_losses(model: keras.Model) -> list:
    """Losses added during the last call (``add_loss``, activity regularisers).

    Keras 3 activity regularisers are sums over the samples, so the losses of
    the devices' slices add up to the whole batch's.
    """
    return [loss for layer in model._flatten_layers(include_self=True) for loss in layer._get_own_losses()]


def weight_losses(model: keras.Model) -> list:
    """Weight regularisation losses: a function of the weights only, counted once per step."""
    return model._get_regularization_losses()


def add_all(values: list, dtype="float32"):
    values = [tf.cast(v, dtype) for v in tree.flatten(values)]
    return tf.add_n(values) if values else tf.zeros((), dtype)
