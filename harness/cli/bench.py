"""``harness bench-compare BASE HEAD``: the asv regression gate, calibrated to each benchmark's noise.

Runs the asv suite on both commits in interleaved rounds (base, head, base,
head, ...: drift on a shared runner hits both sides alike) and judges head
against base (``harness.ci.benchgate``). Per benchmark, head is worse when its
median is worse by more than the larger of ``--factor`` and ``1 + k x noise``
and the samples differ statistically (samples/s counted higher-is-better). The
noise is the benchmark's spread over main's history (``--history``, the
nightly's results) where that has enough commits, else the spread between the
rounds of each commit (an A/A pair per side). A result worse by less than twice
its threshold is measured once more (one more round of both) before it fails.
Each verdict is printed with its noise and the smallest change it could detect.
A benchmark with one value per side (one round, asv ``--quick``) is not judged.

Exit status: 0 clean; 1 a benchmark worse; 2 a usage error or bad input; 3 no
verdict, an infrastructure error: a benchmark errors on head, asv failed or
recorded no results, or nothing could be judged (never read as a slow-down or
as a pass). Prints a Markdown summary for a pull-request comment, its first
line naming the verdict or why there is none (``--markdown FILE`` also writes
it; ``--json`` prints every round).

Two modes:
  virtualenv  asv builds each commit in its own environment (``asv run COMMIT^!``).
  existing    inside a prebuilt image (asv cannot build there): each commit is
              checked out in a git worktree, installed into this Python
              (``--install-command``), and run with ``asv run --python=same
              --set-commit-hash``; the benchmarks are this checkout's, for both commits.
              The default install command builds without isolation: this Python
              must hold each commit's [build-system].requires (checked first: exit 2
              naming what is missing, and the pip command that installs it).
``auto`` (default) picks existing inside a container, else virtualenv.

Examples:
    harness bench-compare main HEAD
    harness bench-compare origin/main HEAD --mode existing --bench throughput --markdown summary.md
    harness bench-compare HEAD HEAD --rounds 3            # an A/A run: how noisy is this runner?
    harness bench-compare HEAD HEAD --aa-series 12        # the gate's false-alarm rate here, and a planted 5%
    harness bench-compare main HEAD --history asv-history --history-machine github-ubuntu-latest
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness.cli.asvopts import add_asv_options, asv_project
from harness.errors import EXIT_NO_VERDICT, InvalidValue

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
    p.add_argument("--noise-k", type=float, default=None, metavar="K",
                   help="threshold = max(factor, 1 + K x noise) (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved runs of each commit (default 2: ABAB)")
    p.add_argument("--no-rerun", action="store_true", help="fail a borderline result without measuring it again")
    p.add_argument("--aa-series", type=int, metavar="N", default=None,
                   help="BASE and HEAD one commit: run the suite N times on it and judge every window of 2 x --rounds "
                        "runs as the gate would (false alarms: exit 1 above 1%%), and again with a planted 5%% "
                        "slow-down (harness.ci.aaseries)")
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
    k = benchgate.NOISE_K if args.noise_k is None else args.noise_k
    if not k >= 0:
        raise InvalidValue(f"--noise-k must be >= 0; got {k:g}")
    project = asv_project(args, "bench-compare")
    config, machine = project.config, project.machine
    noise = _history_noise(args.history, args.history_machine or machine) if args.history else {}
    base, head = gitrepo.rev_parse(project.root, args.base), gitrepo.rev_parse(project.root, args.head)
    project.check_build_requirements(base, head)  # existing mode: both before either is run (exit 2)
    project.register_machine()
    if args.aa_series is not None:
        return _aa_series(args, project, base, head, k)
    rounds = benchgate.Rounds()

    def measure(bench, only=None):
        for side, commit in (("base", base), ("head", head)):
            project.run_commit(commit, bench)
            rounds.add(side, asvresults.read_commit(config, machine, commit), only)

    try:
        for number in range(args.rounds):
            print(f"harness bench-compare: round {number + 1} of {args.rounds}", file=sys.stderr, flush=True)
            measure(args.bench or [])
        rows = benchgate.judge_all(rounds, args.factor, k, noise)
        borderline = [row for row in rows if benchgate.is_borderline(row)]
        if borderline and not args.no_rerun:
            names = sorted({row.name for row in borderline})
            print(f"harness bench-compare: borderline, measuring once more: {', '.join(names)}", file=sys.stderr)
            keys = {(row.name, row.params) for row in borderline}
            # asv matches a parametrized benchmark's regex against ``name(params)``: one regex per combination
            measure(sorted({"^" + re.escape(f"{row.name}({row.params})" if row.params else row.name) + "$"
                            for row in borderline}), keys)
            rows = [benchgate.after_rerun(row, rounds.base[(row.name, row.params)][-1],
                                          rounds.head[(row.name, row.params)][-1]) if row in borderline else row
                    for row in rows]
    except InvalidValue as err:  # harness' diagnosis of the measurements (anything else is a bug: main says so)
        print(f"harness bench-compare: error: {err} (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    status = benchgate.exit_status(rows)
    text = benchgate.markdown(rows, base, head, args.factor)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"base": base, "head": head, "factor": args.factor, "noise_k": k, "mode": project.mode,
                   "rounds": args.rounds, "status": status, "rows": [r.to_json() for r in rows],
                   "values": rounds.to_json()}, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return status


def _aa_series(args, project, base: str, head: str, k: float) -> int:
    """``--aa-series N``: N runs of one commit judged against themselves (``harness.ci.aaseries``)."""
    from harness.ci import aaseries, asvresults

    if base != head:
        raise InvalidValue(f"--aa-series measures one commit against itself; got {args.base} ({base[:12]}) and "
                           f"{args.head} ({head[:12]})")
    needed = 2 * args.rounds + 2
    if args.aa_series < needed:
        raise InvalidValue(f"--aa-series {args.aa_series}: a window of {args.rounds}+{args.rounds} rounds and the "
                           f"pair that confirms a borderline result need at least {needed} runs")
    runs: dict = {}
    try:
        for number in range(args.aa_series):
            print(f"harness bench-compare: A/A run {number + 1} of {args.aa_series}", file=sys.stderr, flush=True)
            project.run_commit(base, args.bench or [])
            for key, measurement in asvresults.read_commit(project.config, project.machine, base).items():
                runs.setdefault(key, []).append(measurement)
        found = aaseries.series(runs, args.rounds, args.factor, k)
    except InvalidValue as err:
        print(f"harness bench-compare: error: {err} (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    if not found.judged:
        print("harness bench-compare: error: no benchmark measured in the A/A series (no verdict)", file=sys.stderr)
        return EXIT_NO_VERDICT
    text = found.text()
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"commit": base, "factor": args.factor, "noise_k": k, **found.to_json()}, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return 1 if found.rate > aaseries.MAX_FALSE_ALARMS else 0


def _history_noise(results: str, machine: str) -> dict:
    """Each benchmark combination's noise over main's history, where it has at least ``_MIN_HISTORY`` commits."""
    from harness.ci.benchgate import Noise
    from harness.ci.history import load_history

    history = load_history(results, machine=machine)
    noise = {}
    for key, series in history.series.items():
        values = [v for v in series.values if v is not None]
        spread = series.noise()
        if len(values) >= _MIN_HISTORY and spread is not None:
            noise[key] = Noise(spread, f"history (n={len(values)})")
    return noise
