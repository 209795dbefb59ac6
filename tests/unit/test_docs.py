"""Every repository path the code and the docs name exists.

A review once found a design document cited in five files that the repository did not have. A
reference is a path that starts with one of the repository's top-level directories
(``harness/bench/runner.py``, ``docs/design.md``, ``tests/unit/``, and without an extension
only in backticks: ``docker/Dockerfile``) or an upper-case Markdown name (``README.md``). Left
alone: URLs, absolute and home paths (``~/.cache/...``), paths under anything else (another
project's ``keras/src/...``), places git ignores (generated ones: ``docker/wheelhouse/``),
dotted module names, bare file names (``split.py``; ``test_GPUs.py`` of seed 000, see
docs/background.md), the files ``harness init`` writes into another repository
(``generated_paths``: their names are references into that repository), and lines marked
``not-a-reference`` (files of a throw-away repository a test builds).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".ini", ".yml", ".yaml", ".hcl", ".cfg", ".json", ".sh"}
TEXT_NAMES = {"Dockerfile"}
# A line with this word names files that are not this repository's.
OPT_OUT = "not-a-reference"

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
# Not after a character that would make it part of a longer path, URL, glob or placeholder.
_BEFORE = r"(?<![\w./~:<>{}*$@\\-])"


def _patterns(tops: set[str]) -> list[re.Pattern[str]]:
    top = "|".join(re.escape(t) for t in sorted(tops, key=len, reverse=True))
    return [
        # anywhere: a file with an extension, or a directory with its trailing slash
        re.compile(_BEFORE + rf"((?:{top})/(?:[\w.-]+/)*(?:[\w-]+\.[A-Za-z0-9]+)?)(?![\w/-])"),
        # a whole backticked path without an extension: `docker/Dockerfile`, `harness/bench`
        re.compile(rf"`((?:{top})/[\w./-]+)`"),
        # an upper-case Markdown name: README.md
        re.compile(_BEFORE + r"([A-Z][A-Z0-9_-]*\.md)\b"),
    ]


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)


def repository_files(root: Path = ROOT) -> list[Path]:
    """The files git tracks or would track (untracked but not ignored) that exist now."""
    out = _git("ls-files", "--cached", "--others", "--exclude-standard", root=root).stdout
    return sorted(p for p in (root / line for line in out.splitlines()) if p.is_file())


def is_text(path: Path) -> bool:
    return path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES


def top_level_entries(files: list[Path], root: Path = ROOT) -> set[str]:
    """First path components of the repository's files that are directories: ``harness``, ``.github``."""
    return {p.relative_to(root).parts[0] for p in files if len(p.relative_to(root).parts) > 1}


def is_ignored(ref: str, root: Path = ROOT) -> bool:
    """Whether git ignores ``ref``: a generated place (``docker/wheelhouse/``), made when needed."""
    paths = (ref,) if ref.endswith("/") else (ref, ref + "/")  # `dir/` patterns match directories only
    return any(_git("check-ignore", "-q", "--no-index", p, root=root).returncode == 0 for p in paths)


def generated_paths() -> set[str]:
    """The paths ``harness init`` writes into a user's repository (rendered here, without writing)."""
    from harness.cli import _parser
    from harness.cli.init import render

    args = _parser().parse_args(["init", "--model", "pkg.models:build", "--harness-requirement", "keras-harness",
                                 "--branch", "main", "--no-measure"])
    files, _ = render(ROOT, args)
    return {*files, "tox.ini"}


def dangling_references(text: str, where: Path, tops: set[str], root: Path = ROOT,
                        generated: frozenset[str] = frozenset()) -> list[str]:
    """The paths named in ``text`` (the contents of the file ``where``) that exist neither
    under ``root`` nor next to ``where`` and are not ``generated``, in the order they appear."""
    lines = (line for line in text.splitlines() if OPT_OUT not in line)
    text = _URL.sub(" ", "\n".join(lines))
    found = []
    for pattern in _patterns(tops):
        for match in pattern.finditer(text):
            ref = match.group(1).rstrip(".-")
            if ref in generated:
                continue
            if not ((root / ref).exists() or (where.parent / ref).exists() or is_ignored(ref, root)):
                found.append((match.start(1), ref))
    return [ref for _, ref in sorted(set(found))]  # a backticked path matches two patterns


@pytest.fixture(scope="module")
def files():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git work tree to list the repository's files")
    return repository_files()


def test_every_referenced_path_exists(files):
    tops = top_level_entries(files)
    assert {"harness", "tests", "docs"} <= tops
    found = {}
    generated = frozenset(generated_paths())
    assert "tests/test_harness_equivalence.py" in generated  # not-a-reference
    for path in filter(is_text, files):
        missing = dangling_references(path.read_text(encoding="utf-8", errors="replace"), path, tops,
                                      generated=generated)
        if missing:
            found[str(path.relative_to(ROOT))] = sorted(set(missing))
    assert found == {}, f"references to files that do not exist: {found}"


def test_the_checker_reports_a_missing_file():
    # The names are split in two so that this file itself names nothing missing.
    gone, nowhere = "DESIGN" + ".md", "harness/bench/" + "nowhere.py"
    no_extension = "`harness/" + "gone`"
    text = (f"See {gone}, 'Emulated devices'. The runner moved to `{nowhere}`; see also tests/"
            f"unit/, docs/design.md and {no_extension}.\n")
    assert dangling_references(text, ROOT / "harness" / "emulate.py", {"harness", "tests", "docs"}) == [
        gone, nowhere, "harness/" + "gone"]


def test_the_checker_leaves_urls_home_paths_other_projects_and_module_names_alone():
    text = (
        "https://github.com/jinkos/multi-gpus/blob/master/tests/test_GPUs.py\n"
        "~/.cache/harness/results/run.json and /tmp/harness/x.py\n"
        "keras/src/distribution/distribution_lib.py, .asv/results/benchmarks.json\n"
        "harness.bench.runner.run_one, `split.py`, test_GPUs.py, `harness/cli/<name>.py`,\n"
        "tests/images/*, {root}/harness/x.py, README.md and harness/bench/runner.py.\n"
        "harness/stock ratios (a ratio, not a path), docker/wheelhouse/ (git ignores it: generated)\n"
        "harness/gone.py, on a line that says not-a-reference\n"
    )
    assert dangling_references(text, ROOT / "docs" / "design.md", {"harness", "tests", "docs"}) == []
    generated = "see tests/test_harness" + "_equivalence.py"  # split: this file names nothing missing
    assert dangling_references(generated, ROOT / "README.md", {"tests"}) == ["tests/test_harness" + "_equivalence.py"]
    assert dangling_references(generated, ROOT / "README.md", {"tests"},
                               generated=frozenset(["tests/test_harness" + "_equivalence.py"])) == []


_ISSUE_NUMBER = re.compile(r"\bissues? \d+\b", re.IGNORECASE)  # the project's own issues are not public


def internal_issue_numbers(text: str) -> list[str]:
    """The lines of ``text`` that cite one of the project's own issues by number (``owner/repo#N`` is fine)."""
    return [line.strip() for line in text.splitlines() if _ISSUE_NUMBER.search(line)]


def test_no_internal_issue_numbers(files):
    found = {str(p.relative_to(ROOT)): internal_issue_numbers(p.read_text(encoding="utf-8", errors="replace"))
             for p in filter(is_text, files)}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_issue_number_check_fails_on_one():
    planted = "# the split (issue " + "19) is validated once"
    assert internal_issue_numbers(planted) == [planted] and internal_issue_numbers("keras-team/keras#19005") == []
