"""Every regression in a history, standing or fixed, and every improvement: the change points, named.

:func:`find_changes` runs the change-point detector over each series of a
:class:`~harness.ci.tracking.history.History` and turns each step into a
:class:`Change`: a *regression* where the later level is worse (slower; fewer
samples/s), else an *improvement*. A regression is *fixed* once a later level
is back within the factor of the level before it (the step that brought it back
is its ``fixed_by``, and is listed among the improvements as the fix); else it
*stands*. A step is placed as a range of commits that holds it with 95% odds
(``last_good``..``first_bad``; 1 commit where the history pins it down) and the
commit most likely to have made it (``likely``).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, replace
from enum import Enum

from harness.ci.benchgate import FACTOR
from harness.ci.tracking.changepoints import Drift, Fit
from harness.ci.tracking.history import History, Series, parse_since
from harness.errors import InvalidValue

__all__ = ["Kind", "Status", "Change", "SeriesDrift", "Changes", "find_changes", "newer_than"]


class Kind(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"


class Status(str, Enum):
    STANDING = "standing"  # a regression whose level still holds (or is not yet back within the factor)
    FIXED = "fixed"  # a later level is back within the factor of the level before it


@dataclass(frozen=True)
class Change:
    """One step of one benchmark combination.

    ``last_good``..``first_bad``: the last commit at the old level and the commit by which the new one holds
    (for an improvement too: the names are a regression's), with 95% odds; ``commits``: the commits along the
    order between them (1: ``first_bad`` alone did it); ``likely``: the commit most likely to be the first of
    the new level. ``before``/``after``: the two levels, in the benchmark's unit; ``ratio``: how much worse
    (regression) or better (improvement), > 1 either way, with 99% bounds ``low``/``high``; ``noise``: the
    series' night-to-night spread. ``status`` and ``fixed_by`` (the likely commit of the step that brought the
    level back) are a regression's; ``fixes``: for an improvement that is such a step, the regression's
    ``first_bad``.
    """

    kind: Kind
    name: str
    params: str
    unit: str
    higher_is_better: bool
    last_good: str
    first_bad: str
    likely: str
    commits: int
    before: float
    after: float
    ratio: float
    low: float
    high: float
    noise: float | None
    status: Status | None = None
    fixed_by: str | None = None
    fixes: str | None = None
    first_bad_date: int | None = None
    latest: float | None = None

    @property
    def is_regression(self) -> bool:
        return self.kind is Kind.REGRESSION

    @property
    def standing(self) -> bool:
        return self.status is Status.STANDING

    @property
    def worse_by(self) -> float:
        """The relative size of a regression (0.15: 15% worse); negative for an improvement."""
        return self.ratio - 1 if self.is_regression else 1 / self.ratio - 1

    @property
    def change(self) -> float:
        """The signed relative change in the benchmark's own unit: +0.15 slower, -0.15 fewer samples/s."""
        return self.after / self.before - 1 if self.before else float("inf")

    @property
    def label(self) -> str:
        return f"{self.name}({self.params})" if self.params else self.name

    def to_json(self) -> dict:
        date = None if self.first_bad_date is None else datetime.datetime.fromtimestamp(
            self.first_bad_date / 1000, datetime.timezone.utc).isoformat()
        return {"kind": self.kind.value, "name": self.name, "params": self.params, "unit": self.unit,
                "higher_is_better": self.higher_is_better, "last_good": self.last_good,
                "first_bad": self.first_bad, "likely": self.likely, "commits": self.commits, "before": self.before,
                "after": self.after, "ratio": self.ratio, "low": self.low, "high": self.high,
                "worse_by": self.worse_by, "change": self.change, "noise": self.noise,
                "status": None if self.status is None else self.status.value, "fixed_by": self.fixed_by,
                "fixes": self.fixes, "first_bad_date": date, "latest": self.latest}


@dataclass(frozen=True)
class SeriesDrift:
    """A slow trend of one benchmark combination, reported apart from its steps (``drift.total``: over the
    ``commits`` measured, > 0 worse)."""

    name: str
    params: str
    drift: Drift
    commits: int

    @property
    def label(self) -> str:
        return f"{self.name}({self.params})" if self.params else self.name

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params, "per_commit": self.drift.per_value,
                "total": self.drift.total, "z": self.drift.z, "commits": self.commits}


