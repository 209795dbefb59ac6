"""The CI files ``harness init`` writes into another repository, and harness' own reusable workflows.

``ci_files(project, package)`` renders, for a repository whose harness.toml is ``project``
(``harness.project``) and whose pip-installable package is its root (``pip install .``):

  .github/workflows/harness-ci.yml           CPU CI (push, pull_request): the generated equivalence test on
                                             logical CPU devices, newest TensorFlow/Keras of the project's matrix
  .github/workflows/harness-gpu.yml          the same checks, ``harness check`` and ``asv run --quick`` on
                                             self-hosted GPU runners, in the image of each matrix entry; gated
                                             like harness' own gpu.yml (push to main, dispatch, label gpu-ok)
  .github/workflows/harness-bench.yml        the PR benchmark gate (``harness bench-compare``), label benchmark
  .github/workflows/harness-bench-comment.yml  posts the gate's summary on the PR; runs no PR code
  .github/workflows/harness-nightly.yml      nightly asv runs on main's new commits, ``harness regressions``,
                                             ``harness bisect`` of new ones, an issue per regression
  .github/actionlint.yaml                    the self-hosted runner label ``gpu`` for actionlint
  docker/harness.Dockerfile, docker/harness-bake.hcl   an image per matrix entry (CPU and GPU variants)
  docker/harness.Dockerfile.dockerignore     what the image's build context (the repository) leaves out
  tox.ini                                    ``[testenv:gpu]`` (``tox_gpu_section``; appendable as it is)

With ``reusable="OWNER/REPO@SHA"`` the gate and the nightly call harness' reusable workflows
(``reusable_workflows()``: .github/workflows/reusable-bench-gate.yml and reusable-nightly.yml of
harness' repository) pinned by that commit instead of carrying their steps. Both forms run the same
steps: the inline jobs and the reusable ones are rendered from one template, the settings coming in
through ``env:`` (literal values inline, ``inputs`` in the reusable workflows).

The version matrix is harness' docker/matrix.toml, shipped in the package as harness/ci/matrix.toml
(tests/unit/test_adopt_ci.py keeps the two identical), so an installed harness renders these files too.
Pure Python, standard library only; every file passes actionlint, zizmor, yamllint (harness'
.yamllint.yaml) and hadolint (tests/unit/test_adopt_ci.py).
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from harness.ci.matrix import CPU_BASE, VARIANTS, Entry, build_args, load_matrix, tox_deps
from harness.errors import InvalidValue

if TYPE_CHECKING:
    from harness.project import Project

__all__ = ["MATRIX", "ci_files", "tox_gpu_section", "reusable_workflows", "matrix_entries", "newest_entry",
           "parse_reusable", "REUSABLE_FILES"]

MATRIX = Path(__file__).with_name("matrix.toml")  # a copy of docker/matrix.toml, shipped as package data

# The actions harness' own workflows pin (tests/unit/test_adopt_ci.py checks they are the same).
CHECKOUT = "actions/checkout@9c091bb21b7c1c1d1991bb908d89e4e9dddfe3e0 # v7.0.0"
SETUP_PYTHON = "actions/setup-python@ece7cb06caefa5fff74198d8649806c4678c61a1 # v6.3.0"
UPLOAD_ARTIFACT = "actions/upload-artifact@043fb46d1a93c77aae656e7c1c64a875d1fc6a0a # v7.0.1"
DOWNLOAD_ARTIFACT = "actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c # v8.0.1"

REUSABLE_FILES = {"bench": "reusable-bench-gate.yml", "nightly": "reusable-nightly.yml"}
GPU_LABEL = "gpu-ok"
BENCH_LABEL = "benchmark"
BENCH_ARTIFACT = "harness-bench"

_REUSABLE = re.compile(r"^(?P<repo>[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100})@(?P<sha>[^@]*)$")
_SHA = re.compile(r"^[0-9a-fA-F]{40}$")
# A workload's MODULE:ATTR or path/to/file.py:ATTR, restricted to what is safe unquoted in YAML, shell and tox.
_SAFE_REF = re.compile(r"^[A-Za-z0-9_./-]+:[A-Za-z_][A-Za-z0-9_]*$")
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?"
                          r"(?P<rest>[A-Za-z0-9._\-=<>!~,@/:+ ]*)$")

Value = Union[str, int]


def matrix_entries(names, path: Path | str | None = None) -> list[Entry]:
    """The docker/matrix.toml entries called ``names`` (default file: the packaged copy), in that order.

    Raises:
        InvalidValue: a name that is no entry; the message names it and lists the known ones.
    """
    entries = {e.name: e for e in load_matrix(path if path is not None else MATRIX)}
    unknown = [n for n in names if n not in entries]
    if unknown:
        raise InvalidValue(f"matrix entry {unknown[0]!r} is not in harness' docker/matrix.toml "
                           f"(known: {', '.join(entries)})")
    if not names:
        raise InvalidValue(f"the project names no matrix entry (known: {', '.join(entries)})")
    return [entries[n] for n in names]


def newest_entry(entries: list[Entry]) -> Entry:
    """The entry flagged newest where it is among them, else the one with the newest TensorFlow (Keras 3 first)."""
    for entry in entries:
        if entry.newest:
            return entry
    return max(entries, key=lambda e: (tuple(int(p) for p in e.tensorflow.split(".")), e.keras_major))


def parse_reusable(value: str) -> tuple[str, str]:
    """``OWNER/REPO@SHA`` -> (``OWNER/REPO``, the 40-hex commit, lower case).

    Raises:
        InvalidValue: not OWNER/REPO@SHA, or the SHA is not a full 40-hex commit (a branch or tag can move).
    """
    found = _REUSABLE.match(value or "")
    if not found:
        raise InvalidValue(f"reusable workflows must be OWNER/REPO@<40-hex commit SHA> of harness' repository; "
                           f"got {value!r}")
    if not _SHA.match(found["sha"]):
        raise InvalidValue(f"reusable workflows {value!r}: {found['sha']!r} is not a full 40-hex commit SHA (a "
                           "branch or tag can move under the workflows; pin the commit)")
    return found["repo"], found["sha"].lower()


def _requirement(requirement: str, extras: tuple[str, ...]) -> str:
    """``requirement`` with ``extras`` added after its name: keras-harness==0.1 -> keras-harness[test]==0.1."""
    found = _REQUIREMENT.match(requirement.strip())
    if not found:
        raise InvalidValue(f"harness_requirement must be a pip requirement without quotes, '$', ';' or '#' "
                           f"(name[extras] version or name @ URL); got {requirement!r}")
    have = [x.strip() for x in (found["extras"] or "").split(",") if x.strip()]
    merged = have + [x for x in extras if x not in have]
    rest = found["rest"].strip()
    if rest.startswith("@"):
        rest = " " + rest
    return f"{found['name']}[{','.join(merged)}]{rest}" if merged else f"{found['name']}{rest}"


def _slug(package: str) -> str:
    """``package`` as a Docker image name part: lower case letters, digits and dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", package.lower()).strip("-")
    return slug or "project"


