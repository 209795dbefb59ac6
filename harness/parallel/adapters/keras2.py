"""The Keras 2 adapter: ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``) and TF <= 2.15's ``keras``.

Every private attribute and ``<module>.src`` import harness uses on Keras 2 is
here, checked on tf_keras 2.15-2.21 and Keras 2.13-2.15 unless a comment says
otherwise. What Keras 2 changes for the parallel steps:

- call-time losses (activity regularisers) are means over the call's batch,
  so a slice's are weighted by ``n_i / N``;
- the compiled loss is the ``LossesContainer``'s loss objects, called here one
  by one: ``compiled_loss`` itself scales mean losses (and the weight
  penalties) by ``1/replicas`` inside a replica and updates its metrics there;
- the fused BatchNormalization kernel (rank-4 inputs, ``layer.fused``) moves
  the moving variance with Bessel's correction ``n/(n-1)``, the unfused path
  does not: the synchronised layer and the towers apply it with the whole
  batch's ``n``; Keras 2's own ``synchronized=True`` (E[x²]-E[x]²) is off;
- a mixed-precision ``LossScaleOptimizer`` wants unscaled gradients in
  ``apply_gradients``.
"""

from __future__ import annotations

import importlib
import inspect

import tensorflow as tf

from harness.errors import Refused
from harness.parallel.adapters.base import Adapter, add_all
from harness.parallel.collective import global_moments, replica_all_reduce

__all__ = ["Keras2Adapter"]


def _bessel(n):
    """The fused kernel's ``n / (n - 1)`` (1 for n <= 1)."""
    return tf.where(n > 1, n / tf.maximum(n - 1, 1), tf.ones_like(n))