@dataclass(frozen=True)
class Changes:
    """What :func:`find_changes` found over a history: ``regressions`` (standing and fixed) and
    ``improvements``, oldest first; ``drifts``; ``fits``: each series' fit, by ``(name, params)``."""

    regressions: tuple[Change, ...]
    improvements: tuple[Change, ...]
    drifts: tuple[SeriesDrift, ...]
    fits: dict

    @property
    def standing(self) -> tuple[Change, ...]:
        return tuple(r for r in self.regressions if r.standing)


def find_changes(history: History, factor: float = FACTOR, bench: str | None = None) -> Changes:
    """The regressions (standing or fixed) and improvements of every series, oldest first.

    Args:
        history: from :func:`~harness.ci.tracking.history.load_history`.
        factor: the smallest step reported, as a ratio (1.03: 3%; the gate's ``--factor``).
        bench: a regular expression; only benchmarks whose name (or ``name(params)``) it matches.

    Raises:
        ValueError: ``factor`` is not above 1; ``bench`` is no regular expression.
    """
    if not factor > 1:
        raise InvalidValue(f"factor must be a ratio above 1 (1.03: 3%); got factor={factor!r}")
    try:
        pattern = None if bench is None else re.compile(bench)
    except re.error as err:
        raise InvalidValue(f"bench must be a regular expression; got bench={bench!r} ({err})") from None
    regressions: list[Change] = []
    improvements: list[Change] = []
    drifts, fits = [], {}
    for key, series in history.series.items():
        label = f"{series.name}({series.params})" if series.params else series.name
        if pattern is not None and not pattern.search(label):
            continue
        fit = series.fit(factor)
        fits[key] = fit
        found = _named(history, series, fit, factor)
        regressions += [c for c in found if c.is_regression]
        improvements += [c for c in found if not c.is_regression]
        if fit.drift is not None:
            drifts.append(SeriesDrift(series.name, series.params, fit.drift, len(series.usable())))

    def order(change: Change) -> tuple:
        return history.position(change.first_bad), change.name, change.params

    return Changes(tuple(sorted(regressions, key=order)), tuple(sorted(improvements, key=order)), tuple(drifts),
                   fits)


def _named(history: History, series: Series, fit: Fit, factor: float) -> list[Change]:
    """The steps of one series as changes, each regression's status from the levels after it."""
    kept = series.usable()
    commit = [series.commits[i] for i in kept]
    latest = series.values[kept[-1]] if kept else None
    changes = []
    for step in fit.steps:
        last_good, first_bad = commit[step.first - 1], commit[step.last]
        worse = step.up
        ratio, low, high = (step.ratio, step.low, step.high) if worse else (1 / step.ratio, 1 / step.high,
                                                                             1 / step.low)
        changes.append(Change(
            Kind.REGRESSION if worse else Kind.IMPROVEMENT, series.name, series.params, series.unit,
            series.higher_is_better, last_good, first_bad, commit[step.index],
            history.position(first_bad) - history.position(last_good), _natural(series, step.before),
            _natural(series, step.after), ratio, low, high, fit.noise, first_bad_date=history.dates.get(first_bad),
            latest=latest))
    return _statuses(changes, fit, factor)


def _statuses(changes: list[Change], fit: Fit, factor: float) -> list[Change]:
    """Each regression fixed by the first later step whose level is back within ``factor`` of the level before
    it, else standing; that step, an improvement, names the regression it fixes."""
    levels = [level for _, _, level in fit.levels]  # oriented: larger is worse; level j + 1 follows step j
    out = list(changes)
    for j, change in enumerate(changes):
        if not change.is_regression:
            continue
        back = next((k for k in range(j + 1, len(changes)) if levels[k + 1] < levels[j] * factor), None)
        if back is None:
            out[j] = replace(out[j], status=Status.STANDING)
            continue
        out[j] = replace(out[j], status=Status.FIXED, fixed_by=changes[back].likely)
        if not changes[back].is_regression and out[back].fixes is None:
            out[back] = replace(out[back], fixes=change.first_bad)
    return out


def _natural(series: Series, oriented: float) -> float:
    """A level of :meth:`Series.oriented` in the benchmark's own unit."""
    return 1 / oriented if series.higher_is_better and oriented else oriented


def newer_than(history: History, changes: list[Change] | tuple[Change, ...], since: str) -> list[Change]:
    """The changes whose first bad commit comes after ``since`` (an ISO date or a commit:
    :func:`~harness.ci.tracking.history.parse_since`).

    Raises:
        ValueError: ``since`` is neither a date nor a commit there.
    """
    after = parse_since(history, since)
    return [c for c in changes if after(c.first_bad)]