def _checked(project: Project) -> None:
    for entry in project.workloads:
        for what, ref in (("model", entry.model), ("data", entry.data)):
            if ref is not None and not _SAFE_REF.match(ref):
                raise InvalidValue(f"workload {entry.name!r}: {what} {ref!r}: the CI files name it unquoted; use "
                                   "letters, digits, '_', '.', '/' and '-' (MODULE:ATTR or path/to/file.py:ATTR)")


def _gpus(project: Project) -> list[str]:
    return [f"/gpu:{i}" for i in range(project.devices)]


def _check_commands(project: Project, devices: list[str]) -> list[list[str]]:
    """``harness check`` of every workload on ``devices``, human-readable (no --json)."""
    return [["harness", *[a for a in project.check_argv(w, devices) if a != "--json"]] for w in project.workloads]


def _wrap(words: list[str], indent: str, width: int = 112) -> str:
    """Shell words, quoted, on lines of at most ``width`` characters (options kept with their values)."""
    chunks: list[str] = []
    for word in words:
        quoted = shlex.quote(word)
        if word.startswith("--") or not chunks:
            chunks.append(quoted)
        else:
            chunks[-1] += " " + quoted
    lines = [chunks[0]]
    for chunk in chunks[1:]:
        if len(indent) + len(lines[-1]) + 1 + len(chunk) + 2 > width:
            lines.append(chunk)
        else:
            lines[-1] += " " + chunk
    return (" \\\n" + indent + "  ").join(lines)


def _yaml(value: Value) -> str:
    return str(value) if isinstance(value, int) else json.dumps(value)


def _fill(template: str, **values: str) -> str:
    def one(found: re.Match) -> str:
        return values[found[1]]

    text = re.sub(r"@@([A-Z_]+)@@", one, template)
    return text


# --- the settings a gate or nightly job reads from env: (literal values inline, inputs when reusable) -----------


@dataclass(frozen=True)
class _Setting:
    env: str
    input: str
    description: str
    default: Value


_GATE_SETTINGS = (
    _Setting("PYTHON_VERSION", "python-version", "the Python the runner sets up (harness and asv run in it)", "3.11"),
    _Setting("SETUP", "setup", "shell command installing harness (the harness command, asv) on the runner",
             "python -m pip install 'keras-harness[bench]'"),
    _Setting("BENCH", "bench", "only benchmarks whose name matches this regular expression ('': all)", ""),
    _Setting("BENCH_MODE", "mode", "harness bench-compare --mode: virtualenv (asv builds each commit as "
             "asv.conf.json says) or existing (each commit installed into the runner's Python)", "virtualenv"),
    _Setting("INSTALL_COMMAND", "install-command",
             "existing mode: how a commit is installed, with {python} and {path} ('': harness' default)", ""),
    _Setting("BENCH_ARGS", "args", "more harness bench-compare options, e.g. --factor 1.2 --rounds 3", ""),
    _Setting("ASV_MACHINE", "machine", "the asv machine name: the nightly's, whose history gives each benchmark's "
             "noise", "github-ubuntu-latest"),
    _Setting("RESULTS_BRANCH", "results-branch", "the branch the nightly keeps its asv results on", "asv-results"),
)

_NIGHTLY_SETTINGS = (
    _Setting("PYTHON_VERSION", "python-version", "the Python the runner sets up (harness and asv run in it)", "3.11"),
    _Setting("SETUP", "setup", "shell command installing harness (the harness command, asv) on the runner",
             "python -m pip install 'keras-harness[bench]'"),
    _Setting("BENCH", "bench", "only benchmarks whose name matches this regular expression ('': all)", ""),
    _Setting("ASV_MACHINE", "machine", "the asv machine name the history is kept under (a hosted runner's host "
             "name changes every run)", "github-ubuntu-latest"),
    _Setting("MAX_COMMITS", "max-commits", "of the branch's newest commits, those without results are benchmarked "
             "(at most this many a night)", 5),
    _Setting("SINCE_DAYS", "since-days", "a regression is new (bisected, reported) when its first bad commit is "
             "at most this many days old", 7),
    _Setting("BISECT_MAX", "bisect-max", "new regressions bisected a night, at most", 3),
    _Setting("RESULTS_BRANCH", "results-branch", "the branch the asv results history is kept on (the store job "
             "pushes there)", "asv-results"),
)


def _env_block(settings, values: dict[str, Value] | None, indent: str = "      ") -> str:
    """``env:`` lines: ``values`` literal (inline), or each setting's ``inputs`` (reusable: values None)."""
    if values is None:
        return "".join(f"{indent}{s.env}: ${{{{ inputs.{s.input} }}}}\n" for s in settings)
    return "".join(f"{indent}{s.env}: {_yaml(values.get(s.input, s.default))}\n" for s in settings)


def _inputs_block(settings, extra: tuple[tuple[str, str, str, Value], ...]) -> str:
    """``on.workflow_call.inputs`` of a reusable workflow: ``extra`` (name, description, type, default) first."""
    rows = [(name, description, kind, default) for name, description, kind, default in extra]
    rows += [(s.input, s.description, "number" if isinstance(s.default, int) else "string", s.default)
             for s in settings]
    out = []
    for name, description, kind, default in rows:
        out += [f"      {name}:", "        description: >-",
                *textwrap.wrap(description, 100, initial_indent=" " * 10, subsequent_indent=" " * 10),
                f"        type: {kind}", f"        default: {_yaml(default)}"]
    return "\n".join(out) + "\n"


def _with_block(settings, values: dict[str, Value], extra: dict[str, str]) -> str:
    lines = [f"      {k}: {v}" for k, v in extra.items()]
    lines += [f"      {s.input}: {_yaml(values.get(s.input, s.default))}" for s in settings]
    return "\n".join(lines) + "\n"


# --- the benchmark gate's job ----------------------------------------------------------------------------------

