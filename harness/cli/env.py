"""``harness env``: everything a bug report needs about this machine and software stack.

Prints the harness version and commit and how it was installed (harness.dist: a release from the index, a git
URL, an archive, an editable checkout), Python, TensorFlow (and the CUDA/cuDNN it was built
against), Keras and its flavour, the NVIDIA driver and GPUs (read through NVML: no CUDA
context, no GPU memory), CPU, RAM and the environment variables that change a run.

Examples:
    harness env              # readable block, paste it into an issue
    harness env --json       # the same as one JSON document
    harness env --no-tf      # skip importing TensorFlow (fast; no build information)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.dist import Installed

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Registers ``env`` on the ``harness`` subcommand parsers."""
    p = subparsers.add_parser(
        "env",
        help="print the environment fingerprint (versions, GPUs, driver) for bug reports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the readable block")
    p.add_argument("--no-tf", action="store_true",
                   help="do not import TensorFlow (versions still come from package metadata)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Prints the fingerprint; returns 0 (a missing piece is reported, not an error)."""
    from dataclasses import asdict

    from harness.bench.environment import fingerprint, format_fingerprint
    from harness.dist import installed

    fp = fingerprint(import_tf=not args.no_tf)
    info = installed()
    fp.setdefault("harness", {})["installed"] = asdict(info)
    if args.json:
        json.dump(fp, sys.stdout, indent=2)
        print()
    else:
        lines = format_fingerprint(fp).splitlines()
        lines.insert(1, "installed    " + describe(info))
        print("\n".join(lines))
    return 0


def describe(info: Installed) -> str:
    """One line: how this harness was installed, from where, at which commit, and whether it is a release."""
    source = {"index": "from the package index", "vcs": f"from {info.url}", "archive": f"from {info.url}",
              "editable": f"editable, {info.url}", "dir": f"from the directory {info.url}",
              "source": "not installed: a source tree on sys.path"}.get(info.how, info.how)
    commit = f", commit {info.commit[:12]}" if info.commit else ""
    return f"{source}{commit} ({'a release' if info.release else 'not a release'})"
