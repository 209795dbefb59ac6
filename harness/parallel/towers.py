"""Towers: one graph, variables on one device, each device runs its slice.

The Keras 2 ``multi_gpu_model`` / ``make_parallel`` design, done exactly:
slices are cut on the host and only they travel; tower outputs are merged
once (masks and logits too), and the loss, metrics and gradients are those of
the whole batch. With BatchNormalization, the graph runs layer by layer across
the towers (``layerwise``) so its statistics are the whole batch's.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from harness.errors import NotSupported, Refused
from harness.parallel import custom, layerwise
from harness.parallel.base import Method, ParallelModel
from harness.parallel.sparse import whole_rows

__all__ = ["Towers", "towers_class"]


class Towers(ParallelModel):
    """A model whose steps run the template once per device on that device's slice."""

    method = Method.TOWERS

    def __init__(self, template, devices, ratios, sync_batchnorm, merge_device, emulator=None):
        super().__init__(template, devices, ratios, sync_batchnorm, merge_device, emulator)
        a = self._adapter
        # The model's own steps (``custom``): they run unchanged, with its models' calls split.
        self.own_steps = tuple(custom.own_steps(template))
        self._in_tower = False
        self.split_calls = 0
        if self.own_steps:
            self._staging_supported = False  # the step cuts the batch where it calls a model, not before it
        self._layerwise = self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(a, template)
        if self._layerwise and a.graph_of(template) is None and not self.own_steps:
            raise Refused(
                "subclassed-batchnorm",
                f"method='towers' with sync_batchnorm=True needs a Functional or Sequential model to share "
                f"BatchNormalization statistics; got a subclassed {type(template).__name__}. "
                "Use method='mirrored' or sync_batchnorm=False"
            )
        refused = a.towers_refusal(template) if len(self.devices) > 1 else []
        if refused:
            raise Refused("towers-unsupported-layer",
                          f"method='towers' cannot run {'; '.join(refused)}. Use method='mirrored'")
        self._core_model = template  # tracked: its variables are this model's

    def _towers(self, x, training: bool, watch=None):
        """Merged outputs, the call-time losses of the whole batch, and the emulated devices' pending ends
        (``_run_towers``)."""
        n, sizes, parts = self._split(x)
        with tf.device(self.merge_device):
            shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
        outputs, extra, pending = self._run_towers(self.template, self.devices, parts, shares, training, watch,
                                                   self._layerwise, self.merge_device)
        return self._merge(outputs), extra, pending

    def _parallel_train(self, x, y, sample_weight):
        a = self._adapter
        with tf.GradientTape() as tape:
            y_pred, extra, pending = self._towers(x, training=True, watch=tape.watch)
            extra = extra + self._penalties()
            compiled, loss = self._whole_batch_loss(y, y_pred, sample_weight, extra)
            scaled = a.scale_loss(self.optimizer, loss)
        weights = self.core.trainable_weights
        grads = tape.gradient(scaled, weights + [leaf for _, _, leaf in pending])
        grads, input_grads = grads[: len(weights)], grads[len(weights):]
        # Sparse gradients get the single device's rows (each batch-independent lookup's blocks summed).
        grads = whole_rows(grads, self._batch_sources(x), len(self.devices), weights)
        # Each emulated device finishes when its backward pass reaches its input.
        grads = self._finish_towers(grads, pending, input_grads, after=y_pred)
        a.apply_gradients(self.optimizer, grads, weights)
        return y_pred, extra, compiled

    def _parallel_forward(self, x):
        y_pred, extra, _ = self._towers(x, training=False)
        return y_pred, extra

    # -- the model's own steps (``custom``) ----------------------------------------------------------
    def compile(self, *args, **kwargs):
        """As ``Model.compile``; a model with its own steps is compiled by its own ``compile`` (any signature:
        a GAN's two optimizers), and this model then steps with the optimizer that gave it."""
        if not self.own_steps:
            return super().compile(*args, **kwargs)
        if kwargs.get("jit_compile") is True:
            super().compile(jit_compile=True)  # refused, as for any parallel model
        self.template.compile(*args, **kwargs)
        a = self._adapter
        super().compile(optimizer=self.template.optimizer, steps_per_execution=a.steps_per_execution(self.template),
                        run_eagerly=bool(self.template.run_eagerly))
        return None

    @property
    def metrics(self):
        # A model with its own steps reports its own metrics (fit resets them each epoch, as on one device).
        if getattr(self, "own_steps", ()):
            return self.template.metrics
        return super().metrics

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # The template's compiled losses and metrics, built as its own fit would (outside the trace).
        self._adapter.symbolic_build(self.template if self.own_steps else self, iterator, data_batch)

    def train_step(self, data):
        if not self.own_steps:
            return super().train_step(data)
        return self._own_step("train_step", data)

    def test_step(self, data):
        if not self.own_steps:
            return super().test_step(data)
        return self._own_step("test_step", data)

    def predict_step(self, data):
        if not self.own_steps:
            return super().predict_step(data)
        return self._own_step("predict_step", data)

    def _own_step(self, name: str, data):
        """The template's own ``name`` step (its class's, or Keras' default calling its own ``compute_loss``) on
        ``data``, with every call of its models split over the devices."""
        models = custom.split_models(self._adapter, self.template)  # as they are now (traced once per trace)
        with custom.splitting(self, models):
            outputs = getattr(self.template, name)(data)
            if self.split_calls == 0 and len(self.devices) > 1:
                raise self._refusing(NotSupported(
                    "custom-step-unsplit",
                    f"{type(self.template).__name__}.{name} called none of its models "
                    f"({', '.join(m.name for m in models)}): "
                    "nothing of it would run on the devices. Call the model (or its sub-models) in the step, not "
                    "their layers or call() directly"
                ))
        return outputs

    def _split_call(self, model, args, kwargs):
        """A call of ``model`` inside the model's own step: its batch cut by the ratios, each slice run on its
        device (``_run_towers``), the outputs merged on the merge device, its call-time losses the whole
        batch's; a batch smaller than the device count runs on the merge device alone (``_by_batch_size``)."""
        extra_args = [name for name, value in kwargs.items() if name != "training" and value is not None]
        if len(args) != 1 or extra_args:
            given = ", ".join(["inputs"] * min(1, len(args)) + [f"arg{i}" for i in range(1, len(args))] + extra_args)
            raise self._refusing(NotSupported(
                "custom-step-call",
                f"{type(self.template).__name__}'s step calls {model.name!r} with ({given}): harness splits a model "
                "call's first argument, the batch, and cannot tell how to split the others. Pass one input structure "
                "(a dict or tuple of tensors is one)"
            ))
        x, training = args[0], kwargs.get("training")
        a = self._adapter
        bn = bool(training) and self.sync_batchnorm and len(self.devices) > 1 and layerwise.has_batchnorm(a, model)
        if bn and a.graph_of(model) is None:
            raise self._refusing(Refused(
                "subclassed-batchnorm",
                f"method='towers' with sync_batchnorm=True needs a Functional or Sequential model to share "
                f"BatchNormalization statistics; {type(self.template).__name__}'s step calls the subclassed "
                f"{type(model).__name__} {model.name!r}. Use sync_batchnorm=False"
            ))
        self.split_calls += 1

        def towers():
            n, sizes, parts = self._split(x)
            with tf.device(self.merge_device):
                shares = tf.cast(sizes, tf.float32) / tf.cast(n, tf.float32)
            outputs, extra, _ = self._run_towers(model, self.devices, parts, shares, bool(training), None, bn,
                                                 self.merge_device)
            return self._merge(outputs), extra

        def single():
            with tf.device(self.merge_device):
                return model(x, training=training), self._call_losses(model)

        self._in_tower = True
        try:
            y, extra = self._by_batch_size(x, towers, single)  # a known batch size: its branch alone
        finally:
            self._in_tower = False
        a.set_call_losses(model, extra)
        return y


@functools.cache
def towers_class(adapter):
    """The towers model class of ``adapter``'s Keras (one per Keras module and process)."""
    return type("TowersModel", (Towers, adapter.k.Model), {"_adapter": adapter, "__module__": __name__})