_GATE_JOB = r"""  bench:
@@IF@@    runs-on: @@RUNS_ON@@
    timeout-minutes: @@TIMEOUT@@
    permissions:
      contents: read
    env:
      BASE_REF: @@BASE_REF@@
      PR_NUMBER: ${{ github.event.pull_request.number }}
@@ENV@@    steps:
      - uses: @@CHECKOUT@@
        with:
          fetch-depth: 0 # both commits and origin/<base> for the gate's git worktrees
          persist-credentials: false
      # The nightly's results history (harness-nightly.yml): each benchmark's noise where it has enough
      # commits. Missing until the nightly's first store job created the branch.
      - id: history
        uses: @@CHECKOUT@@
        continue-on-error: true
        with:
          ref: ${{ env.RESULTS_BRANCH }}
          path: asv-history
          persist-credentials: false
      - uses: @@SETUP_PYTHON@@
        with:
          python-version: ${{ env.PYTHON_VERSION }}
      - name: install harness
        run: eval "$SETUP"
      # Exit status of harness bench-compare: 0 clean, 1 a benchmark significantly slower, 2 bad input, 3 no verdict
      # (a benchmark errors on head, asv failed, nothing judged): an infrastructure error, never read as a slow-down.
      # The summary goes to the job summary and the artifact either way.
      - name: harness bench-compare
        run: |
          out="$RUNNER_TEMP/bench"
          mkdir -p "$out"
          printf '%s\n' "$PR_NUMBER" > "$out/pr-number"
          args=("origin/${BASE_REF}" HEAD --mode "$BENCH_MODE" --machine "$ASV_MACHINE" --markdown "$out/summary.md")
          if [ -n "$BENCH" ]; then args+=(--bench "$BENCH"); fi
          if [ -n "$INSTALL_COMMAND" ]; then args+=(--install-command "$INSTALL_COMMAND"); fi
          if [ -d "asv-history/${ASV_MACHINE}" ]; then args+=(--history asv-history); fi
          read -ra extra <<< "$BENCH_ARGS"
          status=0
          harness bench-compare "${args[@]}" "${extra[@]}" || status=$?
          if [ -f "$out/summary.md" ]; then cat "$out/summary.md" >> "$GITHUB_STEP_SUMMARY"; fi
          case "$status" in
            0) ;;
            1) echo "::error::a benchmark is significantly slower on this pull request (see the summary)" ;;
            2) echo "::error::no verdict: harness bench-compare was given bad input (its message is above)" ;;
            3) echo "::error::no verdict, an infrastructure error (see the summary and the log), not a slow-down" ;;
            *) echo "::error::no verdict: harness bench-compare ended with exit ${status}" ;;
          esac
          exit "$status"
      - name: collect asv results
        if: always()
        run: |
          mkdir -p "$RUNNER_TEMP/bench"
          if [ -d .asv/results ]; then cp -R .asv/results "$RUNNER_TEMP/bench/results"; fi
      - uses: @@UPLOAD_ARTIFACT@@
        if: always()
        with:
          name: @@ARTIFACT@@
          path: ${{ runner.temp }}/bench
          retention-days: 30
"""

# Runs on the labeled event with the label benchmark, and on pushes to a PR of this repository that carries it
# (a fork's push waits for a maintainer to re-apply the label), as harness' own bench.yml.
_GATE_IF = f"""    if: >-
      contains(github.event.pull_request.labels.*.name, '{BENCH_LABEL}') && (
        (github.event.action == 'labeled' && github.event.label.name == '{BENCH_LABEL}') ||
        (github.event.action == 'synchronize' && github.event.pull_request.head.repo.full_name == github.repository)
      )
"""

_GATE_HEAD = f"""# The benchmark gate on a pull request (written by `harness init`): `harness bench-compare` runs
# the asv suites of benchmarks/ on the PR's base and head, in interleaved rounds, and fails on a significant slow-down
# (exit 1), or with no verdict (3: a benchmark that errors on head, asv failing, nothing judged), said to be an
# infrastructure error and never a slow-down. Its Markdown summary goes to the job
# summary and, with the asv results, to the `{BENCH_ARTIFACT}` artifact; harness-bench-comment.yml posts it on the PR.
#
# Label-gated: only PRs carrying the `{BENCH_LABEL}` label run it (people with triage/write access add labels). It
# runs when the label is added and, for branches of this repository, on each push while the label stays (a
# fork's push waits for a maintainer to re-apply it). No write permission, no secrets; never pull_request_target.
name: harness-bench

on:
  pull_request:
    types: [labeled, synchronize]

permissions: {{}}

# A push replaces a running benchmark of the same PR; adding some other label starts a run of its own (its job
# skips) that must not cancel a running one.
concurrency:
  group: >-
    ${{{{ github.workflow }}}}-${{{{ github.event.pull_request.number }}}}-${{{{
    github.event.action == 'labeled' && github.event.label.name != '{BENCH_LABEL}' && github.run_id || 'bench' }}}}
  cancel-in-progress: true

jobs:
"""


def _gate_job(*, reusable: bool, values: dict[str, Value] | None) -> str:
    return _fill(_GATE_JOB, IF="" if reusable else _GATE_IF,
                 RUNS_ON="${{ fromJSON(inputs.runs-on) }}" if reusable else "ubuntu-latest",
                 TIMEOUT="${{ inputs.timeout-minutes }}" if reusable else "300",
                 BASE_REF="${{ inputs.base-ref || github.base_ref }}" if reusable else "${{ github.base_ref }}",
                 ENV=_env_block(_GATE_SETTINGS, None if reusable else values), CHECKOUT=CHECKOUT,
                 SETUP_PYTHON=SETUP_PYTHON, UPLOAD_ARTIFACT=UPLOAD_ARTIFACT, ARTIFACT=BENCH_ARTIFACT)


_COMMENT = f"""# Posts the benchmark gate's summary (harness-bench.yml's `{BENCH_ARTIFACT}` artifact) on its pull
# request (written by `harness init`). harness-bench.yml runs PR code and so gets no write permission; this workflow may
# comment and so NEVER checks out or runs PR code: the artifact is read as data only (the PR number must be
# digits and name a PR that contains the benchmarked commit; the summary is posted as text, size-capped).
name: harness-bench-comment

on:
  # zizmor: workflow_run runs with this repository's token after an untrusted run. Accepted: this workflow
  # checks out nothing and runs nothing from the artifact, see above.
  workflow_run: # zizmor: ignore[dangerous-triggers]
    workflows: [harness-bench]
    types: [completed]

permissions: {{}}

# Comments on one PR branch one after the other (each edits the previous one).
concurrency:
  group: >-
    ${{{{ github.workflow }}}}-${{{{ github.event.workflow_run.head_repository.full_name }}}}-${{{{
    github.event.workflow_run.head_branch }}}}
  cancel-in-progress: false

jobs:
  comment:
    if: github.event.workflow_run.event == 'pull_request'
    runs-on: ubuntu-latest
    timeout-minutes: 5
    permissions:
      actions: read # the triggering run's artifacts
      pull-requests: write # the comment
    env:
      GH_TOKEN: ${{{{ github.token }}}}
      RUN_ID: ${{{{ github.event.workflow_run.id }}}}
      RUN_URL: ${{{{ github.event.workflow_run.html_url }}}}
      HEAD_SHA: ${{{{ github.event.workflow_run.head_sha }}}}
    steps:
      # A run whose bench job was skipped (no `{BENCH_LABEL}` label) uploads nothing.
      - id: find
        name: look for the artifact
        run: |
          count="$(gh api "repos/${{GITHUB_REPOSITORY}}/actions/runs/${{RUN_ID}}/artifacts" \\
            --jq '[.artifacts[] | select(.name == "{BENCH_ARTIFACT}" and (.expired | not))] | length')"
          if [ "$count" -gt 0 ]; then found=true; else found=false; fi
          echo "found=${{found}}" >> "$GITHUB_OUTPUT"
      - uses: {DOWNLOAD_ARTIFACT}
        if: steps.find.outputs.found == 'true'
        with:
          name: {BENCH_ARTIFACT}
          path: ${{{{ runner.temp }}}}/bench-results
          run-id: ${{{{ github.event.workflow_run.id }}}}
          github-token: ${{{{ github.token }}}}
      - name: comment on the pull request
        if: steps.find.outputs.found == 'true'
        run: |
          RESULTS="$RUNNER_TEMP/bench-results"
          pr="$(head -c 32 "$RESULTS/pr-number" | tr -d '[:space:]')"
          if ! [[ "$pr" =~ ^[0-9]{{1,10}}$ ]]; then
            echo "::error::pr-number is not a pull request number"
            exit 1
          fi
          # The artifact names the PR; the PR must contain the commit that was benchmarked.
          commits="$(gh pr view "$pr" --repo "$GITHUB_REPOSITORY" --json commits --jq '.commits[].oid')"
          if ! grep -qx "$HEAD_SHA" <<< "$commits"; then
            echo "::error::pull request #${{pr}} does not contain the benchmarked commit ${{HEAD_SHA}}"
            exit 1
          fi
          {{
            echo "### Benchmarks (harness bench-compare) for ${{HEAD_SHA}}"
            echo
            if [ -f "$RESULTS/summary.md" ]; then
              head -c 60000 "$RESULTS/summary.md"
            else
              echo "The gate wrote no summary: it failed before comparing."
            fi
            echo
            echo "[workflow run](${{RUN_URL}})"
          }} > "$RUNNER_TEMP/comment.md"
          gh pr comment "$pr" --repo "$GITHUB_REPOSITORY" --edit-last --body-file "$RUNNER_TEMP/comment.md" \\
            || gh pr comment "$pr" --repo "$GITHUB_REPOSITORY" --body-file "$RUNNER_TEMP/comment.md"
"""


