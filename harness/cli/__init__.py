"""The ``harness`` command line. Subcommands live in their own modules."""

from __future__ import annotations

import argparse
import sys

from harness import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from harness.cli import check

    parser = argparse.ArgumentParser(
        prog="harness",
        description="Exact ratio-split data parallelism for Keras: equivalence and speed checks.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
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
