"""Benchmark history: asv results of many commits in commit order, their noise, and the regressions in them.

:func:`load_history` reads a results folder (``.asv/results``, or a checkout of
the ``asv-results`` branch the nightly ``publish.yml`` keeps; see
:mod:`harness.ci.resultsdir`) into one :class:`Series` per benchmark and
parameter combination, ordered along ``git rev-list --first-parent`` of a
repository that has the commits, else by the commit dates asv records.

:func:`find_regressions` finds change points with asv's own detector,
``asv.step_detect``: ``detect_steps`` fits a piecewise-constant function (an
L1 Potts fit, the number of steps chosen by an information criterion) and
``detect_regressions`` keeps the upward steps that explain why the latest value
is worse than the best one. We use it rather than our own statistics or another
library because asv is already our dependency and the report then agrees with
the "regressions" page ``asv publish`` deploys from the same history (same
default threshold, 0.05). One difference, on purpose: asv counts a larger value
as worse for every benchmark; here higher-is-better series (samples/s,
efficiency, final accuracy: ``benchgate.higher_is_better``) are inverted before
detection, so a drop in samples/s is the regression and a rise is not.

A regression is reported while it stands: a step that a later commit undid is
not one (asv's rule). :meth:`Series.noise` is the spread around that fit, so a
real step does not count as noise.
"""

from __future__ import annotations

import datetime
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.ci import gitrepo, resultsdir
from harness.ci.asvresults import Key
from harness.ci.benchgate import higher_is_better
from harness.ci.noise import relative_noise
from harness.errors import InvalidValue

