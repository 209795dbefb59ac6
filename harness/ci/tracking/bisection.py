"""Bisection: the first commit between GOOD and BAD that moved one benchmark.

Worse means slower, or lower for higher-is-better benchmarks (``benchgate.higher_is_better``: samples/s, items/s,
efficiency, accuracy). Both modes assume one step (a monotonic change) in the range, as ``git bisect`` does.

Two modes, as the gate's (``harness.ci.asvrun``):

  existing    GOOD runs once as the reference (its value, and that it runs), then a binary search over the
              m = n - 1 commits after it for the first that moved, among m + 1 outcomes (commit 1..m, or none:
              BAD did not move): at most ceil(log2 n) + 1 probes for n commits, GOOD and BAD counted. Each probe
              is decided against GOOD as the gate decides head against base, GOOD the base and the probe the
              head (``harness.ci.interleave``): a ``time_`` benchmark in interleaved pairs (each commit
              installed into a folder of its own), any other in asv rounds of both commits, alternating (AB,
              BA, ...; each run installs the commit into this Python). A probe **moved** where the gate's rule
              says worse (the estimate beyond ``factor``, the gate's 1.03 by default, and its lower 99% bound
              above no change); it is the **same** where the bounds exclude the factor. Measuring goes on
              until one of the two is decided or ``budget_s`` is spent; a probe still undecided then is
              **undecided**, no verdict: the search stops there and says so (status 3), as it does where the
              benchmark fails on a probe. So a step of 5% is resolved where the gate resolves one (its busy
              loop: tests/ci/test_gate.py), not only steps beyond one run's drift.
  virtualenv  asv builds each commit in its own environment: this wraps ``asv find`` (its search, its bound:
              about log2 n + 2 runs), then reads the one value asv saved for every commit it ran and judges it
              against GOOD's by ``max(factor, 1 + NOISE_K * noise)`` (the noise from GOOD's recorded samples,
              ``harness.ci.noise``; else the factor alone). One run a commit, runs minutes apart: a step is
              resolved only where it exceeds that threshold *and* the host's drift between runs (asv runs of a
              5% longer loop seconds apart measured 1.02-1.09x, harness.ci.interleave): steps of a few percent
              are not resolved there, whatever ``factor`` says; the report notes it.

Each commit's asv figures are read back from asv's saved results for the machine; a benchmark first discovered on
GOOD (``asv run --bench just-discover``) names the benchmark and its parameter combination before anything is timed.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from harness.ci import asvresults, benchgate, interleave
from harness.ci.asvrun import AsvProject
from harness.ci.gitrepo import commits_between, rev_parse, subject
from harness.ci.noise import relative_noise
from harness.ci.tracking import confirm
from harness.errors import EXIT_NO_VERDICT, Failed, InvalidValue

__all__ = ["Verdict", "Target", "Probe", "Report", "resolve_target", "search", "run_bound", "bisect",
           "probe_verdict", "PAIRS", "ROUNDS", "ONE_RUN"]

PAIRS, ROUNDS = confirm.PAIRS, confirm.ROUNDS  # how a probe is decided in existing mode
ONE_RUN = "one asv run"  # virtualenv mode: asv find's runs, one a commit


class Verdict(str, Enum):
    GOOD = "good"  # the reference
    MOVED = "moved"
    SAME = "same"
    FAILED = "failed"  # the benchmark failed or was skipped on this commit
    UNDECIDED = "undecided"  # existing mode: neither moved nor the same when the probe's budget ended (no verdict)


@dataclass(frozen=True)
class Target:
    """One benchmark and parameter combination (``params`` as the gate prints it; ``""``: no parameters)."""

    name: str
    params: str
    unit: str
    combo: int  # its index among the benchmark's combinations
    asv_params: tuple = ()  # the benchmark's ``params`` as asv saved them

    @property
    def higher_is_better(self) -> bool:
        return benchgate.higher_is_better(self.name, self.unit)

    @property
    def regex(self) -> str:
        """asv's ``--bench`` regex for this combination alone (asv matches ``name(params)``)."""
        return "^" + re.escape(f"{self.name}({self.params})" if self.asv_params else self.name) + "$"

    @property
    def label(self) -> str:
        return self.name + (f"({self.params})" if self.params else "")

    @property
    def key(self) -> asvresults.Key:
        return self.name, self.params


