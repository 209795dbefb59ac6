"""Towers for Keras 2 models (``tf_keras`` under ``TF_USE_LEGACY_KERAS=1``, or TF <= 2.15's keras).

The same exact step as ``harness.parallel.towers``: the batch is cut by the
current ratios on the host, the template runs once per device on its slice,
the outputs are merged once, and the loss, metrics and gradients are those of
the whole batch. Keras 2 differs in what the step has to collect: weight
penalties are the layers' ``_callable_losses`` (counted once per step, not once
per tower), activity regularisers are means over each slice (weighted by the
slice's share), and the loss goes through ``compiled_loss``. BatchNormalization
gets whole-batch statistics from ``harness.parallel.keras2_layerwise``.

Emulated and timed devices, ``ratios="auto"``, ``set_ratios`` and saving are
those of every parallel model (``common.ParallelCommon``): an emulated device's
slice passes its begin op before its tower and its end op after its backward
pass, and the built-in ``Rebalance`` is a callback of the model's own Keras
(``rebalance_class``). ``method="mirrored"`` is ``keras2_mirrored``.
"""

from __future__ import annotations

import tensorflow as tf

from harness.compat import Keras2NotSupported, keras_module_of
from harness.emulate import add_zero
from harness.parallel import keras2_layerwise as layerwise
from harness.parallel import slicing
from harness.parallel.common import ParallelCommon
from harness.parallel.keras2_batchnorm import unsyncable_batchnorms

__all__ = ["build", "unsupported_layers", "is_loss_scaling", "apply_finished"]


def unsupported_layers(template, sync_batchnorm: bool = True) -> list[str]:
    """Layers the Keras 2 towers cannot train exactly, as ``"name (why)"``."""
    if not sync_batchnorm or not layerwise.has_batchnorm(template):
        return []
    found = unsyncable_batchnorms(template)
    if layerwise.graph_of(template) is None:
        found.append(f"{template.name} (a subclassed model with BatchNormalization: whole-batch statistics "
                     "need a Functional or Sequential model; or pass sync_batchnorm=False)")
    return found


def is_loss_scaling(k, optimizer) -> bool:
    """True for a mixed-precision ``LossScaleOptimizer`` of Keras 2 module ``k``."""
    return isinstance(optimizer, k.mixed_precision.LossScaleOptimizer)


def apply_finished(k, optimizer, grads, weights, zero) -> None:
    """Unscales ``grads`` (mixed precision), adds the emulated devices' ``zero`` and applies them.

    The zero is their end ops' result: the update waits for every device's
    emulated finish, and changes nothing.
    """
    if is_loss_scaling(k, optimizer):
        grads = optimizer.get_unscaled_gradients(grads)
    pairs = [(g, w) for g, w in zip(grads, weights) if g is not None]  # as minimize, unused weights are skipped
    grads, weights = [g for g, _ in pairs], [w for _, w in pairs]
    optimizer.apply_gradients(list(zip(add_zero(grads, zero), weights)))


_CLASSES: dict = {}


