"""What ``compare_training`` reports: per-variable distances (``WeightDiff``), the report and its verdict
(``EquivalenceReport``), and the measures both use.

The criteria the verdict applies (``exact``, ``as accurate as one device``) are described in
``harness.equivalence``; the float64 reference and the rounding floor they read are measured by
``harness.equivalence.reference``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.errors import InvalidValue

REFERENCES = ("float64",)  # the accepted values of ``reference`` besides None
VERDICTS = ("exact", "as accurate as one device", "FAIL")  # ``EquivalenceReport.verdict``
# ``compare_training(randomness=...)``: a model with random layers compared as it is and with them off in training
# (the latter decides), with them off only, or as it is only.
RANDOMNESS = ("both", "off", "as-is")
FLOAT64_TOL = 1e-9  # the parallel float64 run vs the single-device float64 run: rounding of float64 only
# The parallel float32 run's distance from the single-device run, at most this many times the rounding floor
# (the single-device run's largest distance from the same run in another summation order, FLOOR_ORDERS).
# docs/concepts/exactness.md has the measurements.
FLOOR_FACTOR = 8.0
# The loss floor's least value: one unit in the last place of a float32 loss (its machine epsilon, relative). The
# per-epoch loss is a float32 mean of per-batch means; a split sums each batch's loss from its devices' shares,
# which no single-device order reproduces: where every order gives the single-device run's losses bit for bit,
# the parallel run's may still differ in their last place.
LOSS_RESOLUTION = 2.0 ** -23


@dataclass(frozen=True)
class FloorOrder:
    """The single-device run's distance from one of the rounding floor's runs (``FLOOR_ORDERS``): ``weights``
    (weights and optimizer variables, as ``max_deviation``) and ``loss`` (per epoch, as ``max_loss_deviation``);
    both None where the model cannot run in that order (``why_not``)."""

    name: str
    weights: float | None
    loss: float | None
    why_not: str | None = None

    def describe(self) -> str:
        if self.weights is None or self.loss is None:
            return f"{self.name}: not measured ({self.why_not})"
        return f"{self.name} {self.weights:.3e} (loss {self.loss:.3e})"


@dataclass(frozen=True)
class WeightDiff:
    """How far one variable of the parallel run is from the single-device run."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    scale: float

    @property
    def deviation(self) -> float:
        """``max |Δw| / max(1, max |w|)``: absolute for small weights, relative for large."""
        return self.max_abs_diff / self.scale


