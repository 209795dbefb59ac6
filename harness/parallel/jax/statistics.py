"""Whole-batch BatchNormalization statistics over devices that hold different numbers of rows.

Each device reduces its own rows to ``(count, mean, M2)`` (M2: the sum of squared deviations from its own mean);
the merge device combines them with the parallel variance combination of Chan, Golub and LeVeque (one device's
statistics after another, in device order: ``delta = mean_b - mean_a``, ``mean += delta * n_b / n``,
``M2 = M2_a + M2_b + delta**2 * n_a * n_b / n``). Not ``E[x**2] - E[x]**2`` (it cancels where the mean is large
beside the spread) and not a mean of the devices' means (wrong where they hold different counts: Flax's and
Equinox's ``pmean``). The variance is ``M2 / n``, the biased variance one device's ``jnp.var`` gives.

Inside a traced forward pass a BatchNormalization's moments are ``local_moments`` followed by ``BATCH_STATISTICS``,
a primitive that only marks where the whole batch's statistics are needed: ``harness.parallel.jax.segments`` cuts
the forward pass there, and runs ``combine`` on the merge device in its place. Imports no TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive

__all__ = ["BATCH_STATISTICS", "local_moments", "combine", "KERAS_EPSILON"]

KERAS_EPSILON = 1e-7  # keras.backend.epsilon(): Keras' masked moments divide by the weights' sum plus it


def _abstract(count, mean, m2, *, masked: bool, squeeze_all: bool):
    del count, m2, masked, squeeze_all
    return [jax.core.ShapedArray(mean.shape, mean.dtype)] * 2


def _alone(count, mean, m2, *, masked: bool, squeeze_all: bool):
    """Run outside a cut (a marker evaluated as it is): the statistics of this one participant."""
    del squeeze_all
    return list(combine([(count, mean, m2)], masked))


BATCH_STATISTICS = Primitive("harness_batch_statistics")
BATCH_STATISTICS.multiple_results = True
BATCH_STATISTICS.def_abstract_eval(_abstract)
BATCH_STATISTICS.def_impl(_alone)


def local_moments(inputs, mask, axes: Sequence[int]):
    """A BatchNormalization's ``(mean, variance)`` of the whole batch, as Keras' ``BatchNormalization._moments``
    returns them (its shapes), from this device's ``inputs``: its rows reduced to ``(count, mean, M2)`` per channel,
    then the marker the forward pass is cut at. ``mask`` (``inputs`` without its channel axis, or None) weighs rows
    as Keras does: a masked step's statistics are those of the unmasked rows, over their count plus Keras'
    epsilon."""
    axes = tuple(axes)
    if mask is None:
        mean = jnp.mean(inputs, axis=axes)
        m2 = jnp.sum(jnp.square(inputs - jnp.mean(inputs, axis=axes, keepdims=True)), axis=axes)
        count = jnp.full(mean.shape, math.prod(inputs.shape[a] for a in axes), inputs.dtype)
        squeeze_all = False
    else:
        weights = jnp.broadcast_to(jnp.expand_dims(mask, -1), inputs.shape).astype(bool)
        count = jnp.sum(weights.astype(inputs.dtype), axis=axes, keepdims=True)
        mean = jnp.sum(jnp.where(weights, inputs, 0), axis=axes, keepdims=True) / jnp.maximum(count, 1)
        m2 = jnp.sum(jnp.where(weights, jnp.square(inputs - mean), 0), axis=axes, keepdims=True)
        squeeze_all = True  # Keras squeezes every axis of size 1 of its masked moments
    mean, variance = BATCH_STATISTICS.bind(count, mean, m2, masked=mask is not None, squeeze_all=squeeze_all)
    if squeeze_all:
        return jnp.squeeze(mean), jnp.squeeze(variance)
    return mean, variance


def combine(stats: Sequence[tuple], masked: bool):
    """``(mean, variance)`` of the whole batch from each participant's ``(count, mean, M2)``, in their order (the
    Chan et al. combination). A participant whose count is 0 (every row masked) adds nothing. ``masked``: divide by
    the count plus Keras' epsilon, around a mean divided so, as Keras' masked moments do."""
    count, mean, m2 = stats[0]
    for count_b, mean_b, m2_b in stats[1:]:
        total = count + count_b
        share = jnp.where(total > 0, count_b / jnp.where(total > 0, total, 1), 0)
        delta = mean_b - mean
        mean = mean + delta * share
        m2 = m2 + m2_b + delta * delta * count * share
        count = total
    if not masked:
        return mean, m2 / count
    shrunk = mean * (count / (count + KERAS_EPSILON))  # Keras: sum / (count + epsilon)
    m2 = m2 + count * jnp.square(mean - shrunk)  # the squared deviations from that mean
    return shrunk, m2 / (count + KERAS_EPSILON)
