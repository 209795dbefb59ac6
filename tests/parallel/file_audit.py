"""Which files a worker process writes: an audit hook (stdlib only; imported by the multi-worker worker scripts)."""

import os
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def audit_writes(root: str) -> list:
    """Starts recording this process' file writes under ``root``: ``[event, path relative to root]`` each."""
    root = os.path.realpath(root)
    seen: list = []

    def under(path) -> str | None:
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str):
            return None
        full = os.path.realpath(path)
        return os.path.relpath(full, root) if full.startswith(root + os.sep) else None

    def hook(event, args):
        paths = []
        if event == "open":
            path, mode, flags = args
            if (mode and any(c in mode for c in "wax+")) or (not mode and flags and flags & WRITE_FLAGS):
                paths = [path]
        elif event in ("os.rename", "os.remove", "os.mkdir", "os.rmdir", "shutil.rmtree", "shutil.copyfile"):
            paths = [args[1]] if event in ("os.rename", "shutil.copyfile") else [args[0]]
        for path in paths:
            relative = under(path)
            if relative is not None and [event, relative] not in seen:
                seen.append([event, relative])

    sys.addaudithook(hook)
    return seen
