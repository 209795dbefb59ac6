"""Mirrored: ``tf.distribute.MirroredStrategy`` with uneven, exactly weighted replicas.

Keras ``fit`` under a strategy scales every replica's mean loss by
``1/num_replicas`` whatever its sample count, so uneven splits train a
different model. Here each replica gathers the whole batch's predictions
(its own slice live, the others' without gradient) and computes the whole
batch's loss: the gradient each replica sends to the all-reduce is exactly its
slice's share of the single-device gradient, for any split, masks, sample and
class weights, loss weights and multi-output models.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import tree

from harness.parallel.base import Method, ParallelModel, add_all, own_losses, weight_losses
from harness.parallel.batchnorm import SyncBatchNormalization, is_batchnorm
from harness.parallel.collective import replica_device, strategy_for, sum_replicas, whole_batch

__all__ = ["MirroredModel"]


def _clone_layer(layer):
    if is_batchnorm(layer) and type(layer) is keras.layers.BatchNormalization:
        return SyncBatchNormalization.from_config(layer.get_config())
    return layer.__class__.from_config(layer.get_config())


def _uses_sum_reduction(loss) -> bool:
    return any(isinstance(item, keras.losses.Loss) and item.reduction == "sum" for item in tree.flatten(loss))


class MirroredModel(ParallelModel):
    """A model trained by a ``MirroredStrategy`` over ``devices`` with ratio-split batches."""

    method = Method.MIRRORED

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device, emulator=None):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device, emulator)
        self.strategy = strategy_for(self.devices)
        clone = _clone_layer if self.sync_batchnorm else None
        try:
            with self.strategy.scope():
                replica = keras.models.clone_model(template, clone_function=clone, recursive=True)
                replica.set_weights(template.get_weights())
        except (NotImplementedError, TypeError, ValueError) as err:
            raise ValueError(
                f"method='mirrored' needs a model Keras can clone (Functional, Sequential, or subclassed with "
                f"get_config/from_config) to place its variables on every device; cloning {template.name!r} "
                f"failed: {err}"
            ) from err
        self._core_model = replica
        self.built = True

    # -- weights -----------------------------------------------------------------
    def sync_to_template(self) -> None:
        self.template.set_weights(self.core.get_weights())

    def _sync_from_template(self) -> None:
        self.core.set_weights(self.template.get_weights())

    # -- compile: the optimizer must live in the strategy's scope ------------------
    def compile(self, optimizer="rmsprop", loss=None, **kwargs):
        if _uses_sum_reduction(loss):
            raise ValueError(
                "method='mirrored' supports mean-reduced losses ('sum_over_batch_size', 'mean'); got a loss with "
                "reduction='sum'. Use method='towers' for sum-reduced losses"
            )
        with self.strategy.scope():
            if isinstance(optimizer, keras.optimizers.Optimizer):
                optimizer = optimizer.__class__.from_config(optimizer.get_config())
            else:
                optimizer = keras.optimizers.get(optimizer)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)
        with self.strategy.scope():
            self.optimizer.build(self.core.trainable_variables)

    # -- steps -------------------------------------------------------------------------
    def _cross_replica(self):
        return self.strategy.scope()

    @property
    def _in_scope_loss_scale(self) -> float:
        return float(self.strategy.num_replicas_in_sync)

    def _local_variables(self, weights):
        # Outside replicas a mirrored variable is read from the copy on the current device.
        return [w.value._get_on_device_or_primary() for w in weights]

    def _apply_whole_gradients(self, grads, weights):
        # Keras' optimizer only updates mirrored variables from replicas, where it sums the
        # replicas' gradients: replica 0 sends the gradients, the others exact zeros.
        per_replica = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: grads if ctx.replica_id_in_sync_group == 0 else [tf.zeros_like(g) for g in grads]
        )
        self.strategy.run(lambda g: self.optimizer.apply_gradients(zip(g, weights)), args=(per_replica,))

    def _distribute(self, x):
        n, sizes, parts = self._split(x)
        starts = tf.cumsum(sizes, exclusive=True)
        values = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: parts[ctx.replica_id_in_sync_group]
        )
        return n, starts, values

    def _parallel_train(self, x, y, sample_weight):
        n, starts, x_parts = self._distribute(x)
        replicas = float(self.strategy.num_replicas_in_sync)

        def replica_step(x_local):
            ctx = tf.distribute.get_replica_context()
            start = tf.gather(starts, ctx.replica_id_in_sync_group)
            device = replica_device(self.devices, ctx)
            x_local, token = self._begin_device(device, x_local)
            with tf.GradientTape() as tape:
                y_local = self.core(x_local, training=True)
                extra = add_all(own_losses(self.core))
                y_pred = tree.map_structure(lambda t: whole_batch(ctx, t, start, n), y_local)
                # Keras scales mean losses by 1/replicas here: `main` is 1/R of the whole batch's loss.
                main = add_all([] if self._compile_loss is None else [self._compile_loss(y, y_pred, sample_weight)])
                # Weight penalties are the same on every replica; their gradients are summed R times.
                penalty = add_all(weight_losses(self.core)) / replicas
                objective = self.optimizer.scale_loss(replicas * main + extra + penalty)
            weights = self.core.trainable_weights
            # An emulated device finishes after its backward pass: the first layer's gradients come last.
            grads = self._end_device(device, tape.gradient(objective, weights), token)
            self.optimizer.apply_gradients(zip(grads, weights))
            return main + extra + penalty, y_pred  # the replicas' shares add up to the whole batch's loss

        share, y_pred = self.strategy.run(replica_step, args=(x_parts,))
        loss = sum_replicas(self.strategy, share, self.merge_device)
        return loss, self.strategy.experimental_local_results(y_pred)[0]

    def _parallel_forward(self, x):
        _, _, x_parts = self._distribute(x)

        def replica_forward(x_local):
            device = replica_device(self.devices, tf.distribute.get_replica_context())
            x_local, token = self._begin_device(device, x_local)
            y_local = self._end_device(device, self.core(x_local, training=False), token)
            return y_local, add_all(own_losses(self.core))

        y_local, extra = self.strategy.run(replica_forward, args=(x_parts,))
        y_pred = self._merge(list(self.strategy.experimental_local_results(y_local)))
        return y_pred, sum_replicas(self.strategy, extra, self.merge_device)
