"""Coverage claims a machine checks: ``@pytest.mark.covered_by(NODEID, ...)``.

A test kept out of the quick loop (marked ``extended``, ``slow``, ``zoo``, ...; or a Keras 2 case that
tests/conftest.py makes extended) whose path a quick test still runs names that quick test by its pytest node id
(``tests/parallel/test_equivalence.py::test_per_device_batchnorm_is_not_exact[keras2-towers]``) in a ``covered_by``
marker; a comment may say why and what it costs, never carry the claim. tests/unit/test_coverage_claims.py reads
every such marker of the suite and fails where a named test does not exist or is not in the quick loop itself, where
a marker claims coverage for a test whose every case runs in the quick loop, and where a ``keras2_extended`` test
names no quick test (that marker's description says one covers its Keras 2 run).

Collections are read as ``{nodeid: Collected}``: from this session's items (tests/conftest.py records them before
``-k``/``-m`` deselect any) or from a ``pytest --collect-only`` of the files concerned (``collect``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKER = "covered_by"
# The markers that keep a test out of the quick loop (the README's ``pytest -n 2`` on a machine without a GPU): the
# harness plugin skips each unless its option or -m selects it (harness/pytest_plugin.py, MARKERS).
OUT_OF_QUICK_LOOP = ("extended", "slow", "zoo", "timing", "docker", "browser", "gpu", "multi_gpu")
DESCRIPTION = (f"{MARKER}(NODEID, ...): the quick tests, by pytest node id (tests/parallel/test_equivalence.py::"
               "test_per_device_batchnorm_is_not_exact[keras2-towers]), that run the path of this test kept out of "
               "the quick loop (extended, slow, ...); tests/unit/test_coverage_claims.py fails where one does not "
               "exist or is not quick")
COLLECTED = pytest.StashKey[dict]()  # this session's records, before -k/-m deselect any (tests/conftest.py)
ROOTS = re.compile(r"""["']((?:tests/)?[\w/.-]+\.py)::""")  # the files a claim names, read from a module's text


@dataclass(frozen=True)
class Collected:
    """One collected test: the markers that keep it out of the quick loop and the node ids its claims name."""

    out: tuple[str, ...] = ()  # among OUT_OF_QUICK_LOOP; none: a quick test
    claims: tuple[object, ...] | None = None  # covered_by's arguments (None: no such marker)
    keras2_extended: bool = False  # a Keras 2 case of a keras2_extended test

    @property
    def quick(self) -> bool:
        return not self.out


def collected(item) -> Collected:
    """``item``'s record: its out-of-the-quick-loop markers and its ``covered_by`` arguments (every such marker's,
    the closest first)."""
    out = tuple(name for name in OUT_OF_QUICK_LOOP if item.get_closest_marker(name) is not None)
    markers = list(item.iter_markers(MARKER))
    claims = tuple(arg for marker in markers for arg in marker.args) if markers else None
    params = getattr(getattr(item, "callspec", None), "params", {})
    keras2 = params.get("any_keras") == "keras2" and item.get_closest_marker("keras2_extended") is not None
    return Collected(out, claims, keras2)


def snapshot(items: Iterable) -> dict[str, Collected]:
    """Every item's ``Collected``, by node id."""
    return {item.nodeid: collected(item) for item in items}


