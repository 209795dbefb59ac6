"""The CI files ``harness init`` writes into another repository, and harness' own reusable workflows.

``ci_files(project, package)`` renders, for a repository whose harness.toml is ``project``
(``harness.project``) and whose pip-installable package is its root (``pip install .``):

  .github/workflows/harness-ci.yml           CPU CI (push, pull_request): the generated equivalence test on
                                             logical CPU devices, newest TensorFlow/Keras of the project's matrix
                                             (harness.toml's backend = "jax": keras-harness[jax], no TensorFlow)
  .github/workflows/harness-gpu.yml          the same checks, ``harness check`` and ``asv run --quick`` on
                                             self-hosted GPU runners, in the image of each matrix entry; gated
                                             like harness' own gpu.yml (push to the default branch, dispatch,
                                             label gpu-ok)
  .github/workflows/harness-bench.yml        the PR benchmark gate (``harness bench-compare``), label benchmark
  .github/workflows/harness-bench-comment.yml  posts the gate's summary on the PR; runs no PR code
  .github/workflows/harness-nightly.yml      nightly asv runs on the default branch's new commits, ``harness
                                             regressions``, ``harness bisect`` of new ones, an issue per regression
  .github/actionlint.yaml                    the self-hosted runner label ``gpu`` for actionlint
  docker/harness.Dockerfile, docker/harness-bake.hcl   an image per matrix entry (CPU and GPU variants)
  docker/harness.Dockerfile.dockerignore     what the image's build context (the repository) leaves out
  tox.ini                                    ``[testenv:gpu]`` (``tox_gpu_section``; appendable as it is)

With ``reusable="OWNER/REPO@SHA"`` the gate and the nightly call harness' reusable workflows
(``reusable_workflows()``: .github/workflows/reusable-bench-gate.yml and reusable-nightly.yml of
harness' repository) pinned by that commit instead of carrying their steps. Both forms run the same
steps: the inline jobs and the reusable ones are rendered from one template, the settings coming in
through ``env:`` (literal values inline, ``inputs`` in the reusable workflows).

Each file is a Jinja2 template under harness/ci/templates/ (``harness.ci.render``: ``<%= value %>``,
``#% statement`` lines; GitHub's ``${{ }}`` passes through), this module computing the values. The version
matrix is harness' docker/matrix.toml, shipped in the package as harness/ci/matrix.toml
(tests/unit/test_adopt_ci.py keeps the two identical), so an installed harness renders these files too (with
``keras-harness[ci]``, which brings Jinja2). Every file passes actionlint, zizmor, yamllint (harness'
.yamllint.yaml) and hadolint (tests/unit/test_adopt_ci.py).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from harness.ci.matrix import CPU_BASE, Entry, build_args, load_matrix, render_bake, tox_deps
from harness.ci.render import render_template, yaml_scalar
from harness.errors import InvalidValue

if TYPE_CHECKING:
    from harness.project import Project

__all__ = ["MATRIX", "ci_files", "tox_gpu_section", "reusable_workflows", "matrix_entries", "newest_entry",
           "parse_reusable", "requirement_with", "REUSABLE_FILES"]

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
# NAME[extras] VERSION-SPEC or NAME[extras] @ URL, in characters safe in every file that installs harness: a YAML
# plain or double-quoted scalar, a single-quoted shell word, a Dockerfile ARG and an HCL string in double quotes,
# a tox.ini deps line (no quotes, '$', '{', ';' or '#'; a URL without spaces).
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                          r" *(?:\[(?P<extras>[A-Za-z0-9._, -]*)\])?"
                          r"(?: *@ *(?P<url>[A-Za-z0-9._~/:@+=!,%?&-]+)|(?P<spec> *[<>=!~][A-Za-z0-9.*+!<>=~, ]*))?$")
# A git branch name, restricted to what is safe in a YAML flow list and in a GitHub expression's quoted string.
_BRANCH = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._/-]*[A-Za-z0-9_-])?$")
_WIDTH = 120  # the longest line harness' .yamllint.yaml allows

Value = Union[str, int]


def matrix_entries(names, path: Path | str | None = None) -> list[Entry]:
    """The docker/matrix.toml entries called ``names`` (default file: the packaged copy), in that order.

    Raises:
        InvalidValue: a name that is no entry (the message names it and lists the known ones), or an entry
            without TensorFlow (jax011): the files written here install TensorFlow.
    """
    entries = {e.name: e for e in load_matrix(path if path is not None else MATRIX)}
    unknown = [n for n in names if n not in entries]
    if unknown:
        raise InvalidValue(f"matrix entry {unknown[0]!r} is not in harness' docker/matrix.toml "
                           f"(known: {', '.join(entries)})")
    jax = [n for n in names if not entries[n].has_tensorflow]
    if jax:
        raise InvalidValue(f"matrix entry {jax[0]!r} is Keras 3 on JAX without TensorFlow (backend = "
                           f"{entries[jax[0]].backend!r}); the images, tox env and workflows harness init writes "
                           "install TensorFlow: name TensorFlow entries (known: "
                           f"{', '.join(n for n, e in entries.items() if e.has_tensorflow)})")
    if not names:
        raise InvalidValue(f"the project names no matrix entry (known: {', '.join(entries)})")
    return [entries[n] for n in names]


def newest_entry(entries: list[Entry]) -> Entry:
    """The entry flagged newest where it is among them, else the one with the newest TensorFlow (Keras 3 first;
    entries without TensorFlow only where there is no other)."""
    for entry in entries:
        if entry.newest:
            return entry
    return max(entries, key=lambda e: (e.has_tensorflow, tuple(int(p) for p in (e.tensorflow or "0").split(".")),
                                       e.keras_major))


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


def requirement_with(requirement: str, extras: tuple[str, ...]) -> str:
    """``requirement`` with ``extras`` added after its name: keras-harness==0.1 -> keras-harness[test]==0.1,
    keras-harness @ URL -> keras-harness[test] @ URL.

    Raises:
        InvalidValue: not NAME[extras] VERSION-SPEC or NAME[extras] @ URL in the characters every generated file
            can carry unquoted or in its quotes; the message names it.
    """
    found = _REQUIREMENT.match(requirement.strip())
    if not found:
        raise InvalidValue("harness_requirement must be a pip requirement, name[extras] version or name[extras] @ URL, "
                           f"without quotes, '$', '{{', ';', '#' or spaces in the URL; got {requirement!r}")
    have = [x.strip() for x in (found["extras"] or "").split(",") if x.strip()]
    merged = have + [x for x in extras if x not in have]
    rest = f" @ {found['url']}" if found["url"] else (found["spec"] or "").strip()
    return f"{found['name']}[{','.join(merged)}]{rest}" if merged else f"{found['name']}{rest}"


def _setup(requirement: str) -> str:
    """The shell command a gate or nightly runner installs harness with (asv and the harness command)."""
    return f"python -m pip install {shlex.quote(requirement_with(requirement, ('bench',)))}"


def _branch(branch: str) -> str:
    """``branch``, checked: a git branch name of letters, digits, '_', '.', '/' and '-'."""
    if not _BRANCH.match(branch or "") or ".." in branch or "//" in branch or "/." in branch \
            or branch.endswith(".lock"):
        raise InvalidValue(f"branch must be a git branch name of letters, digits, '_', '.', '/' and '-' (the "
                           f"repository's default branch); got {branch!r}")
    return branch


def _note(note: str) -> list[str]:
    """``requirement_note`` as the lines of a comment (without the '# '): ``harness: NOTE``, on one line where it fits
    in 110 characters (at most 8 of indent and '# ' before it: 120, as harness' .yamllint.yaml allows), else
    wrapped, the later lines indented."""
    if not note:
        return []
    if any(ord(c) < 32 or ord(c) == 127 for c in note):
        raise InvalidValue(f"requirement_note must be one line of text (it is written as a comment); got {note!r}")
    return textwrap.wrap(f"harness: {note.strip()}", 110, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


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


def _shell_lines(words: list[str], width: int) -> list[str]:
    """Shell words, quoted, as the lines of a ``run: |`` script: at most ``width`` characters where the words
    allow, each line but the last ending in a backslash, the later ones indented by two spaces."""
    lines: list[str] = []
    for word in (shlex.quote(w) for w in words):
        if lines and len(lines[-1]) + 1 + len(word) + 2 <= width:
            lines[-1] += " " + word
        else:
            lines.append(("  " if lines else "") + word)
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def _yaml_value(key: str, value: Value, indent: int) -> str:
    """``value`` for ``KEY: value`` at ``indent``: a quoted scalar, or a folded one (``>-``) where that line would be
    longer than harness' .yamllint.yaml allows (a long harness requirement). The folded lines join with single
    spaces, so a value with other whitespace stays one (long) line."""
    text = yaml_scalar(value)
    if isinstance(value, int) or indent + len(key) + 2 + len(text) <= _WIDTH or value != " ".join(value.split()):
        return text
    lines = textwrap.wrap(value, _WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
    return ">-" + "".join(f"\n{' ' * (indent + 2)}{line}" for line in lines)


# --- the settings a gate or nightly job reads from env: (literal values inline, inputs when reusable) -----------


@dataclass(frozen=True)
class _Setting:
    env: str
    input: str
    description: str
    default: Value


_SETUP = _Setting("SETUP", "setup", "shell command installing harness (the harness command, asv) on the runner",
                  _setup("keras-harness"))
_GATE_SETTINGS = (
    _Setting("PYTHON_VERSION", "python-version", "the Python the runner sets up (harness and asv run in it)", "3.11"),
    _SETUP,
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
    _SETUP,
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

_RUNNER_INPUTS = (
    ("runs-on", "the runner, as JSON: a label (\"ubuntu-latest\") or a list of labels", "string",
     '"ubuntu-latest"'),
    ("timeout-minutes", "the benchmark job's time limit", "number", 300),
)
_BASE_REF_INPUT = ("base-ref", "the branch the pull request merges into ('': github.base_ref)", "string", "")
_BRANCH_INPUT = ("branch", "the branch benchmarked: the bench job runs only on it", "string", "main")


def _env(settings, values: dict[str, Value] | None) -> list[tuple[str, str]]:
    """A job's ``env:`` (name, YAML value): ``values`` literal (inline), or each setting's input (values None)."""
    if values is None:
        return [(s.env, f"${{{{ inputs.{s.input} }}}}") for s in settings]
    return [(s.env, _yaml_value(s.env, values.get(s.input, s.default), 6)) for s in settings]


def _with(settings, values: dict[str, Value]) -> list[tuple[str, str]]:
    """A call's ``with:`` (input, YAML value) of harness' reusable workflow."""
    return [(s.input, _yaml_value(s.input, values.get(s.input, s.default), 6)) for s in settings]


def _inputs(settings, extra: tuple[tuple[str, str, str, Value], ...]) -> list[dict[str, Any]]:
    """``on.workflow_call.inputs`` of a reusable workflow: ``extra`` (name, description, type, default) first."""
    rows = [*extra, *((s.input, s.description, "number" if isinstance(s.default, int) else "string", s.default)
                      for s in settings)]
    return [{"name": name, "description": textwrap.wrap(description, 90), "type": kind,
             "default": yaml_scalar(default)} for name, description, kind, default in rows]


def _common(**values: Any) -> dict[str, Any]:
    """The values every template may use: the pinned actions, labels and artifact, and ``values``."""
    return {"checkout": CHECKOUT, "setup_python": SETUP_PYTHON, "upload_artifact": UPLOAD_ARTIFACT,
            "download_artifact": DOWNLOAD_ARTIFACT, "gpu_label": GPU_LABEL, "bench_label": BENCH_LABEL,
            "bench_artifact": BENCH_ARTIFACT, "note": [], **values}


# --- harness' own reusable workflows ----------------------------------------------------------------------------


def reusable_workflows() -> dict[str, str]:
    """The text of harness' own .github/workflows/reusable-bench-gate.yml and reusable-nightly.yml."""
    gate = render_template("reusable-bench-gate.yml.j2", **_common(
        from_inputs=True, env=_env(_GATE_SETTINGS, None),
        inputs=_inputs(_GATE_SETTINGS, (_BASE_REF_INPUT, *_RUNNER_INPUTS))))
    nightly = render_template("reusable-nightly.yml.j2", **_common(
        from_inputs=True, env=_env(_NIGHTLY_SETTINGS, None),
        inputs=_inputs(_NIGHTLY_SETTINGS, (_BRANCH_INPUT, *_RUNNER_INPUTS))))
    return {f".github/workflows/{REUSABLE_FILES['bench']}": gate,
            f".github/workflows/{REUSABLE_FILES['nightly']}": nightly}


# --- the files of a user's repository ---------------------------------------------------------------------------


def _ci_workflow(project: Project, entry: Entry, harness_requirement: str, branch: str, note: list[str]) -> str:
    """harness-ci.yml: the package, harness and the newest entry's TensorFlow and Keras; on a JAX project harness'
    jax extra (Keras and CPU JAX) in their place, no TensorFlow."""
    if project.backend == "jax":
        words = ["python", "-m", "pip", "install", ".", requirement_with(harness_requirement, ("test", "jax"))]
        env: dict[str, str] = {}
    else:
        words = ["python", "-m", "pip", "install", ".", requirement_with(harness_requirement, ("test",)),
                 *tox_deps(entry)]
        env = dict(entry.env)
    install = [" ".join(shlex.quote(w) for w in words)]
    if len("        run: ") + len(install[0]) > _WIDTH:  # a long requirement: a script of several lines
        install = _shell_lines(words, _WIDTH - 10)
    return render_template("harness-ci.yml.j2", **_common(devices=project.devices, entry=entry, branch=branch,
                                                          install=install, note=note, backend=project.backend,
                                                          env=env))


def _gpu_workflow(project: Project, entries: list[Entry], slug: str, branch: str) -> str:
    devices = _gpus(project)
    indent = " " * 10
    checks = [_wrap(["in_image", *argv], indent) for argv in _check_commands(project, devices)]
    return render_template("harness-gpu.yml.j2", **_common(names=[e.name for e in entries], devices=devices,
                                                           branch=branch, slug=slug, checks=checks))


def _bench_workflow(values: dict[str, Value], reusable: tuple[str, str] | None, note: list[str]) -> str:
    if reusable is None:
        return render_template("harness-bench.yml.j2", **_common(calls=None, from_inputs=False, note=note,
                                                                 env=_env(_GATE_SETTINGS, values)))
    repo, sha = reusable
    return render_template("harness-bench.yml.j2", **_common(
        calls=f"{repo}/.github/workflows/{REUSABLE_FILES['bench']}@{sha}", note=note,
        with_=_with(_GATE_SETTINGS, values)))


def _nightly_workflow(values: dict[str, Value], reusable: tuple[str, str] | None, branch: str,
                      note: list[str]) -> str:
    if reusable is None:
        return render_template("harness-nightly.yml.j2", **_common(
            calls=None, from_inputs=False, branch=branch, note=note, env=_env(_NIGHTLY_SETTINGS, values),
            results_branch=yaml_scalar(values.get("results-branch", "asv-results"))))
    repo, sha = reusable
    return render_template("harness-nightly.yml.j2", **_common(
        calls=f"{repo}/.github/workflows/{REUSABLE_FILES['nightly']}@{sha}", branch=branch, note=note,
        with_=_with(_NIGHTLY_SETTINGS, values)))


def _dockerfile(entry: Entry, package: str, harness: str, note: list[str]) -> str:
    return render_template("harness.Dockerfile.j2", harness=harness, entry=entry, cpu_base=CPU_BASE,
                           args=build_args(entry), package=re.sub(r'["\\$`]', "", package), note=note)


def _bake(entries: list[Entry], slug: str, harness: str, note: list[str]) -> str:
    """docker/harness-bake.hcl: one target per entry and variant (``harness.ci.matrix.render_bake``, the layout of
    harness' own docker-bake.hcl), tagged ``SLUG-harness:TARGET``, harness installed as ``HARNESS_REQUIREMENT``."""
    return render_bake(entries, image=f"{slug}-harness", own=False,
                       variables={"CPU_BASE": CPU_BASE, "HARNESS_REQUIREMENT": harness},
                       notes={"HARNESS_REQUIREMENT": note}, context=".", dockerfile="docker/harness.Dockerfile")


def tox_gpu_section(project: Project, *, harness_requirement: str = "keras-harness",
                    requirement_note: str = "") -> str:
    """tox.ini's ``[testenv:gpu]`` (with its comment), to write as tox.ini or append to one: the equivalence test
    and ``harness check`` of every workload on the machine's GPUs, newest entry of the project's matrix.

    ``harness_requirement`` and ``requirement_note``: as ``ci_files`` takes them."""
    _checked(project)
    entry = newest_entry(matrix_entries(project.matrix, MATRIX))
    devices = _gpus(project)
    deps = [d.replace("tensorflow-cpu", "tensorflow[and-cuda]") for d in tox_deps(entry)]
    deps.append(requirement_with(harness_requirement, ("test",)))
    setenv = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "HARNESS_CHECK_DEVICES": " ".join(devices), **entry.env}
    checks = [" ".join(shlex.quote(a) for a in argv) for argv in _check_commands(project, devices)]
    return render_template("tox-gpu.ini.j2", devices=devices, entry=entry, deps=deps, setenv=setenv, checks=checks,
                           note=_note(requirement_note))


