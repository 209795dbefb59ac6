"""Mirrored: ``tf.distribute.MirroredStrategy`` with uneven, exactly weighted replicas.

Keras ``fit`` under a strategy scales every replica's mean loss by
``1/num_replicas`` whatever its sample count, so uneven splits train a
different model. Here each replica's loss is exactly its slice's share of the
whole batch's, so the gradient each replica returns is its slice's share of the
single-device gradient, for any split; summed on the merge device, they are the
whole batch's, on which the optimizer steps once, outside the replicas, as on one
device (docs/design.md, "Optimizer steps"):

- where the compiled loss decomposes over samples (Keras built-in losses with
  the ``sum_over_batch_size`` reduction, no mask on the outputs:
  ``Adapter.loss_gather_reason``), a replica computes Keras' own loss on its
  own rows (their targets and sample weights) times n_i/N;
- elsewhere (custom losses, masks, other reductions) a replica gathers the whole
  batch's predictions (its own slice live, the others' without gradient; masks
  and logits too) and computes the whole batch's loss.

``gather_reason`` says which (None: no gather). The loss metrics and compiled
metrics are updated once per step, outside the replicas, on the whole batch
(the replicas' predictions joined on the merge device).
"""

from __future__ import annotations

import functools

import tensorflow as tf

from harness.errors import Refused
from harness.parallel import slicing, sparse
from harness.parallel.base import Method, ParallelModel, add_all, add_zero_where_present
from harness.parallel.collective import replica_device, strategy_for, sum_replicas, whole_batch

__all__ = ["Mirrored", "mirrored_class"]


def _replica(strategy, structure, index: int):
    """Replica ``index``'s values of a structure ``strategy.run`` returned (a value every replica returned
    as one tensor, such as a constant, is not distributed: it is every replica's)."""
    def pick(value):
        values = strategy.experimental_local_results(value)
        return values[index] if len(values) > 1 else values[0]

    return tf.nest.map_structure(pick, structure)


