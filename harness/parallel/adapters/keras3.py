"""The Keras 3 adapter (``keras`` >= 3 on the TensorFlow backend).

Every private attribute and ``keras.src`` import harness uses on Keras 3 is
here, checked on Keras 3.0 through 3.15 unless a comment says otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import keras
import tensorflow as tf
from keras import ops, tree

from harness.parallel.adapters.base import Adapter, add_all
from harness.parallel.collective import global_moments, replica_all_reduce

__all__ = ["Keras3Adapter", "SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose training statistics span all replicas.

    Keras' own ``synchronized=True`` computes ``E[x^2] - E[x]^2``, which is not
    the two-pass moments one device computes; here the mean is all-reduced
    first, then the squared deviations from it, weighted by true sample counts
    (``collective.global_moments``). Outside a replica context (or with a mask)
    it is the Keras layer. It adds no state, so a built layer can become one.
    """

    def _moments(self, inputs, mask):  # Keras 3.0-3.15: BatchNormalization._moments(inputs, mask)
        ctx = tf.distribute.get_replica_context()
        if mask is not None or ctx is None or ctx.num_replicas_in_sync == 1:
            return super()._moments(inputs, mask)
        means, variances = global_moments([inputs], self._reduction_axes, replica_all_reduce)
        return means[0], variances[0]


class _Unscaled:
    """How many harness loss computations are running (in any replica thread)."""

    depth = 0
    lock = threading.Lock()
    installed = False


@contextlib.contextmanager
def _unscaled_losses():
    """Keras' losses computed as on one device, even in a strategy's scope or replica.

    There Keras divides a mean-reduced loss by the replica count, but not a loss function that
    returns a scalar (``reduce_values`` returns those unreduced and unscaled), so no factor
    undoes it afterwards. harness computes the whole batch's loss in every replica and needs
    it unscaled: while this context is open, ``scale_loss_for_distribution`` (Keras 3.0-3.15:
    ``keras.src.losses.loss``, called by ``reduce_values``) returns its value as it is. The
    replicas of one step trace in threads of their own, hence a process-wide count.
    """
    from keras.src.losses import loss as loss_module

    with _Unscaled.lock:
        if not _Unscaled.installed:
            scale = loss_module.scale_loss_for_distribution

            def scale_unless_harness(value):
                return value if _Unscaled.depth else scale(value)

            loss_module.scale_loss_for_distribution = scale_unless_harness
            _Unscaled.installed = True
        _Unscaled.depth += 1
    try:
        yield
    finally:
        with _Unscaled.lock:
            _Unscaled.depth -= 1


@functools.cache
def _activity_losses_are_means() -> bool:
    """Whether this Keras 3 divides an activity regulariser by the batch size of the call.

    Keras 3.0 to 3.13 add it as a sum over the samples; keras-team/keras#22021 (merged January 2026,
    in 3.14 and 3.15) divides it by the call's batch size, as Keras 2 does. Asked of Keras itself,
    with a layer that has no weights (nothing created in a strategy's scope), outside any graph.
    """
    with tf.init_scope():
        layer = keras.layers.Identity(activity_regularizer=keras.regularizers.L1(1.0))
        layer(tf.ones((4, 1)))
        return float(add_all(list(layer.losses))) == 1.0  # the mean of 4 ones; the sum would be 4


