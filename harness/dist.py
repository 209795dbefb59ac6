"""How this harness was installed: its version, whether that is a release, its commit and where it came from.

``harness init`` writes a project's CI files that install harness again on other machines; they should install
this very harness. :func:`default_requirement` gives the pip requirement that does: the release from the package
index, or the git commit, archive or checkout this one came from, with a one-line reason for the file's comment.

The facts come from the installed distribution's metadata (``keras-harness``): its version, which setuptools-scm
took from the git tag at build time (``0.2.0`` at the tag ``v0.2.0``; ``0.2.dev3+g1a2b3c4`` three commits after
``v0.1.0``, ``.dYYYYMMDD`` added for a dirty tree), and the ``direct_url.json`` that installers write for anything
not taken from an index (PEP 610). Standard library only; git is asked only about a checkout harness runs from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["DISTRIBUTION", "UNKNOWN_VERSION", "Installed", "installed", "default_requirement", "git"]

DISTRIBUTION = "keras-harness"
UNKNOWN_VERSION = "0+unknown"  # harness.__version__ of a source tree no distribution describes
_PACKAGE = Path(__file__).resolve().parent  # this harness package (…/harness)
_GIT_TIMEOUT_S = 10
_NOT_RELEASE = re.compile(r"(?:\.?dev\d*|\+)", re.IGNORECASE)  # a development version or a local part
_SCM_NODE = re.compile(r"g([0-9a-f]{4,40})")  # setuptools-scm's local part: +g<sha>[.dYYYYMMDD]
_HEX40 = re.compile(r"[0-9a-f]{40}")
_SCP_LIKE = re.compile(r"^(?P<user>[\w.-]+@)?(?P<host>[\w.-]+):(?P<path>(?!/)[^\s]+)$")  # git@host:owner/repo.git
_NETWORK_SCHEMES = ("https", "http", "ssh", "git")
HOW = ("index", "vcs", "archive", "editable", "dir", "source")


@dataclass(frozen=True)
class Installed:
    """This harness as installed.

    Attributes:
        version: the installed keras-harness version (``0+unknown`` for a source tree never installed).
        release: whether ``version`` is a tag's version: no ``.dev`` part and no local ``+`` part.
        commit: the 40-hex commit it was built or installed from where known: a VCS install's ``commit_id``
            (PEP 610); else setuptools-scm's ``+g<sha>`` expanded by git where the source directory is a
            checkout (a release's ``v<version>`` tag there, a source tree's HEAD); else ``None``.
        url: where it was installed from (``direct_url.json``'s url: a repository for ``vcs``, a file or URL for
            ``archive``, ``file://`` of the directory for ``editable`` and ``dir``); ``None`` from the index and
            for a source tree. A VCS other than git keeps its ``<vcs>+`` prefix.
        how: ``index``, ``vcs``, ``archive``, ``editable``, ``dir`` or ``source`` (running from a tree on
            ``sys.path`` that no installed distribution owns).
    """

    version: str
    release: bool
    commit: str | None
    url: str | None
    how: str


def installed() -> Installed:
    """What the metadata says about the keras-harness distribution that owns this ``harness`` package."""
    for dist in _candidates():
        direct = _direct_url(dist)
        if not _owns_this_package(dist, direct):
            continue
        version = dist.version
        how, url = _how(direct)
        if how == "vcs":
            commit = (direct or {}).get("vcs_info", {}).get("commit_id")
            commit = commit if isinstance(commit, str) and _HEX40.fullmatch(commit) else None
        else:
            source = _path_of(url) if how in ("editable", "dir") else None
            commit = _commit_of_version(version, source) if source is not None else None
        return Installed(version, is_release(version), commit, url, how)
    try:  # as harness.__version__: whatever metadata sys.path has (a tree's egg-info), else 0+unknown
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = UNKNOWN_VERSION
    commit = _commit_of_version(version, _PACKAGE.parent) or git(["rev-parse", "--verify", "HEAD"], _PACKAGE.parent)
    return Installed(version, is_release(version), commit, None, "source")


def is_release(version: str) -> bool:
    """``True`` for a tag's version (``1.2.0``, ``1.2.0rc1``); ``False`` with a ``.dev`` or local ``+`` part."""
    return version != UNKNOWN_VERSION and _NOT_RELEASE.search(version) is None


def default_requirement(info: Installed | None = None) -> tuple[str, str]:
    """The pip requirement that installs this harness elsewhere, and a one-line reason for a generated file.

    A release from the index pins that release; a VCS install its repository at its commit; an archive its URL;
    an editable or directory install, or a source tree, the checkout's git URL at its HEAD commit (``origin``
    where that is a network URL, else ``git+file://`` of the checkout, which only this machine can reach).

    Args:
        info: what :func:`installed` returned (asked when ``None``).

    Returns:
        ``(requirement, reason)``, e.g. ``("keras-harness==0.2.0", "the installed release")``.
    """
    info = installed() if info is None else info
    version = info.version
    if info.how == "index":
        if info.release:
            return f"{DISTRIBUTION}=={version}", "the installed release"
        return f"{DISTRIBUTION}=={version}", f"the installed pre-release {version} from the package index"
    if info.how == "vcs" and info.url:
        url = info.url if _has_vcs_prefix(info.url) else f"git+{info.url}"
        pin = f"@{info.commit}" if info.commit else ""
        what = f"release {version}" if info.release else f"{version}, not a release"
        at = f"commit {info.commit[:12]}" if info.commit else "an unknown commit"
        return f"{DISTRIBUTION} @ {url}{pin}", f"the repository this harness was installed from, at {at} ({what})"
    if info.how == "archive" and info.url:
        reason = f"the archive this harness {version} was installed from"
        if urlsplit(info.url).scheme == "file":
            reason += "; a local file, which only this machine can install: pin a release or a git URL for CI"
        return f"{DISTRIBUTION} @ {info.url}", reason
    return _checkout_requirement(info)


def _checkout_requirement(info: Installed) -> tuple[str, str]:
    where = (_path_of(info.url) if info.url else None) or _PACKAGE.parent
    top = git(["rev-parse", "--show-toplevel"], where)
    head = git(["rev-parse", "--verify", "HEAD"], where) if top else None
    if top is None or head is None:
        return (f"{DISTRIBUTION} @ {where.as_uri()}",
                f"harness {info.version} from {where}, which is not a git checkout with a commit: "
                "only this machine can install it (not a release)")
    origin = _network_url(git(["remote", "get-url", "origin"], where))
    url = f"git+{origin}" if origin else f"git+{Path(top).as_uri()}"
    sub = Path(where).resolve().relative_to(Path(top).resolve()).as_posix()
    fragment = "" if sub == "." else f"#subdirectory={sub}"
    dirty = bool(git(["status", "--porcelain", "--untracked-files=no"], where))
    reason = (f"not a release: harness {info.version} runs from the checkout {top} ({info.how}), pinned to its "
              f"HEAD {head[:12]}" + (" (its uncommitted changes are not in it)" if dirty else "")
              + ("; push it to origin" if origin else "; a file URL, which only this machine can reach"))
    return f"{DISTRIBUTION} @ {url}@{head}{fragment}", reason


def _candidates() -> list[Any]:
    """Every keras-harness distribution on ``sys.path``, in its order (a checkout's egg-info included)."""
    found = []
    for dist in metadata.distributions(name=DISTRIBUTION):
        name = dist.metadata["Name"] if dist.metadata is not None else None
        if name and re.sub(r"[-_.]+", "-", name).lower() == DISTRIBUTION:
            found.append(dist)
    return found


def _direct_url(dist: Any) -> dict[str, Any] | None:
    try:
        text = dist.read_text("direct_url.json")
        doc = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("url"), str) else None


