"""Each device's own random numbers: one stream per device, from the model's seed state, the step and the device.

A random layer (Dropout, GaussianNoise, the Random* augmentations) draws from a ``keras.random.SeedGenerator``,
whose state is ``[seed, counter]`` and advances by one each draw. Every device starts a step from the model's seed
state, so each seed a device draws is the one a single device would draw at that point of the step; the device's
own is that seed folded with its index (``jax.random.fold_in``): devices holding slices of equal size draw
different numbers, independent of each other's, and a step's numbers differ from the next step's (the state moved
on). The first device keeps the seed itself (one device is the single-device run). The generators' states advance
as on one device, once per step. The draws are equal in distribution to one device's, not in value: ``harness
check`` names random layers and judges a model with them off (``harness.randomness.random_layers``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["device_seed"]


def device_seed(seed, index):
    """The seed device ``index`` draws in place of ``seed`` (a raw ``uint32[2]`` key, as Keras' JAX backend draws);
    ``index`` may be traced, so one program serves every device of a slice shape."""
    return jnp.where(index == 0, seed, jax.random.fold_in(seed, index).astype(seed.dtype))