def _sync_batchnorm_class(k):
    """``SyncBatchNormalization`` of Keras 2 module ``k``."""

    class SyncBatchNormalization(k.layers.BatchNormalization):
        """BatchNormalization whose training statistics are the whole batch's, over all replicas.

        Outside a replica context (or with a mask) it is the unfused Keras layer.
        With ``bessel_moving_variance`` the moving variance is updated with the
        unbiased variance, as the fused kernel of the template's layer does.
        """

        def __init__(self, *args, bessel_moving_variance: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.bessel_moving_variance = bessel_moving_variance

        @classmethod
        def like(cls, layer):
            """The synchronised, unfused twin of ``layer`` (a built ``BatchNormalization``)."""
            config = {**layer.get_config(), "synchronized": False}
            return cls(**config, fused=False, bessel_moving_variance=bool(layer.fused))

        def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
            ctx = tf.distribute.get_replica_context()
            local = mask is not None or ctx is None or ctx.num_replicas_in_sync == 1
            if local:
                mean, variance = super()._moments(inputs, reduction_axes, keep_dims, mask=mask)
            else:
                means, variances = global_moments([inputs], reduction_axes, replica_all_reduce)
                mean, variance = means[0], variances[0]
                for axis in sorted(reduction_axes) if keep_dims else []:
                    mean, variance = tf.expand_dims(mean, axis), tf.expand_dims(variance, axis)
            if self.bessel_moving_variance:  # samples per channel, over all replicas
                count = tf.cast(tf.size(inputs) // tf.maximum(1, tf.size(self.moving_mean)), inputs.dtype)
                # Per replica thread, for the moving-variance update of this call.
                self._thread_local.batch_count = count if local else ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
            return mean, variance

        def _assign_moving_average(self, variable, value, momentum, inputs_size):
            if self.bessel_moving_variance and variable is self.moving_variance:
                value = value * _bessel(self._thread_local.batch_count)
            return super()._assign_moving_average(variable, value, momentum, inputs_size)

    return SyncBatchNormalization


class _Resume:
    """What a Keras 2 ``fit`` asks for its first epoch (``Model._training_state``)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return max(self.epoch, initial_epoch), 0


class Keras2Adapter(Adapter):
    generation = 2
    call_losses_are_means = True

    def __init__(self, k):
        super().__init__(k)
        root = k.__name__
        self._compile_utils = importlib.import_module(f"{root}.src.engine.compile_utils")
        self._losses_utils = importlib.import_module(f"{root}.src.utils.losses_utils")
        self._layer_utils = importlib.import_module(f"{root}.src.engine.base_layer_utils")
        self.sync_batchnorm_class = _sync_batchnorm_class(k)

    # -- losses ---------------------------------------------------------------------------------------
    def call_losses(self, layer) -> list:
        # Inside tf.function Keras 2 keeps call-time losses thread-local: per replica.
        return [loss for sub in layer._flatten_layers() for loss in sub._eager_losses]

    def weight_penalties(self, model) -> list:
        return [loss() for layer in model._flatten_layers() for loss in layer._callable_losses]

    def set_call_losses(self, model, total) -> None:
        # Model.losses reads each layer's thread-local call-time losses where it has any, else the losses it
        # was built with: the layers that had some keep a zero (their count stays), the model holds the total.
        layers = [sub for sub in model._flatten_layers() if sub._eager_losses]
        if not layers:
            return
        for sub in layers:
            sub._thread_local._eager_losses = [tf.zeros_like(total)]
        model._thread_local._eager_losses = [total]

    def loss(self, model, y, y_pred, sample_weight):
        container = model.compiled_loss
        if container is None:
            return None
        y_true = tf.nest.flatten(container._conform_to_outputs(y_pred, y))
        weights = tf.nest.flatten(container._conform_to_outputs(y_pred, sample_weight))
        if not container._built:
            container.build(y_pred)
        values = []
        for y_t, y_p, sw, loss_obj, loss_weight in zip(y_true, tf.nest.flatten(y_pred), weights,
                                                       container._losses, container._loss_weights):
            if y_t is None or loss_obj is None:
                continue
            y_t, y_p, sw = self._compile_utils.match_dtype_and_rank(y_t, y_p, sw)
            sw = self._losses_utils.apply_mask(y_p, sw, self._losses_utils.get_mask(y_p))
            value = loss_obj(y_t, y_p, sample_weight=sw)
            values.append(value if loss_weight is None else value * loss_weight)
        return add_all(values, values[0].dtype) if values else None  # in the model's dtype (float64 stays)

    def report_loss(self, model, y, y_pred, sample_weight, extra, n, compiled=None) -> None:
        # LossesContainer.__call__ (2.13-2.21) updates its total's Mean weighted by the batch size, and a Mean
        # per output where there are several.
        container = model.compiled_loss
        if compiled is None or y is None or not container._built or any(container._per_output_metrics or ()):
            container(y, y_pred, sample_weight, regularization_losses=[extra])  # computes the loss again
            return
        container._total_loss_mean.update_state(add_all([compiled, extra]), sample_weight=n)

    def steps_per_execution(self, model) -> int:
        count = getattr(model, "_steps_per_execution", None)
        if getattr(model, "autotune_steps_per_execution", False):
            return 0  # tuned while it trains: not one step per call
        return 1 if count is None else int(count.numpy().item())

    def fit_step(self, model, data):
        outputs = model.train_step(data)
        # tf_keras' step function counts the step once its outputs exist (model._train_counter: fit's
        # iterations, the callbacks' batch numbers).
        with tf.control_dependencies([t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)][:1]):
            model._train_counter.assign_add(1)
        return outputs

    def first_call_builds(self, model, train_function):
        # tf_keras (2.13-2.21, TF 2.15's keras) builds the compiled metrics in the first trace; the
        # metric variables created there make TF trace the step twice (a stock tf_keras fit does
        # too). Built before that trace, from the iterator's element spec and the model's output
        # shapes (all that building reads), the step is traced once.
        metrics = model.compiled_metrics
        if metrics is None or metrics._built or getattr(model, "own_steps", ()):  # its own steps: its own metrics
            return train_function

        def first_call(iterator):
            model.train_function = train_function
            spec = getattr(iterator, "element_spec", None)
            y = self.k.utils.unpack_x_y_sample_weight(spec)[1] if isinstance(spec, tuple) else None
            # Dense targets only (their shapes are all building reads); else Keras builds in the trace.
            if y is not None and not metrics._built and all(
                    type(s) is tf.TensorSpec for s in tf.nest.flatten(y)):
                y_pred = self._output_of(model.core)
                metrics.build(y_pred, metrics._conform_to_outputs(y_pred, y))
            return train_function(iterator)

        return first_call

    def _output_of(self, core):
        """The model's outputs: symbolic for a graph model; a subclassed one has none, so its output on a
        batch of one zero sample (from its saved input spec)."""
        if self.graph_of(core) is not None or isinstance(core, self.k.Sequential):
            return core.output
        args, kwargs = core.save_spec(dynamic_batch=True)
        return core(*tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype), args), **kwargs)

    def prepare_compiled(self, model, core) -> None:
        # Built outside the replicas: building creates its loss metrics.
        model.compiled_loss.build(self._output_of(core))

    # -- optimizers -----------------------------------------------------------------------------------
    def _loss_scaling(self, optimizer) -> bool:
        return isinstance(optimizer, self.k.mixed_precision.LossScaleOptimizer)

    def scale_loss(self, optimizer, loss):
        return optimizer.get_scaled_loss(loss) if self._loss_scaling(optimizer) else loss

    def apply_gradients(self, optimizer, grads, weights) -> None:
        # As minimize: slots for every weight, then the ones without a gradient are skipped (with a warning).
        grads = list(grads)
        if self._loss_scaling(optimizer):
            grads = optimizer.get_unscaled_gradients(grads)  # None stays None
        optimizer.apply_gradients(list(zip(grads, weights)))

    def build_optimizer(self, optimizer, variables) -> None:
        if hasattr(optimizer, "build"):  # the legacy optimizers have none
            optimizer.build(variables)

    def optimizer_refusal(self, optimizer, method: str) -> str | None:
        # tf_keras 2.13-2.21's Nadam caches its u_product behind a Python counter that tracing advances
        # (nadam.py, _u_product_counter): updating each mirrored copy of every variable traces its step
        # once per device, and the cache then answers for the wrong step (mirrored, 2 devices: 6.5e-02
        # from one device after 8 steps; NaN in float64).
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if method == "mirrored" and isinstance(inner, self.k.optimizers.Nadam):
            return (f"{self.k.__name__}.optimizers.Nadam keeps a Python-side counter of its u_product updates "
                    "(_u_product_counter) that each device's update of a mirrored variable advances: it drifts "
                    "under method='mirrored' (as under a stock MirroredStrategy). Use method='towers', or Adam")
        return None

    # -- mirrored -------------------------------------------------------------------------------------
    def _clone(self, template, sync_batchnorm: bool):
        k, sync_class = self.k, self.sync_batchnorm_class
        if self.graph_of(template) is None and not isinstance(template, k.Sequential):
            return self._clone_subclassed(template, sync_batchnorm)

        def clone(layer):
            if isinstance(layer, k.Model):  # tf-keras' clone_model passes nested models whole
                return k.models.clone_model(layer, clone_function=clone)
            if sync_batchnorm and type(layer) is k.layers.BatchNormalization:
                return sync_class.like(layer)
            return layer.__class__.from_config(layer.get_config())

        return k.models.clone_model(template, clone_function=clone)

    def _clone_subclassed(self, template, sync_batchnorm: bool):
        """A subclassed model rebuilt from its config and built on its saved input spec (tf_keras'
        clone_model takes Functional and Sequential models only)."""
        spec = template.save_spec(dynamic_batch=True)
        if spec is None:
            raise Refused("unbuilt-subclassed-model", self.clone_refusal_text(
                template, "it was never called on data, so its input shapes are unknown"))
        replica = type(template).from_config(template.get_config())
        args, kwargs = spec
        replica(*tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype), args), **kwargs)
        if sync_batchnorm:
            for layer in self.sublayers(replica):
                if type(layer) is self.k.layers.BatchNormalization:
                    # The synchronised layer's unfused path, with the fused kernel's Bessel correction.
                    layer.__class__ = self.sync_batchnorm_class
                    layer.bessel_moving_variance = bool(layer.fused)
                    layer.fused = False
        return replica

    def local_variable(self, weight):
        return weight._get_on_device_or_primary()

    def unsupported(self, template, method: str, sync_batchnorm: bool) -> list[str]:
        found = super().unsupported(template, method, sync_batchnorm)
        if not sync_batchnorm or method != "towers" or self.graph_of(template) is not None or self.own_steps(template):
            return found  # a model with its own steps: each model its step calls is checked when it is called
        if any(self.is_batchnorm(layer) for layer in self.sublayers(template)):
            found.append(f"{template.name} (a subclassed model with BatchNormalization: whole-batch statistics "
                         "need a Functional or Sequential model; or pass sync_batchnorm=False)")
        return found

    def unsupported_error(self, template, method: str, refused: list[str]) -> Exception:
        from harness.compat import Keras2NotSupported

        return Keras2NotSupported(
            "keras2-batchnorm",
            f"method={method!r} on a Keras 2 model ({type(template).__module__}) cannot train exactly: "
            + "; ".join(refused) + ". Use a Keras 3 model (import keras, TF >= 2.16), or sync_batchnorm=False")

    # -- BatchNormalization -----------------------------------------------------------------------------
    def is_batchnorm(self, layer) -> bool:
        return any(cls.__name__ == "BatchNormalizationBase" for cls in type(layer).__mro__)

    def batchnorm_refusal(self, layer, method: str) -> str | None:
        for attribute, what in (("renorm", "renorm=True"), ("virtual_batch_size", "virtual_batch_size"),
                                ("adjustment", "adjustment")):
            if getattr(layer, attribute, None):
                return f"{layer.name} (BatchNormalization with {what}: not synchronised across towers)"
        return None

    def bn_prepare(self, layer, xs):
        dtype = layer._param_dtype
        rank = len(xs[0].shape)
        return [tf.cast(tf.cast(x, layer.compute_dtype), dtype) for x in xs], \
            [i for i in range(rank) if i not in layer.axis]

    def bn_update(self, layer, mean, variance, count) -> None:
        if layer.fused or getattr(layer, "bessel_moving_variance", False):  # the fused kernel's moving variance
            # carries Bessel's correction (a SyncBatchNormalization stands in for a fused layer)
            variance = variance * _bessel(tf.cast(count, variance.dtype))
        assign = layer._assign_moving_average
        if hasattr(layer, "bessel_moving_variance"):  # a SyncBatchNormalization: corrected above already; its own
            # correction reads the count its _moments keeps, which this path never sets (TF 2.15: AttributeError)
            assign = super(type(layer), layer)._assign_moving_average  # type: ignore[misc]
        assign(layer.moving_mean, mean, layer.momentum, None)
        assign(layer.moving_variance, variance, layer.momentum, None)

    def bn_normalize(self, layer, x, mean, variance):
        shape = [1] * len(x.shape)
        for axis in layer.axis:
            shape[axis] = x.shape[axis]

        def broadcast(v):
            return tf.reshape(tf.cast(v, x.dtype), shape)

        gamma = broadcast(layer.gamma) if layer.scale else None
        beta = broadcast(layer.beta) if layer.center else None
        y = tf.nn.batch_normalization(x, broadcast(mean), broadcast(variance), beta, gamma, layer.epsilon)
        return tf.cast(y, layer.compute_dtype)

    # -- the graph walk of towers -------------------------------------------------------------------------
    def set_initial_epoch(self, model, epoch: int | None) -> None:
        # tf_keras 2.15-2.21 fit asks ``self._training_state.maybe_load_initial_counters_from_ckpt`` after
        # on_train_begin (BackupAndRestore's hook).
        model._training_state = None if epoch is None else _Resume(epoch)

    def graph_of(self, model):
        if getattr(model, "_is_graph_network", False) and hasattr(model, "_nodes_by_depth"):
            return model
        return None

    def walk(self, graph, parts):
        return _Walk(graph, parts)

    def call_node(self, graph, op, args, kwargs, training):
        op._clear_losses()  # in the call context below the layer does not clear them itself
        with self._enter_call(graph, args, training):
            return op(*args, **kwargs)

    def _enter_call(self, model, inputs, training):
        """A call context as ``model(inputs, training=...)`` opens (tf_keras and Keras 2.15 spell it apart)."""
        context = self._layer_utils.call_context()
        if "call_context_args" in inspect.signature(context.enter).parameters:
            return context.enter(layer=model, inputs=inputs, build_graph=True,
                                 call_context_args={"training": training})
        return context.enter(layer=model, inputs=inputs, build_graph=True, training=training)

    # -- a user's model as a workload ------------------------------------------------------------------------
    def compile_args(self, model) -> dict | None:
        # tf_keras 2.13-2.21 and Keras 2.13-2.15: _is_compiled, and the user's metrics in compiled_metrics
        if not getattr(model, "_is_compiled", False):
            return None
        metrics, losses = model.compiled_metrics, model.compiled_loss
        loss = model.loss if model.loss not in (None, {}) else None  # compile(loss=None) keeps {}
        return {"optimizer": model.optimizer, "loss": loss,
                "loss_weights": getattr(losses, "_user_loss_weights", None) if losses is not None else None,
                "metrics": getattr(metrics, "_user_metrics", None) if metrics is not None else None,
                "weighted_metrics": getattr(metrics, "_user_weighted_metrics", None) if metrics is not None else None}

    def _io_structs(self, graph) -> tuple:
        return graph._nested_inputs, graph._nested_outputs  # tf_keras 2.13-2.21 Functional

    def _graph_nodes(self, graph):
        for depth in sorted(graph._nodes_by_depth, reverse=True):
            for node in graph._nodes_by_depth[depth]:
                if not node.is_input:
                    dtypes = [self._dtype(t) for t in tf.nest.flatten(node.outputs)]
                    yield node.layer, list(node.flat_input_ids), list(zip(node.flat_output_ids, dtypes))

    def _tensor_id(self, t):
        return str(id(t))


class _Walk:
    """A Keras 2 Functional graph walked node by node, as ``Functional._run_internal_graph`` does, per tower."""

    def __init__(self, graph, parts):
        self.graph = graph
        self.values: list[dict] = [{} for _ in parts]
        for values, part in zip(self.values, parts):
            for ref, tensor in zip(graph.inputs, graph._flatten_to_reference_inputs(part)):
                tensor = graph._conform_to_reference_input(tensor, ref_input=ref)
                values[str(id(ref))] = [tensor] * graph._tensor_usage_count[str(id(ref))]

    def nodes(self):
        for depth in sorted(self.graph._nodes_by_depth, reverse=True):
            for node in self.graph._nodes_by_depth[depth]:
                if not node.is_input and all(t in self.values[0] for t in node.flat_input_ids):
                    yield node, node.layer

    def arguments(self, node, tower: int):
        return node.map_arguments(self.values[tower])

    def store(self, node, tower: int, outputs) -> None:
        for ref_id, tensor in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
            self.values[tower][ref_id] = [tensor] * self.graph._tensor_usage_count[ref_id]

    def outputs(self, tower: int):
        values = self.values[tower]
        return tf.nest.pack_sequence_as(self.graph._nested_outputs,
                                        [values[str(id(ref))].pop() for ref in self.graph.outputs])
