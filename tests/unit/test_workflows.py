"""The GitHub Actions workflows: pinned, least-privilege, fork-safe, derived from docker/matrix.toml.

Each guard is a function that returns its findings, run on the real workflows (must find nothing)
and on deliberately bad ones (must find the planted problem). The linters (actionlint, zizmor,
yamllint, hadolint) run as subprocesses; a test skips only when its tool is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.ci.matrix import load_matrix, newest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
GPU_LABEL = "gpu-ok"
BENCH_LABEL = "benchmark"

# `uses: owner/repo[/path]@<full 40-hex commit SHA> # vX.Y.Z`: the commit of that release.
_PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$")
_USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>.*?)\s*$")
_FROM_MATRIX_JOB = re.compile(r"\$\{\{\s*fromJSON\(needs\.matrix\.outputs\.entries\)\s*\}\}")


def _load(text: str) -> dict:
    return yaml.safe_load(text)


def _triggers(workflow: dict) -> dict:
    """The `on:` mapping (YAML 1.1 reads a bare `on` key as True)."""
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on or {}


def _steps(workflow: dict):
    for job_id, job in (workflow.get("jobs") or {}).items():
        for step in job.get("steps") or []:
            yield job_id, step


def _uses(workflow: dict) -> list[str]:
    refs = [job["uses"] for job in (workflow.get("jobs") or {}).values() if "uses" in job]
    return refs + [step["uses"] for _, step in _steps(workflow) if "uses" in step]


# --- guards: each returns what it found wrong ---------------------------------------------------


def unpinned_actions(text: str) -> list[str]:
    """Every `uses:` of a remote action must be a full commit SHA with its `# vX.Y.Z` comment."""
    lines = {m["ref"] for m in map(_USES_LINE.match, text.splitlines()) if m}
    problems = []
    for ref in _uses(_load(text)):
        if ref.startswith(("./", "docker://")):
            continue
        if not any(line.split(" #")[0].strip() == ref and _PINNED.match(line) for line in lines):
            problems.append(f"not pinned to a commit SHA with a '# vX.Y.Z' comment: {ref}")
    return problems


def permission_problems(text: str) -> list[str]:
    """`permissions: {}` at the top, and each job names the (minimal) permissions it needs."""
    workflow = _load(text)
    problems = []
    if "permissions" not in workflow:
        problems.append("no top-level permissions")
    elif workflow["permissions"] not in ({}, None):
        problems.append(f"top-level permissions grant something: {workflow['permissions']!r}")
    for job_id, job in (workflow.get("jobs") or {}).items():
        if "permissions" not in job:
            problems.append(f"job {job_id} does not declare its permissions")
    return problems


def expressions_in_run(text: str) -> list[str]:
    """No `${{ }}` inside `run:` scripts (template injection): values come in through `env:`."""
    return [f"job {job_id}: ${{{{ }}}} in run: {step['run'][:60]!r}"
            for job_id, step in _steps(_load(text)) if "${{" in str(step.get("run", ""))]


def untrusted_triggers(text: str) -> list[str]:
    """Workflows that run PR code never use pull_request_target."""
    return [f"triggers on {t}" for t in _triggers(_load(text)) if t == "pull_request_target"]


def ungated_pull_requests(text: str, label: str, *, events: tuple[str, ...] = ("labeled",)) -> list[str]:
    """A pull_request trigger only for `events`, and every job that runs PR code checks `label`."""
    workflow = _load(text)
    triggers = _triggers(workflow)
    if "pull_request" not in triggers:
        return []
    problems = []
    types = (triggers["pull_request"] or {}).get("types")
    if not types or set(types) - set(events):
        problems.append(f"pull_request must be limited to types {list(events)}; got {types}")
    for job_id, job in workflow["jobs"].items():
        condition = str(job.get("if", ""))
        names_label = f"'{label}'" in condition
        reads_labels = "github.event.label.name" in condition or "github.event.pull_request.labels" in condition
        if not (names_label and reads_labels):
            problems.append(f"job {job_id} does not check the {label!r} label in its if:")
    return problems


def write_permissions(text: str) -> list[str]:
    """Every write permission the workflow or one of its jobs asks for."""
    workflow = _load(text)
    blocks = [("workflow", workflow.get("permissions"))]
    blocks += [(f"job {job_id}", job.get("permissions")) for job_id, job in workflow["jobs"].items()]
    problems = [f"{where} has {perms}" for where, perms in blocks if perms == "write-all"]
    return problems + [f"{where} has {scope}: write" for where, perms in blocks if isinstance(perms, dict)
                       for scope, level in perms.items() if level == "write"]


def ci_matrix_problems(text: str) -> list[str]:
    """ci.yml's test matrix: tox envs named after matrix entries, newest, oldest and legacy among them."""
    entries = load_matrix()
    names = [e.name for e in entries]
    envs = _load(text)["jobs"]["test"]["strategy"]["matrix"]["env"]
    problems = [f"{env} is not a docker/matrix.toml entry" for env in envs if env not in names]
    wanted = {"newest": newest(entries).name, "oldest": entries[0].name, "legacy": "legacy"}
    return problems + [f"the {what} entry {name} is not tested" for what, name in wanted.items() if name not in envs]


