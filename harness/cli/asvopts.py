"""Options ``harness bench-compare`` and ``harness bisect`` share: which asv project, machine and mode."""

from __future__ import annotations

import socket
from pathlib import Path

from harness.errors import InvalidValue
from harness.extras import require

__all__ = ["add_asv_options", "asv_project"]


def add_asv_options(p) -> None:
    from harness.ci.asvrun import INSTALL, MODES

    p.add_argument("--mode", choices=list(MODES), default="auto",
                   help="virtualenv: asv builds each commit; existing: each commit is installed into this Python "
                        "(inside a prebuilt image); auto (default): existing inside a container")
    p.add_argument("--config", default="asv.conf.json", help="asv config file (default asv.conf.json)")
    p.add_argument("--machine", default=None, help="asv machine name (default: this host's name)")
    p.add_argument("--install-command", default=INSTALL, metavar="CMD",
                   help="existing mode: how a commit is installed, with {python} and {path} (default: pip, "
                        "no dependencies)")


def asv_project(args, command: str):
    """The ``AsvProject`` the options name.

    Raises:
        ValueError: no config file at ``--config``.
    """
    from harness.ci.asvrun import AsvProject, resolve_mode

    config = Path(args.config).resolve()
    if not config.is_file():
        raise InvalidValue(f"no asv config at {config}; run from the repository root or pass --config")
    require("asv", package="asv", extra="bench", purpose=f"harness {command}")
    return AsvProject(config, args.machine or socket.gethostname(), resolve_mode(args.mode), args.install_command)
