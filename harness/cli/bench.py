"""``harness bench-compare BASE HEAD``: the asv regression gate, judged on pairs of measurements.

Runs the asv suite on both commits in interleaved rounds (base, head, then head,
base, ...: the order alternates, so a runner drifting one way favours neither
side), then, in existing mode, times each ``time_`` benchmark again sample by
sample from two processes, one per commit, alternately (``harness.ci.interleave``:
a pair's two samples are tens of milliseconds apart, on the same step of a host
whose speed moves in steps lasting seconds). Per benchmark, head is worse when
the pairs' estimate is worse than ``--factor`` and its lower 99% bound is above
no change (samples/s counted higher-is-better). A benchmark whose bounds do
not yet tell worse from the same is measured again - pairs for ``time_``
benchmarks, whole rounds for the others (to ``--max-rounds``) - until they do
or the budget is spent. Each verdict is printed with its spread and the change it
catches 95% of the time (*detects*): what the gate resolved, not what it hoped
to. A benchmark still undecided when its budget is spent - one that could not
tell a --factor slow-down from none - is *inconclusive*, never a pass; so is one
that ran on base and is skipped on head. ``--history`` (main's nightly results)
adds each benchmark's night-to-night noise to the table; it does not widen the
threshold. A benchmark with one value per side (one round, asv ``--quick``) is
not judged.

Exit status: 0 clean; 1 a benchmark worse; 2 a usage error or bad input; 3 no
verdict, an infrastructure error: a benchmark errors on head, asv failed or
recorded no results, or nothing could be judged (never read as a slow-down or
as a pass); 3 too where a benchmark is inconclusive and --inconclusive is fail
(the default; warn: said in the summary, the status as if it were not there).
The JSON's "outcome" names which: clean, regression, inconclusive, no verdict.
Prints a Markdown summary for a pull-request comment, its first
line naming the verdict or why there is none (``--markdown FILE`` also writes
it; ``--json`` prints every round).

Two modes:
  virtualenv  asv builds each commit in its own environment (``asv run COMMIT^!``);
              verdicts come from rounds alone (no interleaved pairs).
  existing    inside a prebuilt image (asv cannot build there): each commit is
              checked out in a git worktree, installed into this Python
              (``--install-command``), and run with ``asv run --python=same
              --set-commit-hash``; the benchmarks are this checkout's, for both commits.
              For the interleaved pairs each commit is also installed into a folder
              of its own (pip --target, no dependencies, no build isolation), and
              its processes replaced every 10 pairs: the verdict is on process pairs.
              This Python must hold each commit's [build-system].requires (checked
              first: exit 2 naming what is missing, and the pip command that installs it).
``auto`` (default) picks existing inside a container, else virtualenv.

Examples:
    harness bench-compare main HEAD
    harness bench-compare origin/main HEAD --mode existing --bench throughput --markdown summary.md
    harness bench-compare HEAD HEAD --mode existing       # an A/A run: what does this runner resolve?
    harness bench-compare HEAD HEAD --mode existing --aa-series 20 --save-runs runs.jsonl   # false alarms, power
    harness bench-compare main HEAD --history asv-history --history-machine github-ubuntu-latest
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from harness.ci.benchgate import INCONCLUSIVE_POLICIES
from harness.cli.asvopts import add_asv_options, asv_project
from harness.errors import EXIT_NO_VERDICT, Failed, InvalidValue, Unavailable

__all__ = ["add_parser", "run"]

_MIN_HISTORY = 5  # commits of main's history a benchmark needs before its noise is taken from there


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench-compare",
                              help="asv regression gate: base vs head, exit 1 on a regression, 3 with no verdict",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="base commit (branch, tag or hash)")
    p.add_argument("head", help="head commit")
    p.add_argument("--factor", type=float, default=None,
                   help="smallest tolerated slow-down ratio, the floor under 1 + K x noise (default 1.03)")
    p.add_argument("--rounds", type=int, default=2,
                   help="asv runs of each commit before judging, order alternating (default 2: AB BA)")
    p.add_argument("--max-rounds", type=int, default=6,
                   help="rounds at most, for benchmarks not yet decided that are not timed in pairs (default 6)")
    p.add_argument("--no-rerun", action="store_true",
                   help="judge after --rounds: no more rounds and no more pairs for undecided benchmarks")
    p.add_argument("--no-interleave", action="store_true",
                   help="existing mode: judge time_ benchmarks on asv's rounds too, not on interleaved pairs")
    p.add_argument("--inconclusive", choices=INCONCLUSIVE_POLICIES, default="fail",
                   help="a benchmark that could not tell --factor from no change within its budget: fail (exit 3, "
                        "the default: never a silent pass) or warn (said in the summary only)")
    p.add_argument("--family-alpha", type=float, default=None, metavar="RATE",
                   help="false alarms allowed per run of the gate, over all the combinations it judges: each "
                        "judgment's bounds at min(1%%, RATE / combinations judged) (Bonferroni; default 0.05)")
    p.add_argument("--pair-budget", type=float, default=None, metavar="SECONDS",
                   help="seconds of interleaved sampling per time_ benchmark combination at most, new process "
                        "pairs' set-up counted (default: 60, or what 10 process pairs cost where that is more, "
                        "at the pace the first one measured)")
    p.add_argument("--aa-series", type=int, metavar="N", default=None,
                   help="BASE and HEAD one commit: measure it against itself N times as the gate does and report "
                        "false alarms and what planted 3%%, 5%% and 10%% slow-downs the gate catches, from the real "
                        "judgments and from resampled ones (harness.ci.aaseries); exit 1 when the false alarms' "
                        "upper 95%% bound exceeds 1%%")
    p.add_argument("--aa-pairs", type=int, default=None, metavar="N",
                   help="--aa-series: interleaved pairs recorded per run and time_ combination at 10 pairs a process "
                        "pair (default 400); scaled alike where the gate sizes a benchmark's process pairs larger")
    p.add_argument("--resampled", type=int, default=None, metavar="N",
                   help="--aa-series: resampled judgments per combination and planted change (default 10000)")
    p.add_argument("--save-runs", metavar="FILE", help="--aa-series: also write every run's measurements here (JSONL)")
    p.add_argument("--from-runs", metavar="FILE",
                   help="the A/A study of the runs --save-runs wrote, measuring nothing (BASE and HEAD are not read)")
    p.add_argument("--history", metavar="DIR", help="asv results of main's history (noise per benchmark from there)")
    p.add_argument("--history-machine", metavar="NAME", help="the machine of --history (default: --machine)")
    p.add_argument("--bench", action="append", metavar="REGEX", help="only benchmarks matching (repeatable)")
    add_asv_options(p)
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown summary here")
    p.add_argument("--json", action="store_true", help="print the rows and every round as JSON instead of Markdown")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci import asvresults, benchgate, gitrepo

    if args.factor is None:
        args.factor = benchgate.FACTOR
    if not args.factor > 1:
        raise InvalidValue(f"--factor must be > 1; got {args.factor:g}")
    if args.rounds < 2:
        raise InvalidValue(f"--rounds must be at least 2; got {args.rounds} (one run per commit is one value per "
                           "benchmark: no spread to judge a change against)")
    if args.max_rounds < args.rounds:
        raise InvalidValue(f"--max-rounds must be at least --rounds ({args.rounds}); got {args.max_rounds}")
    if args.family_alpha is None:
        args.family_alpha = benchgate.FAMILY_ALPHA
    if not 0 < args.family_alpha < 1:
        raise InvalidValue(f"--family-alpha must be in (0, 1); got {args.family_alpha:g}")
    if args.pair_budget is not None and not args.pair_budget > 0:
        raise InvalidValue(f"--pair-budget must be > 0 seconds; got {args.pair_budget:g}")
    if (args.save_runs or args.aa_pairs is not None) and args.aa_series is None:
        raise InvalidValue("--save-runs and --aa-pairs go with --aa-series N")
    if args.resampled is not None and args.aa_series is None and not args.from_runs:
        raise InvalidValue("--resampled goes with --aa-series N or --from-runs FILE")
    if args.from_runs:
        if args.aa_series is not None:
            raise InvalidValue("--from-runs studies recorded runs: --aa-series N measures new ones; give one of them")
        return _aa_series(args, None, "", "")
    project = asv_project(args, "bench-compare")
    config, machine = project.config, project.machine
    history = _history_noise(args.history, args.history_machine or machine) if args.history else {}
    base, head = gitrepo.rev_parse(project.root, args.base), gitrepo.rev_parse(project.root, args.head)
    project.check_build_requirements(base, head)  # existing mode: both before either is run (exit 2)
    project.register_machine()
    if args.aa_series is not None:
        return _aa_series(args, project, base, head)
    rounds = benchgate.Rounds()

    def measure(bench, only=None):
        number = len(next(iter(rounds.base.values()), [])) if only is None else \
            max(len(rounds.base.get(key, [])) for key in only)
        sides = [("base", base), ("head", head)]
        for side, commit in sides if number % 2 == 0 else sides[::-1]:  # AB, BA, AB, ...: drift favours no side
            started = time.time()
            project.run_commit(commit, bench)
            rounds.add(side, asvresults.read_commit(config, machine, commit, since=started), only)

    try:
        for number in range(args.rounds):
            print(f"harness bench-compare: round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
            measure(args.bench or [])
        # each judgment at its share of the family's false alarms: one per combination measured on both sides
        judged = sum(_both_measured(row) for row in benchgate.judge_all(rounds, args.factor, history))
        args.alpha = benchgate.judgment_alpha(judged, args.family_alpha)
        print(f"harness bench-compare: {judged} combination(s) to judge: each at alpha {args.alpha:.3g} "
              f"(--family-alpha {args.family_alpha:g} over them all)", file=sys.stderr, flush=True)
        rows = benchgate.judge_all(rounds, args.factor, history, _rounds_rule(args).alpha_at(args.rounds))
        rows, in_pairs = _interleave(args, project, base, head, rows, history)
        rows = benchgate.conclude(_more_rounds(args, rounds, rows, history, measure, in_pairs), args.factor)
    except InvalidValue as err:  # harness' diagnosis of the measurements (anything else is a bug: main says so)
        print(f"harness bench-compare: error: {err} (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    status = benchgate.exit_status(rows, args.inconclusive)
    text = benchgate.markdown(rows, base, head, args.factor, args.alpha)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"base": base, "head": head, "factor": args.factor, "mode": project.mode,
                   "rounds": args.rounds, "status": status, "outcome": benchgate.outcome(rows),
                   "family_alpha": args.family_alpha, "alpha": args.alpha, "judged": judged,
                   "inconclusive": args.inconclusive, "rows": [r.to_json() for r in rows],
                   "values": rounds.to_json()}, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return status


def _both_measured(row) -> bool:
    """A value on both sides (by the measurements, not the verdict: a failed or skipped side is never timed)."""
    return all(value is not None and not math.isnan(value) for value in (row.base, row.head))


def _timed(name: str) -> bool:
    """A ``time_`` benchmark: one that ``harness.ci.interleave`` can time sample by sample."""
    from harness.ci.interleave import timed

    return timed(name)


def _interleave(args, project, base: str, head: str, rows: list, history: dict) -> tuple[list, set]:
    """Existing mode: each judged ``time_`` row judged again on interleaved pairs (``interleave.compare``); the rows,
    and the keys of those judged on pairs (their verdict is the pairs', undecided or not: no rounds replace it)."""
    import tempfile

    from harness.ci import benchgate, interleave
    from harness.ci.benchgate import Verdict

    wanted = [row for row in rows if _timed(row.name) and _both_measured(row)]
    if project.mode != "existing" or args.no_interleave or not wanted:
        return rows, set()
    with tempfile.TemporaryDirectory(prefix="harness-commits-") as folder:
        try:
            targets = interleave.install_pair(project, base, head, Path(folder))
        except (Failed, Unavailable) as err:  # the rounds' rows stand, saying why
            print(f"harness bench-compare: warning: no interleaved pairs: {err}", file=sys.stderr)
            return [replace(row, note=f"not timed in pairs: {err}") if row in wanted else row for row in rows], set()
        judged, in_pairs = {}, set()
        for row in wanted:
            key = (row.name, row.params)
            print(f"harness bench-compare: timing {_label(key)} in interleaved pairs", file=sys.stderr, flush=True)
            try:
                again = interleave.compare(project, key, row.unit, targets, args.factor,
                                           budget_s=args.pair_budget,
                                           history_noise=history.get(key), no_rerun=args.no_rerun,
                                           progress=partial(_say, key), alpha=getattr(args, "alpha", benchgate.ALPHA))
            except Failed as err:  # the rounds' row stands, saying why it was not timed in pairs
                judged[key] = replace(row, note=f"not timed in pairs: {err}")
                continue
            if again.verdict is Verdict.SKIPPED:  # a side's setup skipped it: no pairs
                judged[key] = replace(row, note=f"not timed in pairs: {again.note}")
                continue
            judged[key] = again
            in_pairs.add(key)
    return [judged.get((row.name, row.params), row) for row in rows], in_pairs


def _more_rounds(args, rounds, rows: list, history: dict, measure, in_pairs: set) -> list:
    """Rows not decided after ``--rounds`` and not judged on interleaved pairs (``in_pairs``: an undecided one keeps
    its pairs' verdict, which :func:`benchgate.conclude` then calls inconclusive) get whole rounds until decided or
    ``--max-rounds``."""
    import re


    rule = _rounds_rule(args)
    while not args.no_rerun:
        undecided = [row for row in rows if not rule.done(row)
                     and len(rounds.base.get((row.name, row.params), [])) < args.max_rounds
                     and (row.name, row.params) not in in_pairs]
        if not undecided:
            return rows
        keys = {(row.name, row.params) for row in undecided}
        print(f"harness bench-compare: not decided yet, measuring once more: "
              f"{', '.join(sorted(_label(key) for key in keys))}", file=sys.stderr, flush=True)
        # asv matches a parametrized benchmark's regex against ``name(params)``: one regex per combination
        measure(sorted({"^" + re.escape(f"{name}({params})" if params else name) + "$" for name, params in keys}),
                keys)
        rows = [_again(row, rule.judge(rounds.base.get(key, []), rounds.head.get(key, []), history.get(key)))
                if key in keys else row for row, key in ((row, (row.name, row.params)) for row in rows)]
    return rows


def _rounds_rule(args):
    """The gate's stopping rule for asv rounds, as the arguments set it (one look with ``--no-rerun``)."""
    from harness.ci import benchgate, interleave

    return interleave.rounds_rule(args.factor, first=args.rounds, alpha=getattr(args, "alpha", benchgate.ALPHA),
                                  max_rounds=args.rounds if args.no_rerun else args.max_rounds)


def _again(before, after):
    """``after`` (a row judged on more rounds), keeping why ``before`` was not timed in pairs."""
    return after if after.note or not before.note.startswith("not timed in pairs") else replace(after, note=before.note)


def _say(key, said: str) -> None:
    """A line of progress on benchmark combination ``key``, to stderr."""
    print(f"harness bench-compare: {_label(key)}: {said}", file=sys.stderr, flush=True)


def _label(key) -> str:
    name, params = key
    return f"{name} ({params})" if params else name


def _aa_series(args, project, base: str, head: str) -> int:
    """``--aa-series N``: one commit measured against itself N times, or the runs of ``--from-runs``, studied by
    ``harness.ci.aaseries``."""
    from harness.ci import aaseries

    if args.aa_series is not None and args.aa_series < 2:
        raise InvalidValue(f"--aa-series needs at least 2 runs; got {args.aa_series}")
    args.aa_pairs = aaseries.PAIRS if args.aa_pairs is None else args.aa_pairs
    args.resampled = aaseries.RESAMPLED if args.resampled is None else args.resampled
    if args.aa_pairs < 20:
        raise InvalidValue(f"--aa-pairs must be at least 20 (the gate's first look); got {args.aa_pairs}")
    if args.resampled < 0:
        raise InvalidValue(f"--resampled must be >= 0; got {args.resampled}")
    if args.from_runs:
        runs = aaseries.load_runs(args.from_runs)
    else:
        if base != head:
            raise InvalidValue(f"--aa-series measures one commit against itself; got {args.base} ({base[:12]}) and "
                               f"{args.head} ({head[:12]})")
        if args.save_runs and Path(args.save_runs).exists():
            raise InvalidValue(f"--save-runs {args.save_runs} exists: name a new file (runs are appended)")
        try:
            runs = _aa_runs(args, project, base)
        except InvalidValue as err:
            print(f"harness bench-compare: error: {err} (no verdict)", file=sys.stderr)
            return EXIT_NO_VERDICT
    try:
        found = aaseries.study(runs, args.factor, args.rounds, args.max_rounds, resampled=args.resampled,
                               family_alpha=args.family_alpha)
    except InvalidValue as err:
        print(f"harness bench-compare: error: {err} (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    if not found.combos:
        print("harness bench-compare: error: no benchmark measured in the A/A series (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    text = found.text()
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"commit": base or None, "factor": args.factor, **found.to_json()}, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return 0 if found.passes else 1


def _aa_runs(args, project, commit: str) -> list[dict]:
    """N runs of ``commit``: an asv run (its rounds), then its ``time_`` combinations in ``aaseries.PAIRS``
    interleaved pairs (existing mode), each run saved as it ends."""
    import tempfile

    from harness.ci import aaseries, asvresults, interleave

    pairs = project.mode == "existing" and not args.no_interleave
    # every pair recorded: the rule's one look is at the last pair (the study judges by the gate's rule later)
    recording = replace(interleave.pairs_rule(args.factor), first=args.aa_pairs)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="harness-commits-") as folder:
        targets = None
        measured: dict = {}
        for number in range(args.aa_series):
            print(f"harness bench-compare: A/A run {number + 1} of {args.aa_series}", file=sys.stderr, flush=True)
            # asv runs once where every benchmark it measured is timed in pairs (the study's runs are the pairs'),
            # else every run (the rounds are the study's runs)
            ok = [key for key, m in measured.items() if m.ok]
            if not ok or not pairs or not all(_timed(name) for name, _ in ok):
                started = time.time()
                project.run_commit(commit, args.bench or [])
                measured = asvresults.read_commit(project.config, project.machine, commit, since=started)
            run: dict = {"run": number, "commit": commit, "pairs": {}, "rounds": {}}
            timed = [key for key, m in measured.items() if m.ok and pairs and _timed(key[0])]
            for key, m in measured.items():
                if m.ok and key not in timed:
                    run["rounds"][_label(key)] = {"unit": m.unit, "value": m.value}
            if timed and targets is None:
                targets = interleave.install_pair(project, commit, commit, Path(folder))
            for key in timed:
                _say(key, f"{args.aa_pairs} interleaved pairs (at 10 a process pair: scaled with their size)")
                sampled = interleave.measure(key, measured[key].unit, project.config, targets,  # type: ignore[arg-type]
                                             recording, max_pairs=args.aa_pairs, budget_s=float("inf"),
                                             progress=partial(_say, key))
                if not sampled.skipped:
                    run["pairs"][_label(key)] = {"unit": measured[key].unit, "number": sampled.number,
                                                 "per_process": sampled.per_process,
                                                 "base": [m.value for m in sampled.base],
                                                 "head": [m.value for m in sampled.head]}
            runs.append(run)
            if args.save_runs:
                aaseries.save_run(args.save_runs, run)
    return runs


def _history_noise(results: str, machine: str) -> dict:
    """Each benchmark combination's noise over main's history, where it has at least ``_MIN_HISTORY`` commits."""
    from harness.ci.benchgate import Noise
    from harness.ci.tracking.history import load_history

    history = load_history(results, machine=machine)
    noise = {}
    for key, series in history.series.items():
        values = [v for v in series.values if v is not None]
        spread = series.noise()
        if len(values) >= _MIN_HISTORY and spread is not None:
            noise[key] = Noise(spread, f"history (n={len(values)})")
    return noise
