"""A regression the history shows, confirmed (or not) by measuring its two commits again, side by side.

:func:`~harness.ci.tracking.regressions.find_changes` finds steps in nights measured apart: a candidate. A night
whose runner ran slow, or two levels the change-point detector split apart, look like a regression there too.
:func:`confirm` measures the candidate's ``last_good`` (base) against its ``first_bad`` (head) again with the gate's
own machinery and rule (``harness.ci.interleave``, ``harness.ci.benchgate``), and maps the gate's verdict:

==================================================  ===================
the gate's row                                      :class:`Verdict`
==================================================  ===================
worse (beyond the factor, lower 99% bound above 1)  ``confirmed``
same or better, its bounds excluding the factor     ``not confirmed``
same, bounds still straddling it when the budget    ``inconclusive``
ends; a single value or one process pair a side
head or base failed, skipped; asv, the install or   ``no verdict``
a benchmark process failed
==================================================  ===================

How it is measured (:func:`method`):

- a ``time_`` benchmark in existing mode: interleaved pairs (``interleave.compare``), each commit installed into a
  folder of its own, sampled until decided or ``budget_s`` is spent;
- anything else (virtualenv mode, ``track_`` benchmarks such as samples/s, which improve upwards): whole asv runs
  of each commit, base and head alternating round by round, AB, BA, ... (``interleave.compare_rounds``), from 2
  rounds a side until decided, ``max_rounds`` or ``budget_s``.

The ratio is the pairs' (or rounds') estimate of how much worse ``first_bad`` is, > 1 worse whatever the benchmark's
direction, with its one-sided 99% bounds (``benchgate.Paired``): the same figures as the gate's row. A re-measurement
is on this host, now, with this checkout's benchmarks: it confirms the code's step, not the nightly runner's
figures. asv results the re-measurement saves (rounds, the benchmark list) are put back as they were when it ends
(:func:`kept_results`): the history it confirms is not rewritten.

``harness regressions --confirm`` (harness/cli/regressions.py) counts a new standing regression for its exit status
1 only when confirmed; a not confirmed one counts for nothing; where none is confirmed and one was inconclusive or had
no verdict, it exits 3 (no verdict), so that a candidate nobody resolved is never read as a pass.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from harness.ci import benchgate, interleave
from harness.ci.asvrun import AsvProject
from harness.ci.benchgate import FACTOR, Row
from harness.ci.tracking.regressions import Change
from harness.errors import Failed, InvalidValue

__all__ = ["Verdict", "Confirmation", "confirm", "from_row", "method", "verdict_of", "kept_results",
           "PAIRS", "ROUNDS"]

PAIRS = "interleaved pairs"
ROUNDS = "asv rounds"


class Verdict(str, Enum):
    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not confirmed"
    INCONCLUSIVE = "inconclusive"
    NO_VERDICT = "no verdict"  # nothing measured: asv, an install or the benchmark failed


@dataclass(frozen=True)
class Confirmation:
    """What measuring a candidate's two commits again said.

    ``ratio``: how much worse ``first_bad`` measured than ``last_good`` (> 1 worse), ``low``/``high`` its one-sided
    99% bounds (None where the measurement gives none); ``pairs``: the values judged a side (interleaved pairs, or
    asv rounds: ``method``); ``detects``: the change it would catch 95% of the time (``benchgate.Row.detects``);
    ``seconds``: the wall time it took, installs included.
    """

    verdict: Verdict
    method: str
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    pairs: int = 0
    detects: float | None = None
    note: str = ""
    seconds: float = 0.0

    @property
    def measured(self) -> bool:
        """A verdict came of it (confirmed, not confirmed or inconclusive), not a failure to measure."""
        return self.verdict is not Verdict.NO_VERDICT

    def label(self) -> str:
        """One table cell: ``confirmed 1.298x (1.281-1.316), 40 interleaved pairs``."""
        if self.verdict is Verdict.NO_VERDICT:
            return f"no verdict: {self.note}" if self.note else "no verdict"
        text = self.verdict.value
        if self.ratio is not None:
            text += f" {self.ratio:.3f}x"
            if self.low is not None and self.high is not None:
                text += f" ({self.low:.3f}-{self.high:.3f})"
        return f"{text}, {self.pairs} {self.method}"

    def to_json(self) -> dict:
        return {"verdict": self.verdict.value, "method": self.method, "ratio": self.ratio, "low": self.low,
                "high": self.high, "pairs": self.pairs, "detects": self.detects, "note": self.note,
                "seconds": round(self.seconds, 1)}


def method(project: AsvProject, change: Change) -> str:
    """How ``change`` is measured again: ``PAIRS`` (a ``time_`` benchmark in existing mode) or ``ROUNDS``."""
    return PAIRS if interleave.pairable(project, change.name) and not change.higher_is_better else ROUNDS


def verdict_of(row: Row, factor: float = FACTOR) -> Verdict:
    """The gate's row for base ``last_good`` against head ``first_bad``, as a confirmation (module docstring)."""
    if row.verdict is benchgate.Verdict.WORSE:
        return Verdict.CONFIRMED
    if row.verdict in (benchgate.Verdict.SAME, benchgate.Verdict.BETTER):
        return Verdict.NOT_CONFIRMED if benchgate.decided(row, factor) else Verdict.INCONCLUSIVE
    if row.verdict is benchgate.Verdict.UNJUDGED:
        return Verdict.INCONCLUSIVE
    return Verdict.NO_VERDICT  # ERROR, FIXED, SKIPPED: a side has no value