__all__ = ["Series", "History", "Regression", "CommitsNotInRepo", "load_history", "find_regressions",
           "newer_than", "relative_noise", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.05  # asv's default ``regressions_thresholds``: the pages publish.yml deploys use it
# A zero or negative value of a higher-is-better series (no samples/s, no accuracy left) counts as this many
# times worse than the worst positive value: a collapse is then a step the detector sees, not a gap.
_ZERO_PENALTY = 10.0


@dataclass(frozen=True)
class Series:
    """One benchmark combination over the commits that have a result for it, oldest first.

    ``values``: None where the benchmark failed, NaN where it was skipped; ``weights``: asv's
    (2 / CI width), None where asv has none (track benchmarks).
    """

    name: str
    params: str
    unit: str
    higher_is_better: bool
    commits: tuple[str, ...]
    values: tuple[float | None, ...]
    weights: tuple[float | None, ...] = ()

    def oriented(self) -> list[float | None]:
        """The values turned so that larger is worse, as asv's detector assumes for every benchmark.

        Higher-is-better values are inverted (samples/s -> seconds per sample): a relative drop stays a
        relative rise, so asv's relative threshold keeps its meaning. Failed and skipped values stay as they are.
        """
        if not self.higher_is_better:
            return list(self.values)
        positive = [v for v in self.values if resultsdir.is_usable(v) and v > 0]  # type: ignore[operator]
        floor = max((1 / v for v in positive), default=1.0) * _ZERO_PENALTY  # type: ignore[operator]
        return [v if not resultsdir.is_usable(v) else (1 / v if v > 0 else floor)  # type: ignore[operator]
                for v in self.values]

    def steps(self) -> list[tuple[int, int, float, float, float]]:
        """asv's piecewise-constant fit of :meth:`oriented`: ``(left, right, value, min, err)`` per segment.

        ``left``/``right`` index :attr:`commits` (right exclusive); failed and skipped points are in no segment.
        """
        from asv.step_detect import detect_steps

        values = self.oriented()
        if not any(resultsdir.is_usable(v) for v in values):
            return []
        return detect_steps(values, list(self.weights) if self.weights else None)

    def noise(self, steps: list | None = None) -> float | None:
        """The relative spread around asv's fit (0.03: about 3% commit to commit); a real step is no noise.

        Each value is divided by the median of its segment (``steps``, default :meth:`steps`); the noise is
        :func:`relative_noise` of those ratios: None with fewer than 2 usable values.
        """
        steps = self.steps() if steps is None else steps
        ratios: list[float] = []
        for left, right, *_ in steps:
            kept = [float(v) for v in self.values[left:right] if v is not None and resultsdir.is_usable(v)]
            center = statistics.median(kept) if kept else 0
            if center:
                ratios += [v / center for v in kept]
        return relative_noise(ratios)


class CommitsNotInRepo(InvalidValue):
    """None of the results' commits is on the branch's first-parent line in the repository given."""


@dataclass(frozen=True)
class History:
    """asv results of one machine, ordered: :attr:`series` maps ``(benchmark, params)`` to its :class:`Series`.

    ``commits``: the commits with results, oldest first; ``line``: every commit of the ordering (with a
    repository, its whole first-parent line; else ``commits``); ``dates``: asv's commit date per commit
    (milliseconds since the epoch); ``dropped``: result commits not on the line; ``order``: how it was ordered.
    """

    results_dir: str
    machine: str
    order: str
    commits: tuple[str, ...]
    series: Mapping[Key, Series]
    dates: Mapping[str, int] = field(default_factory=dict)
    line: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    repo: str | None = None

    def position(self, commit: str) -> int:
        """The index of ``commit`` (a full hash) along :attr:`line`; -1 where it is not on it."""
        line = self.line or self.commits
        return line.index(commit) if commit in line else -1

    def find_commit(self, prefix: str) -> str | None:
        """The full hash of the one tested commit starting with ``prefix``, else None."""
        found = [c for c in self.commits if c.startswith(prefix.lower())] if prefix else []
        return found[0] if len(found) == 1 else None


def load_history(results_dir: Path | str, machine: str | None = None, repo: Path | str | None = None,
                 branch: str | None = None) -> History:
    """Reads the asv results of one machine into ordered series, one per benchmark and parameter combination.

    Args:
        results_dir: an ``.asv/results`` folder or a checkout of the ``asv-results`` branch.
        machine: the machine folder; may be left out when there is only one.
        repo: a git repository holding the commits: order along the first-parent line of ``branch``
            (result commits off that line are dropped, as on asv's pages). None: by asv's commit dates.
        branch: a branch (or any ref) of ``repo``; default ``main`` where it exists, else ``HEAD``.

    Raises:
        ValueError: no such folder, no ``benchmarks.json``, no such machine, several machines and none
            chosen, no results, or ``branch`` is not a ref of ``repo``.
        CommitsNotInRepo: none of the result commits is on that line.

    Example:
        >>> history = load_history(".asv/results", repo=".")  # doctest: +SKIP
        >>> history.series["throughput.Fit.time_step", "'mnist', 2"].noise()  # doctest: +SKIP
        0.021
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise InvalidValue(f"no asv results folder at {str(root)!r} (an .asv/results folder or a checkout of the "
                           "asv-results branch)")
    machine = resultsdir.pick_machine(root, machine)
    points, dates = resultsdir.read_points(root, machine, resultsdir.load_benchmarks(root))
    if not dates:
        raise InvalidValue(f"no asv results for machine {machine!r} in {str(root)!r}")
    dropped: tuple[str, ...] = ()
    if repo is None:
        commits = tuple(sorted(dates, key=lambda c: (dates[c], c)))
        line, order = commits, "commit dates recorded by asv"
    else:
        branch = branch or gitrepo.default_branch(repo)
        line = tuple(gitrepo.first_parent(repo, branch))
        commits = tuple(c for c in line if c in dates)
        if not commits:
            raise CommitsNotInRepo(f"none of the {len(dates)} result commits of machine {machine!r} is on the "
                                   f"first-parent line of {branch!r} in {str(repo)!r}")
        order = f"git rev-list --first-parent {branch} in {repo}"
        dropped = tuple(sorted(set(dates) - set(commits)))
    series = {}
    for key, (unit, by_commit) in sorted(points.items()):
        tested = [c for c in commits if c in by_commit]
        if tested:
            values, weights = zip(*(resultsdir.combine(by_commit[c]) for c in tested))
            series[key] = Series(key[0], key[1], unit, higher_is_better(key[0], unit), tuple(tested), values,
                                 weights)
    return History(str(root), machine, order, commits, series, {c: dates[c] for c in commits}, line, dropped,
                   None if repo is None else str(repo))


@dataclass(frozen=True)
class Regression:
    """A step that made a benchmark combination worse and still stands.

    ``last_good``..``first_bad``: full hashes of the last commit measured before the step and the first one
    after it (``commits`` along the order: 1 means ``first_bad`` alone did it). ``before``: the level before
    the step; ``after``: the best level after it (asv's "value after"); ``ratio``: how much worse (> 1,
    whatever the direction); ``noise``: the series' spread around the fit (:meth:`Series.noise`).
    """

    name: str
    params: str
    unit: str
    higher_is_better: bool
    last_good: str
    first_bad: str
    commits: int
    before: float
    after: float
    ratio: float
    noise: float | None
    first_bad_date: int | None = None
    latest: float | None = None

    @property
    def worse_by(self) -> float:
        """The relative size of the step: 0.15 is 15% worse."""
        return self.ratio - 1

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
        return {"name": self.name, "params": self.params, "unit": self.unit,
                "higher_is_better": self.higher_is_better, "last_good": self.last_good,
                "first_bad": self.first_bad, "commits": self.commits, "before": self.before, "after": self.after,
                "ratio": self.ratio, "worse_by": self.worse_by, "change": self.change, "noise": self.noise,
                "first_bad_date": date, "latest": self.latest}


def find_regressions(history: History, threshold: float = DEFAULT_THRESHOLD,
                     bench: str | None = None) -> list[Regression]:
    """The standing regressions of every series, oldest first, found by ``asv.step_detect``.

    Args:
        history: from :func:`load_history`.
        threshold: asv's relative threshold: smaller steps are left out unless they are needed to explain
            the difference between the best and the latest value.
        bench: a regular expression; only benchmarks whose name (or ``name(params)``) it matches.

    Raises:
        ValueError: ``threshold`` is negative or not a number; ``bench`` is no regular expression.
    """
    from asv.step_detect import detect_regressions

    if not threshold >= 0:
        raise InvalidValue(f"threshold must be a fraction >= 0 (0.05: 5%); got threshold={threshold!r}")
    try:
        pattern = None if bench is None else re.compile(bench)
    except re.error as err:
        raise InvalidValue(f"bench must be a regular expression; got bench={bench!r} ({err})") from None
    found = []
    for series in history.series.values():
        label = f"{series.name}({series.params})" if series.params else series.name
        if pattern is not None and not pattern.search(label):
            continue
        steps = series.steps()
        _, _, jumps = detect_regressions(steps, threshold)
        if not jumps:
            continue
        noise = series.noise(steps)
        latest = next((v for v in reversed(series.values) if resultsdir.is_usable(v)), None)
        for good_index, bad_index, before, after in jumps:
            good, bad = series.commits[good_index], series.commits[bad_index]
            found.append(Regression(
                series.name, series.params, series.unit, series.higher_is_better, good, bad,
                history.position(bad) - history.position(good), _natural(series, before), _natural(series, after),
                after / before if before else float("inf"), noise, history.dates.get(bad), latest))
    return sorted(found, key=lambda r: (history.position(r.first_bad), r.name, r.params))


def _natural(series: Series, oriented: float) -> float:
    """A level of :meth:`Series.oriented` in the benchmark's own unit."""
    return 1 / oriented if series.higher_is_better and oriented else oriented


def newer_than(history: History, regressions: list[Regression], since: str) -> list[Regression]:
    """The regressions whose first bad commit comes after ``since``.

    Args:
        since: an ISO date (``2025-01-31``, ``2025-01-31T12:00:00+00:00``; UTC where no zone): compared with
            the first bad commit's date; or a commit (hash or prefix; with :attr:`History.repo`, any ref):
            compared by position along the order (by ancestry where the commit is off the line).

    Raises:
        ValueError: ``since`` is neither a date nor a commit there.
    """
    cutoff = _parse_date(since)
    if cutoff is not None:
        return [r for r in regressions if r.first_bad_date is not None and r.first_bad_date > cutoff]
    commit = (gitrepo.find_commit(history.repo, since) if history.repo else None) or history.find_commit(since)
    if commit is None:
        where = f"in {history.repo!r}" if history.repo else f"among the {len(history.commits)} tested commits"
        raise InvalidValue(f"--since {since!r} is neither an ISO date (2025-01-31) nor a commit {where}")
    position = history.position(commit)
    if position < 0:  # off the line: by ancestry
        return [r for r in regressions if not gitrepo.is_ancestor(history.repo or ".", r.first_bad, commit)]
    return [r for r in regressions if history.position(r.first_bad) > position]


def _parse_date(text: str) -> int | None:
    """``text`` as an ISO date or date-time, in milliseconds since the epoch; None where it is not one."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ][0-9:.]+)?(Z|[+-]\d{2}:?\d{2})?", text.strip()):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidValue(f"--since {text!r} looks like a date but is not one ({err})") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)

