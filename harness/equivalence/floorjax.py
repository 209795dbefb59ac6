"""The rounding floor's sub-batches order on Keras 3's JAX backend (``harness.equivalence.floor``).

The model's training step stays ``JAXTrainer.train_step``: Keras differentiates its own
``compute_loss_and_updates``, whose forward pass (``stateless_call`` over the whole batch) is replaced by one with
the same values and a backward pass of its own (a ``jax.custom_vjp``): the ``jax.vjp`` of Keras' ``stateless_call``,
pulled back once per sub-batch of ``harness.split.split_batch`` sizes with the other rows' cotangents 0, the weight
gradients added in sub-batch order. The backward pass is linear in the cotangents, so the sum is the batch's gradient
(BatchNormalization's whole-batch statistics included); only its rounding is a split's.

The losses the forward pass added (activity regularisers, ``add_loss``) are means over the whole batch, not one per
row, so no row mask splits their cotangent: each sub-batch pulls back its share of the rows of it, as the towers
weight each device's forward losses by its share and add (``harness.parallel.jax``). The weights' regularisers do
not depend on the batch: pulled back once, after the sub-batches, as the towers add them.

What it shares with harness' parallel code: the sizes are ``harness.split``'s (the towers' own arithmetic is not
called); the loss, its scaling and the optimizer step are Keras' own ``train_step``. From the JAX adapter it takes
the private Keras-on-JAX accessors alone: where the training forward pass is (``wrap_training_forward``), how many
of its losses are the weights' regularisers, and an output's Keras mask (carried to the outputs returned). A wrong
accessor changes the floor run's values, not only its rounding, which tests/onjax/test_floor_jax.py would see (the
order's loss history equals Keras' own). Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# What the JAX trainer's fit runs of a model's own, besides its call: a model defining one of these trains by it.
_STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss", "compute_loss_and_updates")


def sub_batch_steps_jax(model, ratios: Sequence[float]) -> str | None:
    """``harness.equivalence.floor.sub_batch_steps`` on Keras 3's JAX backend: makes ``model`` (compiled, one device)
    sum each batch's gradient from sub-batches of the sizes a split by ``ratios`` gives.

    Args:
        model: a compiled Keras 3 model on the JAX backend.
        ratios: one positive number per device of the split.

    Returns:
        None, or why this model cannot (its own training step: what it calls is its own).
    """
    import keras

    from harness.parallel.adapters.jaxtrainer import weight_regularisers, wrap_training_forward
    from harness.split import validate_ratios

    own = [name for name in _STEP_METHODS if getattr(type(model), name, None) is not getattr(keras.Model, name, None)]
    if own:
        return f"the model's own {', '.join(own)}"
    split = validate_ratios(ratios)
    wrap_training_forward(model, lambda call: _partitioned(call, split, lambda: weight_regularisers(model)))
    return None


def _partitioned(stateless_call: Callable, ratios: tuple[float, ...], regularisers: Callable[[], int]) -> Callable:
    """``stateless_call`` whose values are its own and whose backward pass (with ``return_losses``: the training
    step's) is summed from sub-batches (``_summed_pullbacks``). ``regularisers()``: how many of its losses are the
    weights' regularisers (the last ones)."""
    import jax
    from keras import tree

    from harness.parallel.adapters.jaxtrainer import get_mask, set_mask

    def partitioned(trainable, non_trainable, *args, return_losses: bool = False, **kwargs):
        if not return_losses:  # predict_step: no gradient is taken of it
            return stateless_call(trainable, non_trainable, *args, **kwargs)
        rows = int(tree.flatten(args)[0].shape[0])
        regularised = regularisers()

        def differentiable(non_trainable, args):
            def forward(trainable):
                y, after, losses = stateless_call(trainable, non_trainable, *args, return_losses=True, **kwargs)
                # Keras keeps an output's mask beside its array (a masked loss reads it): returned, attached outside.
                return (y, list(losses)), (after, [get_mask(leaf) for leaf in tree.flatten(y)])
            return forward

        @jax.custom_vjp
        def run(trainable, non_trainable, args):
            (y, losses), (after, masks) = differentiable(non_trainable, args)(trainable)
            return y, after, losses, masks

        def run_forward(trainable, non_trainable, args):
            (y, losses), pull, (after, masks) = jax.vjp(differentiable(non_trainable, args), trainable, has_aux=True)
            return (y, after, losses, masks), pull

        def run_backward(pull, cotangents):
            y_ct, _, losses_ct, _ = cotangents  # the state after the pass and the masks: not differentiated
            # Keras differentiates the trainable weights alone: the state and the batch get no cotangent (None: 0).
            return _summed_pullbacks(pull, y_ct, losses_ct, rows, ratios, len(losses_ct) - regularised), None, None

        run.defvjp(run_forward, run_backward)
        y, after, losses, masks = run(trainable, non_trainable, args)
        for leaf, mask in zip(tree.flatten(y), masks):
            if mask is not None:
                set_mask(leaf, mask)
        return y, after, losses

    return partitioned


def _summed_pullbacks(pull: Callable, y_ct, losses_ct: list, rows: int, ratios: tuple[float, ...], forward: int):
    """The weights' cotangent of the whole batch as a split of ``rows`` by ``ratios`` sums it: ``pull`` (the forward
    pass' ``jax.vjp``) once per sub-batch, with the outputs' cotangents of its rows alone and its share of the rows
    of the cotangents of the first ``forward`` losses (the pass' own), added in sub-batch order; then the weights'
    regularisers' (the other losses) pulled back once and added."""
    import jax
    import jax.numpy as jnp

    from harness.split import split_batch

    zeros = [jnp.zeros_like(ct) for ct in losses_ct]
    total = None
    start = 0
    for size in split_batch(rows, ratios):
        stop = start + size
        if size:  # a device without rows of this batch adds nothing
            part = jax.tree_util.tree_map(lambda ct, a=start, b=stop: _rows_only(ct, a, b, rows), y_ct)
            # share * cotangent: a Python float keeps the cotangent's dtype, as the towers' share * loss does
            shares = [size / rows * ct for ct in losses_ct[:forward]] + zeros[forward:]
            (grads,) = pull((part, shares))
            total = grads if total is None else jax.tree_util.tree_map(jnp.add, total, grads)
        start = stop
    if forward < len(losses_ct):
        nothing = jax.tree_util.tree_map(lambda ct: _rows_only(ct, 0, 0, rows), y_ct)  # no row's: all 0
        (grads,) = pull((nothing, zeros[:forward] + list(losses_ct[forward:])))
        total = grads if total is None else jax.tree_util.tree_map(jnp.add, total, grads)
    return total


def _rows_only(ct, start: int, stop: int, rows: int):
    """``ct`` (an output's cotangent, a row per sample) with the rows outside ``[start, stop)`` 0."""
    import jax
    import jax.numpy as jnp

    from harness.errors import InvalidValue

    if ct.dtype == jax.dtypes.float0:  # an integer output: no cotangent to split
        return ct
    if not ct.shape or ct.shape[0] != rows:
        raise InvalidValue(f"the sub-batches order splits every output by its rows; an output of shape "
                           f"{tuple(ct.shape)} has no row per sample of the batch of {rows}")
    return jnp.zeros_like(ct).at[start:stop].set(ct[start:stop])