def scheduled_matrix_problems(text: str) -> list[str]:
    """slow.yml: every TensorFlow docker/matrix.toml entry's tox env, with the extended tests and the skip check;
    the compatibility table written from their JUnit files. A jax entry (Keras 3 on JAX, Python 3.12: its tox env
    runs tests/onjax only) runs in ci.yml's jax job instead (``jax_entry_problems``)."""
    workflow = _load(text)
    job = workflow["jobs"].get("matrix", {})
    envs = job.get("strategy", {}).get("matrix", {}).get("env", [])
    entries = load_matrix()
    problems = [f"the matrix entry {e.name} has no scheduled run" for e in entries
                if e.has_tensorflow and e.name not in envs]
    problems += [f"the jax entry {e.name} is in the TensorFlow matrix job (Python 3.11, the whole suite)"
                 for e in entries if not e.has_tensorflow and e.name in envs]
    runs = " ".join(str(step.get("run", "")) for step in job.get("steps", []))
    problems += [f"the matrix job's runs lack {flag}"
                 for flag in ("--run-extended", "--run-timing", "--skip-report", "check-skips") if flag not in runs]
    table = " ".join(str(step.get("run", "")) for step in workflow["jobs"].get("compatibility", {}).get("steps", []))
    if "harness matrix --from-junit" not in table:
        problems.append("no compatibility table is written from the matrix job's JUnit files")
    return problems


def jax_entry_problems(text: str) -> list[str]:
    """ci.yml: each jax entry's tox env (its extended tests in its command) runs in the jax job, on its Python, with
    the skip check."""
    job = _load(text)["jobs"].get("jax", {})
    steps = job.get("steps", [])
    runs = " ".join(str(step.get("run", "")) for step in steps)
    pythons = [str(step.get("with", {}).get("python-version")) for step in steps
               if str(step.get("uses", "")).startswith("actions/setup-python@")]
    problems = []
    for entry in (e for e in load_matrix() if not e.has_tensorflow):
        if f"tox -e {entry.name}" not in runs:
            problems.append(f"the jax entry {entry.name} does not run in ci.yml's jax job")
        if pythons != [entry.python]:
            problems.append(f"ci.yml's jax job sets up Python {pythons}; the jax entry {entry.name} is {entry.python}")
    return problems + ([] if "check-skips" in runs else ["ci.yml's jax job does not check its skips"])


