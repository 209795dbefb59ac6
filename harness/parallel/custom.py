"""The user's own steps on our devices: models that define ``train_step``, ``test_step`` or ``compute_loss``.

Keras' guide "Customizing what happens in fit()" teaches steps of one's own: a VAE adds its KL
term in ``train_step``, a GAN trains two models with two optimizers in one step, a distiller calls
a frozen teacher. A towers model (``towers.Towers``) runs such a model's own steps, unchanged
(``train_step``, ``test_step`` and ``predict_step``, its own or Keras' default ones calling its own
``compute_loss``), and while they run, every call of the model or of a ``keras.Model`` inside it
(the GAN's generator and discriminator, the VAE's encoder and decoder) is a towers forward: the
call's inputs cut by the ratios, each slice run on its device, the outputs merged once on the merge
device (masks and logits kept), and the call-time losses those calls added set to the whole
batch's. What the step does with the outputs (its loss, ``tape.gradient``, ``optimizer.apply``, its
metrics) sees what it sees on one device: the towers forward is differentiable, and the gradient
of the merged outputs' loss is the whole batch's.

How: while a step is traced, each of those models' class is a subclass of its own whose
``__call__`` splits (``split_class``), set for the trace and put back after it; calls made inside a
tower (a model calling its sub-models) are plain calls. Only the call's first argument is split
(the batch); a call with other tensor arguments is refused by name at trace time, and so is a step
that calls none of the models (nothing would run on the devices).

Not supported, by name (``harness.errors.NotSupported``): ``method="mirrored"`` and clusters (their
replicas each run a step of their own: the user's step would run once per replica, on its rows,
with its optimizer update per replica).
"""

from __future__ import annotations

import functools
from typing import Any

from harness.errors import NotSupported

__all__ = ["own_steps", "split_models", "split_class", "splitting", "refusal"]

def own_steps(model) -> list[str]:
    """The step methods (``Adapter.STEP_METHODS``) ``model``'s class defines instead of its Keras' own."""
    from harness.parallel.adapters import adapter_for

    return adapter_for(model).own_steps(model)


def refusal(model, own: list[str], method: str) -> NotSupported:
    """Why ``method`` does not run ``model``'s own steps: a refusal naming them and what does."""
    return NotSupported(
        "custom-train-step",
        f"model {model.name!r} ({type(model).__name__}) defines its own {', '.join(own)}; {method} runs a step on "
        "each replica (each would run your step on its rows and update the weights on its own), so it cannot run "
        "yours exactly. Use method='towers', which runs your step once with the model's calls split over the "
        "devices (docs/design.md, \"Custom steps\")"
    )


def split_models(adapter, template) -> list:
    """The models whose calls a custom step splits: ``template`` and every ``keras.Model`` inside it."""
    k = adapter.k
    return [template] + [layer for layer in adapter.sublayers(template) if isinstance(layer, k.Model)]


@functools.cache
def split_class(cls: type) -> type:
    """``cls`` with a ``__call__`` that, while a parallel model runs a step of ``cls``'s model, splits the call
    (one class per model class and process)."""

    def __call__(self, *args, **kwargs):
        runner = _RUNNERS.get(id(self))
        if runner is None or runner._in_tower:
            return cls.__call__(self, *args, **kwargs)
        return runner._split_call(self, args, kwargs)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "_harness_split_of": cls})


_RUNNERS: dict[int, Any] = {}  # id(model) -> the parallel model splitting its calls (while a step is traced)


class splitting:
    """While it is entered, calls of ``models`` are split by ``runner`` (a ``Towers``): their classes swapped
    for ``split_class``'s, put back on exit. ``runner.split_calls`` counts the calls it split."""

    def __init__(self, runner, models: list):
        self.runner, self.models = runner, models
        self.saved: list = []

    def __enter__(self):
        taken = [m for m in self.models if id(m) in _RUNNERS and _RUNNERS[id(m)] is not self.runner]
        if taken:
            raise NotSupported("custom-step-nested", f"model {taken[0].name!r} is already being split by another "
                               "parallel model's step: one parallel model at a time")
        for model in self.models:
            cls = type(model)
            if getattr(cls, "_harness_split_of", None) is None:
                object.__setattr__(model, "__class__", split_class(cls))
                self.saved.append((model, cls))
            _RUNNERS[id(model)] = self.runner
        self.runner.split_calls = 0
        return self

    def __exit__(self, *exc):
        for model in self.models:
            _RUNNERS.pop(id(model), None)
        for model, cls in self.saved:
            object.__setattr__(model, "__class__", cls)
        self.saved = []
        return False
