"""Why stock Keras under a MirroredStrategy drifts from one device: each known cause, confirmed by measurement.

The stock baseline (``harness.bench.stock``: Keras ``fit`` under a stock ``MirroredStrategy``, even
split) is measured against one device like any parallel model; where it drifts, ``explain`` reruns
the same comparison with each known cause taken away in turn and names the causes whose removal
took the drift to the tolerance or at least halved it, with the distance that remained:

1. per-replica gradient clipping: Keras 3's optimizers clip each replica's *partial* gradient
   before the cross-replica sum (``clipnorm``, ``clipvalue``, ``global_clipnorm``; tensorflow#33929;
   Keras 2's optimizers sum first). Rerun without the clipping options.
2. uneven replicas: a batch the replicas cannot split evenly (a partial last batch, a batch not a
   multiple of the replica count); Keras scales each replica's mean loss by 1/replicas whatever
   its rows. Rerun with whole batches that split evenly.

Two more are named from the setup, not measured: per-replica BatchNormalization statistics, and
sparse gradients whose rows Keras 3's optimizers read per row. A drift that remains after every
measured cause is reported as unexplained, never attributed by guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Cause", "StockDrift", "explain", "CLIP_OPTIONS"]

CLIP_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


@dataclass(frozen=True)
class Cause:
    """One reason the stock baseline drifts; ``remaining``: the drift measured once it (and the causes before
    it) was taken away, None where it is named from the setup and not measured."""

    what: str
    remaining: float | None = None

    def text(self) -> str:
        return self.what if self.remaining is None else f"{self.what}: {self.remaining:.1e} without it"


@dataclass(frozen=True)
class StockDrift:
    """The stock baseline's distance from one device and its causes (``explain``)."""

    deviation: float
    causes: tuple[Cause, ...] = ()
    unexplained: float | None = None  # the drift left after every measured cause was taken away, if beyond tol

    def text(self) -> str:
        """``drifts 3.1e-02 from one device: <cause>: 2.9e-08 without it; ...``."""
        parts = [c.text() for c in self.causes]
        if self.unexplained is not None:
            parts.append(f"{self.unexplained:.1e} unexplained")
        return f"drifts {self.deviation:.1e} from one device" + (": " + "; ".join(parts) if parts else "")

    def to_json(self) -> dict:
        return {"deviation": self.deviation, "causes": [{"what": c.what, "remaining": c.remaining}
                                                        for c in self.causes], "unexplained": self.unexplained}


def _clipping(optimizer) -> dict:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    config = inner.get_config()
    return {name: config[name] for name in CLIP_OPTIONS if config.get(name) is not None}


def _without_clipping(optimizer_factory: Callable[[], Any]) -> Callable[[], Any]:
    def make():
        optimizer = optimizer_factory()
        inner = getattr(optimizer, "inner_optimizer", None)
        target = inner if inner is not None else optimizer
        plain = type(target).from_config({**target.get_config(), **dict.fromkeys(CLIP_OPTIONS)})
        if inner is None:
            return plain
        return type(optimizer)(plain, **{k: v for k, v in optimizer.get_config().items() if k != "inner_optimizer"})
    return make


def _has_layer(model, word: str) -> list[str]:
    """The names of ``model``'s layers (nested ones too) of a class whose name, or a base's, contains ``word``."""
    from harness.parallel.adapters import adapter_for

    return [layer.name for layer in adapter_for(model).sublayers(model)
            if any(word in cls.__name__ for cls in type(layer).__mro__)]


def explain(measure: Callable[..., float], build: Callable[[], Any], optimizer, *, samples: int, batch_size: int,
            replicas: int, deviation: float, tol: float = 1e-6) -> StockDrift:
    """The causes of a stock baseline's ``deviation`` from one device.

    Args:
        measure: ``measure(optimizer=factory, samples=n, batch_size=b) -> deviation``: the same comparison
            rerun with the optimizer, the first ``n`` samples and batch ``b`` given.
        build: builds the model (read for its layers and Keras, not trained).
        optimizer: the comparison's optimizer (a name, an instance or a factory).
        samples, batch_size, replicas: the comparison's data size, global batch and replica count.
        deviation: the drift measured; tol: what counts as none.
    """
    from harness.compat import is_keras2_model, keras_module_of, new_optimizer

    model = build()
    k = keras_module_of(model)
    made = new_optimizer(optimizer, k)
    factory: Callable[[], Any] = lambda: new_optimizer(optimizer, k)  # noqa: E731
    causes: list[Cause] = []
    remaining = deviation

    def taken_away(what: str, drift: float) -> float:
        # A cause is one whose removal took the drift to tol, or at least halved it; else it is not named.
        if drift <= tol or drift < remaining / 2:
            causes.append(Cause(what, drift))
        return min(remaining, drift)

    clipped = _clipping(made)
    if clipped and not is_keras2_model(model):
        factory = _without_clipping(factory)
        settings = ", ".join(f"{name}={value:g}" for name, value in clipped.items())
        remaining = taken_away(f"per-replica gradient clipping ({settings}: Keras clips each replica's part of the "
                               "gradient before the sum)", measure(optimizer=factory, samples=samples,
                                                                   batch_size=batch_size))
    last = samples % batch_size
    if remaining > tol and (batch_size % replicas or last % replicas):
        even = batch_size - batch_size % replicas
        whole = samples - samples % even if even else 0
        if whole:
            remaining = taken_away(
                f"uneven replicas (batch {batch_size}" + (f", last batch {last}" if last else "")
                + f" over {replicas} replicas: Keras weighs each replica's mean loss 1/{replicas} whatever its rows)",
                measure(optimizer=factory, samples=whole, batch_size=even))
    if remaining > tol:
        norms = _has_layer(model, "BatchNormalization")
        if norms:
            causes.append(Cause(f"per-replica BatchNormalization statistics ({', '.join(norms[:3])})"))
        lookups = _has_layer(model, "Embedding")
        if lookups and not is_keras2_model(model) and type(made).__name__ != "SGD":
            causes.append(Cause(f"sparse gradients ({', '.join(lookups[:3])}) whose rows Keras 3's "
                                f"{type(made).__name__} reads per row, laid out per replica"))
    unexplained = remaining if remaining > tol and all(c.remaining is not None for c in causes) else None
    return StockDrift(deviation, tuple(causes), unexplained)


def fit_failure(error: BaseException, optimizer, k, *, samples: int, batch_size: int, replicas: int) -> str | None:
    """The known cause of a stock ``fit`` that raised ``error`` (optimizer, data size, global batch and replica
    count as in the comparison), or None."""
    from harness.compat import new_optimizer

    made = new_optimizer(optimizer, k)
    inner = getattr(made, "inner_optimizer", made)
    text = str(error)
    if "merge_call" in text:
        options = [name for name in ("gradient_accumulation_steps", "use_ema") if getattr(inner, name, None)]
        if options:
            return (f"{', '.join(options)}: Keras runs its update inside a cond that calls merge_call, which a "
                    "replica cannot (keras-team/keras#17429)")
    last = samples % batch_size
    if "must have the same size and shape" in text and (batch_size % replicas or last % replicas):
        return (f"uneven replicas (batch {batch_size}" + (f", last batch {last}" if last else "")
                + f" over {replicas} replicas): Keras sums per-replica values of different shapes")
    return None