@dataclass(frozen=True)
class EquivalenceReport:
    """The outcome of ``compare_training``."""

    method: str
    devices: tuple[str, ...]
    ratios: tuple[float, ...]
    batch_size: int
    steps: int
    diffs: tuple[WeightDiff, ...]
    loss_single: tuple[float, ...]
    loss_parallel: tuple[float, ...]
    metrics_single: dict = field(default_factory=dict)
    metrics_parallel: dict = field(default_factory=dict)
    # reference="float64": the distances of each float32 run from a float64 run on one device,
    # measured like ``WeightDiff.deviation`` (max |Δw| / max(1, max |w_float64|)) over every weight
    # and, where the float64 run's optimizer has the same variables, every optimizer variable.
    reference: str | None = None
    reference_single: float | None = None
    reference_parallel: float | None = None
    reference_diffs_single: tuple[WeightDiff, ...] = ()  # per variable, single-device run vs float64
    reference_diffs_parallel: tuple[WeightDiff, ...] = ()  # per variable (same order), parallel run vs float64
    loss_reference: tuple[float, ...] = ()  # the float64 run's loss per epoch
    reference_exact: float | None = None  # the parallel float64 run's distance from the single-device float64 run
    # The rounding floor, in the compared runs' own precision: the largest of the single-device run's distances
    # from the single-device runs in the other summation orders (``floor_orders``, FLOOR_ORDERS); weights and
    # optimizer variables as ``max_deviation``, the per-epoch loss as ``max_loss_deviation``. Never the distance
    # from float64 (``reference_single``, reported beside it). None where not measured (no reference, or the
    # float32 runs were exact).
    floor: float | None = None
    floor_loss: float | None = None
    floor_orders: tuple[FloorOrder, ...] = ()
    # The model's layers that draw random numbers in training (``harness.randomness.random_layers``: class names, in
    # model order), () where none does. Where there are, this report is of the runs with them off in training
    # (as at inference, ``harness.randomness.randomness_off``) unless ``compare_training(randomness="as-is")``, and
    # ``with_randomness`` is the comparison of the model as it is (float32 only; each device draws its own numbers).
    random_layers: tuple[str, ...] = ()
    randomness_off: bool = False  # whether this report's runs had them off in training
    with_randomness: EquivalenceReport | None = None

    @property
    def max_deviation(self) -> float:
        """The worst ``WeightDiff.deviation`` (weights and optimizer state); NaN if any is NaN."""
        return _max_deviation(self.diffs)

    @property
    def max_loss_deviation(self) -> float:
        return _max_rel(self.loss_single, self.loss_parallel)

    def worst(self, limit: int = 10) -> list[WeightDiff]:
        return sorted(self.diffs, key=lambda d: -np.nan_to_num(d.deviation, nan=np.inf))[:limit]

    def is_equivalent(self, tol: float) -> bool:
        deviations = [self.max_deviation, self.max_loss_deviation]
        return all(not math.isnan(v) and v <= tol for v in deviations)

    def as_accurate(self, factor: float = 2.0, slack: float = 1e-7) -> bool:
        """Whether the parallel run is as accurate as one device, judged against the float64 run.

        True when ``reference_parallel <= factor * reference_single + slack``; a NaN
        distance fails. Only weights and optimizer variables count (see
        ``compare_training``), not the per-epoch loss.

        Raises:
            ValueError: the report has no reference (``compare_training(..., reference="float64")``
                makes one), or ``factor``/``slack`` is negative or not finite.
        """
        _check_number("factor", factor, positive=True)
        _check_number("slack", slack)
        if self.reference is None or self.reference_single is None or self.reference_parallel is None:
            raise InvalidValue("as_accurate() needs a float64 reference: this report has none; run "
                             "compare_training(..., reference='float64')")
        single, parallel = self.reference_single, self.reference_parallel
        if math.isnan(single) or math.isnan(parallel):
            return False
        return parallel <= factor * single + slack

    def within_floor(self, factor: float = FLOOR_FACTOR) -> bool:
        """Whether the parallel run is no farther from the single-device run than ``factor`` times the rounding
        floor: weights and optimizer variables against ``floor``, the per-epoch loss against ``floor_loss``.

        Raises:
            ValueError: no floor was measured (``compare_training(..., reference="float64")`` measures it where
                the float32 runs are not exact), or ``factor`` negative or not finite.
        """
        _check_number("factor", factor, positive=True)
        if self.floor is None or self.floor_loss is None:
            raise InvalidValue("within_floor() needs the rounding floor: this report has none; run "
                             "compare_training(..., reference='float64')")
        pairs = ((self.max_deviation, self.floor), (self.max_loss_deviation, self.floor_loss))
        return all(not math.isnan(run) and not math.isnan(floor) and run <= factor * floor for run, floor in pairs)

    def why_not(self) -> str:
        """Why a report that is not exact is not as accurate as one device either, in words (its FAIL reason);
        ``"as accurate as one device"`` where it is."""
        return self._rounding_failure() or "as accurate as one device"

    def _rounding_failure(self) -> str | None:
        """The reason the difference from one device is not float32 rounding, or None where it is: the one rule
        ``verdict`` applies and ``why_not`` words."""
        if self.reference is None:
            return "no float64 reference to tell rounding from drift"
        if self.reference_exact is None:
            return "the parallel float64 run was not trained"
        if not self.reference_exact <= FLOAT64_TOL:
            return (f"not exact in float64 either (parallel vs one device, both float64: {self.reference_exact:.3e} "
                    f"> {FLOAT64_TOL:g}): a bug in the mathematics, not rounding")
        if self.floor is None or self.floor_loss is None:
            return "no rounding floor was measured"
        if self.within_floor():
            return None
        return (f"{self.floor_multiple():.3g} x this model's rounding floor on one device (weights {self.floor:.3e}, "
                f"loss {self.floor_loss:.3e}), more than {FLOOR_FACTOR:g} x, though exact in float64: a defect of "
                f"low-precision arithmetic, or rounding this model amplifies beyond what one device shows")

    def floor_multiple(self) -> float:
        """The parallel run's distance from the single-device run in multiples of the rounding floor (the worse of
        weights and loss); inf where the floor is 0 and the distance is not, NaN without a floor."""
        if self.floor is None or self.floor_loss is None:
            return math.nan
        return _worst(_multiple(self.max_deviation, self.floor), _multiple(self.max_loss_deviation, self.floor_loss))

    def verdict(self, tol: float = 1e-6) -> str:
        """``"exact"``, ``"as accurate as one device"`` or ``"FAIL"``.

        ``"exact"``: ``is_equivalent(tol)``. Otherwise, with a float64 reference, two
        measurements must both pass: the parallel model trained in float64 equals the single
        device in float64 (``reference_exact <= FLOAT64_TOL``; there rounding is a billion
        times smaller, so what remains is a bug in the mathematics), and the parallel float32
        run is within ``FLOOR_FACTOR`` times this model's rounding floor of the single-device
        run (``within_floor``; a defect of float32 or float16 arithmetic alone, which float64
        cannot see, lands far beyond it). Then ``"as accurate as one device"``. Reports without
        a reference are exact or FAIL.

        Raises:
            ValueError: ``tol`` negative or not finite.
        """
        _check_number("tol", tol)
        if self.is_equivalent(tol):
            return "exact"
        return "FAIL" if self._rounding_failure() else "as accurate as one device"

    def worst_against_reference(self, limit: int = 10) -> list[tuple[WeightDiff, WeightDiff]]:
        """``(single vs float64, parallel vs float64)`` of the variables the parallel run has farthest from it."""
        pairs = list(zip(self.reference_diffs_single, self.reference_diffs_parallel))
        return sorted(pairs, key=lambda p: -np.nan_to_num(p[1].deviation, nan=np.inf))[:limit]

    def table(self, limit: int = 10) -> str:
        """A fixed-width table of the worst-differing variables, for failure messages.

        With a reference, a second table shows the variables the parallel run has
        farthest from the float64 run, each with the single-device run's distance.
        """
        rows = [f"{'variable':<48} {'shape':<16} {'max |dw|':>11} {'deviation':>11}"]
        for d in self.worst(limit):
            rows.append(f"{d.name[:48]:<48} {str(d.shape)[:16]:<16} {d.max_abs_diff:>11.3e} {d.deviation:>11.3e}")
        rows.append(
            f"loss per epoch: single {list(_round(self.loss_single))} vs parallel {list(_round(self.loss_parallel))}"
        )
        if self.reference is not None:
            rows.append(f"distance from the {self.reference} run on one device: {self._reference_figures()}")
            rows.append(f"{'variable (farthest from ' + self.reference + ')':<48} {'shape':<16} "
                        f"{'single':>11} {'parallel':>11}")
            for single, parallel in self.worst_against_reference(limit):
                rows.append(f"{parallel.name[:48]:<48} {str(parallel.shape)[:16]:<16} "
                            f"{single.deviation:>11.3e} {parallel.deviation:>11.3e}")
            rows.append(f"{self.reference} loss per epoch: {list(_round(self.loss_reference))}")
        return "\n".join(rows)

    def summary(self) -> str:
        text = (
            f"{self.method} on {len(self.devices)} devices, ratios {list(self.ratios)}, batch {self.batch_size}, "
            f"{self.steps} steps: max weight deviation {self.max_deviation:.3e}, "
            f"max loss deviation {self.max_loss_deviation:.3e}"
        )
        if self.reference is not None:
            text += f"; distance from {self.reference}: {self._reference_figures()}"
        if self.random_layers:
            text += f"; {self.randomness_note()}"
        return text

    def randomness_note(self, tol: float = 1e-6) -> str:
        """What this report says of the model's random layers, in words; ``""`` where it has none.

        E.g. ``"with randomness off; Dropout, RandomFlip draw per device: equal in distribution, not in value (with
        them on: FAIL, max deviation 2.9e-02)"``.
        """
        if not self.random_layers:
            return ""
        names = ", ".join(self.random_layers)
        if not self.randomness_off:
            return f"with randomness on: {names} draw per device: equal in distribution, not in value"
        text = f"with randomness off; {names} draw per device: equal in distribution, not in value"
        other = self.with_randomness
        if other is not None:
            text += f" (with them on: {other.verdict(tol)}, max deviation {other.max_deviation:.2e})"
        return text

    def _reference_figures(self) -> str:
        single, parallel = _or_nan(self.reference_single), _or_nan(self.reference_parallel)
        text = f"single {single:.3e}, parallel {parallel:.3e}"
        if self.reference_exact is not None:
            text += f"; parallel in {self.reference} vs one device in {self.reference}: {self.reference_exact:.3e}"
        if self.floor is not None and self.floor_loss is not None:
            within = self.within_floor()
            orders = "; ".join(order.describe() for order in self.floor_orders)
            text += (f"; rounding floor {self.floor:.3e}, loss {self.floor_loss:.3e} (one device vs one device in "
                     f"another summation order: {orders}): parallel at {self.floor_multiple():.3g} x it "
                     f"({'<=' if within else '>'} {FLOOR_FACTOR:g} x)")
        return text


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _worst(*values: float) -> float:
    """The largest of ``values``; NaN where any is (``max`` would drop a NaN that is not first)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _multiple(run: float, floor: float) -> float:
    if math.isnan(run) or math.isnan(floor):
        return math.nan
    if floor == 0:
        return 0.0 if run == 0 else math.inf
    return run / floor


def _check_number(name: str, value, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        wanted = "a positive" if positive else "a non-negative"
        raise InvalidValue(f"{name} must be {wanted} finite number; got {name}={value!r}")


def _max_deviation(diffs: Sequence[WeightDiff]) -> float:
    values = [d.deviation for d in diffs]
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


def _round(values):
    return (float(f"{v:.6g}") for v in values)


def _max_rel(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return math.inf
    diffs = [abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b)]
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


def relative_deviation(reference: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """``(max |a - b|, max(1, max |a|))`` of two arrays."""
    reference = np.asarray(reference, dtype=np.float64)
    other = np.asarray(other, dtype=np.float64)
    diff = float(np.max(np.abs(reference - other))) if reference.size else 0.0
    scale = max(1.0, float(np.max(np.abs(reference)))) if reference.size else 1.0
    return diff, scale


def _diff_variables(reference, other, prefix: str) -> list[WeightDiff]:
    if len(reference) != len(other):
        raise AssertionError(
            f"{prefix or 'model '}variables differ in number: single {len(reference)} vs parallel {len(other)}"
        )
    diffs = []
    for ref, var in zip(reference, other):
        a, b = np.asarray(ref), np.asarray(var)
        if a.shape != b.shape:
            raise AssertionError(f"{prefix}{_variable_name(ref)}: shape {a.shape} (single) vs {b.shape} (parallel)")
        diff, scale = relative_deviation(a, b)
        diffs.append(WeightDiff(prefix + _variable_name(ref), tuple(a.shape), diff, scale))
    return diffs


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or variable.name  # Keras 3 variables have a path, tf.Variables a name
