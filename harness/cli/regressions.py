"""``harness regressions``: the standing performance regressions in a history of asv results.

Reads the results of many commits (an .asv/results folder, or a checkout of the
asv-results branch the nightly publish workflow keeps), finds the change points
of every benchmark and parameter combination with asv's own detector
(asv.step_detect, the one behind the "regressions" page of asv publish) and
reports each step that made a benchmark worse and still stands: the commit
range (last good..first bad), the level before and after, how much worse, and
the benchmark's noise (its spread around the fitted steps). Samples/s,
efficiency and final accuracy count higher as better: a drop is the regression.

Commits are ordered along `git rev-list --first-parent BRANCH` of --repo (by
default the current directory, where it is a git repository holding the
commits), else by the commit dates asv recorded.

Exit status: 1 when a regression newer than --since exists (no --since: any
regression), 0 when none, 2 on bad input (a missing results folder, an unknown
machine or commit), 3 when it could not read the history (no verdict: never
read as a regression found).

Examples:
    harness regressions --results asv-history --repo . --since HEAD~1
    harness regressions --since 2025-01-31 --bench 'throughput\\.' --markdown regressions.md
    harness regressions --results .asv/results --machine ci-runner --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    from harness.ci.history import DEFAULT_THRESHOLD

    p = subparsers.add_parser("regressions", help="find the standing regressions in a history of asv results",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=".asv/results", metavar="DIR",
                   help="asv results folder, or a checkout of the asv-results branch (default %(default)s)")
    p.add_argument("--machine", help="the machine's results to read (needed when the folder has several)")
    p.add_argument("--repo", metavar="PATH",
                   help="git repository that orders the commits (default: the current directory, where it has "
                        "them; else the commit dates asv recorded)")
    p.add_argument("--branch", help="branch whose first-parent line orders the commits (default main, else HEAD)")
    p.add_argument("--since", metavar="REF|DATE",
                   help="exit 1 only for regressions whose first bad commit comes after this commit or ISO date")
    p.add_argument("--bench", metavar="REGEX", help="only benchmarks whose name (or name(params)) this matches")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="FRACTION",
                   help="asv's relative step threshold (default %(default)s, as on asv's pages)")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown report here ('-': print it)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci.history import find_regressions, newer_than

    history = _load(args)
    regressions = find_regressions(history, args.threshold, args.bench)
    new = newer_than(history, regressions, args.since) if args.since else regressions
    status = 1 if new else 0
    if args.markdown:
        text = _markdown(history, regressions, new, args.since)
        if args.markdown == "-":
            print(text)
        else:
            Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"results_dir": history.results_dir, "machine": history.machine, "order": history.order,
                   "commits": len(history.commits), "first": history.commits[0], "last": history.commits[-1],
                   "dropped": list(history.dropped), "threshold": args.threshold, "since": args.since,
                   "status": status, "regressions": [{**r.to_json(), "new": r in new} for r in regressions]},
                  sys.stdout, indent=2)
        print()
    elif args.markdown != "-":
        print(_table(history, regressions, new, args.since))
    return status


def _load(args):
    """The history, ordered by ``--repo``, else by the current directory's git line, else by dates."""
    from harness.ci import gitrepo
    from harness.ci.history import CommitsNotInRepo, load_history

    if args.repo:
        return load_history(args.results, args.machine, args.repo, args.branch)
    if gitrepo.find_commit(".", "HEAD") is not None:
        try:
            return load_history(args.results, args.machine, ".", args.branch)
        except CommitsNotInRepo as err:
            print(f"harness regressions: {err}; ordering by commit dates", file=sys.stderr)
    return load_history(args.results, args.machine, None, args.branch)


def _summary(history, regressions, new, since) -> str:
    head = (f"{len(regressions)} standing regression{'s' * (len(regressions) != 1)} over {len(history.commits)} "
            f"commits ({history.commits[0][:8]}..{history.commits[-1][:8]}) of machine {history.machine!r}")
    if since:
        head += f", {len(new)} newer than {since}"
    return head


def _table(history, regressions, new, since) -> str:
    lines = [_summary(history, regressions, new, since), f"order: {history.order}"]
    if history.dropped:
        lines.append(f"left out: {len(history.dropped)} result commits not on that line")
    if not regressions:
        return "\n".join(lines)
    rows = [("", "benchmark", "last good..first bad", "before", "after", "change", "worse by", "noise")]
    rows += [("+" if r in new else "", r.label, _range(r), _value(r.before, r.unit), _value(r.after, r.unit),
              f"{100 * r.change:+.1f}%", f"{r.ratio:.2f}x", _noise(r.noise)) for r in regressions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += ["", "+ new: first bad commit after --since (all, without it); (n): commits in the range; worse by: "
              "after vs before, inverted where higher is better; noise: spread around asv's fitted steps"]
    return "\n".join(lines)


def _markdown(history, regressions, new, since) -> str:
    mark = ":x:" if new else ":white_check_mark:"
    lines = [f"### {mark} {_summary(history, regressions, new, since)}", "", f"Order: {history.order}", ""]
    if not regressions:
        return "\n".join(lines).rstrip()
    lines += ["| | benchmark | last good..first bad | before | after | change | worse by | noise |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {'+' if r in new else ''} | `{r.label}` | `{_range(r)}` | {_value(r.before, r.unit)} | "
              f"{_value(r.after, r.unit)} | {100 * r.change:+.1f}% | {r.ratio:.2f}x | {_noise(r.noise)} |"
              for r in regressions]
    lines += ["", "`+` new (first bad commit after `--since`); *(n)*: commits in the range; *worse by*: after vs "
              "before, samples/s, efficiency and final accuracy counting higher as better; *noise*: the "
              "benchmark's spread around asv's fitted steps."]
    return "\n".join(lines)


def _range(regression) -> str:
    return f"{regression.last_good[:8]}..{regression.first_bad[:8]} ({regression.commits})"


def _noise(noise: float | None) -> str:
    return "n/a" if noise is None else f"{100 * noise:.1f}%"


def _value(value: float, unit: str) -> str:
    if unit in ("seconds", "bytes"):
        from asv.util import human_value

        return human_value(value, unit)
    return f"{value:.4g} {unit}".rstrip()