def ci_files(project: Project, package: str, *, reusable: str | None = None,
             harness_requirement: str = "keras-harness", branch: str = "main",
             requirement_note: str = "") -> dict[str, str]:
    """Relative path -> file text of the CI files for a user's repository (the module's docstring lists them).

    Args:
        project: the repository's harness configuration (``harness.project.load_project``).
        package: the repository's package name (image names and labels); the repository's root is the
            pip-installable package (``pip install .``).
        reusable: None (the gate's and the nightly's steps inline), or ``OWNER/REPO@SHA`` of harness' repository:
            they call its reusable workflows pinned by that commit. Default: the project's ``reusable-workflows``.
        harness_requirement: how harness is installed, everywhere it is (the workflows, the image, tox): a pip
            requirement, ``keras-harness==0.3.1`` or ``keras-harness @ URL``; extras are added after its name.
        branch: the repository's default branch: pushes to it run the CPU and GPU workflows, the nightly
            benchmarks it.
        requirement_note: where ``harness_requirement`` came from, e.g. ``"keras-harness==0.3.1 (the installed
            release; harness init --harness-requirement changes it)"``: written as a comment ``# harness: NOTE``
            beside each install of harness ('': none).

    Raises:
        InvalidValue: an unknown matrix entry (listing the known ones), a reusable value that is not
            OWNER/REPO@<40-hex SHA> (naming it), a workload reference, requirement, branch or note not safe to
            write (naming it).
    """
    if reusable is None:
        configured = project.extra.get("reusable-workflows")
        reusable = configured if isinstance(configured, str) and configured else None
    pinned = parse_reusable(reusable) if reusable is not None else None
    _checked(project)
    branch = _branch(branch)
    note = _note(requirement_note)
    entries = matrix_entries(project.matrix, MATRIX)
    entry = newest_entry(entries)
    slug = _slug(package)
    values: dict[str, Value] = {"python-version": entry.python, "setup": _setup(harness_requirement)}
    image_harness = requirement_with(harness_requirement, ("test", "bench"))
    return {
        ".github/workflows/harness-ci.yml": _ci_workflow(project, entry, harness_requirement, branch, note),
        ".github/workflows/harness-gpu.yml": _gpu_workflow(project, entries, slug, branch),
        ".github/workflows/harness-bench.yml": _bench_workflow(values, pinned, note),
        ".github/workflows/harness-bench-comment.yml": render_template("harness-bench-comment.yml.j2", **_common()),
        ".github/workflows/harness-nightly.yml": _nightly_workflow(values, pinned, branch, note),
        ".github/actionlint.yaml": render_template("actionlint.yaml.j2"),
        "docker/harness.Dockerfile": _dockerfile(entry, package, image_harness, note),
        "docker/harness-bake.hcl": _bake(entries, slug, image_harness, note),
        "docker/harness.Dockerfile.dockerignore": render_template("harness.Dockerfile.dockerignore.j2"),
        "tox.ini": tox_gpu_section(project, harness_requirement=harness_requirement,
                                   requirement_note=requirement_note),
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