@dataclass(frozen=True)
class Probe:
    """One commit measured: ``index`` counts commits from GOOD (0) to BAD (n - 1).

    ``ratio``: how much worse than GOOD, > 1 worse whatever the direction; in existing mode the gate's estimate
    from the pairs (or rounds) against GOOD, ``low``/``high`` its one-sided 99% bounds and ``pairs`` the pairs (or
    rounds) a side; ``note``: how it was measured, or why it failed.
    """

    index: int
    commit: str
    subject: str
    value: float | None
    ratio: float | None
    verdict: Verdict
    low: float | None = None
    high: float | None = None
    pairs: int = 0
    note: str = ""

    def to_json(self) -> dict:
        return {"index": self.index, "commit": self.commit, "subject": self.subject, "value": self.value,
                "ratio": self.ratio, "low": self.low, "high": self.high, "pairs": self.pairs,
                "verdict": self.verdict.value, "note": self.note}


@dataclass(frozen=True)
class Report:
    """A bisection's outcome; ``status`` is the command's exit status."""

    target: Target
    mode: str
    commits: tuple[str, ...]  # GOOD first, BAD last
    factor: float
    noise: float | None  # GOOD's, one run's threshold (ONE_RUN); None in pairs or rounds
    threshold: float  # one run's: max(factor, 1 + NOISE_K * noise); the factor, the gate's floor, in pairs or rounds
    probes: tuple[Probe, ...] = ()
    first_bad: int | None = None  # index into ``commits``
    bound: int | None = None  # None: asv find's own
    error: str | None = None
    notes: tuple[str, ...] = field(default=())
    method: str = ONE_RUN  # how the probes were decided: PAIRS, ROUNDS (existing mode) or ONE_RUN (virtualenv)

    @property
    def status(self) -> int:
        """0: the first bad commit was found; 1: BAD is not worse than GOOD beyond the threshold; 3: no verdict,
        a benchmark failed on a probe, or a probe stayed undecided (``harness.errors.EXIT_NO_VERDICT``)."""
        if self.error is not None:
            return EXIT_NO_VERDICT
        return 0 if self.first_bad is not None else 1

    @property
    def runs(self) -> int:
        return len(self.probes)

    def probe_at(self, index: int) -> Probe | None:
        return next((p for p in self.probes if p.index == index), None)

    def before_after(self) -> tuple[Probe, Probe] | None:
        """The first bad commit's probe and the nearest probe before it (its parent, as the search ends)."""
        if self.first_bad is None:
            return None
        after = self.probe_at(self.first_bad)
        earlier = [p for p in self.probes if p.index < self.first_bad and p.value is not None]
        if after is None or not earlier:
            return None
        return max(earlier, key=lambda p: p.index), after

    def to_json(self) -> dict:
        pair, found = self.before_after(), None if self.first_bad is None else self.probe_at(self.first_bad)
        first_bad = None
        if self.first_bad is not None:
            first_bad = {"index": self.first_bad, "commit": self.commits[self.first_bad],
                         "subject": found.subject if found else "",
                         "before": pair[0].value if pair else None, "before_commit": pair[0].commit if pair else None,
                         "after": pair[1].value if pair else None, "ratio": pair[1].ratio if pair else None}
        return {"benchmark": self.target.name, "params": self.target.params, "unit": self.target.unit,
                "higher_is_better": self.target.higher_is_better, "mode": self.mode, "good": self.commits[0],
                "bad": self.commits[-1], "commits": len(self.commits), "factor": self.factor, "noise": self.noise,
                "threshold": self.threshold, "probes": [p.to_json() for p in self.probes], "runs": self.runs,
                "bound": self.bound, "first_bad": first_bad, "status": self.status, "error": self.error,
                "notes": list(self.notes), "method": self.method}


