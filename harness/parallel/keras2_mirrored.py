"""Mirrored for Keras 2 models (``tf_keras`` under ``TF_USE_LEGACY_KERAS=1``, or TF <= 2.15's keras).

The exact step of ``harness.parallel.mirrored``, ported to Keras 2: the
template is cloned into a ``MirroredStrategy``'s scope, each batch is cut by
the current ratios on the host, and every replica gathers the whole batch's
predictions (its own rows live, the others' without gradient) and computes the
whole batch's loss, so the gradient it sends to the all-reduce is exactly its
slice's share of the single-device gradient.

What Keras 2 changes:

- the loss is computed per output from the compiled ``LossesContainer``'s loss
  objects, unscaled: ``compiled_loss`` itself would scale it (and the weight
  penalties) by ``1/replicas`` and update the loss metrics from every replica;
  the metrics are updated once per step, outside the replicas, on the whole batch;
- call-time losses (activity regularisers, ``add_loss`` in ``call``) are taken
  as means over the replica's slice, which Keras 2's activity regularisers are,
  so each replica weights its own by ``n_i/N`` (a summed ``add_loss`` is not exact);
- BatchNormalization layers, nested models' included, become
  ``SyncBatchNormalization`` (unfused: the fused kernel bypasses ``_moments``);
  where the template's layer ran the fused kernel (rank-4 inputs), the moving
  variance is updated with the kernel's Bessel correction ``n/(n-1)``, ``n``
  counted over all replicas. Masked inputs keep per-replica statistics.
- a batch smaller than the device count runs the single-device step on the
  merge device; a mixed-precision ``LossScaleOptimizer`` scales that step's loss.

Emulated and timed devices and ``ratios="auto"`` come from ``common.ParallelCommon``:
each replica's slice passes its device's begin op, and its gradients the end op
before they are applied (the device finishes after its backward pass).
"""

from __future__ import annotations

import importlib

import tensorflow as tf

from harness.compat import Keras2NotSupported, keras_module_of
from harness.parallel import Untracked, slicing
from harness.parallel.collective import replica_device, strategy_for, sum_replicas, whole_batch
from harness.parallel.common import ParallelCommon
from harness.parallel.keras2 import apply_finished, is_loss_scaling
from harness.parallel.keras2_batchnorm import sync_batchnorm_class, unsyncable_batchnorms
from harness.parallel.keras2_layerwise import add_all, own_losses, penalties

__all__ = ["build_mirrored"]

def build_mirrored(template, devices, ratios, merge_device: str, *, sync_batchnorm: bool = True, emulator=None):
    """The Keras 2 mirrored model of ``template``: a ``MirroredStrategy`` over ``devices``, exact.

    Args:
        template: a built Keras 2 Functional or Sequential model; keeps the trained
            weights after ``fit`` (``sync_to_template`` after ``train_on_batch`` loops).
        devices: device names, one replica each.
        ratios: one positive number per device.
        merge_device: where a batch smaller than the device count runs, and
            predictions are merged.
        sync_batchnorm: whole-batch BatchNormalization statistics (exact); ``False``
            keeps per-replica statistics.
        emulator: a ``harness.emulate.Emulator`` for emulated devices, or None.

    Returns:
        A Keras 2 model to ``compile`` and ``fit``.

    Raises:
        ValueError: ``template`` cannot be cloned (subclassed models).
        Keras2NotSupported: BatchNormalization variants without an exact synchronised form.
    """
    k = keras_module_of(template)
    if sync_batchnorm:
        refused = unsyncable_batchnorms(template, exact_class=k.layers.BatchNormalization)
        if refused:
            raise Keras2NotSupported(
                "method='mirrored' on a Keras 2 model cannot synchronise these BatchNormalization layers: "
                + "; ".join(refused) + ". Use sync_batchnorm=False (per-replica statistics) or a Keras 3 model"
            )
    return _mirrored_class(k)(template, devices, ratios, merge_device, sync_batchnorm, emulator)


