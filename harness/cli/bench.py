"""``harness bench-compare BASE HEAD``: the asv regression gate, with an exit status you can trust.

Runs the asv suite on two commits and judges head against base
(``harness.ci.benchgate``): exit 1 when a benchmark is worse by more than
``--factor`` and statistically different (samples/s counted higher-is-better),
2 when a benchmark errors on head, else 0. Prints a Markdown summary for a
pull-request comment (``--markdown FILE`` also writes it).

Two modes:
  virtualenv  ``asv continuous`` builds both commits in asv's own environments.
  existing    inside a prebuilt image (asv cannot run ``continuous`` there): each
              commit is checked out in a git worktree, installed into this
              Python (``--install-command``), and run with
              ``asv run --python=same --set-commit-hash``; the benchmarks are
              this checkout's, for both commits.
``auto`` (default) picks existing inside a container, else virtualenv.

Examples:
    harness bench-compare main HEAD
    harness bench-compare origin/main HEAD --mode existing --bench throughput --markdown summary.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.extras import require

__all__ = ["add_parser", "run"]

_INSTALL = "{python} -m pip install --quiet --no-deps --force-reinstall --no-build-isolation {path}"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench-compare", help="asv regression gate: base vs head, exit 1 on a regression",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="base commit (branch, tag or hash)")
    p.add_argument("head", help="head commit")
    p.add_argument("--factor", type=float, default=1.1, help="tolerated slow-down ratio (default 1.1)")
    p.add_argument("--mode", choices=["auto", "virtualenv", "existing"], default="auto")
    p.add_argument("--bench", action="append", metavar="REGEX", help="only benchmarks matching (repeatable)")
    p.add_argument("--config", default="asv.conf.json", help="asv config file (default asv.conf.json)")
    p.add_argument("--machine", default=None, help="asv machine name (default: this host's name)")
    p.add_argument("--install-command", default=_INSTALL, metavar="CMD",
                   help="existing mode: how a commit is installed, with {python} and {path} (default: pip, "
                        "no dependencies)")
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown summary here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of Markdown")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci import benchgate

    if not args.factor > 1:
        raise ValueError(f"--factor must be > 1; got {args.factor:g}")
    config = Path(args.config).resolve()
    if not config.is_file():
        raise ValueError(f"no asv config at {config}; run from the repository root or pass --config")
    require("asv", package="asv", extra="bench", purpose="harness bench-compare")
    root = config.parent
    base, head = _rev_parse(root, args.base), _rev_parse(root, args.head)
    machine = args.machine or socket.gethostname()
    mode = args.mode if args.mode != "auto" else ("existing" if _in_container() else "virtualenv")
    _asv(root, ["machine", "--yes", "--machine", machine], config)
    bench = [flag for regex in args.bench or [] for flag in ("--bench", regex)]
    common = ["--machine", machine, "--record-samples", "--show-stderr", *bench]
    if mode == "virtualenv":
        _asv(root, ["continuous", "--factor", str(args.factor), *common, base, head], config, check=False)
    else:
        for commit in (base, head):
            _run_existing(root, config, commit, common, args.install_command)
    try:
        rows = benchgate.load_rows(config, machine, base, head, args.factor)
    except ValueError as err:
        print(f"harness bench-compare: {err}", file=sys.stderr)
        return 2
    text = benchgate.markdown(rows, base, head, args.factor)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        json.dump({"base": base, "head": head, "factor": args.factor, "mode": mode,
                   "status": benchgate.exit_status(rows), "rows": [r.to_json() for r in rows]}, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return benchgate.exit_status(rows)


def _rev_parse(root: Path, name: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--verify", f"{name}^{{commit}}"], cwd=root, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise ValueError(f"not a commit in {root}: {name!r} ({done.stderr.strip()})")
    return done.stdout.strip()


def _in_container() -> bool:
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists() or "HARNESS_IN_IMAGE" in os.environ


def _asv(root: Path, argv: list[str], config: Path, check: bool = True) -> int:
    cmd = [sys.executable, "-m", "asv", "--config", str(config), *argv]
    print("$ " + shlex.join(["asv", *argv]), file=sys.stderr, flush=True)
    code = subprocess.run(cmd, cwd=root, stdout=sys.stderr).returncode
    if check and code != 0:
        raise RuntimeError(f"asv {argv[0]} failed with exit status {code}")
    return code


def _run_existing(root: Path, config: Path, commit: str, common: list[str], install: str) -> None:
    """Installs ``commit`` into this Python from a worktree and runs the suite against it."""
    with tempfile.TemporaryDirectory(prefix="harness-gate-") as tmp:
        tree = Path(tmp) / commit[:12]
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=root, check=True,
                       capture_output=True)
        try:
            command = install.format(python=shlex.quote(sys.executable), path=shlex.quote(str(tree)))
            print(f"$ {command}", file=sys.stderr, flush=True)
            done = subprocess.run(command, shell=True, cwd=root, stdout=sys.stderr)
            if done.returncode != 0:
                raise RuntimeError(f"installing {commit[:12]} failed (exit {done.returncode}): {command}")
            # A failing benchmark makes asv exit 2; the gate reads that from the saved results.
            _asv(root, ["run", "--python=same", "--set-commit-hash", commit, *common], config, check=False)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True)
