"""A commit's build requirements, checked against the Python that will install it (existing mode).

Existing mode installs each commit without build isolation (``asvrun.INSTALL``: ``pip install
--no-build-isolation``), so the installing environment itself must hold the commit's
``[build-system].requires``. Where it does not, pip fails deep in the build with the backend's own error (an
old setuptools: "``project.license`` must be valid exactly by one definition"); :func:`check` says so before
anything is installed, naming each requirement that is missing or too old and the pip command that adds them.

The installed versions are read in the installing interpreter (``importlib.metadata``, a small ``python -c``);
the specifiers and environment markers are judged here, by a minimal PEP 440 / PEP 508 reading
(``packaging`` is no dependency of harness, and may be absent from the installing environment): the operators
``==`` (and ``==X.*``), ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``~=`` and ``===`` over epochs, release
segments, pre-, post- and dev-releases; markers over the standard variables, an unknown one counting as
applying. A requirement or a version it cannot read is not held against the environment (pip judges it).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from harness.errors import Failed, InvalidValue, Unavailable
from harness.project import read_toml_text

__all__ = ["DEFAULT_REQUIRES", "Environment", "Requirement", "check", "commit_requires", "missing",
           "marker_applies", "normalize", "parse_requirement", "query", "require", "satisfies"]

DEFAULT_REQUIRES = ("setuptools>=40.8.0",)  # PEP 517's (and pip's) when a commit declares none

_QUERY = r"""
import importlib.metadata as m, json, os, platform, re, sys
found = {}
for dist in m.distributions():  # sys.path order: the first of a name is the one imported
    name = dist.metadata["Name"]
    if name:
        found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
i = sys.implementation
iv = "{0.major}.{0.minor}.{0.micro}".format(i.version)
if i.version.releaselevel != "final":
    iv += i.version.releaselevel[0] + str(i.version.serial)
markers = {"os_name": os.name, "sys_platform": sys.platform, "platform_machine": platform.machine(),
           "platform_python_implementation": platform.python_implementation(),
           "platform_release": platform.release(), "platform_system": platform.system(),
           "platform_version": platform.version(), "python_full_version": platform.python_version(),
           "python_version": ".".join(platform.python_version_tuple()[:2]), "implementation_name": i.name,
           "implementation_version": iv}
print(json.dumps({"distributions": found, "markers": markers}))
"""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Setuptools_SCM`` -> ``setuptools-scm``."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- versions (PEP 440, minimal) ---------------------------------------------------------------------------

_VERSION = re.compile(r"""
    v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
""", re.VERBOSE | re.IGNORECASE)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


@dataclass(frozen=True)
class _Version:
    epoch: int
    release: tuple[int, ...]
    pre: Optional[tuple[int, int]]
    post: Optional[int]
    dev: Optional[int]
    local: Optional[str]

    @property
    def base(self) -> tuple:
        """Epoch and release, trailing zeros dropped (``1.0`` is ``1``)."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        return self.epoch, tuple(release)

    @property
    def key(self) -> tuple:
        """The public version's sort key (the local label left out), ordered as PEP 440 orders versions."""
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple = (-1,)  # 1.0.dev1 sorts before 1.0a1
        else:
            pre = (1,) if self.pre is None else (0, *self.pre)
        post = (-1,) if self.post is None else (0, self.post)
        dev = (1,) if self.dev is None else (0, self.dev)
        return (*self.base, pre, post, dev)


def _parse_version(text: str) -> Optional[_Version]:
    """``text`` as a PEP 440 version; None where it is not one."""
    found = _VERSION.fullmatch(text.strip())
    if found is None:
        return None
    g = found.groupdict()
    pre = None if g["pre_l"] is None else (_PRE_RANK[g["pre_l"].lower()], int(g["pre_n"] or 0))
    post_n = g["post_n1"] or g["post_n2"]
    post = int(post_n or 0) if (g["post_n1"] or g["post_l"]) else None
    dev = None if g["dev_l"] is None else int(g["dev_n"] or 0)
    local = None if g["local"] is None else re.sub(r"[-_]", ".", g["local"].lower())
    return _Version(int(g["epoch"] or 0), tuple(int(part) for part in g["release"].split(".")), pre, post, dev,
                    local)