def _owns_this_package(dist: Any, direct: dict[str, Any] | None) -> bool:
    """Whether ``dist`` installed the ``harness`` package this module belongs to.

    An editable install owns the directory its ``direct_url.json`` names; any other install the files it put
    next to its metadata, and only an installer's metadata counts (a wheel's ``WHEEL`` file): the egg-info a
    build leaves in a source tree describes that tree's last build, not an install.
    """
    if direct is not None and direct.get("dir_info", {}).get("editable"):
        source = _path_of(direct["url"])
        return source is not None and _same(source / "harness", _PACKAGE)
    if dist.read_text("WHEEL") is None:
        return False
    return _same(Path(str(dist.locate_file("harness"))), _PACKAGE)


def _how(direct: dict[str, Any] | None) -> tuple[str, str | None]:
    if direct is None:
        return "index", None
    url = direct["url"]
    if isinstance(direct.get("vcs_info"), dict):
        vcs = direct["vcs_info"].get("vcs", "git")
        return "vcs", url if vcs == "git" or _has_vcs_prefix(url) else f"{vcs}+{url}"
    if isinstance(direct.get("archive_info"), dict):
        return "archive", url
    if isinstance(direct.get("dir_info"), dict):
        return ("editable" if direct["dir_info"].get("editable") else "dir"), url
    return "archive", url  # PEP 610 requires one of the three; a URL nonetheless


def _commit_of_version(version: str, source: Path | None) -> str | None:
    """The 40-hex commit ``version`` names in the checkout ``source``: setuptools-scm's ``+g<sha>``, or a
    release's ``v<version>`` tag; ``None`` where there is neither or ``source`` is no checkout that has it."""
    if source is None:
        return None
    local = version.partition("+")[2]
    node = _SCM_NODE.fullmatch(local.split(".")[0]) if local else None
    if node:
        return git(["rev-parse", "--verify", "--quiet", f"{node.group(1)}^{{commit}}"], source)
    if is_release(version):
        return git(["rev-parse", "--verify", "--quiet", f"refs/tags/v{version}^{{commit}}"], source)
    return None


def _path_of(url: str | None) -> Path | None:
    """The local path of a ``file:`` URL, else ``None``."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parts.path))


def _network_url(url: str | None) -> str | None:
    """A remote URL pip can clone on another machine (https, ssh, git; scp-like ``git@host:path`` as ssh)."""
    if not url:
        return None
    if urlsplit(url).scheme in _NETWORK_SCHEMES and urlsplit(url).netloc:
        return url
    scp = _SCP_LIKE.match(url)
    if scp and "/" not in scp["host"] and not Path(url).exists():
        return f"ssh://{scp['user'] or ''}{scp['host']}/{scp['path']}"
    return None


def _has_vcs_prefix(url: str) -> bool:
    return re.match(r"^(git|hg|svn|bzr)\+", url) is not None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def git(args: list[str], cwd: Path, timeout: float = _GIT_TIMEOUT_S) -> str | None:
    """``git args`` in ``cwd``: its output, stripped (``""`` where it printed nothing: ``git status --porcelain`` of
    a clean tree), or ``None`` (no git, not a checkout, a failed or too slow command)."""
    # GIT_OPTIONAL_LOCKS=0: `git status` takes no index.lock from under someone else's git command.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