def gpu_matrix_problems(text: str) -> list[str]:
    """gpu.yml's jobs: one per entry of `python -m harness.ci.matrix json`, on the self-hosted GPU runners; a jax
    entry's job (no TensorFlow in its image) runs tests/onjax, not the TensorFlow suite and zoo."""
    problems = [] if "python -m harness.ci.matrix json" in text else ["the matrix does not come from harness.ci.matrix"]
    gpu = _load(text)["jobs"].get("gpu", {})
    if any(not e.has_tensorflow for e in load_matrix()):
        steps = {str(step.get("name", "")): step for step in gpu.get("steps", [])}
        suite = next((step for name, step in steps.items() if name.startswith("pytest in")), {})
        zoo = next((step for name, step in steps.items() if name.startswith("whole model zoo")), {})
        if gpu.get("env", {}).get("BACKEND") != "${{ matrix.entry.backend }}" or "tests/onjax" not in str(
                suite.get("run", "")):
            problems.append("the gpu job does not run tests/onjax for the matrix's jax entries")
        if "matrix.entry.backend != 'jax'" not in str(zoo.get("if", "")):
            problems.append("the gpu job runs the TensorFlow zoo for the matrix's jax entries")
    entry = str(gpu.get("strategy", {}).get("matrix", {}).get("entry", ""))
    if gpu.get("needs") != "matrix" or not _FROM_MATRIX_JOB.fullmatch(entry):
        problems.append("the gpu job's matrix is not fromJSON(needs.matrix.outputs.entries)")
    if gpu.get("runs-on") != ["self-hosted", "linux", "x64", "gpu"]:
        problems.append(f"the gpu job runs on {gpu.get('runs-on')}")
    return problems


# --- the real workflows ---------------------------------------------------------------------------


def _text(name: str) -> str:
    return (WORKFLOWS / name).read_text()


