"""``harness bisect BENCHMARK GOOD BAD``: the first commit that moved one benchmark.

GOOD is run once as the reference; a commit has *moved* when the benchmark is
worse than on GOOD by more than ``max(--factor, 1 + 3 x noise)``, the noise
measured from GOOD's recorded samples (else ``--factor`` alone). Worse is
slower, or lower for higher-is-better benchmarks (samples/s, items/s,
efficiency, accuracy). Progress goes to stderr as each probe completes; the
report (every probe: commit, value, ratio against GOOD, verdict; then the first
bad commit with its before/after figures and the run count against the bound)
goes to stdout, or ``--json``.

Modes, as ``harness bench-compare``'s:
  existing    each probed commit is checked out in a git worktree, installed
              into this Python (``--install-command``) and run with
              ``asv run --python=same``; a binary search needs at most
              ceil(log2 n) + 1 benchmark runs for n commits, GOOD and BAD counted.
              This Python must hold each commit's [build-system].requires
              (the default install command builds without isolation; checked
              before each install: exit 2 naming what is missing).
  virtualenv  asv builds each commit in its own environment: ``asv find`` does
              the search (with its own bound, about log2 n + 2 runs) and its
              answer is reported the same way.
``auto`` (default) picks existing inside a container, else virtualenv.

Exit status: 0 the first bad commit was found; 1 BAD is not worse than GOOD
beyond the threshold (nothing to name); 2 bad input; 3 no verdict: the
benchmark failed on a probed commit (the search stops there and says which;
bisect a range that excludes it), or asv or the install command failed.

Examples:
    harness bisect throughput.Throughput.track_samples_per_second v1.0 main \\
        --params "'mnist_maxing', 'mirrored', 'tuned', 3" --mode existing
    harness bisect bench.Work.time_work HEAD~9 HEAD --json
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
    from harness.ci.bisect import Probe, Report

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bisect", help="find the first commit between GOOD and BAD that moved a benchmark",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("benchmark", help="asv benchmark name, full or a unique dotted suffix (Work.time_work)")
    p.add_argument("good", help="a commit where the benchmark was good (branch, tag or hash)")
    p.add_argument("bad", help="a later commit where it is bad; GOOD must be an ancestor of BAD")
    p.add_argument("--params", default=None, metavar="COMBO",
                   help="the parameter combination, as asv shows it: \"'mnist_maxing', 'mirrored', 3\" "
                        "(needed when the benchmark has several)")
    p.add_argument("--factor", type=float, default=1.1,
                   help="a commit moved when worse than GOOD by more than this ratio, or 1 + 3 x GOOD's noise "
                        "if larger (default 1.1)")
    add_asv_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci import bisect

    if not args.factor > 1:
        raise InvalidValue(f"--factor must be > 1; got {args.factor:g}")
    project = asv_project(args, "bisect")
    if project.mode == "existing":  # GOOD's and BAD's build requirements, before any probe (exit 2)
        from harness.ci.gitrepo import rev_parse

        project.check_build_requirements(*(rev_parse(project.root, ref) for ref in (args.good, args.bad)))
    report = bisect.bisect(project, args.benchmark, args.good, args.bad, params=args.params, factor=args.factor,
                           progress=_progress)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        print()
    else:
        print(render(report))
    return report.status


def _progress(report: Report, probe: Probe) -> None:
    if probe.index == 0:
        bound = f"at most {report.bound} benchmark runs" if report.bound else "asv find's own bound"
        print(f"harness bisect: {report.target.label} over {len(report.commits)} commits ({bound}); moved: worse "
              f"than GOOD by more than {report.threshold:.2f}x", file=sys.stderr)
    print(f"harness bisect: {format_probe(report, probe)}", file=sys.stderr, flush=True)


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
    """One progress line: ``[2] commit 5 of 10  82b356ff44d1 note 5: 20.1ms, 1.00x vs good: same``."""
    ratio = "" if probe.ratio is None else f", {probe.ratio:.2f}x vs good"
    return (f"[{report.probes.index(probe) + 1}] commit {probe.index + 1} of {len(report.commits)}  "
            f"{probe.commit[:12]} {_short(probe.subject)}: {format_value(probe.value, report.target.unit)}{ratio}: "
            f"{probe.verdict.value}")


def render(report: Report) -> str:
    """The report as text: the threshold, a table of the probes, the first bad commit with before/after, the runs."""
    from harness.ci.benchgate import NOISE_K

    target, commits = report.target, report.commits
    direction = "higher is better" if target.higher_is_better else "lower is better"
    noise = ("noise not recorded: the factor alone" if report.noise is None else
             f"noise {report.noise:.1%} of GOOD's samples x {NOISE_K:g}")
    lines = [f"bisect {target.label} ({target.unit or 'no unit'}, {direction}), {report.mode} mode",
             f"{len(commits)} commits from GOOD {commits[0][:12]} to BAD {commits[-1][:12]}; a commit moved when "
             f"worse than GOOD by more than {report.threshold:.2f}x (factor {report.factor:g}; {noise})", ""]
    rows = [("run", "commit", "hash", "value", "vs good", "verdict", "subject")]
    rows += [(str(run), f"{probe.index + 1}/{len(commits)}", probe.commit[:12],
              format_value(probe.value, target.unit), "" if probe.ratio is None else f"{probe.ratio:.2f}x",
              probe.verdict.value, _short(probe.subject)) for run, probe in enumerate(report.probes, 1)]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[6] for row in rows]
    lines.append("")
    lines += _conclusion(report)
    return "\n".join(line.rstrip() for line in lines)


def _conclusion(report: Report) -> list[str]:
    commits, unit = report.commits, report.target.unit
    bound = (f"bound ceil(log2 {len(commits)}) + 1 = {report.bound}" if report.bound is not None else
             "asv find's own bound")
    runs = f"{report.runs} benchmark runs ({bound})"
    lines = [f"note: {note}" for note in report.notes]
    if report.error is not None:
        return [*lines, f"error: {report.error}", runs]
    if report.first_bad is None:
        bad = report.probe_at(len(commits) - 1)
        figures = f" ({bad.ratio:.2f}x)" if bad is not None and bad.ratio is not None else ""
        return [*lines, f"No commit moved: BAD {commits[-1][:12]} is not worse than GOOD beyond "
                        f"{report.threshold:.2f}x{figures}.", runs]
    probe = report.probe_at(report.first_bad)
    lines.append(f"First bad commit: {commits[report.first_bad]} {probe.subject if probe else ''}".rstrip())
    pair = report.before_after()
    if pair is not None:
        before, after = pair
        lines.append(f"  before {format_value(before.value, unit)} (commit {before.index + 1}, "
                     f"{before.commit[:12]}), after {format_value(after.value, unit)} (commit {after.index + 1}): "
                     f"{after.ratio:.2f}x worse than GOOD")
    return [*lines, runs]
