"""Towers for Keras 2 models (``tf_keras`` under ``TF_USE_LEGACY_KERAS=1``, or TF <= 2.15's keras).

The same exact step as ``harness.parallel.towers``: the batch is cut by the
current ratios on the host, the template runs once per device on its slice,
the outputs are merged once, and the loss, metrics and gradients are those of
the whole batch. Keras 2 differs in what the step has to collect: weight
penalties are the layers' ``_callable_losses`` (counted once per step, not once
per tower), activity regularisers are means over each slice (weighted by the
slice's share), and the loss goes through ``compiled_loss``. BatchNormalization
gets whole-batch statistics from ``harness.parallel.keras2_layerwise``.

Not built for Keras 2 yet (refused with the reason): emulated devices and
``ratios="auto"``. ``method="mirrored"`` is ``harness.parallel.keras2_mirrored``.
"""

from __future__ import annotations

import tensorflow as tf

from harness.compat import Keras2NotSupported, keras_module_of
from harness.parallel import Untracked, slicing
from harness.parallel import keras2_layerwise as layerwise
from harness.parallel.keras2_batchnorm import unsyncable_batchnorms
from harness.split import shares, validate_ratios

__all__ = ["build_towers", "unsupported_layers"]


def unsupported_layers(template, sync_batchnorm: bool = True) -> list[str]:
    """Layers the Keras 2 towers cannot train exactly, as ``"name (why)"``."""
    if not sync_batchnorm or not layerwise.has_batchnorm(template):
        return []
    found = unsyncable_batchnorms(template)
    if layerwise.graph_of(template) is None:
        found.append(f"{template.name} (a subclassed model with BatchNormalization: whole-batch statistics "
                     "need a Functional or Sequential model; or pass sync_batchnorm=False)")
    return found


_CLASSES: dict = {}


