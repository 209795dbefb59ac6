"""Benchmark history: asv results of many commits in commit order, one series per benchmark combination.

:func:`load_history` reads a results folder (``.asv/results``, or a checkout of
the ``asv-results`` branch the nightly ``publish.yml`` keeps; see
:mod:`harness.ci.tracking.resultsdir`) into one :class:`Series` per benchmark and
parameter combination, ordered along ``git rev-list --first-parent`` of a
repository that has the commits, else by the commit dates asv records.
:meth:`Series.fit` hands a series to the change-point detector
(:mod:`harness.ci.tracking.changepoints`) turned so that larger is worse, with
each night's own standard error from asv's confidence interval;
:mod:`harness.ci.tracking.regressions` names what it finds.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.ci import gitrepo
from harness.ci.asvresults import Key
from harness.ci.benchgate import FACTOR, higher_is_better
from harness.ci.tracking import resultsdir
from harness.ci.tracking.changepoints import Fit, find_steps
from harness.errors import InvalidValue

__all__ = ["Series", "History", "CommitsNotInRepo", "load_history", "parse_since"]

_Z_99 = 2.5758  # asv's confidence interval is 99%: its half width over this is a standard error
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
        """The values turned so that larger is worse, as the change-point detector reads every benchmark.

        Higher-is-better values are inverted (samples/s -> seconds per sample): a relative drop stays a
        relative rise, so the factor keeps its meaning. Failed and skipped values stay as they are.
        """
        if not self.higher_is_better:
            return list(self.values)
        positive = [v for v in self.values if resultsdir.is_usable(v) and v > 0]  # type: ignore[operator]
        floor = max((1 / v for v in positive), default=1.0) * _ZERO_PENALTY  # type: ignore[operator]
        return [v if not resultsdir.is_usable(v) else (1 / v if v > 0 else floor)  # type: ignore[operator]
                for v in self.values]

    def usable(self) -> list[int]:
        """The indexes of the measured values (neither failed nor skipped), oldest first."""
        return [i for i, v in enumerate(self.values) if resultsdir.is_usable(v)]

    def fit(self, factor: float = FACTOR) -> Fit:
        """The change points of :meth:`oriented`'s measured values (indexes count :meth:`usable`'s), each
        night's standard error taken from asv's weight (2 / the width of its 99% confidence interval)."""
        kept = self.usable()
        oriented = self.oriented()
        weights = [self.weights[i] if self.weights else None for i in kept]
        errors = [1 / (w * _Z_99) if w else None for w in weights]
        return find_steps([float(oriented[i]) for i in kept], errors, factor)  # type: ignore[arg-type]

    def noise(self) -> float | None:
        """The relative night-to-night spread (0.03: about 3% commit to commit), which a step barely moves: the
        detector's (:attr:`~harness.ci.tracking.changepoints.Fit.noise`); None with fewer than 3 values."""
        return self.fit().noise if len(self.usable()) >= 3 else None


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


def parse_since(history: History, since: str) -> Callable[[str], bool]:
    """Whether a commit of ``history`` comes after ``since``, as a predicate.

    Args:
        since: an ISO date (``2025-01-31``, ``2025-01-31T12:00:00+00:00``; UTC where no zone): compared with
            the commit's date as asv recorded it; or a commit (hash or prefix; with :attr:`History.repo`, any
            ref): compared by position along the order (by ancestry where the commit is off the line).

    Raises:
        ValueError: ``since`` is neither a date nor a commit there.
    """
    cutoff = _parse_date(since)
    if cutoff is not None:
        return lambda commit: history.dates.get(commit, -1) > cutoff
    found = (gitrepo.find_commit(history.repo, since) if history.repo else None) or history.find_commit(since)
    if found is None:
        where = f"in {history.repo!r}" if history.repo else f"among the {len(history.commits)} tested commits"
        raise InvalidValue(f"--since {since!r} is neither an ISO date (2025-01-31) nor a commit {where}")
    position = history.position(found)
    if position < 0:  # off the line: by ancestry
        return lambda commit: not gitrepo.is_ancestor(history.repo or ".", commit, found)
    return lambda commit: history.position(commit) > position


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