class Mirrored(ParallelModel):
    """A model trained by a ``MirroredStrategy`` over ``devices`` with ratio-split batches."""

    method = Method.MIRRORED

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device, emulator=None):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device, emulator)
        self.strategy = self._make_strategy()
        self._core_model = self._adapter.clone(template, self.strategy, self.sync_batchnorm)
        self.gather_reason: str | None = "not compiled"
        self._loss_reason: str | None = "not compiled"  # what compile() decided from the losses alone

    def _make_strategy(self):
        return strategy_for(self.devices)

    def _sum_replicas(self, value):
        """The sum of a per-replica scalar over every replica, on the merge device."""
        return sum_replicas(self.strategy, value, self.merge_device)

    # -- weights -----------------------------------------------------------------
    def sync_to_template(self) -> None:
        self.template.set_weights(self.core.get_weights())

    def _sync_from_template(self) -> None:
        self.core.set_weights(self.template.get_weights())

    # -- compile: the optimizer must live in the strategy's scope ------------------
    def compile(self, optimizer="rmsprop", loss=None, *args, **kwargs):
        """As ``Model.compile``, without XLA (``ParallelCommon.compile``). A loss whose divisor spans the batch
        (``reduction="sum"``, ``"none"``...) is computed on the whole batch's predictions (``gather_reason``)."""
        k = self._adapter.k
        optimizer = k.optimizers.get(optimizer)  # a name made an optimizer; an optimizer taken as it is
        refused = self._adapter.optimizer_refusal(optimizer, self.method.value)
        if refused:
            raise Refused("optimizer-drifts", refused)
        # The user's own optimizer, with all its settings (a copy from its config would lose what the config
        # leaves out, such as exclude_from_weight_decay), stepping this strategy's mirrored variables.
        self._adapter.adopt_optimizer(optimizer, self.strategy)
        super().compile(optimizer, loss, *args, **kwargs)
        with self.strategy.scope():
            self._adapter.build_optimizer(self.optimizer, self.core.trainable_variables)
        self._adapter.prepare_compiled(self, self.core)
        self.gather_reason = self._loss_reason = self._adapter.loss_gather_reason(self)

    # -- steps -------------------------------------------------------------------------
    def _cross_replica(self):
        return self.strategy.scope()

    def _local_variables(self, weights):
        # Outside replicas a mirrored variable is read from the copy on the current device.
        return [self._adapter.local_variable(w) for w in weights]

    def _sum_gradients(self, grads):
        """The whole batch's gradients on the merge device from the replicas' (``strategy.run``'s): dense ones
        summed, sparse ones given the single device's rows (``sparse.join``)."""
        out = []
        for g in grads:
            if isinstance(g, sparse.Rows):
                with tf.device(self.merge_device):
                    out.append(sparse.join([_replica(self.strategy, g, i) for i in range(len(self.devices))]))
            else:
                out.append(None if g is None else self._sum_replicas(g))
        return out

    def _distribute(self, x):
        """``(n, sizes, starts, shares, slices)``: the batch cut on the host, one slice per replica."""
        n, sizes, parts = self._split(x)
        with tf.device(self.input_device):
            starts = tf.cumsum(sizes, exclusive=True)
            shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
        values = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: parts[ctx.replica_id_in_sync_group]
        )
        return n, sizes, starts, shares, values

    def _gather(self, ctx, y_local, start, n):
        """The whole batch's predictions inside a replica (``whole_batch``), masks and logits gathered too."""
        extras = self._extras(y_local)
        gathered = {}
        for key, value in extras.items():
            if key.startswith("mask"):  # booleans travel as exact 0/1 floats
                gathered[key] = tf.cast(whole_batch(ctx, tf.cast(value, tf.float32), start, n), tf.bool)
            else:
                gathered[key] = whole_batch(ctx, value, start, n)
        y_pred = tf.nest.map_structure(lambda t: whole_batch(ctx, t, start, n), y_local)
        return self._attach(y_pred, gathered)

    def _local_loss_reason(self, y, y_local) -> str | None:
        """Why this step's loss needs the whole batch's predictions (``gather_reason``), None if it does not."""
        reason = self._loss_reason
        if reason is None and y is None:
            reason = "no targets"
        if reason is None and any(self._adapter.get_mask(t) is not None for t in tf.nest.flatten(y_local)):
            reason = "an output carries a Keras mask (its loss divides by the whole batch's unmasked count)"
        self.gather_reason = reason
        return reason

    def _parallel_train(self, x, y, sample_weight):
        n, sizes, starts, shares, x_parts = self._distribute(x)
        with tf.device(self.input_device):  # cut like x (read by replicas whose loss is their own rows')
            y_parts, weight_parts = (slicing.split_structure(v, sizes, len(self.devices)) for v in (y, sample_weight))
        replicas = float(self.strategy.num_replicas_in_sync)
        a = self._adapter
        sources = self._batch_sources(x)  # a sparse gradient's lookup depends on the batch, or not (``sparse``)

        def replica_step(x_local):
            ctx = tf.distribute.get_replica_context()
            replica = ctx.replica_id_in_sync_group
            index = int(tf.get_static_value(replica))
            device = replica_device(self.devices, ctx)
            x_local, token = self._begin_device(device, x_local)
            with tf.GradientTape() as tape:
                y_local = self.core(x_local, training=True)
                share = tf.gather(shares, replica)
                extra = self._call_losses(self.core, share)
                if self._local_loss_reason(y, y_local) is None:
                    # Keras' loss on this slice's rows is a mean over n_i samples: times n_i/N, its share,
                    # computed in the loss' own dtype (a float32 n_i/N would round a float64 model's gradients).
                    y_pred = y_local
                    local = a.loss(self, y_parts[index], y_local, weight_parts[index])
                    rows = tf.cast(tf.gather(sizes, replica), local.dtype)
                    main = add_all([local * (rows / tf.cast(n, local.dtype))])
                else:
                    y_pred = self._gather(ctx, y_local, tf.gather(starts, replica), n)
                    main = add_all([a.loss(self, y, y_pred, sample_weight)])
                # Weight penalties are the same on every replica; their gradients are summed R times.
                penalty = self._penalties()
                scaled = a.scale_loss(self.optimizer, main + extra + penalty / replicas)
            weights = self.core.trainable_weights
            grads = tape.gradient(scaled, weights)
            if token is not None:
                # An emulated device finishes after its backward pass: the first layer's gradients come last.
                after = next((g for g in grads if g is not None), y_local)
                # Off the merge device, its gradients and outputs cross its emulated link to the merge device.
                sent = (grads, y_local) if self._is_remote(device) else None
                grads = add_zero_where_present(grads, self.emulator.finish(device, token, after, sent=sent))
            grads = [sparse.rows_of(g, sources, variable=w) for g, w in zip(grads, weights)]
            return y_pred, self._extras(y_pred), extra, penalty, main, grads

        with a.untracked_losses(self):
            y_pred, extras, extra, penalty, main, grads = self.strategy.run(replica_step, args=(x_parts,))
        # One optimizer step on the whole batch's gradient, outside the replicas: clipping, accumulation,
        # EMA and loss scaling see what they see on one device (docs/design.md, "Optimizer steps").
        self._apply_whole_gradients(self._sum_gradients(grads), self.core.trainable_weights)
        if self.gather_reason is None:
            # Each replica kept its own rows: joined once, for the metrics (pruned from the step where none
            # reads them), and the replicas' shares of the loss summed.
            y_pred = self._merge([self._attach(_replica(self.strategy, y_pred, i), _replica(self.strategy, extras, i))
                                  for i in range(len(self.devices))])
            compiled = self._sum_replicas(main)
        else:
            y_pred = self._attach(_replica(self.strategy, y_pred, 0), _replica(self.strategy, extras, 0))
            compiled = _replica(self.strategy, main, 0)
        extra = self._sum_replicas(extra) + _replica(self.strategy, penalty, 0)
        return y_pred, extra, compiled

    def _parallel_forward(self, x):
        _, _, _, shares, x_parts = self._distribute(x)

        def replica_forward(x_local):
            ctx = tf.distribute.get_replica_context()
            device = replica_device(self.devices, ctx)
            x_local, token = self._begin_device(device, x_local, weights=False)
            y_local = self._end_device(device, self.core(x_local, training=False), token)
            return y_local, self._extras(y_local), self._call_losses(
                self.core, tf.gather(shares, ctx.replica_id_in_sync_group))

        y_local, extras, extra = self.strategy.run(replica_forward, args=(x_parts,))
        parts = [self._attach(_replica(self.strategy, y_local, i), _replica(self.strategy, extras, i))
                 for i in range(len(self.devices))]
        return self._merge(parts), self._sum_replicas(extra)


@functools.cache
def mirrored_class(adapter):
    """The mirrored model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("MirroredModel", (Mirrored, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