# --- the nightly's jobs ----------------------------------------------------------------------------------------

_NIGHTLY_JOBS = r"""  bench:
    if: @@IF@@
    runs-on: @@RUNS_ON@@
    timeout-minutes: @@TIMEOUT@@
    permissions:
      contents: read
    env:
@@ENV@@    steps:
      - uses: @@CHECKOUT@@
        with:
          fetch-depth: 0 # the branch's history: the commits to benchmark, their order for harness regressions
          persist-credentials: false
      # The stored history; missing before the first night's store job created the branch.
      - id: history
        uses: @@CHECKOUT@@
        continue-on-error: true
        with:
          ref: ${{ env.RESULTS_BRANCH }}
          path: asv-history
          persist-credentials: false
      - name: restore the results history
        if: steps.history.outcome == 'success'
        run: |
          mkdir -p .asv/results
          git -C asv-history archive --format=tar HEAD | tar -x -C .asv/results
      - uses: @@SETUP_PYTHON@@
        with:
          python-version: ${{ env.PYTHON_VERSION }}
      - name: install harness
        run: eval "$SETUP"
      - run: asv machine --yes --machine "$ASV_MACHINE"
      # The branch's newest MAX_COMMITS commits that have no results on this machine yet, each built by asv as
      # asv.conf.json says. asv exits 2 when a benchmark fails: that result is recorded, the night goes on.
      - name: asv run on the new commits
        run: |
          new="$RUNNER_TEMP/new-commits"
          : > "$new"
          for commit in $(git rev-list --first-parent -n "$MAX_COMMITS" HEAD); do
            if ! compgen -G ".asv/results/${ASV_MACHINE}/${commit:0:8}-*.json" > /dev/null; then
              echo "$commit" >> "$new"
            fi
          done
          if [ ! -s "$new" ]; then
            echo "no new commits to benchmark"
            exit 0
          fi
          args=(--machine "$ASV_MACHINE" --show-stderr)
          if [ -n "$BENCH" ]; then args+=(--bench "$BENCH"); fi
          status=0
          asv run "HASHFILE:${new}" "${args[@]}" || status=$?
          if [ "$status" -ne 0 ] && [ "$status" -ne 2 ]; then exit "$status"; fi
      # Outside the hidden .asv folder: upload-artifact leaves hidden files out.
      - name: collect the results
        run: |
          mkdir -p .asv/results
          cp -R .asv/results "$RUNNER_TEMP/asv-results"
          # harness dashboard: asv publish with its scripts and styles beside it (the page renders offline)
          if [ -d ".asv/results/${ASV_MACHINE}" ]; then harness dashboard && cp -R .asv/html "$RUNNER_TEMP/asv-html"; fi
      - uses: @@UPLOAD_ARTIFACT@@
        with:
          name: harness-asv-results
          path: ${{ runner.temp }}/asv-results
          retention-days: 7
      - uses: @@UPLOAD_ARTIFACT@@
        with:
          name: harness-asv-html
          path: ${{ runner.temp }}/asv-html
          if-no-files-found: ignore
          retention-days: 7
      # harness regressions: exit 1 when a regression newer than SINCE_DAYS exists (the report job decides
      # what to open); 2 (bad input) or 3 (no verdict) stop the night, said to be no regression.
      - name: find regressions
        run: |
          out="$RUNNER_TEMP/regressions"
          mkdir -p "$out"
          since="$(date -u -d "${SINCE_DAYS} days ago" +%Y-%m-%d)"
          args=(--results .asv/results --machine "$ASV_MACHINE" --repo . --since "$since")
          if [ -n "$BENCH" ]; then args+=(--bench "$BENCH"); fi
          status=0
          harness regressions "${args[@]}" --markdown "$out/summary.md" --json > "$out/regressions.json" \
            || status=$?
          if [ "$status" -gt 1 ]; then
            echo "::error::no verdict: harness regressions could not read the history (exit ${status}): no regression"
            exit "$status"
          fi
          cat "$out/summary.md" >> "$GITHUB_STEP_SUMMARY"
      # After the results were collected: the probes' results stay out of the history. At most BISECT_MAX new
      # regressions whose range spans several commits, each time-boxed; bisect-<index>.json per regression.
      - name: bisect new regressions
        timeout-minutes: 150
        run: |
          out="$RUNNER_TEMP/regressions"
          jq -r '.regressions | to_entries[] | select(.value.new and .value.commits > 1) | .key' \
            "$out/regressions.json" | head -n "$BISECT_MAX" | while read -r index; do
            reg="$(jq -c --argjson i "$index" '.regressions[$i]' "$out/regressions.json")"
            args=("$(jq -r .name <<< "$reg")" "$(jq -r .last_good <<< "$reg")" "$(jq -r .first_bad <<< "$reg")")
            params="$(jq -r .params <<< "$reg")"
            if [ -n "$params" ]; then args+=(--params "$params"); fi
            timeout 45m harness bisect "${args[@]}" --mode virtualenv --machine "$ASV_MACHINE" --json \
              > "$out/bisect-$index.json" || echo "bisect of regression $index: exit $? (1: not worse; 3: no verdict)"
          done
      - uses: @@UPLOAD_ARTIFACT@@
        with:
          name: harness-regressions
          path: ${{ runner.temp }}/regressions
          retention-days: 30

  # Plain git, no checkout of project code: the only job that can write to the repository runs none of it.
  store:
    needs: bench
    runs-on: ubuntu-latest
    timeout-minutes: 10
    permissions:
      contents: write # push to the results branch
    env:
      RESULTS_BRANCH: @@RESULTS_BRANCH@@
    steps:
      - uses: @@DOWNLOAD_ARTIFACT@@
        with:
          name: harness-asv-results
          path: ${{ runner.temp }}/asv-results
      # Files are added or replaced, never deleted: a night whose restore failed cannot erase the history.
      - name: push to the results branch
        env:
          GH_TOKEN: ${{ github.token }}
        run: |
          git init -q results && cd results
          git config user.name "github-actions[bot]"
          git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
          auth="$(printf 'x-access-token:%s' "$GH_TOKEN" | base64 -w0)"
          echo "::add-mask::${auth}"
          git config "http.${GITHUB_SERVER_URL}/.extraheader" "AUTHORIZATION: basic ${auth}"
          git remote add origin "${GITHUB_SERVER_URL}/${GITHUB_REPOSITORY}.git"
          if git fetch -q --depth=1 origin "$RESULTS_BRANCH"; then
            git checkout -q -b "$RESULTS_BRANCH" FETCH_HEAD
          else
            git checkout -q --orphan "$RESULTS_BRANCH"
          fi
          cp -R "$RUNNER_TEMP/asv-results/." .
          git add -A
          if git diff --cached --quiet; then echo "no new results"; exit 0; fi
          git commit -q -m "asv results for ${GITHUB_SHA}"
          git push -q origin "$RESULTS_BRANCH"

  # One issue per new regression, titled by benchmark, parameters and first bad commit: a later night finds the
  # open issue by that title and comments with its figures. jq and gh over the bench job's JSON, no project code.
  report:
    needs: bench
    runs-on: ubuntu-latest
    timeout-minutes: 10
    permissions:
      issues: write # open or comment on one issue per regression
    steps:
      - uses: @@DOWNLOAD_ARTIFACT@@
        with:
          name: harness-regressions
          path: ${{ runner.temp }}/regressions
      - name: open or update issues
        env:
          GH_TOKEN: ${{ github.token }}
          GH_REPO: ${{ github.repository }}
          RUN_URL: ${{ github.server_url }}/${{ github.repository }}/actions/runs/${{ github.run_id }}
        run: |
          dir="$RUNNER_TEMP/regressions"
          label=benchmark-regression
          gh label create "$label" --color B60205 --description "found by the nightly harness regressions" \
            > /dev/null 2>&1 || true
          open="$(gh issue list --label "$label" --state open --limit 500 --json number,title)"
          machine="$(jq -r .machine "$dir/regressions.json")"
          jq -r '.regressions | to_entries[] | select(.value.new) | .key' "$dir/regressions.json" |
          while read -r index; do
            reg="$(jq -c --argjson i "$index" '.regressions[$i]' "$dir/regressions.json")"
            title="$(jq -r '"Benchmark regression: \(.name)\(if .params == "" then "" else " (\(.params))" end)
              at \(.first_bad[:8])" | gsub("\\s+"; " ")' <<< "$reg")"
            body="$(jq -r --arg machine "$machine" --arg run "$RUN_URL" '
              def num: if . == null then "n/a" else (. * 10000 | round / 10000 | tostring) end;
              "The nightly `harness regressions` ([run](\($run)), machine `\($machine)`) finds a standing " +
              "regression.\n\n| benchmark | parameters | last good..first bad | before | after | worse by | noise |\n" +
              "|---|---|---|---|---|---|---|\n" +
              "| `\(.name)` | \(.params) | \(.last_good[:8])..\(.first_bad[:8]) (\(.commits) commits) | " +
              "\(.before | num) \(.unit) | \(.after | num) \(.unit) | \(.ratio | num)x | " +
              "\(if .noise == null then "n/a" else (.noise * 1000 | round / 10 | tostring) + "%" end) |"
              ' <<< "$reg")"
            if [ -s "$dir/bisect-$index.json" ]; then
              body+=$'\n\n'"$(jq -r '
                if .first_bad == null then
                  "`harness bisect` named no commit (exit \(.status)): \(.error // (.notes | join("; ")))"
                else
                  "`harness bisect` (\(.runs) runs, bound \(.bound)): first bad commit \(.first_bad.commit) " +
                  "\"\(.first_bad.subject)\", \(.first_bad.before) -> \(.first_bad.after) \(.unit)"
                end' "$dir/bisect-$index.json")"
            fi
            number="$(jq -r --arg t "$title" '[.[] | select(.title == $t) | .number][0] // empty' <<< "$open")"
            if [ -n "$number" ]; then
              gh issue comment "$number" --body "$body"
            else
              gh issue create --title "$title" --label "$label" --body "$body"
            fi
          done
"""