class Keras3Adapter(Adapter):
    generation = 3

    def __init__(self, k):
        super().__init__(k)
        self.call_losses_are_means = _activity_losses_are_means()

    # -- losses ---------------------------------------------------------------------------------------
    def call_losses(self, layer) -> list:
        if not isinstance(layer, keras.layers.Layer):  # a graph node can be a plain Operation (keras.ops)
            return []
        return [loss for sub in layer._flatten_layers(include_self=True) for loss in sub._get_own_losses()]

    def weight_penalties(self, model) -> list:
        return model._get_regularization_losses()

    def set_call_losses(self, model, total) -> None:
        if self.call_losses(model):
            model._clear_losses()  # every sublayer's, as a new call of the model would
            model._losses.append(total)

    def loss(self, model, y, y_pred, sample_weight):
        compile_loss = model._compile_loss
        if compile_loss is None:
            return None
        with _unscaled_losses():
            return compile_loss(y, y_pred, sample_weight)

    @contextlib.contextmanager
    def untracked_losses(self, model):
        # CompileLoss updates one Mean per output from inside the call (3.x with several losses):
        # inside replicas those plain variables would be updated per replica (and TF refuses
        # mixing strategies). Its `metrics` list, None-filled, switches the updates off.
        compile_loss = model._compile_loss
        saved = None if compile_loss is None else compile_loss._metrics
        if not saved:
            yield
            return
        compile_loss._metrics = [None] * len(saved)
        try:
            yield
        finally:
            compile_loss._metrics = saved

    def prepare_compiled(self, model, core) -> None:
        # Keras builds its CompileLoss (and with several losses one Mean per output) on first use;
        # inside a replica those variables would belong to the strategy. Built here from the
        # model's symbolic outputs, as Keras' own symbolic build would (y_true shaped like y_pred).
        compile_loss = model._compile_loss
        outputs = getattr(core, "outputs", None)
        if compile_loss is None or compile_loss.built or not outputs:
            return  # a subclassed model: built on first use
        graph = self.graph_of(core)
        y_pred = tree.pack_sequence_as(graph._outputs_struct, outputs) if graph is not None else outputs
        if isinstance(y_pred, (list, tuple)) and len(y_pred) == 1:
            y_pred = y_pred[0]
        compile_loss.build(y_pred, y_pred)

    def report_loss(self, model, y, y_pred, sample_weight, extra, n, compiled=None) -> None:
        per_output = model._compile_loss is not None and any(model._compile_loss._metrics or ())
        if compiled is None or per_output:
            compiled = self.loss(model, y, y_pred, sample_weight)  # also updates the per-output loss metrics
        model._loss_tracker.update_state(add_all([compiled, extra]), sample_weight=n)

    # -- optimizers -----------------------------------------------------------------------------------
    def scale_loss(self, optimizer, loss):
        return optimizer.scale_loss(loss)  # a LossScaleOptimizer scales; apply() unscales

    def apply_gradients(self, optimizer, grads, weights) -> None:
        # Keras builds its slots for every weight, then skips the ones without a gradient (with a warning).
        optimizer.apply_gradients(zip(grads, weights))

    def build_optimizer(self, optimizer, variables) -> None:
        if not optimizer.built:  # LossScaleOptimizer.build would add its variables again
            optimizer.build(variables)

    def symbolic_build(self, model, iterator=None, data_batch=None) -> None:
        # Keras' TF trainer (3.0-3.15) does this in _maybe_symbolic_build only under a
        # distribution strategy of the model's own; the iterator is reset by fit after it.
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = next(batches)
                break
        build = getattr(model, "_symbolic_build", None)
        if data_batch is None or build is None:
            return
        with model.distribute_strategy.scope():
            if keras.utils.unpack_x_y_sample_weight(data_batch)[1] is not None:
                build(data_batch=data_batch)
                return
            # x alone (fit(x): a model whose own train_step reads no y, keras-io's VAE): on one device Keras
            # builds the compiled loss and metrics at their first use, which such a step never makes, and
            # building them here would need the y there is not ("None values not supported"). So build the
            # model and the optimizer only, and leave the compiled loss and metrics to their first use.
            compiled = model._compile_loss, model._compile_metrics
            model._compile_loss = model._compile_metrics = None
            try:
                build(data_batch=data_batch)
            finally:
                model._compile_loss, model._compile_metrics = compiled

    # -- mirrored -------------------------------------------------------------------------------------
    def _clone(self, template, sync_batchnorm: bool):
        # Nested models are cloned too (recursive), so their variables are mirrored as well;
        # a subclassed model is rebuilt from its config.
        replica = keras.models.clone_model(template, recursive=True) if self.graph_of(template) is not None \
            else keras.models.clone_model(template)
        if sync_batchnorm:
            for layer in self.sublayers(replica):
                if type(layer) is keras.layers.BatchNormalization:
                    layer.__class__ = SyncBatchNormalization
        return replica

    def local_variable(self, weight):
        return weight.value._get_on_device_or_primary()  # a Keras Variable around a MirroredVariable

    def towers_refusal(self, template) -> list[str]:
        # keras.src.backend.tensorflow.nn.conv (Keras 3.0-3.15) runs grouped convolutions, and 3D
        # ones with channels_first, in a tf.function(jit_compile=True) that captures the kernel
        # variable: an XLA cluster on a tower's device cannot read a variable on another device
        # ("Trying to access resource ... located in device CPU:0 from device CPU:1").
        found = []
        for layer in self.sublayers(template):
            if not isinstance(layer, keras.layers.Layer) or not hasattr(layer, "kernel_size"):
                continue
            groups = getattr(layer, "groups", 1) or 1
            conv3d_first = getattr(layer, "rank", 0) == 3 and getattr(layer, "data_format", "") == "channels_first"
            if groups > 1 or conv3d_first:
                why = f"groups={groups}" if groups > 1 else "3D, channels_first"
                found.append(f"{layer.name} ({type(layer).__name__}, {why}: Keras compiles it with XLA, which cannot "
                             "read the kernel from the device the towers keep it on)")
        return found

    # -- BatchNormalization -----------------------------------------------------------------------------
    def is_batchnorm(self, layer) -> bool:
        return isinstance(layer, keras.layers.BatchNormalization)

    def batchnorm_refusal(self, layer, method: str) -> str | None:
        # renorm=True (checked on Keras 3.15) keeps moving statistics of its own, which the towers'
        # whole-batch BatchNormalization does not update: 0.14 from one device at 1:3. Mirrored's
        # SyncBatchNormalization gives its renorm path the whole batch's moments: exact.
        if method == "towers" and getattr(layer, "renorm", False):
            return f"{layer.name} (BatchNormalization with renorm=True: not synchronised across towers)"
        return None

    def bn_prepare(self, layer, xs):
        dtype = "float64" if xs[0].dtype == tf.float64 else "float32"  # as BatchNormalization.call
        return [ops.cast(x, dtype) for x in xs], list(layer._reduction_axes)

    def bn_update(self, layer, mean, variance, count) -> None:
        dtype = mean.dtype
        momentum = layer.momentum
        layer.moving_mean.assign(ops.cast(layer.moving_mean, dtype) * momentum + mean * (1.0 - momentum))
        layer.moving_variance.assign(ops.cast(layer.moving_variance, dtype) * momentum + variance * (1.0 - momentum))

    def bn_normalize(self, layer, x, mean, variance):
        dtype = x.dtype
        gamma = ops.cast(layer.gamma, dtype) if layer.scale else None
        beta = ops.cast(layer.beta, dtype) if layer.center else None
        y = ops.batch_normalization(x, mean=mean, variance=variance, axis=layer.axis, offset=beta, scale=gamma,
                                    epsilon=layer.epsilon)
        return ops.cast(y, layer.compute_dtype)

    # -- the graph walk of towers -------------------------------------------------------------------------
    def set_initial_epoch(self, model, epoch: int | None) -> None:
        # Keras 3.0-3.15 fit: ``initial_epoch = self._initial_epoch or initial_epoch`` after on_train_begin.
        model._initial_epoch = epoch

    def graph_of(self, model):
        if isinstance(model, keras.Sequential):
            model = getattr(model, "_functional", None)  # a built Sequential runs a Functional inside
        if model is not None and hasattr(model, "_nodes_by_depth") and hasattr(model, "_run_through_graph"):
            return model
        return None

    def walk(self, graph, parts):
        return _Walk(graph, parts)

    def call_node(self, graph, op, args, kwargs, training):
        if training is not None and "training" in getattr(op, "_call_context_args", ()):
            kwargs = {**kwargs, "training": training}
        return op(*args, **kwargs)

    # -- a user's model as a workload ------------------------------------------------------------------------
    def compile_args(self, model) -> dict | None:
        from harness.parallel.adapters.keras3io import compile_args

        return compile_args(model)

    def _io_structs(self, graph) -> tuple:
        return graph._inputs_struct, graph._outputs_struct  # Keras 3.0-3.15 Functional

    def _graph_nodes(self, graph):
        for depth in sorted(graph._nodes_by_depth, reverse=True):
            for node in graph._nodes_by_depth[depth]:
                if node.operation is not None and not node.is_input:
                    yield (node.operation, [id(t) for t in node.input_tensors],
                           [(id(t), self._dtype(t)) for t in node.output_tensors])

    def _tensor_id(self, t):
        return id(t)


class _Walk:
    """A Keras 3 Functional graph walked node by node, as ``Functional._run_through_graph`` does, per tower."""

    def __init__(self, graph, parts):
        self.graph = graph
        self.values: list[dict] = [{} for _ in parts]
        for values, x in zip(self.values, parts):
            for ref, tensor in zip(graph.inputs, tree.flatten(graph._standardize_inputs(x))):
                values[id(ref)] = tensor

    def nodes(self):
        for depth in sorted(self.graph._nodes_by_depth, reverse=True):
            for node in self.graph._nodes_by_depth[depth]:
                if node.operation and not node.is_input and all(id(t) in self.values[0] for t in node.input_tensors):
                    yield node, node.operation

    def arguments(self, node, tower: int):
        return node.arguments.fill_in(self.values[tower])

    def store(self, node, tower: int, outputs) -> None:
        for ref, tensor in zip(node.outputs, tree.flatten(outputs)):
            self.values[tower][id(ref)] = tensor

    def outputs(self, tower: int):
        values = self.values[tower]
        result = tree.pack_sequence_as(self.graph._outputs_struct, [values[id(ref)] for ref in self.graph.outputs])
        if isinstance(result, (list, tuple)) and len(result) == 1:
            return result[0]
        return result