def from_row(row: Row, factor: float, how: str, seconds: float = 0.0) -> Confirmation:
    """:func:`verdict_of` with the row's figures."""
    verdict = verdict_of(row, factor)
    low = high = None
    if row.pairs is not None:
        low, high = (math.exp(row.pairs.low) if math.isfinite(row.pairs.low) else None,
                     math.exp(row.pairs.high) if math.isfinite(row.pairs.high) else None)
    note = row.note
    if verdict is Verdict.NO_VERDICT:
        why = {benchgate.Verdict.ERROR: "the benchmark failed on first_bad",
               benchgate.Verdict.FIXED: "the benchmark failed on last_good",
               benchgate.Verdict.SKIPPED: "the benchmark was skipped"}.get(row.verdict, row.verdict.value)
        note = f"{why}; {note}" if note else why
    return Confirmation(verdict, how, row.ratio, low, high, min(row.rounds),  # pairs, or rounds, a side
                        None if row.detects is None or math.isinf(row.detects) else row.detects, note, seconds)


def confirm(project: AsvProject, change: Change, factor: float = FACTOR, budget_s: float = interleave.BUDGET_S,
            max_rounds: int = interleave.MAX_ROUNDS, progress: Callable[[str], None] | None = None,
            keep: bool = True) -> Confirmation:
    """``change``'s ``last_good`` (base) measured again against its ``first_bad`` (head), judged by the gate's rule
    on ``factor``: :attr:`Confirmation.verdict` as the module docstring maps it.

    Args:
        project: the asv project the commits belong to; ``project.machine`` names the asv machine, registered
            first (``project.register_machine()``).
        change: a regression from :func:`~harness.ci.tracking.regressions.find_changes`.
        budget_s: seconds of interleaved sampling, or of asv rounds after the first two a side.
        max_rounds: asv rounds a side at most (rounds only).
        progress: called with a line of news now and then (stderr in the CLI).
        keep: the asv results of the two commits put back as they were afterwards (:func:`kept_results`); False
            where the caller keeps them itself, around several confirmations (asv's benchmark list, discovered
            once, then serves them all).

    Returns:
        The confirmation; a failure to measure (asv, an install, the benchmark's processes) is
        ``Verdict.NO_VERDICT`` with its reason in ``note``, never raised.

    Raises:
        Unavailable: existing mode, and this Python lacks a commit's build requirements (a usage error: exit 2).
        ValueError: ``factor`` is not above 1; ``change`` is an improvement.
    """
    if not factor > 1:
        raise InvalidValue(f"factor must be > 1; got factor={factor!r}")
    if not change.is_regression:
        raise InvalidValue(f"confirm takes a regression; got an improvement of {change.label}")
    how, start = method(project, change), time.perf_counter()
    key = (change.name, change.params)
    try:
        with kept_results(project, (change.last_good, change.first_bad)) if keep else contextlib.nullcontext():
            if how == PAIRS:
                row = _pairs(project, change, factor, budget_s, progress)
            else:
                row = interleave.compare_rounds(project, key, change.last_good, change.first_bad, factor,
                                                budget_s=budget_s, max_rounds=max_rounds, progress=progress)
    except Failed as err:
        return Confirmation(Verdict.NO_VERDICT, how, note=str(err), seconds=time.perf_counter() - start)
    return from_row(row, factor, how, time.perf_counter() - start)


