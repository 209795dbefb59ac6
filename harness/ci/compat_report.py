"""The compatibility table: matrix env x test suite -> pass / fail / skip, from pytest's JUnit XML.

Framework-neutral: reads the files ``pytest --junitxml`` writes (one per tox
env), whose global properties carry the versions the harness pytest plugin
records (``tensorflow``, ``keras``, ``tf_keras``, ``TF_USE_LEGACY_KERAS``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.errors import InvalidValue

__all__ = ["Cell", "EnvResult", "read_junit", "markdown_table", "to_json", "STATES"]

STATES = ("pass", "fail", "skip")


@dataclass
class Cell:
    """One suite in one env: counts, and the reasons of skips and expected failures."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.failed:
            return "fail"
        return "pass" if self.passed or self.xfailed else "skip"

    def text(self) -> str:
        parts = [f"{self.passed} passed"]
        parts += [f"{n} {word}" for n, word in ((self.failed, "failed"), (self.xfailed, "xfailed"),
                                                (self.skipped, "skipped")) if n]
        return f"**{self.state}** ({', '.join(parts)})"


@dataclass
class EnvResult:
    env: str
    versions: dict[str, str]
    cells: dict[str, Cell]
    seconds: float = 0.0
    error: str = ""  # the env never ran its tests (e.g. its install failed)


def _suite(testcase: ET.Element) -> str:
    # classname "tests.upstream.test_batches" or "tests.parallel.test_api.TestX": the folder under tests/
    parts = (testcase.get("classname") or "").split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else (parts[0] or "?")


def read_junit(path: Path | str, env: str | None = None) -> EnvResult:
    """One env's results from a pytest JUnit XML file (env name: ``env`` or the file's stem).

    Raises:
        ValueError: naming the file when it is not pytest JUnit XML.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise InvalidValue(f"{path} is not JUnit XML: {err}") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise InvalidValue(f"{path} has no <testsuite>; is it pytest --junitxml output?")
    versions: dict[str, str] = {}
    cells: dict[str, Cell] = {}
    seconds = 0.0
    for suite in suites:
        seconds += float(suite.get("time") or 0)
        for prop in suite.iter("property"):
            versions[prop.get("name", "?")] = prop.get("value", "")
        for case in suite.iter("testcase"):
            cell = cells.setdefault(_suite(case), Cell())
            skipped = case.find("skipped")
            if case.find("failure") is not None or case.find("error") is not None:
                cell.failed += 1
            elif skipped is not None:
                message = skipped.get("message", "")
                if skipped.get("type") == "pytest.xfail":
                    cell.xfailed += 1
                else:
                    cell.skipped += 1
                if message and message not in cell.reasons:
                    cell.reasons.append(message)
            else:
                cell.passed += 1
    return EnvResult(env or path.stem, versions, dict(sorted(cells.items())), round(seconds, 1))


def _versions_text(result: EnvResult) -> str:
    v = result.versions
    keras = f"tf-keras {v['tf_keras']}" if v.get("TF_USE_LEGACY_KERAS") == "1" and v.get("tf_keras") else \
        f"Keras {v.get('keras', '?')}"
    return f"TF {v.get('tensorflow', '?')}, {keras}, Python {v.get('python', '?')}"


def markdown_table(results: list[EnvResult]) -> str:
    """The table: one row per env (with its versions and seconds), one column per suite; notes below."""
    # a folder no env ran a test of gets no column
    suites = sorted({s for r in results for s, c in r.cells.items() if c.passed or c.failed or c.skipped or c.xfailed})
    lines = ["| env | versions | " + " | ".join(suites) + " | time |",
             "|---|---|" + "---|" * len(suites) + "---|"]
    notes: list[str] = []
    where: dict[str, list[str]] = {}
    for r in results:
        if r.error:
            lines.append(f"| {r.env} | - | " + " | ".join(["**error**"] * len(suites)) + " | - |")
            notes.append(f"- {r.env}: {r.error}")
            continue
        row = [r.cells[s].text() if s in r.cells else "-" for s in suites]
        lines.append(f"| {r.env} | {_versions_text(r)} | " + " | ".join(row) + f" | {r.seconds:.0f} s |")
        for s, cell in r.cells.items():
            for reason in cell.reasons:
                where.setdefault(reason, []).append(f"{r.env}/{s}")
    notes += [f"- {reason} ({', '.join(places)})" for reason, places in where.items()]
    totals = Counter(r.cells[s].state for r in results for s in suites if s in r.cells)
    totals["error"] = sum(1 for r in results if r.error)
    summary = ", ".join(f"{totals[state]} {state}" for state in (*STATES, "error") if totals[state])
    text = "\n".join(lines) + f"\n\n{len(results)} env(s) x {len(suites)} suite(s): {summary}.\n"
    if notes:
        text += "\nSkips and expected failures (reasons as the tests give them):\n\n" + "\n".join(notes) + "\n"
    return text


def to_json(results: list[EnvResult]) -> str:
    out = []
    for r in results:
        item = asdict(r)
        for name, cell in r.cells.items():
            item["cells"][name]["state"] = cell.state
        out.append(item)
    return json.dumps(out, indent=2)
