"""The ``harness`` command line. Subcommands live in their own modules."""

from __future__ import annotations

import argparse
import sys

from harness import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from harness.cli import (
        bench,
        bisect,
        calibrate,
        check,
        compare,
        docker,
        env,
        launch,
        matrix,
        regressions,
        run,
        tfconfig,
        tune,
    )

    parser = argparse.ArgumentParser(
        prog="harness",
        description="Exact ratio-split data parallelism for Keras: equivalence checks, throughput runs and "
        "comparisons on real, logical or emulated devices.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (run, compare, tune, calibrate, check, launch, tfconfig, env, bench, regressions, bisect, docker,
                   matrix):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the exit status."""
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
    except (ValueError, TypeError, RuntimeError) as err:
        if args.debug:
            raise
        print(f"harness {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
