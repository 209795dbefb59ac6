"""What differs between the Keras generations, behind one small adapter each.

The parallel steps (``towers``, ``mirrored``, ``layerwise``, ``batchnorm``) are
written once; everything they need from Keras that Keras 3 and Keras 2
(``tf_keras``, or TF <= 2.15's ``keras``) spell differently goes through an
``Adapter``: the losses a call added, the compiled loss without scaling or
metric updates, optimizer scaling, cloning into a strategy, masks and logits
on tensors, BatchNormalization internals and the Functional graph walk.

The adapters are the only modules of harness that touch private Keras
attributes or import ``keras.src``; each such use says which Keras versions it
was checked on. The design follows Keras' own ``keras/src/distribution/
distribution_lib.py``, whose front delegates to one module per backend.
"""

from __future__ import annotations

import functools

from harness.compat import keras_module_name

__all__ = ["adapter_for", "adapter_of"]


def adapter_for(model):
    """The adapter of ``model``'s Keras (from its classes: ``tf_keras``/Keras 2, or Keras 3)."""
    from harness.compat import is_keras2_model

    return adapter_of(keras_module_name(model), is_keras2_model(model))


@functools.cache
def adapter_of(module_name: str, keras2: bool):
    """One adapter per Keras module and process."""
    import importlib

    k = importlib.import_module(module_name)
    if keras2:
        from harness.parallel.adapters.keras2 import Keras2Adapter

        return Keras2Adapter(k)
    from harness.parallel.adapters.keras3 import Keras3Adapter

    return Keras3Adapter(k)