def _pairs(project: AsvProject, change: Change, factor: float, budget_s: float,
           progress: Callable[[str], None] | None) -> Row:
    key = (change.name, change.params)
    _discovered(project, key, change.first_bad)
    with tempfile.TemporaryDirectory(prefix="harness-confirm-") as folder:
        targets = interleave.install_pair(project, change.last_good, change.first_bad, Path(folder))
        # see=False: a candidate is settled once its bounds exclude the factor (the gate's passes also go on until
        # they could see 5%, for the pass's *detects*: no question a confirmation asks)
        return interleave.compare(project, key, change.unit, targets, factor, budget_s=budget_s, progress=progress,
                                  see=False)


def _discovered(project: AsvProject, key: tuple[str, str], commit: str) -> None:
    """asv's benchmark list (the project's ``benchmarks.json``) holds ``key``, discovered on ``commit`` where it
    does not yet (``asv run --bench just-discover``: nothing timed, no result saved).

    Raises:
        Failed: asv failed, or its list has no ``key`` (a benchmark renamed or removed since).
    """
    try:
        interleave.benchmark_id(project.config, key)
        return
    except Exception:  # asv's UserError (no benchmarks.json yet) or Failed (not in it): discover, then ask again
        pass
    project.run_commit(commit, bench=["just-discover"])
    try:
        interleave.benchmark_id(project.config, key)
    except Failed:
        raise
    except Exception as err:  # asv's UserError: its list unreadable after a discovery that did not fail
        raise Failed(f"asv's benchmark list: {err}") from None


@contextlib.contextmanager
def kept_results(project: AsvProject, commits: Sequence[str]) -> Iterator[None]:
    """Context: the asv results ``project`` keeps for ``commits`` on its machine (``<hash8>-*.json``), its
    ``machine.json`` and ``benchmarks.json`` put back as they were on exit, files that were not there removed.

    asv saves a run's results into the project's results folder, and ``harness regressions`` may be reading that
    very folder (the nightly's ``--results .asv/results --machine NAME``): a re-measurement on another host must not
    replace the nights it confirms.
    """
    folder = _results_dir(project)
    if folder is None:
        yield
        return
    machine = folder / project.machine

    def paths() -> set[Path]:
        found = {folder / "benchmarks.json", machine / "machine.json"}
        for commit in commits:
            found |= set(machine.glob(f"{commit[:8]}-*.json"))
        return {path for path in found if path.is_file()}

    with tempfile.TemporaryDirectory(prefix="harness-kept-") as saved:
        before = {}
        for number, path in enumerate(sorted(paths())):
            before[path] = Path(saved) / str(number)
            shutil.copy2(path, before[path])
        try:
            yield
        finally:
            for path in paths() - set(before):
                path.unlink(missing_ok=True)
            for path, copy in before.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(copy, path)


def _results_dir(project: AsvProject) -> Path | None:
    """The project's asv results folder (its config's ``results_dir``, relative to the config file), or None where
    the config cannot be read."""
    try:
        from asv.config import Config

        return (project.root / Config.load(str(project.config)).results_dir).resolve()
    except Exception:  # asv's UserError and friends: asv itself then says what is wrong when it runs
        return None