def test_the_workflows_of_the_project_exist():
    names = {p.name for p in WORKFLOW_FILES}
    assert {"ci.yml", "gpu.yml", "bench.yml", "bench-comment.yml", "publish.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_parses_with_name_triggers_and_jobs(path):
    workflow = _load(path.read_text())
    assert isinstance(workflow, dict) and workflow.get("name")
    assert _triggers(workflow), "no triggers"
    assert workflow.get("jobs")


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_sha(path):
    assert unpinned_actions(path.read_text()) == []


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_permissions_are_empty_at_the_top_and_declared_per_job(path):
    assert permission_problems(path.read_text()) == []


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_no_expression_inside_a_run_script(path):
    assert expressions_in_run(path.read_text()) == []


def test_ci_tests_the_newest_the_oldest_and_the_legacy_matrix_entries():
    assert ci_matrix_problems(_text("ci.yml")) == []


def test_every_matrix_env_runs_weekly_with_the_extended_tests():
    assert scheduled_matrix_problems(_text("slow.yml")) == []


def test_gpu_jobs_come_from_the_matrix_file():
    assert gpu_matrix_problems(_text("gpu.yml")) == []


def test_the_jax_entries_run_in_cis_jax_job():
    assert jax_entry_problems(_text("ci.yml")) == []


@pytest.mark.parametrize(
    ("guard", "name", "old", "new", "found"),
    [
        (ci_matrix_problems, "ci.yml", "[tf221, legacy, tf215]", "[tf221, legacy, tf215, tf999]", "tf999 is not"),
        (ci_matrix_problems, "ci.yml", "[tf221, legacy, tf215]", "[tf221, tf215]", "legacy entry"),
        (ci_matrix_problems, "ci.yml", "[tf221, legacy, tf215]", "[tf220, legacy, tf215]", "newest entry tf221"),
        (ci_matrix_problems, "ci.yml", "[tf221, legacy, tf215]", "[tf221, legacy, tf216]", "oldest entry tf215"),
        (scheduled_matrix_problems, "slow.yml", "[tf215, tf216, tf217, tf218, tf219, tf220, tf221, legacy]",
         "[tf215, tf221, legacy]", "tf218 has no scheduled run"),
        (scheduled_matrix_problems, "slow.yml", 'tox -e "$TOX_ENV" -- --run-extended', 'tox -e "$TOX_ENV" --',
         "lack --run-extended"),
        (scheduled_matrix_problems, "slow.yml", "harness matrix --from-junit", "ls", "no compatibility table"),
        (gpu_matrix_problems, "gpu.yml", "python -m harness.ci.matrix json", "cat entries.json", "not come from"),
        (gpu_matrix_problems, "gpu.yml", "fromJSON(needs.matrix.outputs.entries)", "fromJSON('[]')", "fromJSON"),
        (gpu_matrix_problems, "gpu.yml", "runs-on: [self-hosted, linux, x64, gpu]", "runs-on: ubuntu-latest",
         "ubuntu-latest"),
        (gpu_matrix_problems, "gpu.yml", "paths=(tests/onjax tests/unit/test_device_check.py)", "paths=()",
         "does not run tests/onjax"),
        (gpu_matrix_problems, "gpu.yml", " && matrix.entry.backend != 'jax' }}", " }}", "TensorFlow zoo"),
        (scheduled_matrix_problems, "slow.yml", "tf221, legacy]", "tf221, legacy, jax011]", "jax entry jax011 is in"),
        (jax_entry_problems, "ci.yml", 'tox -e jax011 --', 'tox -e jax010 --', "jax011 does not run"),
        (jax_entry_problems, "ci.yml", 'python-version: "3.12"', 'python-version: "3.11"', "jax011 is 3.12"),
    ],
)
def test_the_matrix_guards_report_a_planted_problem(guard, name, old, new, found):
    text = _text(name)
    assert old in text
    problems = guard(text.replace(old, new))
    assert any(found in p for p in problems), problems


@pytest.mark.parametrize("name", ["gpu.yml", "bench.yml"])
def test_workflows_running_pr_code_never_use_pull_request_target(name):
    assert untrusted_triggers(_text(name)) == []


def test_gpu_runs_a_pull_request_only_when_a_maintainer_labels_it():
    assert ungated_pull_requests(_text("gpu.yml"), GPU_LABEL) == []
    condition = _load(_text("gpu.yml"))["jobs"]["gpu"]["if"]
    assert f"github.event.label.name == '{GPU_LABEL}'" in condition


def test_bench_is_label_gated_and_cannot_write():
    text = _text("bench.yml")
    assert ungated_pull_requests(text, BENCH_LABEL, events=("labeled", "synchronize")) == []
    assert f"contains(github.event.pull_request.labels.*.name, '{BENCH_LABEL}')" in _load(text)["jobs"]["bench"]["if"]
    assert write_permissions(text) == []


def test_bench_comment_never_checks_out_code():
    workflow = _load(_text("bench-comment.yml"))
    assert list(_triggers(workflow)) == ["workflow_run"]
    assert not any(ref.startswith("actions/checkout@") for ref in _uses(workflow))


# --- each guard catches what it guards against -------------------------------------------------

_GOOD = """\
name: t
on:
  pull_request:
    types: [labeled]
permissions: {}
jobs:
  a:
    if: github.event.label.name == 'gpu-ok'
    runs-on: ubuntu-latest
    permissions:
      contents: read
    env:
      X: ${{ github.ref }}
    steps:
      - uses: actions/checkout@9c091bb21b7c1c1d1991bb908d89e4e9dddfe3e0 # v7.0.0
      - run: echo "$X"
"""
_CHECKOUT = "actions/checkout@9c091bb21b7c1c1d1991bb908d89e4e9dddfe3e0 # v7.0.0"


@pytest.mark.parametrize(
    ("guard", "old", "new", "found"),
    [
        (unpinned_actions, _CHECKOUT, "actions/checkout@v4", "actions/checkout@v4"),
        (unpinned_actions, _CHECKOUT, "actions/checkout@9c091bb21b7c1c1d1991bb908d89e4e9dddfe3e0",
         "not pinned"),
        (unpinned_actions, _CHECKOUT, "actions/checkout@9c091bb # v7.0.0", "not pinned"),
        (unpinned_actions, _CHECKOUT, "actions/checkout@main # v7.0.0", "not pinned"),
        (permission_problems, "permissions: {}\n", "", "no top-level permissions"),
        (permission_problems, "permissions: {}\n", "permissions: write-all\n", "grant something"),
        (permission_problems, "    permissions:\n      contents: read\n", "", "job a does not declare"),
        (expressions_in_run, 'echo "$X"', 'echo "${{ github.event.pull_request.title }}"', "in run"),
        (untrusted_triggers, "  pull_request:\n", "  pull_request_target:\n", "pull_request_target"),
        (lambda t: ungated_pull_requests(t, GPU_LABEL), "types: [labeled]", "types: [labeled, synchronize]",
         "must be limited"),
        (lambda t: ungated_pull_requests(t, GPU_LABEL), "    types: [labeled]\n", "", "must be limited"),
        (lambda t: ungated_pull_requests(t, GPU_LABEL), "'gpu-ok'", "'bug'", "does not check"),
        (write_permissions, "contents: read", "contents: write", "job a has contents: write"),
        (write_permissions, "    permissions:\n      contents: read\n", "    permissions: write-all\n",
         "job a has write-all"),
    ],
)
def test_each_guard_reports_a_planted_problem(guard, old, new, found):
    assert guard(_GOOD) == [], "the good workflow must pass every guard"
    assert old in _GOOD
    problems = guard(_GOOD.replace(old, new))
    assert any(found in p for p in problems), problems


# --- linters ------------------------------------------------------------------------------------


def _tool(name: str) -> str:
    """The tool next to this Python (the venv's bin) or on PATH; skip when it is not installed."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install the lint extra)")
    return found


def _run(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # The venv's bin first on PATH: actionlint runs shellcheck on `run:` scripts from there.
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               NO_COLOR="1")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _zizmor(target: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return _run([_tool("zizmor"), "--offline", "--no-progress", "--min-severity", "medium", target], cwd)


def _bad_workflow(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".github" / "workflows" / "bad.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_actionlint_is_clean():
    done = _run([_tool("actionlint")])
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_finds_nothing_of_medium_or_higher_severity():
    done = _zizmor(".github/workflows")
    assert done.returncode == 0, done.stdout + done.stderr


def test_yamllint_is_clean():
    done = _run([_tool("yamllint"), "--strict", ".github"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_is_clean_on_the_dockerfile():
    dockerfile = ROOT / "docker" / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip("docker/Dockerfile does not exist (yet)")
    done = _run([_tool("hadolint"), str(dockerfile)])
    assert done.returncode == 0, done.stdout + done.stderr


_INJECTION = _GOOD.replace('echo "$X"', 'echo "${{ github.event.pull_request.title }}"')


def test_actionlint_reports_a_bad_workflow(tmp_path):
    path = _bad_workflow(tmp_path, _INJECTION.replace("ubuntu-latest", "[self-hosted, tpu]"))
    done = _run([_tool("actionlint"), "-config-file", str(ROOT / ".github" / "actionlint.yaml"), str(path)],
                tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "potentially untrusted" in done.stdout and 'label "tpu" is unknown' in done.stdout


def test_zizmor_reports_a_bad_workflow(tmp_path):
    path = _bad_workflow(tmp_path, _INJECTION.replace(_CHECKOUT, "actions/checkout@v4"))
    done = _zizmor(str(path), tmp_path)
    assert done.returncode != 0
    assert "template-injection" in done.stdout and "unpinned-uses" in done.stdout, done.stdout


def test_yamllint_reports_a_bad_file(tmp_path):
    path = _bad_workflow(tmp_path, _GOOD + "      - run: echo " + "x" * 120 + "\n")
    done = _run([_tool("yamllint"), "-c", str(ROOT / ".yamllint.yaml"), str(path)], tmp_path)
    assert done.returncode == 1 and "line-length" in done.stdout, done.stdout


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text("FROM ubuntu:latest\nRUN cd /tmp && make\n")
    done = _run([_tool("hadolint"), str(path)], tmp_path)
    assert done.returncode == 1 and "DL3007" in done.stdout and "DL3003" in done.stdout, done.stdout
