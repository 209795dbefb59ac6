"""``harness regressions``: every performance regression in a history of asv results, standing or fixed.

Reads the results of many commits (an .asv/results folder, or a checkout of the
asv-results branch the nightly publish workflow keeps) and finds the steps of
every benchmark and parameter combination with harness' change-point detector
(harness.ci.tracking.changepoints: levels fitted by least squares with a
penalty, each step tested against the benchmark's own night-to-night noise;
docs/regressions.md gives its recall and false alarms beside asv's and Otava's).
A step is reported when it is beyond --factor (the gate's: 1.03) and stands
out of the noise; a level must hold 6 nights, so a one-night outlier is no step.
Each regression is listed with the commit range that holds it with 95% odds
(last good..first bad), the commit most likely to have made it, the levels
before and after, how much worse with 99% bounds, and its status: standing, or
fixed (naming the commit that undid it). Improvements and slow drifts are
listed apart. Samples/s, efficiency and final accuracy count higher as better:
a drop is the regression.

Commits are ordered along `git rev-list --first-parent BRANCH` of --repo (by
default the current directory, where it is a git repository holding the
commits), else by the commit dates asv recorded.

--confirm measures each candidate again before it counts: its last good
commit (base) against its first bad one (head), with the gate's machinery and
rule (harness.ci.tracking.confirm; asv options --config, --mode and
--install-command as bench-compare's; --machine, the results' machine, is the
asv machine too). A time_ benchmark in existing mode is timed in interleaved
pairs, anything else in asv rounds of each commit, alternating; each until
the gate's verdict is decided or --confirm-budget is spent. Each candidate is
then confirmed (worse beyond --factor, its lower 99% bound above no change),
not confirmed (same or better, its bounds excluding the factor), inconclusive
(undecided when the budget ended) or no verdict (asv, the install or the
benchmark failed). Candidates: the standing regressions (--confirm-fixed: the
fixed ones too), with --since only the new ones. The asv results the
re-measurement saves are put back as they were, so a results folder that is
the project's own (.asv/results) keeps its nights.

Exit status: 1 when a standing regression newer than --since exists (no
--since: any standing regression; fixed ones never), 0 when none, 2 on bad
input (a missing results folder, an unknown machine or commit; --confirm: a
commit not in the asv project, a build requirement missing), 3 when it
could not read the history (no verdict: never read as a regression found).
With --confirm, a new standing regression counts for 1 only when confirmed;
one not confirmed counts for nothing (it is labelled); and when none is
confirmed but one could not be told (inconclusive) or not measured (no
verdict), the exit status is 3: a candidate nobody resolved is never read as a
pass. A confirmed regression gives 1 even where another was not resolved.

Each regression's JSON says "alert": true for a new standing regression that
a re-measurement did not refute (confirmed, inconclusive, no verdict, or not
measured again): what the nightly opens an issue for. --html FILE writes the
report as a page, each benchmark that stepped drawn with its steps marked (the
page harness dashboard publishes).

Examples:
    harness regressions --results asv-history --repo . --since HEAD~1
    harness regressions --since 2025-01-31 --bench 'throughput\\.' --markdown regressions.md
    harness regressions --results .asv/results --machine ci-runner --json
    harness regressions --results asv-history --since HEAD~1 --confirm --mode existing --confirm-budget 120
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.errors import EXIT_NO_VERDICT, EXIT_OK, EXIT_VERDICT, InvalidValue

__all__ = ["add_parser", "run"]

_CONFIRM_BUDGET_S = 60.0  # harness.ci.interleave.BUDGET_S, the gate's --pair-budget (not imported: --help stays light)


def add_parser(subparsers) -> None:
    from harness.ci.benchgate import FACTOR

    p = subparsers.add_parser("regressions", help="find every regression in a history of asv results, standing "
                                                  "or fixed", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=".asv/results", metavar="DIR",
                   help="asv results folder, or a checkout of the asv-results branch (default %(default)s)")
    p.add_argument("--machine", help="the machine's results to read (needed when the folder has several)")
    p.add_argument("--repo", metavar="PATH",
                   help="git repository that orders the commits (default: the current directory, where it has "
                        "them; else the commit dates asv recorded)")
    p.add_argument("--branch", help="branch whose first-parent line orders the commits (default main, else HEAD)")
    p.add_argument("--since", metavar="REF|DATE",
                   help="exit 1 only for standing regressions whose first bad commit comes after this commit or "
                        "ISO date")
    p.add_argument("--bench", metavar="REGEX", help="only benchmarks whose name (or name(params)) this matches")
    p.add_argument("--factor", type=float, default=FACTOR, metavar="RATIO",
                   help="the smallest step reported, as the gate's --factor (default %(default)s: 3%%)")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown report here ('-': print it)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument("--html", metavar="FILE", help="also write the report as a page, each benchmark that stepped "
                                                  "drawn with its steps marked")
    confirming = p.add_argument_group("confirming candidates by measuring them again (--confirm)")
    confirming.add_argument("--confirm", action="store_true",
                            help="measure each candidate's last good and first bad commits again, as the gate "
                                 "does, and count only the confirmed ones for the exit status")
    confirming.add_argument("--confirm-budget", type=float, default=None, metavar="SECONDS",
                            help="seconds of measuring per candidate: interleaved pairs, or asv rounds after the "
                                 f"first two a side (default {_CONFIRM_BUDGET_S:g})")
    confirming.add_argument("--confirm-fixed", action="store_true",
                            help="confirm the fixed regressions too (default: the standing ones)")
    _add_asv_options(confirming)
    p.set_defaults(run=run)


def _add_asv_options(group) -> None:
    """``harness.cli.asvopts``' options but ``--machine``: this command's ``--machine`` (the results' machine) is
    the asv machine too."""
    from harness.ci.asvrun import INSTALL, MODES

    group.add_argument("--mode", choices=list(MODES), default="auto",
                       help="--confirm: virtualenv: asv builds each commit; existing: each commit is installed into "
                            "this Python (inside a prebuilt image); auto (default): existing inside a container")
    group.add_argument("--config", default="asv.conf.json",
                       help="--confirm: the asv config of the project the commits belong to (default asv.conf.json)")
    group.add_argument("--install-command", default=INSTALL, metavar="CMD",
                       help="--confirm, existing mode: how a commit is installed, with {python} and {path} "
                            "(default: pip, no dependencies)")


def run(args) -> int:
    from harness.ci.tracking.regressions import find_changes, newer_than

    if not args.factor > 1:
        raise InvalidValue(f"--factor must be a ratio above 1 (1.03: 3%); got {args.factor:g}")
    if not args.confirm and (args.confirm_budget is not None or args.confirm_fixed):
        raise InvalidValue("--confirm-budget and --confirm-fixed go with --confirm")
    if args.confirm_budget is not None and not args.confirm_budget > 0:
        raise InvalidValue(f"--confirm-budget must be > 0 seconds; got {args.confirm_budget:g}")
    history = _load(args)
    found = find_changes(history, args.factor, args.bench)
    new = newer_than(history, found.regressions, args.since) if args.since else list(found.regressions)
    confirmed = _confirm(args, history, found, new) if args.confirm else None
    status = _status(new, confirmed)
    if args.markdown:
        text = _markdown(history, found, new, args.since, confirmed, status)
        if args.markdown == "-":
            print(text)
        else:
            Path(args.markdown).write_text(text + "\n")
    if args.html:
        from harness.ci.tracking.page import render

        Path(args.html).write_text(render(history, found, args.factor), encoding="utf-8")
    if args.json:
        json.dump({"results_dir": history.results_dir, "machine": history.machine, "order": history.order,
                   "commits": len(history.commits), "first": history.commits[0], "last": history.commits[-1],
                   "dropped": list(history.dropped), "factor": args.factor, "since": args.since,
                   "confirm": bool(args.confirm), "status": status,
                   "regressions": [{**r.to_json(), "new": r in new, "alert": _alert(r, new, confirmed),
                                    "confirmation": _confirmation_json(confirmed, r)} for r in found.regressions],
                   "improvements": [i.to_json() for i in found.improvements],
                   "drifts": [d.to_json() for d in found.drifts]}, sys.stdout, indent=2)
        print()
    elif args.markdown != "-":
        print(_table(history, found, new, args.since, confirmed))
    return status


def _status(new, confirmed: dict | None) -> int:
    """The exit status (module docstring): without ``--confirm`` (``confirmed`` None), 1 for any new standing
    regression; with it, 1 for a new standing regression confirmed, else 3 where one was inconclusive or had no
    verdict, else 0."""
    standing = [r for r in new if r.standing]
    if confirmed is None:
        return EXIT_VERDICT if standing else EXIT_OK
    from harness.ci.tracking.confirm import Verdict

    said = [confirmed.get(r) for r in standing]
    if any(c is not None and c.verdict is Verdict.CONFIRMED for c in said):
        return EXIT_VERDICT
    if any(c is not None and c.verdict in (Verdict.INCONCLUSIVE, Verdict.NO_VERDICT) for c in said):
        return EXIT_NO_VERDICT
    return EXIT_OK


def _alert(change, new, confirmed: dict | None) -> bool:
    """What the nightly opens an issue for: a new standing regression that no re-measurement refuted."""
    if not (change.standing and change in new):
        return False
    from harness.ci.tracking.confirm import Verdict

    said = None if confirmed is None else confirmed.get(change)
    return said is None or said.verdict is not Verdict.NOT_CONFIRMED


def _confirmation_json(confirmed: dict | None, change) -> dict | None:
    found = None if confirmed is None else confirmed.get(change)
    return None if found is None else found.to_json()


def _confirm(args, history, found, new) -> dict:
    """``--confirm``: each candidate measured again (``harness.ci.tracking.confirm``), by candidate.

    Raises:
        InvalidValue: a candidate's commit is not in the asv project's repository.
        Unavailable: existing mode, and this Python lacks a candidate commit's build requirements.
    """
    from harness.ci import gitrepo
    from harness.ci.tracking import confirm
    from harness.cli.asvopts import asv_project

    candidates = [r for r in (new if args.since else found.regressions) if r.standing or args.confirm_fixed]
    if not candidates:
        print("harness regressions: no candidate to confirm", file=sys.stderr)
        return {}
    project = asv_project(argparse.Namespace(**{**vars(args), "machine": history.machine}), "regressions")
    commits = list(dict.fromkeys(c for r in candidates for c in (r.last_good, r.first_bad)))
    missing = [c for c in commits if gitrepo.find_commit(project.root, c) != c]
    if missing:
        raise InvalidValue(f"--confirm: {len(missing)} candidate commit(s) are not in {project.root} (the asv "
                           f"project of --config): {', '.join(c[:12] for c in missing)}")
    project.check_build_requirements(*commits)  # existing mode: every commit's, before any is measured (exit 2)
    project.register_machine()
    budget = args.confirm_budget or _CONFIRM_BUDGET_S
    out = {}
    with confirm.kept_results(project, commits):  # the nights confirmed stay as they were
        for number, change in enumerate(candidates, 1):
            how = confirm.method(project, change)
            print(f"harness regressions: confirming {number} of {len(candidates)}: {change.label} "
                  f"{change.last_good[:8]}..{change.first_bad[:8]} in {how}", file=sys.stderr, flush=True)

            def progress(said: str, label: str = change.label) -> None:
                print(f"harness regressions: {label}: {said}", file=sys.stderr, flush=True)

            out[change] = confirm.confirm(project, change, args.factor, budget_s=budget, progress=progress,
                                          keep=False)
            progress(out[change].label() + (f" ({out[change].note})" if out[change].note else ""))
    return out


def _load(args):
    """The history, ordered by ``--repo``, else by the current directory's git line, else by dates."""
    from harness.ci import gitrepo
    from harness.ci.tracking.history import CommitsNotInRepo, load_history

    if args.repo:
        return load_history(args.results, args.machine, args.repo, args.branch)
    if gitrepo.find_commit(".", "HEAD") is not None:
        try:
            return load_history(args.results, args.machine, ".", args.branch)
        except CommitsNotInRepo as err:
            print(f"harness regressions: {err}; ordering by commit dates", file=sys.stderr)
    return load_history(args.results, args.machine, None, args.branch)


def _summary(history, found, new, since, confirmed=None) -> str:
    standing = len(found.standing)
    fixed = len(found.regressions) - standing
    head = (f"{standing} standing regression{'s' * (standing != 1)}, {fixed} fixed, "
            f"{len(found.improvements)} improvement{'s' * (len(found.improvements) != 1)} over "
            f"{len(history.commits)} commits ({history.commits[0][:8]}..{history.commits[-1][:8]}) of machine "
            f"{history.machine!r}")
    if since:
        head += f", {sum(1 for r in new if r.standing)} standing newer than {since}"
    if confirmed is not None:
        from harness.ci.tracking.confirm import Verdict

        counts = [f"{n} {v.value}" for v in Verdict if (n := sum(c.verdict is v for c in confirmed.values()))]
        head += f"; measured again: {', '.join(counts) or 'none'}"
    return head


_REGRESSION_COLUMNS = ("", "benchmark", "status", "last good..first bad", "likely", "before", "after", "change",
                       "worse by (99%)", "noise")
_CONFIRM_COLUMN = "measured again (99%)"
_IMPROVEMENT_COLUMNS = ("benchmark", "last before..first after", "likely", "before", "after", "change",
                        "better by (99%)", "fixes")
_LEGEND = ("new: first bad commit after --since (all, without it); (n): commits in the range that holds the step "
           "with 95% odds; likely: the commit most likely to have made it; worse by: after vs before, inverted where "
           "higher is better, with its 99% bounds; noise: the benchmark's night-to-night spread")
_CONFIRM_LEGEND = ("; measured again (--confirm): last good against first bad, side by side as the gate measures "
                   "them: confirmed (worse beyond the factor, lower bound above no change: counts for the exit "
                   "status), not confirmed (bounds exclude the factor), inconclusive (undecided within the budget), "
                   "no verdict (the measurement failed); with the ratio, its 99% bounds and the pairs or rounds a "
                   "side")


def _columns(confirmed) -> tuple[str, ...]:
    return _REGRESSION_COLUMNS + ((_CONFIRM_COLUMN,) if confirmed is not None else ())


def _legend(confirmed) -> str:
    return _LEGEND + (_CONFIRM_LEGEND if confirmed is not None else "")


def _regression_row(r, new, confirmed=None) -> tuple[str, ...]:
    status = "standing" if r.standing else f"fixed by {r.fixed_by[:8]}"
    row = ("+" if r in new else "", r.label, status, _range(r), r.likely[:8], _value(r.before, r.unit),
           _value(r.after, r.unit), f"{100 * r.change:+.1f}%", _ratio(r), _noise(r.noise))
    if confirmed is None:
        return row
    found = confirmed.get(r)
    return row + ("not measured again" if found is None else found.label(),)


def _improvement_row(i) -> tuple[str, ...]:
    return (i.label, _range(i), i.likely[:8], _value(i.before, i.unit), _value(i.after, i.unit),
            f"{100 * i.change:+.1f}%", _ratio(i), i.fixes[:8] if i.fixes else "")


def _table(history, found, new, since, confirmed=None) -> str:
    lines = [_summary(history, found, new, since, confirmed), f"order: {history.order}"]
    if history.dropped:
        lines.append(f"left out: {len(history.dropped)} result commits not on that line")
    if found.regressions:
        lines += ["", "Regressions (+ new)"]
        lines += _aligned([_columns(confirmed)] + [_regression_row(r, new, confirmed) for r in found.regressions])
    if found.improvements:
        lines += ["", "Improvements"]
        lines += _aligned([_IMPROVEMENT_COLUMNS] + [_improvement_row(i) for i in found.improvements])
    lines += _drifts(found, "")
    if found.regressions or found.improvements:
        lines += ["", "+ " + _legend(confirmed)]
    return "\n".join(lines)


def _aligned(rows) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _drifts(found, code: str) -> list[str]:
    if not found.drifts:
        return []
    return ["", "Slow drifts (not steps):"] + [
        f"- {code}{d.label}{code}: {100 * d.drift.total:+.1f}% over {d.commits} commits "
        f"({100 * d.drift.per_value:+.2f}% a commit{', worse' if d.drift.total > 0 else ', better'})"
        for d in found.drifts]


def _markdown(history, found, new, since, confirmed=None, status=None) -> str:
    if status is None:
        status = _status(new, confirmed)
    mark = {EXIT_VERDICT: ":x:", EXIT_NO_VERDICT: ":grey_question:"}.get(status, ":white_check_mark:")
    lines = [f"### {mark} {_summary(history, found, new, since, confirmed)}", "", f"Order: {history.order}"]
    if found.regressions:
        columns = _columns(confirmed)
        lines += ["", "#### Regressions", "", _md_row(("new",) + columns[1:]), "|---" * len(columns) + "|"]
        lines += [_md_row(_regression_row(r, new, confirmed), code=(1, 3, 4)) for r in found.regressions]
    if found.improvements:
        lines += ["", "#### Improvements", "", _md_row(_IMPROVEMENT_COLUMNS), "|---" * len(_IMPROVEMENT_COLUMNS) + "|"]
        lines += [_md_row(_improvement_row(i), code=(0, 1, 2, 7)) for i in found.improvements]
    lines += _drifts(found, "`")
    if found.regressions or found.improvements:
        lines += ["", "*" + _legend(confirmed) + ".*"]
    return "\n".join(lines)


def _md_row(cells, code=()) -> str:
    return "| " + " | ".join(f"`{c}`" if i in code and c else c for i, c in enumerate(cells)) + " |"


def _range(change) -> str:
    return f"{change.last_good[:8]}..{change.first_bad[:8]} ({change.commits})"


def _ratio(change) -> str:
    return f"{change.ratio:.3f}x ({change.low:.3f}-{change.high:.3f})"


def _noise(noise: float | None) -> str:
    return "n/a" if noise is None else f"{100 * noise:.1f}%"


def _value(value: float, unit: str) -> str:
    if unit in ("seconds", "bytes"):
        from asv.util import human_value

        return human_value(value, unit)
    return f"{value:.4g} {unit}".rstrip()