def _function(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def claim_problems(tests: Mapping[str, Collected], root: Path | None = None) -> list[str]:
    """What is wrong with the claims among ``tests``, one line each naming the test, the claim and the fault.

    With ``root`` (the rootdir of the node ids), a claim naming a test of a module that exists under it but gave no
    test here (skipped as a whole: ``pytest.importorskip`` of an extra this environment lacks) is not judged here;
    it is where that module is collected.
    """
    problems = []
    cases: dict[str, list[str]] = {}
    for nodeid in tests:
        cases.setdefault(_function(nodeid), []).append(nodeid)
    modules = {_module(nodeid) for nodeid in tests}
    claimed_functions = set()
    for nodeid, test in tests.items():
        if test.keras2_extended and test.claims is None:
            problems.append(f"{nodeid}: keras2_extended, and no {MARKER} names the quick test of its Keras 2 path")
        if test.claims is None:
            continue
        claimed_functions.add(_function(nodeid))
        if not test.claims or not all(isinstance(name, str) for name in test.claims):
            problems.append(f"{nodeid}: {MARKER} takes one or more node ids (strings); got {list(test.claims)!r}")
            continue
        if test.quick:
            continue  # a quick case of a test whose other cases are out (keras2_extended's Keras 3 cases)
        for name in test.claims:
            named = tests.get(name)
            if named is None and root is not None and _module(name) not in modules and (root / _module(name)).is_file():
                continue  # its module was skipped as a whole here
            if named is None:
                near = cases.get(_function(name), [])
                hint = f" (its cases: {', '.join(near)})" if near else ""
                problems.append(f"{nodeid}: {MARKER} names {name!r}, which does not exist{hint}")
            elif not named.quick:
                why = ", ".join(named.out)
                problems.append(f"{nodeid}: {MARKER} names {name!r}, which is not in the quick loop (marked {why})")
    for function in sorted(claimed_functions):
        if all(tests[case].quick for case in cases[function]):
            problems.append(f"{function}: {MARKER} on a test whose every case runs in the quick loop: no claim to make")
    return problems


def claimant_files(root: Path) -> set[str]:
    """The test modules under ``root``/tests whose text holds a ``covered_by`` or ``keras2_extended`` marker, the
    modules their claims name (read from the text: node ids are string literals), and the modules named in
    tests/conftest.py (its ``MOVED_FOR_TIME`` cases and their claims), relative to ``root``."""
    files = set()
    for path in sorted((root / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if f"mark.{MARKER}" in text or "mark.keras2_extended" in text:
            files.add(str(path.relative_to(root)))
            files |= {name for name in ROOTS.findall(text) if (root / name).is_file()}
    # tests/conftest.py's MOVED_FOR_TIME: the cases it moves and the quick tests it names
    text = (root / "tests" / "conftest.py").read_text(encoding="utf-8")
    return files | {name for name in ROOTS.findall(text) if (root / name).is_file()}


class Dump:
    """A pytest plugin: writes the collection's ``Collected`` records to ``path`` (JSON) once collection ends."""

    def __init__(self, path: str):
        self.path = path

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        records = {nodeid: {"out": list(c.out), "claims": None if c.claims is None else list(c.claims),
                            "keras2_extended": c.keras2_extended} for nodeid, c in snapshot(items).items()}
        Path(self.path).write_text(json.dumps(records))


def collect(files: Iterable[str], root: Path, timeout: float = 600) -> dict[str, Collected]:
    """``pytest --collect-only`` of ``files`` (relative to ``root``, its rootdir) in a process of its own, read
    as ``Collected`` records; a file that fails to collect adds none (its tests then "do not exist")."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "collected.json"
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import pytest, coverage_claims; "
                f"sys.exit(pytest.main(sys.argv[1:], plugins=[coverage_claims.Dump({str(out)!r})]))")
        args = ["--collect-only", "-q", "-o", "addopts=", "-p", "no:xdist", "-p", "no:cacheprovider",
                "--rootdir", str(root), *sorted(files)]
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=root, capture_output=True, text=True,
                              timeout=timeout)
        if not out.exists():
            raise RuntimeError(f"pytest --collect-only of {sorted(files)} wrote no records (exit {done.returncode}): "
                               f"{(done.stdout + done.stderr)[-3000:]}")
        records = json.loads(out.read_text())
    return {nodeid: Collected(tuple(r["out"]), None if r["claims"] is None else tuple(r["claims"]),
                              r["keras2_extended"]) for nodeid, r in records.items()}