_NIGHTLY_HEAD = """# Nightly benchmarks of main (written by `harness init`): asv runs the suites of benchmarks/ on
# main's newest commits that have no results yet (each built as asv.conf.json says), `harness regressions` finds
# the standing regressions in the whole history, `harness bisect` names the first bad commit of each new one, and
# the report job opens one GitHub issue per new regression (or comments on the open one).
#
# History lives on the branch `asv-results` (the contents of .asv/results), not in the Actions cache, which
# evicts it. Only the store job can write to the repository and only the report job can write issues; neither
# runs project code. The bench job, which installs and runs the project, only reads.
name: harness-nightly

on:
  schedule:
    - cron: "23 2 * * *"
  workflow_dispatch:

permissions: {}

# One run at a time, never cancelled halfway (two runs pushing results would race).
concurrency:
  group: ${{ github.workflow }}
  cancel-in-progress: false

jobs:
"""


def _nightly_jobs(*, reusable: bool, values: dict[str, Value] | None) -> str:
    return _fill(_NIGHTLY_JOBS,
                 IF="github.ref == format('refs/heads/{0}', inputs.branch)" if reusable
                 else "github.ref == 'refs/heads/main'",
                 RUNS_ON="${{ fromJSON(inputs.runs-on) }}" if reusable else "ubuntu-latest",
                 TIMEOUT="${{ inputs.timeout-minutes }}" if reusable else "300",
                 ENV=_env_block(_NIGHTLY_SETTINGS, None if reusable else values),
                 RESULTS_BRANCH="${{ inputs.results-branch }}" if reusable
                 else _yaml((values or {}).get("results-branch", "asv-results")),
                 CHECKOUT=CHECKOUT, SETUP_PYTHON=SETUP_PYTHON, UPLOAD_ARTIFACT=UPLOAD_ARTIFACT,
                 DOWNLOAD_ARTIFACT=DOWNLOAD_ARTIFACT)


# --- harness' own reusable workflows ----------------------------------------------------------------------------

_RUNNER_INPUTS = (
    ("runs-on", "the runner, as JSON: a label (\"ubuntu-latest\") or a list of labels", "string",
     '"ubuntu-latest"'),
    ("timeout-minutes", "the benchmark job's time limit", "number", 300),
)
_BASE_REF_INPUT = ("base-ref", "the branch the pull request merges into ('': github.base_ref)", "string", "")
_BRANCH_INPUT = ("branch", "the branch benchmarked: the bench job runs only on it", "string", "main")

