"""Tracking: a benchmark's history of asv results, its change points, its regressions (standing or fixed).

The nightly's side of harness, beside the gate's (``harness.ci.benchgate`` and its
interleaved pairs): :mod:`~harness.ci.tracking.resultsdir` reads an asv results
folder, :mod:`~harness.ci.tracking.history` orders it into series,
:mod:`~harness.ci.tracking.changepoints` finds their steps,
:mod:`~harness.ci.tracking.regressions` names them (regressions standing or fixed,
improvements), :mod:`~harness.ci.tracking.page` draws them,
:mod:`~harness.ci.tracking.confirm` re-measures a candidate with the gate's pairs
and :mod:`~harness.ci.tracking.bisection` finds the commit of one.
"""