def _towers_class(k):
    """The Keras 2 towers model class for Keras module ``k`` (one per module and process)."""
    if k in _CLASSES:
        return _CLASSES[k]

    class Keras2TowersModel(ParallelCommon, k.Model):
        """Ratio-split towers around a Keras 2 template; ``fit``/``evaluate``/``predict`` as any model."""

        method = "towers"

        def __init__(self, template, devices, ratios, merge_device, sync_batchnorm=True, emulator=None):
            super().__init__(name=f"towers_{template.name}")
            self.template = template  # tracked: its variables are this model's variables
            self._init_common(devices, ratios, merge_device, emulator)
            self.sync_batchnorm = bool(sync_batchnorm)
            self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(template)

        def call(self, inputs, training=None):
            return self.template(inputs, training=training)

        # -- the step ---------------------------------------------------------
        def _forward(self, x, training, watch=None):
            """``(y_pred, losses, pending)``: merged outputs, the layers' call-time losses of the whole batch,
            and the emulated devices' pending ends.

            Keras 2 divides an activity regulariser by the batch size of the call
            (``_handle_activity_regularization``): a tower's losses are means over
            its slice, so each is weighted by its slice's share ``n_i / N``.
            With ``watch`` (a training tape's), emulated devices are finished after
            their backward pass, as in ``harness.parallel.towers``: each pending
            ``(device, token, input)`` is finished on its input's gradient.
            """
            # Cut (and gated on the begin ops) outside the cond: the tape watches the gated inputs.
            with tf.device("/device:CPU:0"):
                n = slicing.batch_size_of(x)
                sizes = slicing.split_sizes(n, self._shares_ref.value)
                parts = slicing.split_structure(x, sizes, len(self.devices))
            parts, tokens = zip(*(self._begin_device(d, part) for d, part in zip(self.devices, parts)))
            pending = []
            if watch is not None:
                for device, part, token in zip(self.devices, parts, tokens):
                    leaf = tf.nest.flatten(part)[0]
                    if token is not None and leaf.dtype.is_floating:
                        watch(leaf)
                        pending.append((device, token, leaf))
            deferred = {device for device, _, _ in pending}

            def parallel():
                if training and self._layerwise:
                    outputs, losses = layerwise.run_towers(self.template, list(parts), self.devices,
                                                           self.merge_device, training)
                else:
                    outputs, losses = [], []
                    for device, part in zip(self.devices, parts):
                        with tf.device(device):
                            outputs.append(self.template(part, training=training))
                        losses.append(layerwise.own_losses(self.template))
                outputs = [out if d in deferred else self._end_device(d, out, token)
                           for d, out, token in zip(self.devices, outputs, tokens)]
                with tf.device(self.merge_device):
                    weights = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
                    extra = [tf.cast(loss, tf.float32) * weights[i] for i, tower in enumerate(losses) for loss in tower]
                    return slicing.concat_structures(outputs), layerwise.add_all(extra)

            def single():  # fewer samples than devices: the single-device step itself
                with tf.device(self.merge_device):
                    y_pred = self.template(x, training=training)
                    return y_pred, layerwise.add_all(layerwise.own_losses(self.template))

            if len(self.devices) == 1:
                return (*parallel(), pending)
            return (*tf.cond(n >= len(self.devices), parallel, single), pending)

        def train_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred, extra, pending = self._forward(x, training=True, watch=tape.watch)
                regularization = [extra, *layerwise.penalties(self.template)]  # weight penalties once per step
                loss = self.compiled_loss(y, y_pred, sample_weight, regularization_losses=regularization)
                scaled = self.optimizer.get_scaled_loss(loss) if pending and is_loss_scaling(k, self.optimizer) \
                    else loss
            if not pending:
                self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
                return self.compute_metrics(x, y, y_pred, sample_weight)
            weights = self.trainable_variables
            grads = tape.gradient(scaled, weights + [leaf for _, _, leaf in pending])

            def finished():  # each emulated device finishes when its backward pass reaches its input
                return tf.add_n([self.emulator.finish(device, token, after=y_pred if g is None else g)
                                 for (device, token, _), g in zip(pending, grads[len(weights):])])

            # A batch smaller than the device count ran the single-device step: no device's work to log.
            zero = finished() if len(self.devices) == 1 else tf.cond(
                slicing.batch_size_of(x) >= len(self.devices), finished, lambda: tf.zeros((), tf.float32))
            apply_finished(k, self.optimizer, grads[: len(weights)], weights, zero)
            return self.compute_metrics(x, y, y_pred, sample_weight)

        def test_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            y_pred, extra, _ = self._forward(x, training=False)
            regularization = [extra, *layerwise.penalties(self.template)]
            self.compiled_loss(y, y_pred, sample_weight, regularization_losses=regularization)
            return self.compute_metrics(x, y, y_pred, sample_weight)

        def predict_step(self, data):
            x, _, _ = k.utils.unpack_x_y_sample_weight(data)
            return self._forward(x, training=False)[0]

    _CLASSES[k] = Keras2TowersModel
    return Keras2TowersModel


def build(template, devices: list[str], ratios, merge_device: str, *, method: str = "towers",
          sync_batchnorm: bool = True, emulator=None):
    """The Keras 2 parallel model of ``template``; refuses layers it cannot train exactly, naming them.

    ``method="mirrored"`` is built by ``harness.parallel.keras2_mirrored``.

    Args:
        template, devices, ratios, merge_device, method, sync_batchnorm: as for ``harness.parallelize``.
        emulator: a ``harness.emulate.Emulator`` for emulated devices, or None.

    Raises:
        Keras2NotSupported: for layers listed by ``unsupported_layers`` (towers).
    """
    refused = unsupported_layers(template, sync_batchnorm) if method == "towers" else []
    if refused:
        raise Keras2NotSupported(
            f"harness.parallelize on a Keras 2 model ({type(template).__module__}) does not support yet: "
            + "; ".join(refused) + ". Use a Keras 3 model (import keras, TF >= 2.16) for these"
        )
    if method == "mirrored":
        from harness.parallel.keras2_mirrored import build_mirrored

        return build_mirrored(template, devices, ratios, merge_device, sync_batchnorm=sync_batchnorm,
                              emulator=emulator)
    return _towers_class(keras_module_of(template))(template, devices, ratios, merge_device, sync_batchnorm,
                                                    emulator)