def _clone_into(strategy, k, template, sync_batchnorm: bool):
    """``template`` cloned in ``strategy``'s scope with its weights; nested models cloned too."""
    sync_class = sync_batchnorm_class(k)

    def clone(layer):
        if isinstance(layer, k.Model):  # tf-keras' clone_model passes nested models whole
            return k.models.clone_model(layer, clone_function=clone)
        if sync_batchnorm and type(layer) is k.layers.BatchNormalization:
            return sync_class.like(layer)
        return layer.__class__.from_config(layer.get_config())

    try:
        with strategy.scope():
            replica = k.models.clone_model(template, clone_function=clone)
            replica.set_weights(template.get_weights())
    except (NotImplementedError, TypeError, ValueError) as err:
        raise ValueError(
            f"method='mirrored' needs a Keras 2 model that clone_model can clone (Functional or Sequential) "
            f"to place its variables on every device; cloning {template.name!r} "
            f"({type(template).__name__}) failed: {err}"
        ) from err
    return replica


# -- the loss pieces ----------------------------------------------------------------------
def _loss_internals(k) -> tuple:
    """``(compile_utils, losses_utils)`` of Keras 2 module ``k`` (imported outside traced code)."""
    return tuple(importlib.import_module(f"{k.__name__}.src.{name}")
                 for name in ("engine.compile_utils", "utils.losses_utils"))


def _compiled_loss_value(internals, container, y_true, y_pred, sample_weight):
    """The compiled loss of the whole batch, as ``compiled_loss`` computes it, without scaling or metrics.

    Inside a replica ``compiled_loss`` scales mean losses (and the weight
    penalties) by ``1/replicas`` and updates its loss metrics once per replica.
    """
    compile_utils, losses_utils = internals
    y_true = tf.nest.flatten(container._conform_to_outputs(y_pred, y_true))
    sample_weight = tf.nest.flatten(container._conform_to_outputs(y_pred, sample_weight))
    values = []
    for y_t, y_p, sw, loss_obj, loss_weight in zip(y_true, tf.nest.flatten(y_pred), sample_weight,
                                                   container._losses, container._loss_weights):
        if y_t is None or loss_obj is None:
            continue
        y_t, y_p, sw = compile_utils.match_dtype_and_rank(y_t, y_p, sw)
        sw = losses_utils.apply_mask(y_p, sw, losses_utils.get_mask(y_p))
        value = loss_obj(y_t, y_p, sample_weight=sw)
        values.append(value if loss_weight is None else value * loss_weight)
    return add_all(values)


def _uses_sum_reduction(k, loss) -> bool:
    return any(isinstance(item, k.losses.Loss) and item.reduction == "sum" for item in tf.nest.flatten(loss))


# -- the model ---------------------------------------------------------------------------------
_CLASSES: dict = {}