_REUSABLE_GATE_HEAD = """# Reusable: the benchmark gate of a repository that adopted harness (`harness init --reusable
# OWNER/REPO@SHA` writes a harness-bench.yml that calls this file, pinned by commit). `harness bench-compare`
# runs the caller's asv suites on the pull request's base and head and fails on a significant slow-down (exit 1), or
# with no verdict (3: a benchmark that errors on head, asv failing, nothing judged: an infrastructure error, never a
# slow-down); the summary goes to the job summary and, with the
# asv results and the PR number, to the `harness-bench` artifact (the caller's harness-bench-comment.yml posts
# it). The job reads only (contents: read); the caller decides when it runs (label-gated, never
# pull_request_target). Rendered by harness.ci.adopt.reusable_workflows(); tests/unit/test_adopt_ci.py checks
# this file is its output and that the inline form `harness init` writes runs the same steps.
name: reusable-bench-gate

on:
  workflow_call:
    inputs:
"""

_REUSABLE_NIGHTLY_HEAD = """# Reusable: the nightly benchmarks of a repository that adopted harness (`harness init
# --reusable OWNER/REPO@SHA` writes a harness-nightly.yml that calls this file, pinned by commit): asv on the branch's
# newest commits without results, `harness regressions` over the history kept on the results branch, `harness
# bisect` of each new regression, and one issue per new regression. The caller's job must grant contents: write
# (the store job pushes the results branch) and issues: write (the report job); the bench job, which runs the
# caller's code, gets contents: read only, and the jobs that write run none of it. Rendered by
# harness.ci.adopt.reusable_workflows(); tests/unit/test_adopt_ci.py checks this file is its output and that the
# inline form `harness init` writes runs the same steps.
name: reusable-nightly

on:
  workflow_call:
    inputs:
"""


def reusable_workflows() -> dict[str, str]:
    """The text of harness' own .github/workflows/reusable-bench-gate.yml and reusable-nightly.yml."""
    gate = (_REUSABLE_GATE_HEAD + _inputs_block(_GATE_SETTINGS, (_BASE_REF_INPUT, *_RUNNER_INPUTS))
            + "\npermissions: {}\n\njobs:\n" + _gate_job(reusable=True, values=None))
    nightly = (_REUSABLE_NIGHTLY_HEAD + _inputs_block(_NIGHTLY_SETTINGS, (_BRANCH_INPUT, *_RUNNER_INPUTS))
               + "\npermissions: {}\n\njobs:\n" + _nightly_jobs(reusable=True, values=None))
    return {f".github/workflows/{REUSABLE_FILES['bench']}": gate,
            f".github/workflows/{REUSABLE_FILES['nightly']}": nightly}


# --- the files of a user's repository ---------------------------------------------------------------------------


def _ci_workflow(project: Project, entry: Entry, harness_requirement: str) -> str:
    pins = [shlex.quote(p) for p in tox_deps(entry)]
    install = " ".join(["python -m pip install .", shlex.quote(_requirement(harness_requirement, ("test",))), *pins])
    env = "".join(f"    env:\n      {k}: {_yaml(v)}\n" for k, v in entry.env.items())
    return f"""# harness' equivalence checks on GitHub's hosted runners (written by `harness init`; harness.toml
# names the workloads): tests/test_harness_equivalence.py runs `harness check` on each workload and asserts its parallel
# training on {project.devices} logical CPU devices equals its single-device training.
# TensorFlow {entry.tensorflow}, Keras {entry.keras}: matrix entry {entry.name}, the newest of harness.toml's matrix.
name: harness-ci

on:
  push:
    branches: [main]
  pull_request:

permissions: {{}}

concurrency:
  group: ${{{{ github.workflow }}}}-${{{{ github.ref }}}}
  cancel-in-progress: true

jobs:
  equivalence:
    runs-on: ubuntu-latest
    timeout-minutes: 60
    permissions:
      contents: read
{env}    steps:
      - uses: {CHECKOUT}
        with:
          persist-credentials: false
      - uses: {SETUP_PYTHON}
        with:
          python-version: "{entry.python}"
      - name: install
        run: {install}
      - name: harness equivalence test on logical CPU devices
        run: python -m pytest -p no:cacheprovider -v tests/test_harness_equivalence.py
"""


_IN_IMAGE = r"""          in_image() {
            docker run --rm --gpus all -e CUDA_VISIBLE_DEVICES -e TF_FORCE_GPU_ALLOW_GROWTH=true \
              -e HARNESS_CHECK_DEVICES -v "$PWD:/src:ro" "$IMAGE" \
              bash -c 'cp -r /src "$HOME/src" && cd "$HOME/src" && "$@"' in-image "$@"
          }
"""


def _gpu_workflow(project: Project, entries: list[Entry], slug: str) -> str:
    devices = _gpus(project)
    indent = " " * 10
    checks = "\n".join(indent + _wrap(["in_image", *argv], indent) + " || status=1"
                       for argv in _check_commands(project, devices))
    names = ", ".join(e.name for e in entries)
    return f"""# harness' checks on real GPUs (written by `harness init`): for each entry of harness.toml's matrix
# ({names}), the image docker/harness.Dockerfile builds with that entry's TensorFlow, Keras and CUDA
# (docker/harness-bake.hcl, target "<entry>-gpu") runs the equivalence test and `harness check` of every workload
# on {" ".join(devices)}, and each asv benchmark once (`asv run --quick`).
#
# Trust model (as harness' own gpu.yml). Self-hosted machines outlive a job: code that runs there could leave
# something behind for later jobs. So only code a maintainer has vouched for runs:
#   - push to main: reviewed and merged code;
#   - workflow_dispatch: started by someone with write access;
#   - pull_request, only the `labeled` event, and only when the label just added is `{GPU_LABEL}`. Labels can only
#     be added by people with triage/write access, and a later push does NOT re-run it (no `synchronize`): a
#     maintainer re-applies the label after reading the new commits.
# Never pull_request_target: the job gets no secrets and a read-only token. Runners labelled `gpu`
# (.github/actionlint.yaml): at least {project.devices} NVIDIA GPU(s), their driver, Docker with the NVIDIA
# container toolkit, and buildx. Use ephemeral runners where possible.
name: harness-gpu

on:
  push:
    branches: [main]
  workflow_dispatch:
  pull_request:
    types: [labeled]

permissions: {{}}

# A newer run for the same ref replaces an older one; adding some other label to a PR starts a run of its own
# (its job skips) that must not cancel a running one.
concurrency:
  group: >-
    ${{{{ github.workflow }}}}-${{{{ github.ref }}}}-${{{{
    github.event.action == 'labeled' && github.event.label.name != '{GPU_LABEL}' && github.run_id || 'gpu' }}}}
  cancel-in-progress: true

jobs:
  gpu:
    if: github.event_name != 'pull_request' || github.event.label.name == '{GPU_LABEL}'
    runs-on: [self-hosted, gpu]
    timeout-minutes: 180
    permissions:
      contents: read
    strategy:
      fail-fast: false
      matrix:
        entry: [{names}]
    name: gpu (${{{{ matrix.entry }}}})
    env:
      ENTRY: ${{{{ matrix.entry }}}}
      IMAGE: "{slug}-harness:${{{{ matrix.entry }}}}-gpu"
      HARNESS_CHECK_DEVICES: "{" ".join(devices)}"
    steps:
      - uses: {CHECKOUT}
        with:
          persist-credentials: false
      - id: bake
        run: docker buildx bake --file docker/harness-bake.hcl --load "${{ENTRY}}-gpu"
      # Each check runs in the image (its pinned TensorFlow, Keras and CUDA, this checkout's package installed):
      # the checkout is mounted read-only and copied into the container's home, as tests and asv write beside it.
      # TF_FORCE_GPU_ALLOW_GROWTH: the processes harness check starts share the cards.
      - name: equivalence test on GPUs
        timeout-minutes: 60
        run: |
{_IN_IMAGE}          in_image python -m pytest -p no:cacheprovider -v tests/test_harness_equivalence.py
      - name: harness check on GPUs
        if: ${{{{ !cancelled() && steps.bake.outcome == 'success' }}}}
        timeout-minutes: 60
        run: |
{_IN_IMAGE}          status=0
{checks}
          exit "$status"
      - name: asv benchmarks, each once
        if: ${{{{ !cancelled() && steps.bake.outcome == 'success' }}}}
        timeout-minutes: 60
        run: |
{_IN_IMAGE}          in_image bash -c 'asv machine --yes && asv run --quick --python=same --show-stderr'
      - name: harness env
        if: ${{{{ !cancelled() && steps.bake.outcome == 'success' }}}}
        run: docker run --rm --gpus all "$IMAGE" harness env
      - name: remove the image
        if: always()
        run: docker image rm "$IMAGE" || true
"""