def run_bound(n: int) -> int:
    """``ceil(log2 n) + 1``: the most benchmark runs the existing mode needs for ``n`` commits, both ends counted."""
    return (n - 1).bit_length() + 1


def search(count: int, is_moved: Callable[[int], bool]) -> int | None:
    """The first of commits ``1..count`` for which ``is_moved`` holds, or None when commit ``count`` did not move.

    A binary search over ``count + 1`` outcomes, assuming a monotonic change: at most
    ``ceil(log2(count + 1))`` calls, and commit ``count`` is only called when the answer hinges on it.

    Example:
        >>> search(9, lambda i: i >= 5)
        5
    """
    lo, hi = 1, count + 1
    while lo < hi:
        mid = (lo + hi) // 2  # always <= count
        if is_moved(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo if lo <= count else None


def resolve_target(benchmarks: Mapping[str, dict], name: str, params: str | None) -> Target:
    """The benchmark ``name`` (full, or a unique dotted suffix) and its combination ``params``.

    Raises:
        ValueError: no such benchmark, or several; ``params`` missing where it has several combinations,
            or not one of them.
    """
    names = [k for k in benchmarks if k == name] or [k for k in benchmarks if k.endswith("." + name)]
    if len(names) != 1:
        known = ", ".join(sorted(benchmarks)[:12]) + (", ..." if len(benchmarks) > 12 else "")
        what = "several benchmarks match" if names else "unknown benchmark"
        raise InvalidValue(f"{what} {name!r}; the suite has: {known or 'no benchmarks'}")
    bench = benchmarks[names[0]]
    choices = asvresults.combos(bench["params"])
    if params is None:
        if len(choices) > 1:
            raise InvalidValue(f"{names[0]} has {len(choices)} parameter combinations; pick one with --params, "
                               f"one of: {_quoted(choices)}")
        index = 0
    else:
        index = _match_params(params, choices, names[0])
    return Target(names[0], choices[index], bench.get("unit", ""), index, tuple(bench["params"] or ()))


def _match_params(params: str, choices: list[str], name: str) -> int:
    def plain(text: str) -> list[str]:
        return [part.strip().strip("'\"") for part in text.split(",")]

    for same in (lambda c: c == params, lambda c: plain(c) == plain(params)):
        found = [i for i, choice in enumerate(choices) if same(choice)]
        if found:
            return found[0]
    raise InvalidValue(f"--params {params!r} is not a combination of {name}; one of: {_quoted(choices)}")


def _quoted(choices: Sequence[str]) -> str:
    shown = ", ".join(f'"{c}"' for c in choices[:8])
    return shown + (f" (and {len(choices) - 8} more)" if len(choices) > 8 else "")


def bisect(project: AsvProject, benchmark: str, good: str, bad: str, params: str | None = None,
           factor: float = benchgate.FACTOR, progress: Callable[[Report, Probe], None] | None = None,
           budget_s: float = interleave.BUDGET_S, log: Callable[[str], None] | None = None) -> Report:
    """Finds the first commit after ``good`` up to ``bad`` that moved ``benchmark``.

    Args:
        project: the asv project, machine and mode (existing or virtualenv).
        benchmark: a benchmark name, full or a unique dotted suffix (``Work.time_work``).
        good, bad: commits; ``good`` must be an ancestor of ``bad`` (first parents are followed).
        params: the parameter combination, ``", ".join(str(p) for p in combo)``; needed where there are several.
        factor: existing mode: a probe moved where the gate's rule on ``factor`` says worse than GOOD (module
            docstring); virtualenv mode: where one run is worse than GOOD's by ``max(factor, 1 + NOISE_K * noise)``.
        progress: called with the report so far and each probe as it completes.
        budget_s: existing mode: seconds of interleaved sampling per probe (or of asv rounds after the first two a
            side) before an undecided probe is given up as no verdict.
        log: called with a line of news while a probe is measured (pairs taken, not decided yet).

    Returns:
        The report; ``status`` 0 found, 1 BAD not worse than GOOD, 3 a benchmark failed on a probe or a probe
        stayed undecided (no verdict).

    Raises:
        ValueError: bad input (commits, benchmark, parameters, factor).
        RuntimeError: asv or the install command failed.

    Example::

        project = AsvProject(Path("asv.conf.json").resolve(), "ci-runner", mode="existing")
        report = bisect(project, "throughput.Throughput.track_samples_per_second", "v1.0", "main",
                        params="'mnist_maxing', 'mirrored', 'tuned', 3")
        print(report.status, report.first_bad and report.commits[report.first_bad])
    """
    if not factor > 1:
        raise InvalidValue(f"factor must be > 1; got factor={factor!r}")
    if not budget_s > 0:
        raise InvalidValue(f"budget_s must be > 0 seconds; got budget_s={budget_s!r}")
    good, bad = rev_parse(project.root, good), rev_parse(project.root, bad)
    if good == bad:
        raise InvalidValue(f"GOOD and BAD are the same commit ({good[:12]}): nothing to search")
    commits = (good, *commits_between(project.root, good, bad))
    if rev_parse(project.root, f"{commits[1]}^") != good:  # GOOD merged in from a side branch
        raise InvalidValue(f"{good[:12]} is not on {bad[:12]}'s first-parent line; pass a GOOD on it "
                           f"(git log --first-parent {bad[:12]})")
    project.register_machine()
    project.run_commit(good, bench=["just-discover"])  # installs GOOD, saves asv's list of benchmarks; times nothing
    _, benchmarks = asvresults.load_config(project.config)
    target = resolve_target(benchmarks, benchmark, params)
    say = progress or (lambda report, probe: None)
    if project.mode == "virtualenv":
        return _bisect_with_asv_find(project, target, commits, factor, say)
    return _bisect_existing(project, target, commits, factor, say, budget_s, log)


class _ProbeFailed(Exception):
    pass


def probe_verdict(row: benchgate.Row, factor: float = benchgate.FACTOR) -> Verdict:
    """The gate's row for GOOD (base) against a probe (head) as the probe's verdict: worse -> moved, decided the
    same (or better) -> same, undecided (or one process pair) -> undecided, a side without a value -> failed.
    The mapping ``harness regressions --confirm`` makes (``confirm.verdict_of``), named for a bisection."""
    return {confirm.Verdict.CONFIRMED: Verdict.MOVED, confirm.Verdict.NOT_CONFIRMED: Verdict.SAME,
            confirm.Verdict.INCONCLUSIVE: Verdict.UNDECIDED,
            confirm.Verdict.NO_VERDICT: Verdict.FAILED}[confirm.verdict_of(row, factor)]


def _bisect_existing(project: AsvProject, target: Target, commits: tuple[str, ...], factor: float,
                     say: Callable[[Report, Probe], None], budget_s: float,
                     log: Callable[[str], None] | None) -> Report:
    bound = run_bound(len(commits))
    how = PAIRS if interleave.pairable(project, target.name) and not target.higher_is_better else ROUNDS
    started = time.time()
    project.run_commit(commits[0], bench=[target.regex])  # GOOD's value, and that it runs at all
    value, _ = _read(project, commits[0], target, started)
    report = replace(_reference(project, target, commits, factor, value, None, "existing", bound), method=how)
    say(report, report.probes[0])
    if report.error:
        return report
    with tempfile.TemporaryDirectory(prefix="harness-bisect-") as folder:
        installed: dict[str, Path] = {}

        def measure(index: int) -> benchgate.Row:
            if how == ROUNDS:
                return interleave.compare_rounds(project, target.key, commits[0], commits[index], factor,
                                                 budget_s=budget_s, progress=log)
            for commit in (commits[0], commits[index]):
                if commit not in installed:
                    project.install_into(commit, Path(folder) / commit[:12])
                    installed[commit] = Path(folder) / commit[:12]
            # see=False: a probe is the same once its bounds exclude the factor (a gate's pass also goes on until
            # it could see 5%, for its *detects*; a bisection does not report one)
            return interleave.compare(project, target.key, target.unit, (installed[commits[0]],
                                                                         installed[commits[index]]),
                                      factor, budget_s=budget_s, progress=log, see=False)

        def is_moved(index: int) -> bool:
            nonlocal report
            try:
                probe = _from_row(project, index, commits[index], measure(index), factor)
            except Failed as err:
                probe = Probe(index, commits[index], subject(project.root, commits[index]), None, None,
                              Verdict.FAILED, note=str(err))
            report = replace(report, probes=(*report.probes, probe))
            say(report, probe)
            where = f"{commits[index][:12]} ({probe.subject})"
            if probe.verdict is Verdict.FAILED:
                raise _ProbeFailed(f"{target.label} failed on {where}: stopped there; bisect a range that "
                                   f"excludes it" + (f" ({probe.note})" if probe.note else ""))
            if probe.verdict is Verdict.UNDECIDED:
                raise _ProbeFailed(f"{target.label} on {where} is undecided against GOOD after {probe.pairs} "
                                   f"{how} a side within the probe's budget of {budget_s:g} s: no verdict for this "
                                   f"probe, so the search stops there; give a larger budget (--probe-budget), or "
                                   f"bisect with a --factor further from the change")
            return probe.verdict is Verdict.MOVED

        try:
            first_bad = search(len(commits) - 1, is_moved)
        except _ProbeFailed as err:
            return replace(report, error=str(err))
    return replace(report, first_bad=first_bad)


def _from_row(project: AsvProject, index: int, commit: str, row: benchgate.Row, factor: float) -> Probe:
    """A probe from the gate's row for GOOD (base) against it (head)."""
    low = high = None
    if row.pairs is not None:
        low = math.exp(row.pairs.low) if math.isfinite(row.pairs.low) else None
        high = math.exp(row.pairs.high) if math.isfinite(row.pairs.high) else None
    value = row.head if row.head is not None and not math.isnan(row.head) else None
    return Probe(index, commit, subject(project.root, commit), value, row.ratio, probe_verdict(row, factor), low,
                 high, min(row.rounds), row.note)


def _bisect_with_asv_find(project: AsvProject, target: Target, commits: tuple[str, ...], factor: float,
                          say: Callable[[Report, Probe], None]) -> Report:
    # asv's range excludes its start: ``BAD --not GOOD^@`` keeps GOOD in it, so asv can name GOOD's child.
    argv = ["find", "--machine", project.machine, "--show-stderr", *(["--invert"] if target.higher_is_better else []),
            f"{commits[-1]} --not {commits[0]}^@", target.regex]
    started = time.time()
    code, lines = _asv_streamed(project, argv)
    if code != 0:
        raise Failed(f"asv find failed with exit status {code}")
    ran, answer = _parse_find(lines, commits)
    for index in (0, len(commits) - 1):  # asv finds without running anything in a range of two
        if commits[index] not in ran:
            project.run_commit(commits[index], bench=[target.regex])
            ran.append(commits[index])
    value, samples = _read(project, commits[0], target, started)
    report = _reference(project, target, commits, factor, value, samples, "virtualenv", None)
    report = replace(report, notes=(f"virtualenv mode: one asv run a commit, judged against GOOD's by "
                                    f"{report.threshold:.2f}x; runs minutes apart drift by a few percent, so a "
                                    f"smaller step is not resolved here (existing mode decides each probe in "
                                    f"interleaved pairs, or asv rounds, by the gate's rule)",))
    for commit in ran:
        if commit != commits[0]:
            probe = _judge(project, report, commits.index(commit), *_read(project, commit, target, started))
            report = replace(report, probes=(*report.probes, probe))
    for probe in report.probes:
        say(report, probe)
    if report.error:
        return report
    bad_probe = report.probe_at(len(commits) - 1)
    if answer is None:
        return replace(report, error="asv find named no commit (see its output above)")
    if bad_probe is not None and bad_probe.verdict is not Verdict.MOVED:
        change = "drop" if target.higher_is_better else "rise"
        note = f"asv find's greatest {change}, {commits[answer][:12]}, is within the threshold"
        return replace(report, notes=(*report.notes, note))
    return replace(report, first_bad=answer)


def _asv_streamed(project: AsvProject, argv: list[str]) -> tuple[int, list[str]]:
    """Runs ``asv ARGV``, echoing its output to stderr as it comes; returns its exit status and lines."""
    print("$ " + shlex.join(["asv", *argv]), file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "asv", "--config", str(project.config), *argv]
    lines = []
    with subprocess.Popen(cmd, cwd=project.root, stdout=subprocess.PIPE, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            lines.append(line.rstrip("\n"))
    return proc.returncode, lines


_FOR_COMMIT = re.compile(r"\bFor .* commit ([0-9a-f]{7,40})\b")
_FOUND = re.compile(r"Greatest (?:regression|improvement) found: ([0-9a-f]{7,40})\b")


def _parse_find(lines: list[str], commits: Sequence[str]) -> tuple[list[str], int | None]:
    """The commits ``asv find`` ran, in order, and the index of the one it named."""
    def full(short: str) -> str | None:
        return next((c for c in commits if c.startswith(short)), None)

    ran: list[str] = []
    answer = None
    for line in lines:
        if (match := _FOR_COMMIT.search(line)) and (commit := full(match.group(1))) and commit not in ran:
            ran.append(commit)
        if (match := _FOUND.search(line)) and (commit := full(match.group(1))):
            answer = commits.index(commit)
    return ran, answer


def _reference(project: AsvProject, target: Target, commits: tuple[str, ...], factor: float, value: float | None,
               samples: Sequence[float] | None, mode: str, bound: int | None) -> Report:
    """The report with GOOD's probe; the threshold from ``samples`` (GOOD's), the factor alone without them."""
    noise = relative_noise(samples) if samples and len(samples) > 1 else None
    threshold = benchgate.threshold(factor, noise)
    probe = Probe(0, commits[0], subject(project.root, commits[0]), value, 1.0 if _ok(value) else None,
                  Verdict.GOOD if _ok(value) else Verdict.FAILED)
    error = None if _ok(value) else f"{target.label} failed on GOOD {commits[0][:12]}: nothing to compare against"
    return Report(target, mode, commits, factor, noise, threshold, (probe,), bound=bound, error=error)


def _judge(project: AsvProject, report: Report, index: int, value: float | None, _samples) -> Probe:
    commit, good = report.commits[index], report.probes[0].value
    if value is None or not _ok(value) or good is None:
        return Probe(index, commit, subject(project.root, commit), value, None, Verdict.FAILED)
    ratio = benchgate.worse_ratio(good, value, report.target.higher_is_better)
    verdict = Verdict.MOVED if ratio > report.threshold else Verdict.SAME
    return Probe(index, commit, subject(project.root, commit), value, ratio, verdict)


def _ok(value: float | None) -> bool:
    return value is not None and not asvresults.is_skipped(value)


def _read(project: AsvProject, commit: str, target: Target,
          since: float | None = None) -> tuple[float | None, tuple[float, ...] | None]:
    """``target``'s value and samples on ``commit``, from the result asv saved last for it on the machine (since
    ``since``, ``time.time()`` before the run: none where asv did not run it then)."""
    try:
        found = asvresults.read_commit(project.config, project.machine, commit, since).get(target.key)
    except ValueError:  # no results at all for the commit
        return None, None
    return (None, None) if found is None else (found.value, found.samples)
