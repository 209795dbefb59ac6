"""The adapter interface, and what both Keras generations spell alike.

Each method is one thing a parallel step needs from Keras. ``Keras3Adapter``
and ``Keras2Adapter`` implement them; the steps never look past them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf

from harness.errors import Refused

__all__ = ["Adapter", "add_all"]


def add_all(values, dtype="float32") -> tf.Tensor:
    """The sum of a (nested) list of losses in ``dtype``; 0 for none (``None`` entries skipped)."""
    values = [tf.cast(v, dtype) for v in tf.nest.flatten(values) if v is not None]
    return tf.add_n(values) if values else tf.zeros((), dtype)


class Adapter:
    """What the parallel steps need from one Keras generation."""

    #: the Keras module (``keras`` or ``tf_keras``)
    k: Any = None
    #: 3 or 2
    generation = 0
    #: Keras 2 and Keras 3.14+ divide an activity regulariser by the batch size of the call: a
    #: slice's losses are means over the slice (weighted by n_i/N); earlier Keras 3's are sums.
    call_losses_are_means = False

    def __init__(self, k):
        self.k = k

    # -- tensors: the mask and the logits Keras keeps on an output ---------------------------
    # Checked on Keras 3.0-3.15 (backend/tensorflow/nn.py, activations.py, backend/common/masking.py)
    # and tf_keras/Keras 2.13-2.21 (backend.py, engine/base_layer.py): both keep them as
    # attributes of the TensorFlow tensor.
    @staticmethod
    def get_mask(t):
        return getattr(t, "_keras_mask", None)

    @staticmethod
    def set_mask(t, mask) -> None:
        with contextlib.suppress(AttributeError):  # eager tensors may refuse attributes
            t._keras_mask = mask

    @staticmethod
    def get_logits(t):
        """The logits a softmax/sigmoid output was computed from: Keras' cross-entropy uses them."""
        return getattr(t, "_keras_logits", None)

    @staticmethod
    def set_logits(t, logits) -> None:
        with contextlib.suppress(AttributeError):
            t._keras_logits = logits

    @staticmethod
    def sublayers(model) -> list:
        """Every layer inside ``model``, nested ones included (Keras 3.0-3.15 and Keras 2.13-2.21 alike)."""
        return list(model._flatten_layers(include_self=False))

    # -- losses ---------------------------------------------------------------------------
    def call_losses(self, layer) -> list:
        """The losses ``layer`` and its sublayers added in their last call (activity regularisers, ``add_loss``)."""
        raise NotImplementedError

    def set_call_losses(self, model, total) -> None:
        """Makes ``total`` the call-time losses ``model.losses`` reports, where its last call added any (a custom
        step's split call: the towers' losses as the whole batch's, ``towers.Towers._split_call``)."""
        raise NotImplementedError

    def weight_penalties(self, model) -> list:
        """Weight regularisation: a function of the weights only, counted once per step."""
        raise NotImplementedError

    def loss(self, model, y, y_pred, sample_weight):
        """The compiled loss of ``y_pred`` (loss weights, masks), not scaled by any strategy; None without one."""
        raise NotImplementedError

    #: built-in losses that reduce over the batch, not per sample (Keras 3: dice, tversky, circle)
    BATCH_LEVEL_LOSSES = ("dice", "tversky", "circle")
    #: the reductions that divide by the number of per-sample values (a count each replica knows)
    MEAN_REDUCTIONS = ("auto", "sum_over_batch_size", "mean")

    def loss_gather_reason(self, model) -> str | None:
        """Why ``model``'s compiled loss needs the whole batch's predictions, or None where it decomposes.

        A loss decomposes where every compiled loss is a Keras built-in computed per
        sample and reduced by the count of its values (``sum_over_batch_size``): then a
        slice's loss on its own rows times n_i/N is its exact share of the whole
        batch's, sample and class weights and loss weights included. Custom losses,
        batch-level ones (dice, tversky, circle), ``ignore_class`` and the other
        reductions (their divisor spans the batch) are computed on the whole batch.
        Masks are checked on the outputs, when the step is traced.
        """
        given = getattr(model, "loss", None)
        if given is None or given == {}:
            return "no compiled loss"
        builtin = (f"{self.k.__name__}.src.losses", f"{self.k.__name__}.losses")
        for item in tf.nest.flatten(given):
            if item is None:
                continue
            loss = self.k.losses.get(item) if isinstance(item, str) else item
            fn = getattr(loss, "fn", None) if isinstance(loss, self.k.losses.Loss) else loss
            where = getattr(type(loss) if fn is None else fn, "__module__", "") or ""
            name = getattr(type(loss) if fn is None else fn, "__name__", repr(loss))
            if not where.startswith(builtin):
                return f"loss {name!r} is not a Keras built-in (it may mix samples)"
            if any(word in name.lower() for word in self.BATCH_LEVEL_LOSSES):
                return f"loss {name!r} reduces over the batch"
            if isinstance(loss, self.k.losses.Loss):
                reduction = str(getattr(loss, "reduction", "auto")).lower()
                if reduction not in self.MEAN_REDUCTIONS:
                    return f"loss {name!r} has reduction={reduction!r} (its divisor spans the batch)"
                if loss.get_config().get("ignore_class") is not None:
                    return f"loss {name!r} ignores a class (it divides by the whole batch's other labels)"
        return None

    def untracked_losses(self, model):
        """A context in which ``loss`` updates no loss metric (around ``strategy.run``)."""
        return contextlib.nullcontext()

    def report_loss(self, model, y, y_pred, sample_weight, extra, n, compiled=None) -> None:
        """Updates the loss metrics once, as a single-device step on the whole batch does.

        ``compiled``: the whole batch's compiled loss, if the step has it; the loss is
        computed again only where Keras keeps a loss metric per output.
        """
        raise NotImplementedError

    def prepare_compiled(self, model, core) -> None:
        """After ``compile`` of a mirrored model: build what must exist before the replicas run."""

    # -- optimizers -------------------------------------------------------------------------
    def scale_loss(self, optimizer, loss):
        """The loss a mixed-precision optimizer differentiates (scaled), else ``loss``."""
        raise NotImplementedError

    def apply_gradients(self, optimizer, grads, weights) -> None:
        """Unscales (mixed precision) and applies; weights without a gradient (None) are skipped by Keras,
        after it made their optimizer slots, as on one device."""
        raise NotImplementedError

    def build_optimizer(self, optimizer, variables) -> None:
        """Creates the optimizer's slots for ``variables`` now (a no-op once built)."""
        raise NotImplementedError

    @staticmethod
    def optimizers_in(optimizer) -> list:
        """``optimizer`` and the optimizers it wraps (a loss-scaling wrapper's inner one, Keras 3.15's
        ``MultiOptimizer``'s)."""
        found, stack = [], [optimizer]
        while stack:
            current = stack.pop()
            found.append(current)
            inner = getattr(current, "inner_optimizer", None)
            stack += ([inner] if inner is not None else []) + list(getattr(current, "optimizers", None) or [])
        return found

    def adopt_optimizer(self, optimizer, strategy) -> None:
        """Makes ``optimizer`` (and the optimizers it wraps) step the variables of ``strategy``, whatever scope it was
        made in: the strategy it updates variables through (``extended.update``) and creates its slots with.

        Keras 3.0-3.15's TFOptimizer and tf_keras 2.13-2.21's optimizers keep the strategy current when they
        were made as ``_distribution_strategy``; the slots are made when the optimizer is built, in
        ``strategy``'s scope. Variables made with the optimizer (its step counter) stay single-device: the
        step applies the optimizer outside the replicas (docs/design.md, "Optimizer steps").
        """
        for each in self.optimizers_in(optimizer):
            if hasattr(each, "_distribution_strategy"):
                each._distribution_strategy = strategy

    def optimizer_refusal(self, optimizer, method: str) -> str | None:
        """Why ``optimizer`` cannot step a ``method`` model exactly, or None."""
        return None

    def steps_per_execution(self, model) -> int:
        """How many steps one call of ``model``'s train function runs (``compile(steps_per_execution=...)``)."""
        return int(getattr(model, "steps_per_execution", 1) or 1)

    def fit_step(self, model, data):
        """One training step on ``data`` as ``fit``'s train function runs it (what it returns, and any
        bookkeeping of Keras' own around ``train_step``): the step a staged train function calls
        (``harness.parallel.staging``)."""
        return model.train_step(data)

    def first_call_builds(self, model, train_function):
        """``train_function``, or one that first builds what Keras would build in its first trace."""
        return train_function

    def symbolic_build(self, model, iterator=None, data_batch=None) -> None:
        """Builds the compiled metrics and losses of ``model`` from the first batch, outside any trace.

        Keras 3 calls it from ``fit``, ``evaluate`` and ``train_on_batch``; Keras 2 has
        ``first_call_builds``.
        """

    # -- mirrored --------------------------------------------------------------------------------
    def clone(self, template, strategy, sync_batchnorm: bool):
        """``template`` cloned in ``strategy``'s scope with its weights, BatchNormalization synchronised.

        Raises:
            harness.errors.Refused: ``template`` is a subclassed model Keras cannot rebuild from a config
                (``"not-cloneable"``: it keeps Keras' ``get_config`` while its ``__init__`` takes arguments
                Keras cannot record), or a Keras 2 subclassed model never called on data
                (``"unbuilt-subclassed-model"``). Any other error of cloning (a layer's own ``get_config``
                or ``from_config`` failing, an error of Keras) propagates as it is.
        """
        why = self._clone_refusal(template)
        if why is not None:
            raise Refused("not-cloneable", self.clone_refusal_text(template, why))
        with strategy.scope(), self._global_policy(template):
            replica = self._clone(template, sync_batchnorm)
            replica.set_weights(template.get_weights())
        return replica

    def clone_refusal_text(self, template, why: str) -> str:
        """The message of a refusal to clone ``template`` for ``method='mirrored'``, ``why`` at its end."""
        return (f"method='mirrored' needs a model {self.k.__name__} can clone (Functional, Sequential, or subclassed "
                f"with get_config/from_config, called on data once) to place its variables on every device; "
                f"cannot clone {template.name!r} ({type(template).__name__}): {why}")

    def _clone_refusal(self, template) -> str | None:
        """Why Keras cannot rebuild the subclassed model ``template`` from a config, or None.

        A subclassed model that keeps Keras' own ``Model.get_config`` has a config only where Keras
        recorded its ``__init__`` arguments; otherwise Keras' ``Layer.get_config`` raises
        ``NotImplementedError`` (Keras 3.15 and tf_keras 2.21 checked; tf_keras' ``Model.get_config``
        returns an empty config instead, which ``from_config`` cannot build from). A model with a
        ``get_config`` of its own is cloned, and its errors are its own.
        """
        k = self.k
        if self.graph_of(template) is not None or isinstance(template, k.Sequential):
            return None
        if getattr(type(template), "get_config", None) is not getattr(k.Model, "get_config", None):
            return None
        try:
            k.layers.Layer.get_config(template)
        except NotImplementedError as err:
            return " ".join(str(err).split())
        return None

    @contextlib.contextmanager
    def _global_policy(self, template):
        """Keras' global dtype policy set to ``template``'s while it is cloned: a layer's ``__init__`` creates its
        sublayers under the global policy, as it did when the template was built under it (a Keras 2 model
        built under mixed_float16 and cloned under float32 added float32 to float16)."""
        policy = getattr(getattr(template, "dtype_policy", None), "name", None)
        current = self.k.mixed_precision.global_policy().name
        if policy is None or policy == current:
            yield
            return
        self.k.mixed_precision.set_global_policy(policy)
        try:
            yield
        finally:
            self.k.mixed_precision.set_global_policy(current)

    def _clone(self, template, sync_batchnorm: bool):
        """``template`` cloned (in the current scope), nested models included."""
        raise NotImplementedError

    def local_variable(self, weight):
        """Outside replicas, the copy of a mirrored variable on the current device."""
        raise NotImplementedError

    #: the step methods a model may define for itself (``harness.parallel.custom``)
    STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss")

    def own_steps(self, model) -> list[str]:
        """The step methods (``STEP_METHODS``) ``model``'s class defines instead of its Keras' own."""
        return [name for name in self.STEP_METHODS
                if getattr(type(model), name, None) is not getattr(self.k.Model, name, None)]

    def unsupported(self, template, method: str, sync_batchnorm: bool) -> list[str]:
        """``"name (why)"`` of what this generation cannot train exactly with ``method``: the
        BatchNormalization layers it cannot synchronise (``batchnorm_refusal``), and under mirrored
        any subclass of BatchNormalization (replicas synchronise the Keras class only)."""
        if not sync_batchnorm:
            return []
        found = []
        for layer in self.sublayers(template):
            if not self.is_batchnorm(layer):
                continue
            if method == "mirrored" and type(layer) is not self.k.layers.BatchNormalization:
                found.append(f"{layer.name} ({type(layer).__name__}: only {self.k.__name__}.layers."
                             "BatchNormalization can be synchronised across replicas)")
            elif why := self.batchnorm_refusal(layer, method):
                found.append(why)
        return found

    def unsupported_error(self, template, method: str, refused: list[str]) -> Exception:
        """The error ``parallelize`` raises for what ``unsupported`` found: a ``Refused``
        (``"unsynchronised-batchnorm"``)."""
        return Refused("unsynchronised-batchnorm",
                       f"method={method!r} cannot train {template.name!r} exactly: {'; '.join(refused)}. "
                       "Use " + ("method='mirrored', or " if method == "towers" else "") + "sync_batchnorm=False")

    def towers_refusal(self, template) -> list[str]:
        """``"name (why)"`` of the layers towers cannot run on devices other than their variables'."""
        return []

    # -- BatchNormalization and the graph walk of towers ---------------------------------------
    def is_batchnorm(self, layer) -> bool:
        raise NotImplementedError

    def batchnorm_refusal(self, layer, method: str) -> str | None:
        """Why ``layer`` cannot get whole-batch statistics under ``method``, or None."""
        return None

    def bn_prepare(self, layer, xs: list) -> tuple[list, list[int]]:
        """``(inputs cast to the statistics' dtype, reduction axes)`` of a BatchNormalization call."""
        raise NotImplementedError

    def bn_update(self, layer, mean, variance, count) -> None:
        """Moves the layer's averages once by the whole batch's moments (``count`` values per channel)."""
        raise NotImplementedError

    def bn_normalize(self, layer, x, mean, variance):
        """The layer's output for ``x`` normalised by the given moments."""
        raise NotImplementedError

    def set_initial_epoch(self, model, epoch: int | None) -> None:
        """Makes ``model``'s next ``fit`` start at ``epoch`` (None: as asked), from a callback's
        ``on_train_begin`` (``harness.parallel.backup``)."""
        raise NotImplementedError

    def graph_of(self, model):
        """The Functional graph behind a Functional or built Sequential model, else None."""
        raise NotImplementedError

    def walk(self, graph, parts: list):
        """A ``GraphWalk`` of ``graph`` with one tower per entry of ``parts``."""
        raise NotImplementedError

    def call_node(self, graph, op, args, kwargs, training):
        """Calls one layer of ``graph`` on one tower's arguments, as the model's own call would."""
        raise NotImplementedError

    # -- a user's model as a workload (harness.bench.workloads.user) ------------------------------
    def compile_args(self, model) -> dict | None:
        """What ``model`` was compiled with: ``optimizer`` (the model's own object), ``loss`` (None where compiled
        without one), ``loss_weights``, ``metrics``, ``weighted_metrics``; None where it was not compiled."""
        raise NotImplementedError

    def io_description(self, model) -> dict | None:
        """A Functional or built Sequential model's inputs and outputs, for ``harness.bench.workloads.infer``; None
        for a model without a graph (subclassed).

        Returns:
            ``{"inputs": [(name, shape, dtype)], "outputs": [(name, shape, dtype)], "input_tree", "output_tree",
            "embeddings"}``: shapes with the batch axis, dtype names; the trees are the model's input and output
            structures with each leaf its flat index; ``embeddings`` holds, per input, the ``input_dim`` of the
            first ``Embedding`` the input reaches through integer tensors (nested single-input models included),
            or None.
        """
        graph = self.graph_of(model)
        if graph is None:
            return None
        inputs, outputs = self._io_structs(graph)
        flat_in, flat_out = tf.nest.flatten(inputs), tf.nest.flatten(outputs)
        names = list(getattr(model, "output_names", None) or [])
        names = names if len(names) == len(flat_out) else [self._name(t) for t in flat_out]
        return {"inputs": [(self._name(t), tuple(t.shape), self._dtype(t)) for t in flat_in],
                "outputs": [(name, tuple(t.shape), self._dtype(t)) for name, t in zip(names, flat_out)],
                "input_tree": tf.nest.pack_sequence_as(inputs, list(range(len(flat_in)))),
                "output_tree": tf.nest.pack_sequence_as(outputs, list(range(len(flat_out)))),
                "embeddings": [self._embedding_dim(graph, t) for t in flat_in]}

    def _embedding_dim(self, graph, ref) -> int | None:
        """The ``input_dim`` of the first Embedding that input ``ref`` of ``graph`` reaches through integer tensors."""
        reached = {self._tensor_id(ref)}
        for op, inputs, outputs in self._graph_nodes(graph):
            if not reached.intersection(inputs):
                continue
            if isinstance(op, self.k.layers.Embedding):
                return int(op.input_dim)
            inner = self.graph_of(op) if isinstance(op, self.k.Model) else None
            if inner is not None and len(inner.inputs) == 1:
                dim = self._embedding_dim(inner, inner.inputs[0])
                if dim is not None:
                    return dim
            reached.update(ident for ident, dtype in outputs if dtype.startswith(("int", "uint")))
        return None

    @staticmethod
    def _name(t) -> str:
        return str(getattr(t, "name", "") or "").split(":")[0]

    @staticmethod
    def _dtype(t) -> str:
        return str(getattr(t.dtype, "name", t.dtype))

    def _io_structs(self, graph) -> tuple:
        """The (nested) input and output KerasTensors of a Functional graph."""
        raise NotImplementedError

    def _graph_nodes(self, graph):
        """``(layer, input ids, [(output id, dtype name)])`` of each layer call of ``graph``, inputs first."""
        raise NotImplementedError

    def _tensor_id(self, t):
        """The id ``_graph_nodes`` names KerasTensor ``t`` by."""
        raise NotImplementedError