_OPERATORS = ("===", "~=", "==", "!=", "<=", ">=", "<", ">")


def _contains(version: _Version, op: str, wanted: str) -> Optional[bool]:
    """Whether ``version`` meets ``op wanted`` (pre-releases count, as for an installed version); None where
    ``wanted`` is not a version."""
    prefix = op in ("==", "!=") and wanted.endswith(".*")
    spec = _parse_version(wanted[:-2] if prefix else wanted)
    if spec is None:
        return None
    if op in ("==", "!="):
        if prefix:
            width = len(spec.release)
            padded = version.release + (0,) * max(0, width - len(version.release))
            equal = (version.epoch, padded[:width]) == (spec.epoch, spec.release)
            if spec.pre is not None or spec.post is not None or spec.dev is not None:
                equal = equal and (version.pre, version.post, version.dev) == (spec.pre, spec.post, spec.dev)
        else:
            equal = version.key == spec.key and (spec.local is None or version.local == spec.local)
        return equal if op == "==" else not equal
    if op == "~=":
        if len(spec.release) < 2:
            return None
        stem = ".".join(str(part) for part in spec.release[:-1]) + ".*"
        return version.key >= spec.key and bool(_contains(version, "==", f"{spec.epoch}!{stem}"))
    if op == ">=":
        return version.key >= spec.key
    if op == "<=":
        return version.key <= spec.key
    if version.key == spec.key or (version.key < spec.key) != (op == "<"):
        return False
    if version.base != spec.base:
        return True
    if op == "<":  # <V is <V.dev0 unless V is a pre- or dev-release (1.0a1 < 1.0 is False)
        return spec.pre is not None or spec.dev is not None or version.key < replace(spec, dev=0).key
    # ">": not a post-release of the version named (1.0.post1 > 1.0 is False), unless that is a dev or post-release
    return spec.dev is not None or spec.post is not None or version.pre != spec.pre


def satisfies(version: str, specifiers: tuple[tuple[str, str], ...]) -> Optional[bool]:
    """Whether the installed ``version`` meets every ``(operator, version)`` of ``specifiers``; None where that
    cannot be told (``version`` or a specifier's version is not PEP 440).

    Examples:
        >>> satisfies("65.5.0", ((">=", "77"),)), satisfies("80.9.0", ((">=", "77"), ("<", "81")))
        (False, True)
        >>> satisfies("8.1.1", (("~=", "8.0"),)), satisfies("9.0", (("~=", "8.0"),)), satisfies("2.0rc1", (("<", "2"),))
        (True, False, False)
    """
    if not specifiers:
        return True
    if any(op == "===" for op, _ in specifiers):
        if not all(op == "===" for op, _ in specifiers):
            return None
        return all(version.strip().lower() == wanted.strip().lower() for _, wanted in specifiers)
    parsed = _parse_version(version)
    if parsed is None:
        return None
    verdicts = [_contains(parsed, op, wanted) for op, wanted in specifiers]
    if False in verdicts:
        return False
    return None if None in verdicts else True


# --- requirements and markers (PEP 508, minimal) ------------------------------------------------------------

_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[([^\]]*)\])?\s*")
_SPECIFIER = re.compile(r"\s*(===|~=|==|!=|<=|>=|<|>)\s*([A-Za-z0-9][^\s,;()]*)\s*")


@dataclass(frozen=True)
class Requirement:
    """One requirement string: ``text`` as written without its marker, the normalized ``name``, its
    ``(operator, version)`` specifiers, its environment ``marker`` (None when it has none)."""

    text: str
    name: str
    specifiers: tuple[tuple[str, str], ...]
    marker: Optional[str]


