"""The stock baseline harness measures itself against: Keras ``fit`` alone, or under a stock MirroredStrategy.

``stock_model`` builds a model as a user without harness trains it: on one
device plain Keras (variables and step placed there by the caller's device
scope), on several Keras ``fit`` under a stock ``tf.distribute.MirroredStrategy``
(its even split of the global batch, its own loss scaling: exact on even full
batches only).

On emulated devices the model is wrapped once (``Emulated``): each replica's
input slice passes the device's begin op, and a zero-valued trainable scalar
carries the device's finish: its gradient is the emulator's exact zero, computed
once the backward pass reaches the input (its first floating-point input), so the
step waits for the emulated device as harness' own steps do (``harness.emulate``).
No gradient reaches an integer input (token ids): a model whose inputs are all
integers cannot be emulated so (it would run at the host's speed, its
devices 0% busy), and ``stock_model`` refuses it (``STOCK_INTEGER_INPUTS``). Keras' optimizer
all-reduces that zero with the other gradients; the scalar stays 0. Nothing else
of Keras' step changes. The wrapper is of the model's own Keras (``emulated_class(k)``):
a Keras 3 model, or a tf_keras one, as the stock baseline across workers trains
(``harness.bench.cluster_run``: Keras 3.15's fit cannot run under a stock
MultiWorkerMirroredStrategy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from harness.errors import InvalidValue, Refused

__all__ = ["stock_model", "emulated_class", "keras", "STOCK_INTEGER_INPUTS", "has_float_input"]

STOCK_INTEGER_INPUTS = "stock-emulation-integer-inputs"  # the reason of that refusal


def has_float_input(model) -> bool:
    """Whether ``model`` has a floating-point input (True where its inputs are unknown: a subclassed model)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return True
    return any(str(getattr(t.dtype, "name", t.dtype)).startswith(("float", "bfloat", "half")) for t in inputs)


def stock_model(build: Callable[[], Any], compile_model: Callable[[Any], None], devices: Sequence[str],
                emulator=None, strategy=None):
    """A compiled stock Keras model over ``devices``: ``build()`` in the right scope, then ``compile_model(model)``.

    Args:
        build: returns a new, built Keras model.
        compile_model: compiles it (called in the strategy's scope).
        devices: one device (plain Keras) or several (a stock MirroredStrategy, one per device set and process).
        emulator: a ``harness.emulate.Emulator`` of these devices, or None.
        strategy: the stock strategy to train under instead, whose replicas are ``devices`` in order (replica
            ``i`` of the sync group runs on ``devices[i]``): a stock ``MultiWorkerMirroredStrategy`` across
            workers, one replica per worker.
    """
    import tensorflow as tf

    from harness.compat import keras_module_of
    from harness.parallel.collective import stock_strategy_for

    devices = tuple(devices)
    if strategy is not None:
        scope = strategy.scope()
    else:
        scope = tf.device(devices[0]) if len(devices) == 1 else stock_strategy_for(devices).scope()
    with scope:
        model = build()
        if emulator is not None and not has_float_input(model):
            raise Refused(STOCK_INTEGER_INPUTS, f"the stock baseline on emulated devices waits for each replica's "
                          f"backward pass at its input, and model {model.name!r} has integer inputs only (no "
                          "gradient reaches them): its figures would be this host's, not the emulated devices' "
                          "(leave the stock rows out: --no-stock; or run on logical CPUs or GPUs without --emulate)")
        if emulator is not None:
            model = emulated_class(keras_module_of(model))(model, emulator, devices)
        compile_model(model)
    return model


@functools.cache
def emulated_class(k):
    """The ``Emulated`` wrapper model class of Keras module ``k`` (one per module and process)."""
    import tensorflow as tf

    class Emulated(k.Model):
        """``inner`` whose every replica runs at its emulated device's rate (see the module's doc)."""

        def __init__(self, inner, emulator, devices):
            super().__init__(name=f"emulated_{inner.name}")
            self.inner = inner
            self.emulator = emulator
            self.emulated_devices = tuple(devices)
            self.finish_gate = self.add_weight(name="emulation_finish", shape=(), initializer="zeros",
                                               trainable=True)

        def _all_reduce_share(self):
            from harness.emulate import variable_bytes

            n = len(self.emulated_devices)
            size, count = variable_bytes(self.inner.trainable_weights)
            return (0, 0) if n < 2 else (int(2 * (n - 1) / n * size), count)

        def call(self, x, training=None):
            ctx = tf.distribute.get_replica_context()
            if ctx is None:  # cross-replica (Keras' symbolic build): nothing runs
                return self.inner(x, training=training)
            device = self.emulated_devices[int(tf.get_static_value(ctx.replica_id_in_sync_group))]
            # An emulated link pays for the slice and for this replica's part of the stock all-reduce of the
            # gradients (a ring: 2 (n - 1) / n of their bytes sent and as many received by each replica).
            x, token = self.emulator.begin(device, x, reads=self._all_reduce_share() if training else (0, 0))
            if token is not None and training:
                x = _gated(x, self.finish_gate, lambda after: self.emulator.finish(device, token, after))
            y = self.inner(x, training=training)
            return y if training else self.emulator.end(device, y, token)

    def _gated(x, gate, finish):
        leaves = tf.nest.flatten(x)
        first = next((i for i, leaf in enumerate(leaves) if leaf.dtype.is_floating), 0)  # a gradient reaches it

        @tf.custom_gradient
        def gate_op(first, value):
            def grad(dy):
                return dy, tf.cast(finish(dy), value.dtype)  # after the backward pass reached the input
            return tf.identity(first), grad

        leaves[first] = gate_op(leaves[first], tf.convert_to_tensor(gate))
        return tf.nest.pack_sequence_as(x, leaves)

    return Emulated


def keras(template, devices, ratios=None):
    """The stock baseline as ``harness.compare_training``'s ``method``: ``template`` under a stock MirroredStrategy.

    A clone of ``template`` with its weights, built in the scope of the stock
    strategy over ``devices``; Keras ``fit`` trains it (even split, Keras' own
    loss scaling) and copies the trained weights back into ``template``, so the
    comparison reads them as it does a harness model's.

    Raises:
        ValueError: ``ratios`` that are not even (the stock strategy splits evenly).
    """
    from harness.compat import copy_optimizer, keras_module_of
    from harness.parallel.collective import stock_strategy_for

    if ratios is not None and len({float(r) for r in ratios}) > 1:
        raise InvalidValue(f"the stock MirroredStrategy splits every batch evenly; got ratios={list(ratios)}")
    k = keras_module_of(template)
    strategy = stock_strategy_for(tuple(devices))
    with strategy.scope():
        model = k.models.clone_model(template)
        model.set_weights(template.get_weights())
    fit, compile_model = model.fit, model.compile

    def compile_in_scope(*args, optimizer="rmsprop", **kwargs):
        # As a user of a stock strategy does: the optimizer made in its scope (one made outside is copied from
        # its config there), or Keras refuses to mix the strategies. Stock Keras steps the optimizer in each
        # replica, so its variables must be the strategy's (adopting one made outside drifted 1.0 under Adam).
        with strategy.scope():
            if isinstance(optimizer, k.optimizers.Optimizer):
                optimizer = copy_optimizer(optimizer)
            return compile_model(*args, optimizer=optimizer, **kwargs)

    def fit_then_copy(*args, **kwargs):
        try:
            return fit(*args, **kwargs)
        finally:
            template.set_weights(model.get_weights())

    model.fit, model.compile = fit_then_copy, compile_in_scope
    return model
