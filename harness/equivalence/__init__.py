"""Trains one model on one device and in parallel, from the same start, and compares.

Used by ``assert_equivalent`` (pytest), ``harness check`` (CLI) and the
benchmarks' fidelity tracks, so "equivalent" means the same thing everywhere.

Two criteria:

- **exact**: every weight, optimizer variable and epoch loss of the parallel run
  within ``tol`` (default 1e-6) of the single-device float32 run.
- **as accurate as one device** (``reference="float64"``): float32 rounding alone can
  put a correct parallel step 1e-5 from the single-device float32 step on a real CNN
  (BatchNormalization, depthwise convolutions), and training amplifies it. Two
  measurements tell that rounding from a bug: the model's **rounding floor**, the
  rounding this model shows on one device, and a parallel run in float64 beside a
  single-device one in float64, where rounding is a billion times smaller. The floor
  is measured in the compared runs' own precision: the largest distance of the
  single-device run from single-device runs that differ from it only in summation
  order (``FLOOR_ORDERS``: each batch's rows reversed, permuted, rotated, and its
  gradient summed from sub-batches of the split's sizes: the same batches, the same
  mathematics). The parallel run passes when the float64 pair agree (``FLOAT64_TOL``)
  and its own distance from the single-device run is at most ``FLOOR_FACTOR`` times
  the floor. The single-device run's distance from float64 is reported beside the
  floor, never part of it: on a chaotic model it is large, and a defect of float32
  alone would hide under it. A mixed-precision model's runs are all in its policy,
  the floor's too (there reordering rows may change nothing: float16 products add up
  exactly in a float32 accumulator; the sub-batches' order is the one that measures).

A model with training-time randomness (Dropout, the Random* layers: ``harness.randomness.random_layers``) draws
per device and cannot equal one device: it is judged with those layers as at inference in training, in every run
(``harness.randomness.randomness_off``), and its run as it is is reported beside
(``EquivalenceReport.with_randomness``).

One idea per module: ``report`` (``EquivalenceReport``, ``WeightDiff``, the verdict's constants and the
distance measures), ``runs`` (what the runs of one comparison share and keep), ``floor`` (the rounding
floor's summation orders), ``reference`` (the float64 reference and the rounding floor's runs),
``training`` (``compare_training``, ``assert_equivalent``).
"""

from __future__ import annotations

from harness.equivalence.floor import FLOOR_ORDERS as FLOOR_ORDERS
from harness.equivalence.report import (
    FLOAT64_TOL,
    FLOOR_FACTOR,
    RANDOMNESS,
    REFERENCES,
    VERDICTS,
    EquivalenceReport,
    WeightDiff,
    relative_deviation,
)
from harness.equivalence.report import FloorOrder as FloorOrder
from harness.equivalence.runs import _Traced as _Traced
from harness.equivalence.training import assert_equivalent, compare_training

__all__ = ["WeightDiff", "EquivalenceReport", "compare_training", "assert_equivalent", "relative_deviation",
           "REFERENCES", "VERDICTS", "RANDOMNESS", "FLOOR_FACTOR", "FLOAT64_TOL"]