def _mirrored_class(k):
    """The Keras 2 mirrored model class for Keras module ``k`` (one per module and process)."""
    if k in _CLASSES:
        return _CLASSES[k]
    internals = _loss_internals(k)

    class Keras2MirroredModel(ParallelCommon, k.Model):
        """A ``MirroredStrategy`` over ``devices`` with ratio-split batches; ``fit``/``evaluate``/``predict``."""

        method = "mirrored"

        def __init__(self, template, devices, ratios, merge_device, sync_batchnorm, emulator=None):
            super().__init__(name=f"mirrored_{template.name}")
            self._template_ref = Untracked(template)  # untracked: its variables are not this model's
            self._init_common(devices, ratios, merge_device, emulator)
            self.sync_batchnorm = bool(sync_batchnorm)
            self.strategy = strategy_for(self.devices)
            self.core = _clone_into(self.strategy, k, template, self.sync_batchnorm)

        @property
        def template(self):
            """The single-device model passed in; holds the trained weights after ``fit``."""
            return self._template_ref.value

        def call(self, inputs, training=None):
            return self.core(inputs, training=training)

        # -- compile: the optimizer lives in the strategy's scope ----------------------
        def compile(self, optimizer="rmsprop", loss=None, *args, **kwargs):
            """As ``Model.compile``, without XLA (``ParallelCommon.compile``); sum-reduced losses are refused."""
            if _uses_sum_reduction(k, loss):
                raise ValueError("method='mirrored' supports mean-reduced losses ('sum_over_batch_size', "
                                 f"'auto'); got loss={loss!r} with reduction='sum'. Use method='towers'")
            with self.strategy.scope():
                if isinstance(optimizer, k.optimizers.Optimizer):
                    optimizer = optimizer.__class__.from_config(optimizer.get_config())
                else:
                    optimizer = k.optimizers.get(optimizer)
            super().compile(optimizer, loss, *args, **kwargs)
            with self.strategy.scope():
                if hasattr(self.optimizer, "build"):
                    self.optimizer.build(self.core.trainable_variables)
            # Built now, outside the replicas: building creates its loss metrics.
            self.compiled_loss.build(self.core.output)

        # -- weights: the template holds them between fits -------------------------------
        def sync_to_template(self) -> None:
            """Copies the trained weights into the template (``fit`` and the save methods call it)."""
            self.template.set_weights(self.core.get_weights())

        def _sync_from_template(self) -> None:
            self.core.set_weights(self.template.get_weights())

        # -- the steps ------------------------------------------------------------------------
        def _by_batch_size(self, x, parallel, single):
            """``parallel()``, or ``single()`` for a batch smaller than the device count (empty slices)."""
            if len(self.devices) == 1:
                return parallel()
            return tf.cond(slicing.batch_size_of(x) >= len(self.devices), parallel, single)

        def _distribute(self, x):
            """``(n, starts, shares, slices)``: the batch cut on the host, one slice per replica."""
            with tf.device("/device:CPU:0"):
                n = slicing.batch_size_of(x)
                sizes = slicing.split_sizes(n, self._shares_ref.value)
                parts = slicing.split_structure(x, sizes, len(self.devices))
                starts = tf.cumsum(sizes, exclusive=True)
                fractions = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
            values = self.strategy.experimental_distribute_values_from_function(
                lambda ctx: parts[ctx.replica_id_in_sync_group])
            return n, starts, fractions, values

        def _parallel_train(self, x, y, sample_weight):
            n, starts, fractions, x_parts = self._distribute(x)
            replicas = float(self.strategy.num_replicas_in_sync)

            def replica_step(x_local):
                ctx = tf.distribute.get_replica_context()
                replica = ctx.replica_id_in_sync_group
                device = replica_device(self.devices, ctx)
                x_local, token = self._begin_device(device, x_local)
                with tf.GradientTape() as tape:
                    y_local = self.core(x_local, training=True)
                    # Keras 2 divides an activity regulariser by the slice's size: n_i/N makes it the batch's.
                    extra = add_all(own_losses(self.core)) * tf.gather(fractions, replica)
                    start = tf.gather(starts, replica)
                    y_pred = tf.nest.map_structure(lambda t: whole_batch(ctx, t, start, n), y_local)
                    main = _compiled_loss_value(internals, self.compiled_loss, y, y_pred, sample_weight)
                    # The same on every replica, and its gradients are summed over the replicas.
                    penalty = add_all(penalties(self.core))
                    objective = main + extra + penalty / replicas
                    scaling = token is not None and is_loss_scaling(k, self.optimizer)
                    scaled = self.optimizer.get_scaled_loss(objective) if scaling else objective
                weights = self.core.trainable_variables
                if token is None:
                    self.optimizer.minimize(objective, weights, tape=tape)
                else:
                    # An emulated device finishes after its backward pass: the first layer's gradients come last.
                    grads = tape.gradient(scaled, weights)
                    after = next((g for g in grads if g is not None), y_local)
                    apply_finished(k, self.optimizer, grads, weights, self.emulator.finish(device, token, after))
                return y_pred, extra, penalty

            y_pred, extra, penalty = self.strategy.run(replica_step, args=(x_parts,))
            first = self.strategy.experimental_local_results
            return first(y_pred)[0], sum_replicas(self.strategy, extra, self.merge_device) + first(penalty)[0]

        def _single_train(self, x, y, sample_weight):
            with self.strategy.scope(), tf.GradientTape() as tape:
                with tf.device(self.merge_device):
                    y_pred = self.core(x, training=True)
                    extra = add_all(own_losses(self.core)) + add_all(penalties(self.core))
                    loss = _compiled_loss_value(internals, self.compiled_loss, y, y_pred, sample_weight) + extra
                    scaling = isinstance(self.optimizer, k.mixed_precision.LossScaleOptimizer)
                    scaled = self.optimizer.get_scaled_loss(loss) if scaling else loss
            weights = self.core.trainable_variables
            with tf.device(self.merge_device):
                # Outside replicas a mirrored variable is read from its copy on the current device.
                grads = tape.gradient(scaled, [w._get_on_device_or_primary() for w in weights])
                grads = self.optimizer.get_unscaled_gradients(grads) if scaling else grads
            self._apply_whole_gradients(grads, weights)
            return y_pred, extra

        def _apply_whole_gradients(self, grads, weights):
            # The optimizer updates mirrored variables from replicas, summing their gradients:
            # replica 0 sends the gradients, the others exact zeros.
            pairs = [(g, w) for g, w in zip(grads, weights) if g is not None]
            per_replica = self.strategy.experimental_distribute_values_from_function(
                lambda ctx: [g if ctx.replica_id_in_sync_group == 0 else tf.zeros_like(g) for g, _ in pairs])
            self.strategy.run(lambda gs: self.optimizer.apply_gradients(zip(gs, [w for _, w in pairs])),
                              args=(per_replica,))

        def _parallel_forward(self, x):
            _, _, fractions, x_parts = self._distribute(x)

            def replica_forward(x_local):
                ctx = tf.distribute.get_replica_context()
                replica, device = ctx.replica_id_in_sync_group, replica_device(self.devices, ctx)
                x_local, token = self._begin_device(device, x_local)
                y_local = self._end_device(device, self.core(x_local, training=False), token)
                return y_local, add_all(own_losses(self.core)) * tf.gather(fractions, replica)

            y_local, extra = self.strategy.run(replica_forward, args=(x_parts,))
            with tf.device(self.merge_device):
                y_pred = slicing.concat_structures(list(self.strategy.experimental_local_results(y_local)))
            return y_pred, sum_replicas(self.strategy, extra, self.merge_device)

        def _forward(self, x):
            def single():
                with tf.device(self.merge_device):
                    return self.core(x, training=False), add_all(own_losses(self.core))

            return self._by_batch_size(x, lambda: self._parallel_forward(x), single)

        def _report(self, x, y, y_pred, sample_weight, regularization):
            """Updates the loss metrics (through ``compiled_loss``) and compiled metrics on the whole batch."""
            with tf.device(self.merge_device):
                self.compiled_loss(y, y_pred, sample_weight, regularization_losses=[regularization])
            return self.compute_metrics(x, y, y_pred, sample_weight)

        def train_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            y_pred, regularization = self._by_batch_size(
                x, lambda: self._parallel_train(x, y, sample_weight), lambda: self._single_train(x, y, sample_weight))
            return self._report(x, y, y_pred, sample_weight, regularization)

        def test_step(self, data):
            x, y, sample_weight = k.utils.unpack_x_y_sample_weight(data)
            y_pred, extra = self._forward(x)
            return self._report(x, y, y_pred, sample_weight, extra + add_all(penalties(self.core)))

        def predict_step(self, data):
            x, _, _ = k.utils.unpack_x_y_sample_weight(data)
            return self._forward(x)[0]

    _CLASSES[k] = Keras2MirroredModel
    return Keras2MirroredModel