def parse_requirement(text: str) -> Requirement:
    """``setuptools-scm[toml] >= 8 ; python_version >= "3.9"`` as a :class:`Requirement` (a URL requirement,
    ``name @ URL``, asks for the name alone).

    Raises:
        InvalidValue: not a requirement, naming it.
    """
    body, _, marker = text.partition(";")
    found = _NAME.match(body)
    if not found:
        raise InvalidValue(f"not a PEP 508 requirement: {text!r}")
    rest = body[found.end():].strip()
    specifiers: list[tuple[str, str]] = []
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    for part in rest.split(",") if rest and not rest.startswith("@") else ():
        spec = _SPECIFIER.fullmatch(part)
        if spec is None:
            raise InvalidValue(f"not a PEP 508 requirement: {text!r} (at {part.strip()!r})")
        specifiers.append((spec.group(1), spec.group(2)))
    return Requirement(body.strip(), normalize(found.group(1)), tuple(specifiers), marker.strip() or None)


_TOKEN = re.compile(r"""\s*(?:(?P<str>'[^']*'|"[^"]*")|(?P<op>===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b)
                    |(?P<paren>[()])|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))""", re.VERBOSE)


class _Unknown(Exception):
    """A marker this reading cannot evaluate (an unknown variable, a syntax it does not know)."""