def _towers_class(k):
    """The Keras 2 towers model class for Keras module ``k`` (one per module and process)."""
    if k in _CLASSES:
        return _CLASSES[k]

    class Keras2TowersModel(k.Model):
        """Ratio-split towers around a Keras 2 template; ``fit``/``evaluate``/``predict`` as any model."""

        method = "towers"

        def __init__(self, template, devices, ratios, merge_device, sync_batchnorm=True):
            super().__init__(name=f"towers_{template.name}")
            self.template = template  # tracked: its variables are this model's variables
            self.devices = tuple(devices)
            self.ratios = validate_ratios(ratios, len(self.devices))
            self.merge_device = merge_device
            self.sync_batchnorm = bool(sync_batchnorm)
            self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(template)
            with tf.init_scope(), tf.device("/device:CPU:0"):
                split = tf.Variable(shares(self.ratios), dtype=tf.float64, trainable=False, name="split_shares")
            self._shares_ref = Untracked(split)

        def call(self, inputs, training=None):
            return self.template(inputs, training=training)

        def compile(self, *args, jit_compile=None, **kwargs):
            """As ``Model.compile``, without XLA (see ``ParallelModel.compile``)."""
            if jit_compile is True:
                raise ValueError("parallel models cannot be compiled with jit_compile=True: the ratio split's "
                                 "sizes change per batch and XLA needs them as compile-time constants")
            super().compile(*args, jit_compile=False, **kwargs)

        def set_ratios(self, ratios):
            """Splits the following batches by ``ratios`` (no retrace), as ``ParallelModel.set_ratios``."""
            values = validate_ratios(ratios, len(self.devices))
            self._shares_ref.value.assign(shares(values))
            self.ratios = values
            return values

        def sync_to_template(self) -> None:
            """Nothing to copy: the towers train the template's own variables."""

        # -- the step ---------------------------------------------------------
        def _forward(self, x, training):
            """``(y_pred, losses)``: merged outputs and the layers' call-time losses of the whole batch.

            Keras 2 divides an activity regulariser by the batch size of the call
            (``_handle_activity_regularization``): a tower's losses are means over
            its slice, so each is weighted by its slice's share ``n_i / N``.
            """
            def parallel():
                with tf.device("/device:CPU:0"):
                    n = slicing.batch_size_of(x)
                    sizes = slicing.split_sizes(n, self._shares_ref.value)
                    parts = slicing.split_structure(x, sizes, len(self.devices))
                if training and self._layerwise:
                    outputs, losses = layerwise.run_towers(self.template, parts, self.devices, self.merge_device,
                                                           training)
                else:
                    outputs, losses = [], []
                    for device, part in zip(self.devices, parts):
                        with tf.device(device):
                            outputs.append(self.template(part, training=training))
                        losses.append(layerwise.own_losses(self.template))
                with tf.device(self.merge_device):
                    weights = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
                    extra = [tf.cast(loss, tf.float32) * weights[i] for i, tower in enumerate(losses) for loss in tower]
                    return slicing.concat_structures(outputs), _sum(extra)

            def single():  # fewer samples than devices: the single-device step itself
                with tf.device(self.merge_device):
                    y_pred = self.template(x, training=training)
                    return y_pred, _sum([tf.cast(loss, tf.float32) for loss in layerwise.own_losses(self.template)])

            if len(self.devices) == 1:
                return parallel()
            return tf.cond(slicing.batch_size_of(x) >= len(self.devices), parallel, single)

        def _penalties(self):
            # Weight regularisation: a function of the weights, once per step (template.losses after
            # each tower would add it once per tower).
            return [loss() for layer in self.template._flatten_layers() for loss in layer._callable_losses]

        def train_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred, extra = self._forward(x, training=True)
                loss = self.compiled_loss(y, y_pred, sample_weight, regularization_losses=[extra, *self._penalties()])
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            return self.compute_metrics(x, y, y_pred, sample_weight)

        def test_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            y_pred, extra = self._forward(x, training=False)
            self.compiled_loss(y, y_pred, sample_weight, regularization_losses=[extra, *self._penalties()])
            return self.compute_metrics(x, y, y_pred, sample_weight)

        def predict_step(self, data):
            x, _, _ = k.utils.unpack_x_y_sample_weight(data)
            return self._forward(x, training=False)[0]

        # -- persistence: the plain template ------------------------------------------
        def save(self, filepath, *args, **kwargs):
            return self.template.save(filepath, *args, **kwargs)

        def save_weights(self, filepath, *args, **kwargs):
            return self.template.save_weights(filepath, *args, **kwargs)

        def get_config(self):
            raise NotImplementedError("a parallel model is not serialised itself: save() writes the template model")

    _CLASSES[k] = Keras2TowersModel
    return Keras2TowersModel


def build_towers(template, devices: list[str], ratios, merge_device: str, *, method: str = "towers",
                 sync_batchnorm: bool = True, emulate=None, auto: bool = False):
    """The Keras 2 parallel model of ``template``; refuses what is not built for Keras 2 yet, naming it.

    ``method="mirrored"`` is built by ``harness.parallel.keras2_mirrored``.

    Raises:
        Keras2NotSupported: for emulated devices, ``ratios="auto"``, or layers listed by ``unsupported_layers``.
    """
    refused = []
    if emulate is not None:
        refused.append("emulate= (emulated devices)")
    if auto:
        refused.append('ratios="auto"')
    if method == "towers":
        refused += unsupported_layers(template, sync_batchnorm)
    if refused:
        raise Keras2NotSupported(
            f"harness.parallelize on a Keras 2 model ({type(template).__module__}) does not support yet: "
            + "; ".join(refused) + ". Use a Keras 3 model (import keras, TF >= 2.16) for these"
        )
    if method == "mirrored":
        from harness.parallel.keras2_mirrored import build_mirrored

        return build_mirrored(template, devices, ratios, merge_device, sync_batchnorm=sync_batchnorm)
    return _towers_class(keras_module_of(template))(template, devices, ratios, merge_device, sync_batchnorm)


def _sum(values: list):
    return tf.add_n(values) if values else tf.zeros((), tf.float32)