def _bench_workflow(values: dict[str, Value], reusable: tuple[str, str] | None) -> str:
    if reusable is None:
        return _GATE_HEAD + _gate_job(reusable=False, values=values)
    repo, sha = reusable
    return _GATE_HEAD + f"""  bench:
{_GATE_IF}    permissions:
      contents: read
    uses: {repo}/.github/workflows/{REUSABLE_FILES['bench']}@{sha}
    with:
""" + _with_block(_GATE_SETTINGS, values, {"base-ref": "${{ github.base_ref }}"})


def _nightly_workflow(values: dict[str, Value], reusable: tuple[str, str] | None) -> str:
    if reusable is None:
        return _NIGHTLY_HEAD + _nightly_jobs(reusable=False, values=values)
    repo, sha = reusable
    return _NIGHTLY_HEAD + f"""  nightly:
    permissions:
      contents: write # the store job pushes the results branch (it runs no project code)
      issues: write # the report job opens one issue per new regression (it runs no project code)
    uses: {repo}/.github/workflows/{REUSABLE_FILES['nightly']}@{sha}
    with:
""" + _with_block(_NIGHTLY_SETTINGS, values, {"branch": "main"})


_ACTIONLINT = """# actionlint: the label of the self-hosted GPU runners harness-gpu.yml runs on (written by
# `harness init`).
# "self-hosted" is GitHub's own label; "gpu": a machine with NVIDIA GPUs, their driver, Docker with the NVIDIA
# container toolkit (docker run --gpus) and buildx.
self-hosted-runner:
  labels:
    - gpu
"""


_DOCKERFILE = r"""# An image of this repository for one entry of harness' version matrix (written by `harness init`):
# the entry's TensorFlow and Keras, harness (@@HARNESS@@) and this repository's package (`pip install .`).
# Build arguments come from docker/harness-bake.hcl, one target per entry and variant, from the repository root:
#
#   docker buildx bake --file docker/harness-bake.hcl --load @@NEWEST@@       # CPU: tensorflow-cpu on Debian
#   docker buildx bake --file docker/harness-bake.hcl --load @@NEWEST@@-gpu   # GPU: tensorflow[and-cuda] on CUDA
#
# The build context is the repository root; docker/harness.Dockerfile.dockerignore keeps virtualenvs and asv's
# environments and results out of it (.git stays: a version from setuptools-scm needs it).
# The image runs `harness env`; harness-gpu.yml runs the checks in it.

ARG BASE_IMAGE=@@CPU_BASE@@
FROM ${BASE_IMAGE}

ARG PYTHON=@@PYTHON@@
ARG ENTRY=@@NEWEST@@
ARG VARIANT=cpu
ARG TENSORFLOW=@@TENSORFLOW@@
ARG KERAS=@@KERAS@@
ARG TF_REQUIREMENT=@@TF_REQUIREMENT@@
ARG KERAS_REQUIREMENT=@@KERAS_REQUIREMENT@@
ARG HARNESS_REQUIREMENT="@@HARNESS@@"
ARG CUDA=@@CUDA@@
ARG CUDNN=@@CUDNN@@
ARG TF_USE_LEGACY_KERAS=0
ARG PACKAGE="@@PACKAGE@@"

LABEL org.opencontainers.image.title="${PACKAGE} with harness, ${ENTRY} (${VARIANT})" \
      org.opencontainers.image.description="${PACKAGE} and harness: TensorFlow ${TENSORFLOW}, Keras ${KERAS}, \
Python ${PYTHON}" \
      io.harness.entry="${ENTRY}" \
      io.harness.variant="${VARIANT}" \
      io.harness.tensorflow="${TENSORFLOW}" \
      io.harness.keras="${KERAS}" \
      io.harness.python="${PYTHON}" \
      io.harness.cuda="${CUDA}" \
      io.harness.cudnn="${CUDNN}" \
      io.harness.base="${BASE_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Versions come from the base image's release (Debian bookworm or Ubuntu 22.04), pinned by the base tag itself;
# pinning Debian package versions here would break one of the two bases. git: asv reads the repository.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "python${PYTHON}" "python${PYTHON}-venv" ca-certificates git \
 && rm -rf /var/lib/apt/lists/*

# The package is installed from a bind mount of the context (writable for the build, discarded after it): the
# image holds what pip installed, not a copy of the repository. TensorFlow and Keras are pinned by the matrix.
RUN --mount=type=bind,source=.,target=/src,rw \
    "python${PYTHON}" -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        "${TF_REQUIREMENT}" ${KERAS_REQUIREMENT:+"${KERAS_REQUIREMENT}"} "${HARNESS_REQUIREMENT}" /src \
 && /opt/venv/bin/pip check

# Numeric, so that hosts and Kubernetes' runAsNonRoot can tell it is not root.
RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash harness
USER 1000:1000
WORKDIR /home/harness
ENV PATH=/opt/venv/bin:${PATH} \
    TF_USE_LEGACY_KERAS=${TF_USE_LEGACY_KERAS} \
    TF_CPP_MIN_LOG_LEVEL=1 \
    PYTHONDONTWRITEBYTECODE=1

# The smoke command: versions, devices and drivers as harness sees them.
CMD ["harness", "env"]
"""


_DOCKERIGNORE = """# The build context of docker/harness.Dockerfile (written by `harness init`; BuildKit reads
# <Dockerfile>.dockerignore beside it): the repository, less what is large and never part of the package.
.asv/
.tox/
.nox/
.venv/
**/__pycache__/
"""


def _dockerfile(entry: Entry, package: str, harness: str) -> str:
    args = build_args(entry)
    return _fill(_DOCKERFILE, HARNESS=harness, NEWEST=entry.name, CPU_BASE=CPU_BASE, PYTHON=entry.python,
                 TENSORFLOW=args["TENSORFLOW"], KERAS=args["KERAS"], TF_REQUIREMENT=args["TF_REQUIREMENT"],
                 KERAS_REQUIREMENT=args["KERAS_REQUIREMENT"], CUDA=entry.cuda, CUDNN=entry.cudnn,
                 PACKAGE=re.sub(r'["\\$`]', "", package))


