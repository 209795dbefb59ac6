"""``harness test-time``: where a test run's time went, and each CI step against its budget.

Reads pytest's JUnit XML (``pytest --junitxml FILE``; with harness' pytest plugin each test also carries its
markers and the TensorFlow processes it started) and prints, per file given: the tests that ran, the wall
and test time, the slowest tests, the time per test file and per marker. With ``--steps`` it reads what
``.ci/run`` recorded of its steps (one JSON object a line: step, wall_s, status, junit, probe_s) and prints
each step's report and a table of the steps' wall times; with ``--budget`` it holds each step against its
budget (a TOML file: .ci/test-budget.toml), scaled to this host's speed, and fails beyond the file's
``fail_factor``, naming the step and its slowest tests.

Exit status: 0 within budget (or no budget given), 1 a step over its budget, 2 a file that cannot be read.

Examples:
    pytest -n 2 --junitxml quick.xml && harness test-time quick.xml
    harness test-time --steps steps.jsonl --budget .ci/test-budget.toml
    harness test-time --probe        # this host's speed probe (seconds, 2 workers; the budget file's probe_s)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import InvalidValue

__all__ = ["add_parser", "run"]

def add_parser(subparsers) -> None:
    p = subparsers.add_parser("test-time", help="where a test run's time went; CI steps against their budget",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit", nargs="*", metavar="JUNIT", help="JUnit XML files written by pytest --junitxml")
    p.add_argument("--steps", metavar="FILE", help="the steps a CI run recorded (JSON lines; .ci/run writes them)")
    p.add_argument("--budget", metavar="FILE", help="each step's budget (TOML, e.g. .ci/test-budget.toml)")
    p.add_argument("--top", type=int, default=25, metavar="N", help="slowest tests shown per step (default 25)")
    p.add_argument("--files", type=int, default=15, metavar="N", help="test files shown per step (default 15)")
    p.add_argument("--table-only", action="store_true", help="with --steps: the table and verdicts alone")
    p.add_argument("--probe", action="store_true",
                   help="print this host's speed probe in seconds (lower is faster), run in as many processes at "
                        "once as the CI steps' workers (2, as the budget file's probe_s), and nothing else")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci import testtime

    if args.probe:
        print(f"{testtime.probe_host(workers=testtime.PROBE_WORKERS):.4f}")
        return 0
    if args.top < 0 or args.files < 0:
        raise InvalidValue(f"--top and --files must be >= 0; got --top {args.top} --files {args.files}")
    if not args.junit and not args.steps:
        raise InvalidValue("give JUnit files, or --steps FILE (what .ci/run recorded)")
    budgets = testtime.read_budgets(args.budget) if args.budget else None
    show = dict(top=args.top, files=args.files)
    for path in args.junit:
        print(testtime.step_report(Path(path).stem, testtime.read_junit(path), **show), end="\n\n")
    if not args.steps:
        return 0
    steps = testtime.read_steps(args.steps)
    if not steps:
        raise InvalidValue(f"the steps file {args.steps!r} records no step")
    tests = {s.name: [t for path in s.junit if Path(path).exists() for t in testtime.read_junit(path)]
             for s in steps}
    if not args.table_only:
        for step in steps:
            if tests[step.name]:
                print(testtime.step_report(step.name, tests[step.name], step.wall_s, **show), end="\n\n")
    verdicts = testtime.judge(steps, budgets)
    print(testtime.steps_table(steps, verdicts, budgets))
    over = [v for v in verdicts if v.over]
    for verdict in over:
        slowest = sorted((t for t in tests[verdict.step] if t.outcome != "skipped"), key=lambda t: -t.seconds)[:5]
        print(f"harness test-time: step {verdict.step!r} took {verdict.wall_s:.0f} s, over {verdict.limit_s:.0f} s "
              f"({budgets.fail_factor if budgets else 1:g} x its {verdict.budget_s:.0f} s budget x "
              f"{verdict.scale:.2f} for this host){': its slowest tests: ' if slowest else ''}"
              + "; ".join(f"{t.nodeid} {t.seconds:.0f} s" for t in slowest))
    return 1 if over else 0

