"""``harness bisect BENCHMARK GOOD BAD``: the first commit that moved one benchmark.

GOOD is run once as the reference. In existing mode each probed commit is then
decided against GOOD as the gate decides head against base (GOOD the base, the
probe the head): a ``time_`` benchmark in interleaved pairs, two processes, one
per commit, sampled in turn (``harness.ci.interleave``), any other benchmark in
asv rounds of both commits, alternating. A commit has *moved* where the gate's
rule says worse: the estimate beyond ``--factor`` (default 1.03, the gate's and
``harness regressions``'s) and its lower 99% bound above no change; it is the
*same* where the bounds exclude the factor. An undecided probe is measured on
until decided or ``--probe-budget`` is spent; one still undecided then has no
verdict: the search stops there and says so (exit 3). So a 5% step is resolved
where the gate resolves one. Worse is slower, or lower for higher-is-better
benchmarks (samples/s, items/s, efficiency, accuracy). Progress goes to stderr
as each probe completes; the report (every probe: commit, value, ratio against
GOOD with its bounds, verdict; then the first bad commit with its before/after
figures and the probe count against the bound) goes to stdout, or ``--json``.

Modes, as ``harness bench-compare``'s:
  existing    each probed commit is checked out in a git worktree and installed:
              for pairs into a folder of its own, for asv rounds into this
              Python (``--install-command``, run with ``asv run --python=same``);
              a binary search needs at most ceil(log2 n) + 1 probes for n
              commits, GOOD and BAD counted. This Python must hold each
              commit's [build-system].requires (the default install command
              builds without isolation; checked before each install: exit 2
              naming what is missing).
  virtualenv  asv builds each commit in its own environment: ``asv find`` does
              the search (with its own bound, about log2 n + 2 runs) and its
              answer is reported the same way, each commit's one run judged
              against GOOD's by ``max(--factor, 1 + 3 x noise)``, the noise
              from GOOD's recorded samples. Runs minutes apart drift by a few
              percent: a smaller step is not resolved there (the report notes it).
``auto`` (default) picks existing inside a container, else virtualenv.

Exit status: 0 the first bad commit was found; 1 BAD is not worse than GOOD
beyond the threshold (nothing to name); 2 bad input; 3 no verdict: the
benchmark failed on a probed commit, or a probe stayed undecided within its
budget (the search stops there and says which; bisect a range that excludes
it, or give a larger --probe-budget), or asv or the install command failed.

Examples:
    harness bisect throughput.Throughput.track_samples_per_second v1.0 main \\
        --params "'mnist_maxing', 'mirrored', 'tuned', 3" --mode existing
    harness bisect bench.Work.time_work HEAD~9 HEAD --json
    harness bisect bench.time_loop HEAD~5 HEAD --mode existing --probe-budget 120
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING

from harness.cli.asvopts import add_asv_options, asv_project
from harness.errors import InvalidValue

if TYPE_CHECKING:
    from harness.ci.tracking.bisection import Probe, Report

__all__ = ["add_parser", "run"]

_PROBE_BUDGET_S = 60.0  # harness.ci.interleave.BUDGET_S, the gate's --pair-budget (not imported: --help stays light)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bisect", help="find the first commit between GOOD and BAD that moved a benchmark",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("benchmark", help="asv benchmark name, full or a unique dotted suffix (Work.time_work)")
    p.add_argument("good", help="a commit where the benchmark was good (branch, tag or hash)")
    p.add_argument("bad", help="a later commit where it is bad; GOOD must be an ancestor of BAD")
    p.add_argument("--params", default=None, metavar="COMBO",
                   help="the parameter combination, as asv shows it: \"'mnist_maxing', 'mirrored', 3\" "
                        "(needed when the benchmark has several)")
    from harness.ci.benchgate import FACTOR

    p.add_argument("--factor", type=float, default=FACTOR,
                   help="a commit moved when the gate's rule says worse than GOOD beyond this ratio (virtualenv "
                        "mode: one run worse than GOOD's by this, or 1 + 3 x GOOD's noise if larger; default "
                        "%(default)s, the gate's)")
    p.add_argument("--probe-budget", type=float, default=None, metavar="SECONDS",
                   help="existing mode: seconds of interleaved pairs (or of asv rounds after the first two a side) "
                        "per probe before an undecided probe is given up as no verdict (default 60)")
    add_asv_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci.tracking import bisection

    if not args.factor > 1:
        raise InvalidValue(f"--factor must be > 1; got {args.factor:g}")
    if args.probe_budget is not None and not args.probe_budget > 0:
        raise InvalidValue(f"--probe-budget must be > 0 seconds; got {args.probe_budget:g}")
    project = asv_project(args, "bisect")
    if project.mode == "existing":  # GOOD's and BAD's build requirements, before any probe (exit 2)
        from harness.ci.gitrepo import rev_parse

        project.check_build_requirements(*(rev_parse(project.root, ref) for ref in (args.good, args.bad)))
    report = bisection.bisect(project, args.benchmark, args.good, args.bad, params=args.params, factor=args.factor,
                              progress=_progress, budget_s=args.probe_budget or _PROBE_BUDGET_S, log=_log)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        print()
    else:
        print(render(report))
    return report.status


def _progress(report: Report, probe: Probe) -> None:
    if probe.index == 0:
        bound = f"at most {report.bound} probes" if report.bound else "asv find's own bound"
        print(f"harness bisect: {report.target.label} over {len(report.commits)} commits ({bound}); moved: "
              f"{_rule(report)}", file=sys.stderr)
    print(f"harness bisect: {format_probe(report, probe)}", file=sys.stderr, flush=True)


def _log(said: str) -> None:
    print(f"harness bisect:     {said}", file=sys.stderr, flush=True)


def _paired(report: Report) -> bool:
    """Probes decided against GOOD by the gate's rule (existing mode), not by one run's threshold."""
    from harness.ci.tracking.bisection import ONE_RUN

    return report.method != ONE_RUN


def _rule(report: Report) -> str:
    """When a probe moved, in words."""
    if _paired(report):
        return (f"the gate's rule says worse than GOOD beyond {report.factor:g}x, measured against it in "
                f"{report.method} (lower 99% bound above no change)")
    return f"worse than GOOD by more than {report.threshold:.2f}x"


def _vs_good(probe: Probe) -> str:
    """``1.052x (1.041-1.063)``: the ratio against GOOD, with its bounds where the probe has them."""
    if probe.ratio is None:
        return ""
    text = f"{probe.ratio:.3f}x" if probe.pairs else f"{probe.ratio:.2f}x"
    if probe.low is not None and probe.high is not None:
        text += f" ({probe.low:.3f}-{probe.high:.3f})"
    return text


def _short(subject: str, width: int = 60) -> str:
    """A commit subject cut to ``width`` characters for a table row (the JSON keeps it whole)."""
    return subject if len(subject) <= width else subject[:width - 3].rstrip() + "..."


def format_value(value: float | None, unit: str) -> str:
    """``20.1ms`` (seconds), ``1.2M`` (bytes, asv's style), ``49.7 items/s``; ``failed`` for None."""
    if value is None or math.isnan(value):
        return "failed" if value is None else "skipped"
    if unit in ("seconds", "bytes"):
        from asv.util import human_value

        return human_value(value, unit)
    return f"{value:.4g} {unit}".rstrip()


def format_probe(report: Report, probe: Probe) -> str:
    """One progress line: ``[2] commit 5 of 10  82b356ff44d1 note 5: 20.1ms, 1.00x vs good: same`` (in pairs or
    rounds, the ratio's bounds and how many a side too)."""
    ratio = f", {_vs_good(probe)} vs good" if probe.ratio is not None else ""
    if probe.pairs:
        ratio += f", {probe.pairs} {report.method}"
    why = f" ({probe.note})" if probe.note and probe.verdict.value in ("failed", "undecided") else ""
    return (f"[{report.probes.index(probe) + 1}] commit {probe.index + 1} of {len(report.commits)}  "
            f"{probe.commit[:12]} {_short(probe.subject)}: {format_value(probe.value, report.target.unit)}{ratio}: "
            f"{probe.verdict.value}{why}")


def render(report: Report) -> str:
    """The report as text: the rule, a table of the probes, the first bad commit with before/after, the probes."""
    from harness.ci.benchgate import NOISE_K

    target, commits = report.target, report.commits
    direction = "higher is better" if target.higher_is_better else "lower is better"
    if _paired(report):
        rule = f"a commit moved when {_rule(report)}"
    else:
        noise = ("noise not recorded: the factor alone" if report.noise is None else
                 f"noise {report.noise:.1%} of GOOD's samples x {NOISE_K:g}")
        rule = f"a commit moved when {_rule(report)} (factor {report.factor:g}; {noise})"
    lines = [f"bisect {target.label} ({target.unit or 'no unit'}, {direction}), {report.mode} mode",
             f"{len(commits)} commits from GOOD {commits[0][:12]} to BAD {commits[-1][:12]}; {rule}", ""]
    rows = [("run", "commit", "hash", "value", "vs good", "verdict", "subject")]
    rows += [(str(run), f"{probe.index + 1}/{len(commits)}", probe.commit[:12],
              format_value(probe.value, target.unit), _vs_good(probe), probe.verdict.value, _short(probe.subject))
             for run, probe in enumerate(report.probes, 1)]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[6] for row in rows]
    lines.append("")
    lines += _conclusion(report)
    return "\n".join(line.rstrip() for line in lines)