def image_tag(slug: str, entry: Entry, variant: str) -> str:
    return f"{slug}-harness:{entry.name}" + ("" if variant == "cpu" else "-gpu")


def _bake(entries: list[Entry], slug: str, harness: str) -> str:
    """docker/harness-bake.hcl: one target per entry and variant (harness.ci.matrix.bake_file's layout)."""
    out = [
        "# Images of this repository, one per entry of harness.toml's matrix and variant (written by `harness init`;",
        "# versions from harness' docker/matrix.toml). From the repository root:",
        "#   docker buildx bake --file docker/harness-bake.hcl --load ENTRY        (CPU)",
        "#   docker buildx bake --file docker/harness-bake.hcl --load ENTRY-gpu    (GPU)",
        "",
        f'variable "CPU_BASE" {{\n  default = "{CPU_BASE}"\n}}',
        "",
        f'variable "HARNESS_REQUIREMENT" {{\n  default = "{harness}"\n}}',
        "",
        'group "default" {\n  targets = ["cpu"]\n}',
        "",
    ]
    for variant in VARIANTS:
        names = ", ".join(f'"{e.name}{"" if variant == "cpu" else "-gpu"}"' for e in entries)
        out += [f'group "{variant}" {{\n  targets = [{names}]\n}}', ""]
    out += ['target "_common" {\n  context    = "."\n  dockerfile = "docker/harness.Dockerfile"\n}', ""]
    for entry in entries:
        for variant in VARIANTS:
            tag = image_tag(slug, entry, variant)
            args = build_args(entry, variant, cpu_base="${CPU_BASE}")
            args["HARNESS_REQUIREMENT"] = "${HARNESS_REQUIREMENT}"
            width = max(len(k) for k in args)
            out += [f'target "{entry.name}{"" if variant == "cpu" else "-gpu"}" {{',
                    '  inherits = ["_common"]',
                    f'  tags     = ["{tag}"]',
                    "  args = {",
                    *(f'    {k.ljust(width)} = "{v}"' for k, v in args.items()),
                    "  }",
                    "}",
                    ""]
    return "\n".join(out).rstrip("\n") + "\n"


def tox_gpu_section(project: Project, *, harness_requirement: str = "keras-harness") -> str:
    """tox.ini's ``[testenv:gpu]`` (with its comment), to write as tox.ini or append to one: the equivalence test
    and ``harness check`` of every workload on the machine's GPUs, newest entry of the project's matrix."""
    _checked(project)
    entry = newest_entry(matrix_entries(project.matrix, MATRIX))
    devices = _gpus(project)
    deps = [d.replace("tensorflow-cpu", "tensorflow[and-cuda]") for d in tox_deps(entry)]
    deps.append(_requirement(harness_requirement, ("test",)))
    setenv = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "HARNESS_CHECK_DEVICES": " ".join(devices), **entry.env}
    checks = [" ".join(shlex.quote(a) for a in argv) for argv in _check_commands(project, devices)]
    lines = [
        "# harness' checks on this machine's GPUs (written by `harness init`): `tox -e gpu` runs the equivalence",
        f"# test and `harness check` of every workload of harness.toml on {' '.join(devices)}, with the newest",
        f"# TensorFlow and Keras of its matrix ({entry.name}) built for CUDA.",
        "[testenv:gpu]",
        f"description = harness' equivalence test and harness check of every workload on {len(devices)} GPU(s), "
        f"TensorFlow {entry.tensorflow} (matrix entry {entry.name})",
        "deps =",
        *(f"    {d}" for d in deps),
        "passenv = CUDA_VISIBLE_DEVICES, NVIDIA_*, TF_*, XLA_*",
        "setenv =",
        *(f"    {k} = {v}" for k, v in setenv.items()),
        "commands =",
        "    pytest -p no:cacheprovider tests/test_harness_equivalence.py {posargs}",
        *(f"    {c}" for c in checks),
    ]
    return "\n".join(lines) + "\n"


def ci_files(project: Project, package: str, *, reusable: str | None = None,
             harness_requirement: str = "keras-harness") -> dict[str, str]:
    """Relative path -> file text of the CI files for a user's repository (the module's docstring lists them).

    Args:
        project: the repository's harness configuration (``harness.project.load_project``).
        package: the repository's package name (image names and labels); the repository's root is the
            pip-installable package (``pip install .``).
        reusable: None (the gate's and the nightly's steps inline), or ``OWNER/REPO@SHA`` of harness' repository:
            they call its reusable workflows pinned by that commit. Default: the project's ``reusable-workflows``.
        harness_requirement: how harness is installed (a pip requirement; extras are added after its name).

    Raises:
        InvalidValue: an unknown matrix entry (listing the known ones), a reusable value that is not
            OWNER/REPO@<40-hex SHA> (naming it), a workload reference or requirement not safe to write unquoted.
    """
    if reusable is None:
        configured = project.extra.get("reusable-workflows")
        reusable = configured if isinstance(configured, str) and configured else None
    pinned = parse_reusable(reusable) if reusable is not None else None
    _checked(project)
    entries = matrix_entries(project.matrix, MATRIX)
    entry = newest_entry(entries)
    slug = _slug(package)
    setup = f"python -m pip install {shlex.quote(_requirement(harness_requirement, ('bench',)))}"
    values: dict[str, Value] = {"python-version": entry.python, "setup": setup}
    image_harness = _requirement(harness_requirement, ("test", "bench"))
    return {
        ".github/workflows/harness-ci.yml": _ci_workflow(project, entry, harness_requirement),
        ".github/workflows/harness-gpu.yml": _gpu_workflow(project, entries, slug),
        ".github/workflows/harness-bench.yml": _bench_workflow(values, pinned),
        ".github/workflows/harness-bench-comment.yml": _COMMENT,
        ".github/workflows/harness-nightly.yml": _nightly_workflow(values, pinned),
        ".github/actionlint.yaml": _ACTIONLINT,
        "docker/harness.Dockerfile": _dockerfile(entry, package, image_harness),
        "docker/harness-bake.hcl": _bake(entries, slug, image_harness),
        "docker/harness.Dockerfile.dockerignore": _DOCKERIGNORE,
        "tox.ini": tox_gpu_section(project, harness_requirement=harness_requirement),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.ci.adopt reusable DIR``: writes harness' reusable workflows under DIR (the repository's
    root); ``check DIR`` exits 1 where they differ from the rendered ones."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.ci.adopt", description=main.__doc__)
    parser.add_argument("what", choices=["reusable", "check"])
    parser.add_argument("dir", nargs="?", default=".")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in reusable_workflows().items():
        path = Path(args.dir) / rel
        if args.what == "reusable":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            stale.append(rel)
    for rel in stale:
        print(f"{rel} differs from harness.ci.adopt.reusable_workflows(): python -m harness.ci.adopt reusable")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
