"""The ``harness`` command line. Subcommands live in their own modules.

Exit statuses, pytest's convention (``harness.errors.exit_status``): 0 success; 1 a negative verdict (the
subcommand's own: not equivalent, a regression, a failed check); 2 a usage error (argparse) or bad input
(``InvalidValue``, ``InvalidType``, ``Refused``, ``Unavailable``: one line ``harness COMMAND: error: MESSAGE``);
3 no verdict: a step that failed (``Failed``: one line, ``harness COMMAND: error: MESSAGE (no verdict)``) or an
internal error of harness (any exception it did not diagnose: its traceback, and a line asking to report it).
``--debug`` shows the traceback of every error instead.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from harness import __version__
from harness.errors import EXIT_NO_VERDICT, HarnessError, exit_status

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from harness.cli import (
        bench,
        bisect,
        calibrate,
        check,
        compare,
        dashboard,
        docker,
        env,
        init,
        launch,
        matrix,
        regressions,
        run,
        testtime,
        tfconfig,
        tune,
    )

    parser = argparse.ArgumentParser(
        prog="harness",
        description="Exact ratio-split data parallelism for Keras: equivalence checks, throughput runs and "
        "comparisons on real, logical or emulated devices.",
        epilog="exit status: 0 ok; 1 a negative verdict (not equivalent, a regression, a failed check); 2 a usage "
        "error or bad input; 3 no verdict (a step that failed, or an internal error)",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (run, compare, tune, calibrate, check, launch, tfconfig, env, bench, regressions, bisect, dashboard,
                   docker, matrix, init, testtime):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (the module's docstring): 2 for a usage error or bad input (one
    line), 3 for a step that failed (one line) or any exception harness did not diagnose (its traceback)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, or a usage error (argparse printed why)
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except HarnessError as err:
        if args.debug:
            raise
        status = exit_status(err)
        said = " (no verdict)" if status == EXIT_NO_VERDICT else ""
        print(f"harness {args.command}: error: {err}{said}", file=sys.stderr)
        return status
    except Exception as err:  # noqa: BLE001  not diagnosed by harness: a bug, said to be one, with where it happened
        if args.debug:
            raise
        traceback.print_exc(file=sys.stderr)
        print(f"harness {args.command}: internal error: the exception above is a bug in harness (or a case it "
              f"does not foresee); please report it with the traceback (harness {__version__}); no verdict "
              f"(exit {EXIT_NO_VERDICT})", file=sys.stderr)
        return exit_status(err)


def console() -> int:
    """The ``harness`` command (and ``python -m harness``): ``main()``, then every object left is frozen out of the
    garbage collector, so the full collection that ends the interpreter has nothing to walk. After ``harness
    tune`` that collection took 0.2 to 17 s while freed ``fit`` iterators waited on tf.data's autotuning thread
    (``harness.bench.workloads.tfdata``), still 0.4 to 1.8 s without it; the process is ending, its memory goes
    back whole. ``main()`` itself freezes nothing: a process that goes on (a test, a notebook) keeps collecting."""
    import gc

    status = main()
    gc.freeze()
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console())