def _conclusion(report: Report) -> list[str]:
    commits, unit = report.commits, report.target.unit
    bound = (f"bound ceil(log2 {len(commits)}) + 1 = {report.bound}" if report.bound is not None else
             "asv find's own bound")
    runs = f"{report.runs} {'probes' if _paired(report) else 'benchmark runs'} ({bound})"
    lines = [f"note: {note}" for note in report.notes]
    if report.error is not None:
        return [*lines, f"error: {report.error}", runs]
    if report.first_bad is None:
        bad = report.probe_at(len(commits) - 1)
        figures = f": {_vs_good(bad)}" if bad is not None and bad.ratio is not None else ""
        beyond = f"{report.factor:g}x" if _paired(report) else f"{report.threshold:.2f}x"
        return [*lines, f"No commit moved: BAD {commits[-1][:12]} is not worse than GOOD beyond {beyond}{figures}.",
                runs]
    probe = report.probe_at(report.first_bad)
    lines.append(f"First bad commit: {commits[report.first_bad]} {probe.subject if probe else ''}".rstrip())
    pair = report.before_after()
    if pair is not None:
        before, after = pair
        lines.append(f"  before {format_value(before.value, unit)} (commit {before.index + 1}, "
                     f"{before.commit[:12]}), after {format_value(after.value, unit)} (commit {after.index + 1}): "
                     f"{_vs_good(after)} worse than GOOD")
    return [*lines, runs]
