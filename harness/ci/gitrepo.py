"""The git queries of the gate, bisection and ``harness regressions``: commits, their order, their subjects."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.errors import InvalidValue

__all__ = ["rev_parse", "find_commit", "is_ancestor", "default_branch", "first_parent", "commits_between",
           "subject"]


def _git(repo: Path | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def find_commit(repo: Path | str, ref: str) -> str | None:
    """The full hash of commit ``ref`` in ``repo``, or None where it is not one (or ``repo`` is no repository)."""
    done = _git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
    return done.stdout.strip() if done.returncode == 0 else None


def rev_parse(repo: Path | str, ref: str) -> str:
    """The full hash of commit ``ref`` in ``repo``.

    Raises:
        ValueError: ``ref`` is not a commit there.
    """
    found = find_commit(repo, ref)
    if found is None:
        raise InvalidValue(f"not a commit in {repo}: {ref!r}")
    return found


def is_ancestor(repo: Path | str, older: str, newer: str) -> bool:
    """Whether ``older`` is ``newer`` or one of its ancestors."""
    return _git(repo, "merge-base", "--is-ancestor", older, newer).returncode == 0


def default_branch(repo: Path | str) -> str:
    """``main`` where the repository has that branch, else ``HEAD``."""
    return "main" if _git(repo, "rev-parse", "--verify", "-q", "refs/heads/main").returncode == 0 else "HEAD"


def first_parent(repo: Path | str, branch: str) -> list[str]:
    """The commits of ``branch``'s first-parent line, oldest first.

    Raises:
        ValueError: ``repo`` is no git repository or ``branch`` no ref there.
    """
    done = _git(repo, "rev-list", "--first-parent", "--reverse", branch, "--")
    if done.returncode != 0:
        raise InvalidValue(f"cannot list the commits of branch {branch!r} in {str(repo)!r}: "
                           f"{done.stderr.strip() or 'not a git repository'}")
    return done.stdout.split()


def commits_between(repo: Path | str, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to and including ``bad``, oldest first, along first parents.

    Raises:
        ValueError: ``good`` is not an ancestor of ``bad``.
    """
    if not is_ancestor(repo, good, bad):
        raise InvalidValue(f"{good[:12]} is not an ancestor of {bad[:12]}: nothing to search between them")
    return first_parent(repo, f"{good}..{bad}")


def subject(repo: Path | str, commit: str) -> str:
    """The first line of ``commit``'s message."""
    return _git(repo, "show", "-s", "--format=%s", commit).stdout.strip()
