"""Running the asv suite on one commit: what the gate and bisection share.

Two modes:
  virtualenv  asv builds the commit in its own environment (``asv run COMMIT^!``).
  existing    inside a prebuilt image (asv cannot build there): the commit is
              checked out in a git worktree, installed into this Python with an
              install command, and run with ``asv run --python=same
              --set-commit-hash``; the benchmarks are this checkout's, for every commit.

Existing mode's default install command builds without isolation, so this Python must hold each commit's
``[build-system].requires``: that is checked before anything is installed (``harness.ci.buildreqs``), and a
commit whose requirements are missing or too old stops the run (``Unavailable``, exit 2) naming them.

``--append-samples`` makes a second run of a commit add its samples to the
first run's instead of replacing them: that is how the gate interleaves rounds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import Failed, InvalidValue, Unavailable

__all__ = ["INSTALL", "INSTALL_INTO", "MODES", "AsvProject", "in_container", "resolve_mode"]

INSTALL = "{python} -m pip install --quiet --no-deps --force-reinstall --no-build-isolation {path}"
# A commit into a folder of its own (harness.ci.interleave: two commits importable at once, one per process)
INSTALL_INTO = "{python} -m pip install --quiet --no-deps --no-build-isolation --target {target} {path}"
MODES = ("auto", "virtualenv", "existing")


def in_container() -> bool:
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists() or "HARNESS_IN_IMAGE" in os.environ


def resolve_mode(mode: str) -> str:
    """``auto`` -> ``existing`` inside a container, else ``virtualenv``."""
    if mode not in MODES:
        raise InvalidValue(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode if mode != "auto" else ("existing" if in_container() else "virtualenv")


@dataclass(frozen=True)
class AsvProject:
    """An asv project (its config file's folder) and how its commits are run.

    ``install`` (existing mode) is a shell command with ``{python}`` and ``{path}``.
    """

    config: Path
    machine: str
    mode: str = "virtualenv"
    install: str = INSTALL
    _checked: set = field(default_factory=set, init=False, repr=False, compare=False)

    @property
    def root(self) -> Path:
        return self.config.parent

    def asv(self, argv: Sequence[str], check: bool = True) -> int:
        """Runs ``asv ARGV`` with this config; its output goes to stderr."""
        cmd = [sys.executable, "-m", "asv", "--config", str(self.config), *argv]
        print("$ " + shlex.join(["asv", *argv]), file=sys.stderr, flush=True)
        code = subprocess.run(cmd, cwd=self.root, stdout=sys.stderr).returncode
        if check and code != 0:
            raise Failed(f"asv {argv[0]} failed with exit status {code}")
        return code

    def check_build_requirements(self, *commits: str) -> None:
        """Existing mode: whether this Python can build each of ``commits`` without isolation (its
        pyproject.toml's ``[build-system].requires`` installed, new enough); each commit is checked once.

        With the default install command (``--no-build-isolation``) a shortfall stops the run; with a custom
        ``install`` that passes ``--no-build-isolation`` it is a warning; other custom commands are the user's.

        Raises:
            Unavailable: the default install command, and this Python lacks a build requirement of a commit; the
                message names each one (and the version there), and the pip command that installs them.
        """
        from harness.ci import buildreqs

        if self.mode != "existing" or (self.install != INSTALL and "--no-build-isolation" not in self.install):
            return
        for commit in commits:
            if commit in self._checked:
                continue
            why = buildreqs.check(sys.executable, self.root, commit)
            if why is not None and self.install == INSTALL:
                raise Unavailable(why)
            if why is not None:
                print(f"harness: warning: {why} (the --install-command builds without isolation too)",
                      file=sys.stderr)
            self._checked.add(commit)

    def register_machine(self) -> None:
        self.asv(["machine", "--yes", "--machine", self.machine])

    def run_commit(self, commit: str, bench: Sequence[str] = (), append: bool = False,
                   extra: Sequence[str] = ()) -> int:
        """Runs the benchmarks matching ``bench`` (regexes; all when empty) on ``commit``; asv saves the results.

        Returns asv's exit status: 2 when a benchmark failed (that is in the saved results, for the caller to
        judge), 0 otherwise.

        Raises:
            Unavailable: existing mode, and this Python lacks the commit's build requirements
                (``check_build_requirements``); nothing was installed.
            RuntimeError: installing the commit failed (existing mode), or asv failed for another reason.
        """
        flags = ["--machine", self.machine, "--record-samples", "--show-stderr", *extra]
        flags += [flag for regex in bench for flag in ("--bench", regex)]
        if append:
            flags.append("--append-samples")
        if self.mode == "virtualenv":
            code = self.asv(["run", *flags, f"{commit}^!"], check=False)
        elif self.mode == "existing":
            if os.environ.get("PYTHONPATH"):  # seen: timeraw_ benchmarks timed that tree, not the installed commit
                print(f"harness: warning: PYTHONPATH is set ({os.environ['PYTHONPATH']}): benchmark processes may "
                      f"import from there rather than the commit installed ({commit[:12]})", file=sys.stderr)
            with self._installed(commit):
                code = self.asv(["run", "--python=same", "--set-commit-hash", commit, *flags], check=False)
        else:
            raise InvalidValue(f"mode must be virtualenv or existing; got {self.mode!r}")
        if code not in (0, 2):
            raise Failed(f"asv run on {commit[:12]} failed with exit status {code}")
        return code

    def _installed(self, commit: str):
        return _Installed(self, commit)

    def install_into(self, commit: str, target: Path) -> None:
        """Installs ``commit`` into the folder ``target`` (``INSTALL_INTO``, with this Python), not into this
        Python: ``harness.ci.interleave`` puts the folder first on a benchmark process' path.

        Raises:
            Unavailable: this Python lacks the commit's build requirements (as in existing mode).
            Failed: pip failed.
        """
        self.check_build_requirements(commit)
        with _Worktree(self.root, commit) as tree:
            command = INSTALL_INTO.format(python=shlex.quote(sys.executable), path=shlex.quote(str(tree)),
                                          target=shlex.quote(str(target)))
            print(f"$ {command}", file=sys.stderr, flush=True)
            done = subprocess.run(command, shell=True, cwd=self.root, stdout=sys.stderr)
            if done.returncode != 0:
                raise Failed(f"installing {commit[:12]} into {target} failed (exit {done.returncode}): {command}")


class _Worktree:
    """Context: ``commit`` checked out in a temporary git worktree of ``root``."""

    def __init__(self, root: Path, commit: str):
        self.root, self.commit = root, commit

    def __enter__(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory(prefix="harness-asv-")
        self.tree = Path(self._tmp.name) / self.commit[:12]
        subprocess.run(["git", "worktree", "add", "--detach", str(self.tree), self.commit], cwd=self.root, check=True,
                       capture_output=True)
        return self.tree

    def __exit__(self, *exc):
        subprocess.run(["git", "worktree", "remove", "--force", str(self.tree)], cwd=self.root, capture_output=True)
        self._tmp.cleanup()
        return False


class _Installed:
    """Context: ``commit`` checked out in a temporary worktree and installed into this Python."""

    def __init__(self, project: AsvProject, commit: str):
        self.project, self.commit = project, commit

    def __enter__(self):
        self.project.check_build_requirements(self.commit)
        self._worktree = _Worktree(self.project.root, self.commit)
        tree = self._worktree.__enter__()
        try:
            command = self.project.install.format(python=shlex.quote(sys.executable), path=shlex.quote(str(tree)))
            print(f"$ {command}", file=sys.stderr, flush=True)
            done = subprocess.run(command, shell=True, cwd=self.project.root, stdout=sys.stderr)
            if done.returncode != 0:
                raise Failed(f"installing {self.commit[:12]} failed (exit {done.returncode}): {command}")
        except BaseException:
            self._worktree.__exit__(None, None, None)
            raise
        return tree

    def __exit__(self, *exc):
        return self._worktree.__exit__(*exc)
