""".ci/run, the CI entry point: the README's test command, every marker's tests somewhere, every skip checked."""

import re
import shlex
from pathlib import Path

import pytest

from harness.pytest_plugin import MARKERS

REPO = Path(__file__).resolve().parents[2]
# The markers whose tests need what CI's machine lacks (GPUs) or hours (the whole zoo): where they run instead.
ELSEWHERE = {"gpu": ("gpu.yml", "--require-gpu"), "multi_gpu": ("gpu.yml", '-m "zoo and multi_gpu"'),
             "zoo": ("slow.yml", "--run-zoo")}
# How .ci/run selects each other marker's tests: a pytest flag, or a command of its own.
SELECTS = {"slow": "--run-slow", "extended": "--run-extended", "timing": "--run-timing",
           "docker": "harness docker test"}


def _readme_test_command() -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(r"```bash\n\./scripts/dev-env\.sh && (\.venv/bin/pytest[^\n]*)\n```", text)
    assert found, "README has no `./scripts/dev-env.sh && .venv/bin/pytest ...` block"
    return found[1]


def _commands(text: str) -> list[list[str]]:
    """.ci/run's commands, as tokens: comments dropped, continuations joined, `|| ...` cut."""
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")).replace("\\\n", " ")
    return [shlex.split(line.split("||")[0]) for line in code.splitlines() if line.split("||")[0].strip()]


def _unwrapped(tokens: list[str]) -> list[str]:
    """A command less what only wraps it: ``VAR=value`` assignments and .ci/run's ``step NAME`` (which times it)."""
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        tokens = tokens[1:]
    return tokens[2:] if tokens[:1] == ["step"] else tokens


def _selection(tokens: list[str]) -> str | None:
    return tokens[tokens.index("-m") + 1] if "-m" in tokens[:-1] else None


def ci_problems(text: str, readme_command: str) -> list[str]:
    """What .ci/run lacks: the README's test command as it is, a step for each marker's tests, a skip check per
    report, a Keras 2 env of the matrix."""
    commands = [_unwrapped(tokens) for tokens in _commands(text)]
    # Reports (skips, JUnit, the time budget's line) and pytest's cache off: the same tests run.
    neutral = {"--skip-report", "-p", "--junitxml", "--time-budget"}
    problems = []
    bare = []
    for tokens in commands:
        kept, skip = [], False
        for token in tokens:
            if skip:
                skip = False
            elif token in neutral:
                skip = True
            else:
                kept.append(token)
        bare.append(kept)
    readme = shlex.split(readme_command)
    # As it is, or less the timing tests where a step of their own runs them (beside the hogs: checked below).
    if readme not in bare and [*readme, "-m", "not timing"] not in bare:
        problems.append(f"the README's test command `{readme_command}` is not run as it is")
    joined = [" ".join(tokens) for tokens in commands]
    for marker in MARKERS:
        if marker in ELSEWHERE:
            continue
        flag = SELECTS.get(marker, f"--run-{marker}")
        steps = [line for line, tokens in zip(joined, commands) if flag in line
                 and (_selection(tokens) is None or marker in _selection(tokens))]
        if not steps:
            problems.append(f"no step runs the {marker!r} tests ({flag})")
    if not any("tox -e tf215" in line or "tox -e legacy" in line for line in joined):
        problems.append("no Keras 2 env of the matrix (tox -e tf215 or legacy) runs")
    for tokens in commands:
        if "--skip-report" in tokens[:-1]:
            report = tokens[tokens.index("--skip-report") + 1]
            if not any(t[-1:] == [report] and t[0].endswith("check-skips") for t in commands):
                problems.append(f"the skips written to {report} are not checked")
    return problems


def test_ci_runs_the_readme_command_every_marker_and_checks_every_skip():
    assert ci_problems((REPO / ".ci" / "run").read_text(), _readme_test_command()) == []


@pytest.mark.parametrize("marker", sorted(ELSEWHERE))
def test_the_markers_ci_cannot_run_run_in_a_workflow(marker):
    workflow, selects = ELSEWHERE[marker]
    assert marker in MARKERS
    assert selects in (REPO / ".github" / "workflows" / workflow).read_text()


@pytest.mark.parametrize(("old", "new", "found"), [
    ('-m "extended and not timing and not slow" --run-extended', "-m slow", "'extended' tests"),
    ('.venv/bin/pytest -n 2 -m "not timing"', '.venv/bin/pytest -n 4 -m "not timing"', "README's test command"),
    ('.venv/bin/pytest -n 2 -m "not timing"', '.venv/bin/pytest -n 2 -m "not timing and not slow"',
     "README's test command"),
    ("-m timing --run-extended", "-m slow --run-extended", "'timing' tests"),
    ('./scripts/check-skips "$skips/tf215.jsonl"', "true", "tf215.jsonl are not checked"),
    (".venv/bin/tox -e tf215", ".venv/bin/tox -e tf221", "no Keras 2 env"),
    ("--run-slow", "", "'slow' tests"),
    ("-m browser --run-browser", "-m browser", "'browser' tests"),
    ('./scripts/check-skips "$skips/browser.jsonl"', "true", "browser.jsonl are not checked"),
], ids=["extended", "readme-command", "readme-command-selection", "timing", "skip-check", "keras2-env", "slow",
        "browser", "browser-skip-check"])
def test_the_ci_guard_reports_a_planted_gap(old, new, found):
    text = (REPO / ".ci" / "run").read_text()
    assert old in text
    problems = ci_problems(text.replace(old, new), _readme_test_command())
    assert any(found in p for p in problems), problems