def _marker_tokens(marker: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while marker[at:].strip():
        found = _TOKEN.match(marker, at)
        if found is None:
            raise _Unknown(marker)
        kind = found.lastgroup or ""
        tokens.append((kind, found.group(kind)))
        at = found.end()
    return tokens


def marker_applies(marker: Optional[str], env: dict[str, str]) -> bool:
    """Whether ``marker`` holds in ``env`` (the installing interpreter's marker values); True where it has
    none or cannot be read (an unknown variable such as ``extra``: the requirement is checked anyway).

    Examples:
        >>> env = {"python_version": "3.11", "sys_platform": "linux"}
        >>> marker_applies("python_version < '3.11'", env), marker_applies("python_version >= '3.8'", env)
        (False, True)
        >>> marker_applies("sys_platform == 'win32' or (python_version > '3.9' and extra == 'x')", env)
        True
    """
    if not marker:
        return True
    try:
        tokens = _marker_tokens(marker)
        value, rest = _marker_or(tokens, env)
    except (_Unknown, IndexError, ValueError):  # ValueError: too few tokens for a comparison
        return True
    return value if not rest else True


def _marker_or(tokens, env):
    value, tokens = _marker_and(tokens, env)
    while tokens and tokens[0] == ("word", "or"):
        right, tokens = _marker_and(tokens[1:], env)
        value = value or right
    return value, tokens


def _marker_and(tokens, env):
    value, tokens = _marker_atom(tokens, env)
    while tokens and tokens[0] == ("word", "and"):
        right, tokens = _marker_atom(tokens[1:], env)
        value = value and right
    return value, tokens


def _marker_atom(tokens, env):
    if tokens[0] == ("paren", "("):
        value, tokens = _marker_or(tokens[1:], env)
        if not tokens or tokens[0] != ("paren", ")"):
            raise _Unknown("unbalanced parentheses")
        return value, tokens[1:]
    (left_kind, left), (op_kind, op), (right_kind, right) = tokens[:3]
    if op_kind != "op":
        raise _Unknown(op)
    names = [(left_kind, left), (right_kind, right)]
    variable = next((text for kind, text in names if kind == "word"), None)
    lhs, rhs = (_marker_value(kind, text, env) for kind, text in names)
    op = " ".join(op.split())
    if op in ("in", "not in"):
        return (lhs in rhs) == (op == "in"), tokens[3:]
    if variable and variable.endswith("version") and left_kind == "word":
        verdict = satisfies(lhs, ((op, rhs),))
        if verdict is not None:
            return verdict, tokens[3:]
    compare = {"==": lhs == rhs, "===": lhs == rhs, "!=": lhs != rhs, "<": lhs < rhs, "<=": lhs <= rhs,
               ">": lhs > rhs, ">=": lhs >= rhs}
    if op not in compare:
        raise _Unknown(op)
    return compare[op], tokens[3:]


def _marker_value(kind: str, text: str, env: dict[str, str]) -> str:
    if kind == "str":
        return text[1:-1]
    if kind == "word" and text in env:
        return env[text]
    raise _Unknown(text)


# --- a commit's requirements, an environment, the check -----------------------------------------------------


def commit_requires(repo: Path | str, commit: str) -> Optional[list[str]]:
    """``commit``'s ``[build-system].requires`` (its top-level pyproject.toml, read from git in ``repo``);
    :data:`DEFAULT_REQUIRES` where it has no pyproject.toml or no ``[build-system]``; None where they cannot be
    read (pip will say why).

    Raises:
        InvalidValue: that pyproject.toml is not valid TOML, naming the commit.
    """
    shown = subprocess.run(["git", "show", f"{commit}:pyproject.toml"], cwd=repo, capture_output=True, text=True)
    if shown.returncode != 0:
        return list(DEFAULT_REQUIRES)
    table = read_toml_text(shown.stdout, Path(f"{commit[:12]}:pyproject.toml")).get("build-system")
    if table is None:
        return list(DEFAULT_REQUIRES)
    requires = table.get("requires") if isinstance(table, dict) else None
    if not isinstance(requires, list) or not all(isinstance(item, str) for item in requires):
        return None
    return requires


@dataclass(frozen=True)
class Environment:
    """An interpreter's installed distributions (normalized name -> version) and its marker values."""

    python: str
    distributions: dict[str, str]
    markers: dict[str, str]


def query(python: str) -> Environment:
    """What ``python`` has installed, read by ``python`` itself (``importlib.metadata``).

    Raises:
        Failed: ``python`` did not answer.
    """
    try:
        done = subprocess.run([python, "-c", _QUERY], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Failed(f"cannot read the installed distributions of {python}: {err}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failed(f"cannot read the installed distributions of {python} (exit {done.returncode}): {last}")
    found = json.loads(done.stdout)
    return Environment(python, found["distributions"], found["markers"])


def missing(requires: list[str], env: Environment) -> list[tuple[Requirement, Optional[str]]]:
    """The requirements of ``requires`` whose marker applies in ``env`` and that ``env`` does not meet, each with
    the version it has (None: not installed). A requirement or version that cannot be read is left to pip."""
    unmet = []
    for text in requires:
        try:
            requirement = parse_requirement(text)
        except InvalidValue:
            continue
        if not marker_applies(requirement.marker, env.markers):
            continue
        has = env.distributions.get(requirement.name)
        if has is None or satisfies(has, requirement.specifiers) is False:
            unmet.append((requirement, has))
    return unmet


def check(python: str, repo: Path | str, commit: str) -> Optional[str]:
    """Why ``python``'s environment cannot build ``commit`` without isolation; None when it can (or when that
    cannot be told: then pip judges).

    The message names every requirement missing or too old, the version there, and the pip command that adds
    them: ``the environment /venv/bin/python lacks the build requirements of 1a2b3c4d5e6f (pyproject.toml
    [build-system].requires): setuptools>=77 (has 65.5.0), setuptools-scm (missing); install them
    (/venv/bin/python -m pip install 'setuptools>=77' setuptools-scm) or use --mode virtualenv``.

    Raises:
        InvalidValue: the commit's pyproject.toml is not valid TOML.
        Failed: ``python`` did not answer.
    """
    requires = commit_requires(repo, commit)
    if not requires:
        return None
    unmet = missing(requires, query(python))
    if not unmet:
        return None
    listed = ", ".join(f"{req.text} ({'missing' if has is None else f'has {has}'})" for req, has in unmet)
    command = shlex.join([python, "-m", "pip", "install", *(req.text for req, _ in unmet)])
    return (f"the environment {python} lacks the build requirements of {commit[:12]} (pyproject.toml "
            f"[build-system].requires): {listed}; install them ({command}) or use --mode virtualenv")


def require(python: str, repo: Path | str, commit: str) -> None:
    """:func:`check`, raising where the environment lacks something.

    Raises:
        Unavailable: the message of :func:`check` (exit 2: the environment, not the commit, is at fault).
    """
    why = check(python, repo, commit)
    if why is not None:
        raise Unavailable(why)
