"""The CI files `harness init` writes (harness.ci.adopt): lint-clean, safe, doing what they say.

A sample project's files are rendered four times, steps inline and calling harness' reusable workflows, each
with the defaults and with another default branch (trunk), a URL requirement and its note, into git
repositories under tmp_path, and each linter of harness' own CI (actionlint with shellcheck, zizmor, yamllint
with harness' .yamllint.yaml, hadolint) runs once over all of them; planted problems show each linter call can
fail. The workflows obey the rules tests/unit/test_workflows.py holds harness' own to, and harness' reusable
workflows are the rendered ones, running the same steps as the inline form. The templates
(harness/ci/templates, harness.ci.render) ship as package data.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import hcl2
import pytest
import yaml
from test_workflows import (  # _tool: the linter, or a skip where the lint extra is absent (the images)
    BENCH_LABEL,
    GPU_LABEL,
    _tool,
    expressions_in_run,
    permission_problems,
    ungated_pull_requests,
    unpinned_actions,
    untrusted_triggers,
    write_permissions,
)

from harness.ci import adopt
from harness.ci import render as ci_render
from harness.ci.matrix import build_args, load_matrix, tox_deps
from harness.errors import InvalidValue
from harness.extras import MissingExtra
from harness.project import CHECK_SAMPLES, parse_config

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
REUSABLE = f"example-org/harness@{SHA}"
URL = f"git+https://example.org/x/harness@{SHA}"
NOTE = f"keras-harness @ {URL} (a commit of harness' repository; harness init --harness-requirement changes it)"
# mode -> ci_files keywords: steps inline or calling harness' reusable workflows; the defaults or another branch,
# a URL requirement and its note.
MODES = {"inline": {}, "reusable": {"reusable": REUSABLE},
         "trunk": {"branch": "trunk", "harness_requirement": f"keras-harness @ {URL}", "requirement_note": NOTE},
         "trunk-reusable": {"reusable": REUSABLE, "branch": "trunk", "harness_requirement": f"keras-harness @ {URL}",
                            "requirement_note": NOTE}}
TABLE = {"devices": 2, "ratios": [3, 2], "methods": ["mirrored", "towers"], "matrix": ["tf221", "legacy"],
         "workloads": {"classifier": {"model": "mypkg.model:build", "data": "mypkg.data:batches"},
                       "text": {"model": "models/text_model.py:build_text_classifier", "check-batch-size": 10}}}
FILES = {".github/workflows/harness-ci.yml", ".github/workflows/harness-gpu.yml", ".github/workflows/harness-bench.yml",
         ".github/workflows/harness-bench-comment.yml", ".github/workflows/harness-nightly.yml",
         ".github/actionlint.yaml", "docker/harness.Dockerfile", "docker/harness-bake.hcl",
         "docker/harness.Dockerfile.dockerignore", "tox.ini"}


def _project(tmp_path: Path, **changes):
    return parse_config({**TABLE, **changes}, tmp_path / "harness.toml")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """mode (MODES) -> a git repository holding that mode's files; and "jax": a Keras 3 on JAX project's (harness.toml:
    backend = "jax"), steps inline."""
    base = tmp_path_factory.mktemp("adopt")
    project = parse_config(TABLE, base / "harness.toml")
    jax = parse_config({**TABLE, "backend": "jax", "methods": ["towers"]}, base / "harness.toml")
    roots = {}
    for mode, options in (*MODES.items(), ("jax", {})):
        root = base / mode
        for rel, text in adopt.ci_files(jax if mode == "jax" else project, "My_Pkg", **options).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        # actionlint finds .github/actionlint.yaml (the `gpu` runner label) at the repository's root.
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        roots[mode] = root
    return roots


def _workflows(rendered: dict[str, Path]) -> list[Path]:
    return sorted(p for root in rendered.values() for p in (root / ".github" / "workflows").glob("*.yml"))


def _text(rendered, mode: str, name: str) -> str:
    return (rendered[mode] / ".github" / "workflows" / name).read_text()


def _load(text: str) -> dict:
    return yaml.safe_load(text)


def _on(workflow: dict):
    """The triggers (YAML 1.1 reads a bare `on` key as True)."""
    return workflow.get("on", workflow.get(True))


# --- the linters: one call each over every generated file, and each shown failing ------------------------------


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # The venv's bin first on PATH: actionlint runs shellcheck on `run:` scripts from there.
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               NO_COLOR="1")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _zizmor(paths: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    return _run([_tool("zizmor"), "--offline", "--no-progress", "--min-severity", "medium", *map(str, paths)], cwd)


def test_the_files_are_written_in_every_mode(rendered):
    for root in rendered.values():
        assert {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git/" not in
                str(p.relative_to(root)) + "/"} == FILES


def test_actionlint_with_shellcheck_is_clean(rendered):
    done = _run([_tool("actionlint"), *map(str, _workflows(rendered))], rendered["inline"].parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_finds_nothing_of_medium_or_higher_severity(rendered):
    done = _zizmor([root / ".github" / "workflows" for root in rendered.values()], rendered["inline"].parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_yamllint_is_clean_with_harness_config(rendered):
    done = _run([_tool("yamllint"), "--strict", "-c", str(ROOT / ".yamllint.yaml"),
                 *(str(root / ".github") for root in rendered.values())], rendered["inline"].parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_is_clean_on_the_dockerfile(rendered):
    dockerfiles = [root / "docker" / "harness.Dockerfile" for root in rendered.values()]
    done = _run([_tool("hadolint"), *map(str, dockerfiles)], rendered["inline"].parent)
    assert done.returncode == 0, done.stdout + done.stderr


def _planted_repo(tmp_path: Path, rendered, text: str) -> Path:
    """A repository with the generated actionlint.yaml and one workflow, ``text``."""
    shutil.copytree(rendered["inline"] / ".github", tmp_path / ".github")
    (tmp_path / ".github" / "workflows" / "bad.yml").write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path / ".github" / "workflows" / "bad.yml"


def test_actionlint_reports_a_planted_problem(tmp_path, rendered):
    text = _text(rendered, "inline", "harness-gpu.yml").replace("[self-hosted, gpu]", "[self-hosted, gpu, tpu]")
    text = text.replace('run: docker image rm "$IMAGE" || true',
                        'run: docker image rm $IMAGE "${{ github.event.pull_request.title }}"')
    done = _run([_tool("actionlint"), str(_planted_repo(tmp_path, rendered, text))], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'label "tpu" is unknown' in done.stdout and 'label "gpu"' not in done.stdout, done.stdout
    assert "potentially untrusted" in done.stdout and "SC2086" in done.stdout, done.stdout


def test_zizmor_reports_a_planted_problem(tmp_path, rendered):
    text = _text(rendered, "inline", "harness-ci.yml").replace(adopt.CHECKOUT, "actions/checkout@v4")
    text = text.replace("persist-credentials: false", "fetch-depth: 1")
    done = _zizmor([_planted_repo(tmp_path, rendered, text)], tmp_path)
    assert done.returncode != 0
    assert "unpinned-uses" in done.stdout and "artipacked" in done.stdout, done.stdout


def test_yamllint_reports_a_planted_problem(tmp_path, rendered):
    text = _text(rendered, "inline", "harness-ci.yml") + "      - run: echo " + "x" * 120 + "\n"
    path = _planted_repo(tmp_path, rendered, text)
    done = _run([_tool("yamllint"), "--strict", "-c", str(ROOT / ".yamllint.yaml"), str(path)], tmp_path)
    assert done.returncode == 1 and "line-length" in done.stdout, done.stdout


def test_hadolint_reports_a_planted_problem(tmp_path, rendered):
    text = (rendered["inline"] / "docker" / "harness.Dockerfile").read_text()
    assert "# hadolint ignore=DL3008\n" in text
    path = tmp_path / "harness.Dockerfile"
    path.write_text(text.replace("# hadolint ignore=DL3008\n", "").replace("USER 1000:1000", "USER root"))
    done = _run([_tool("hadolint"), str(path)], tmp_path)
    assert done.returncode == 1 and "DL3008" in done.stdout and "DL3002" in done.stdout, done.stdout


# --- the rules harness' own workflows obey (tests/unit/test_workflows.py) ---------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_the_workflows_obey_harness_workflow_rules(rendered, mode):
    for path in _workflows({mode: rendered[mode]}):
        text = path.read_text()
        workflow = _load(text)
        assert workflow.get("name") and workflow.get("jobs"), path.name
        # A call of harness' reusable workflow is pinned by the commit SHA itself (no release comment).
        assert [p for p in unpinned_actions(text) if not p.endswith(f"@{SHA}")] == [], path.name
        assert permission_problems(text) == [], path.name
        assert expressions_in_run(text) == [], path.name
        assert untrusted_triggers(text) == [], path.name
        for job_id, job in workflow["jobs"].items():
            assert "timeout-minutes" in job or "uses" in job, f"{path.name}: job {job_id} has no timeout"
    gpu, bench = _text(rendered, mode, "harness-gpu.yml"), _text(rendered, mode, "harness-bench.yml")
    assert ungated_pull_requests(gpu, GPU_LABEL) == [] and write_permissions(gpu) == []
    assert ungated_pull_requests(bench, BENCH_LABEL, events=("labeled", "synchronize")) == []
    assert write_permissions(bench) == [] and write_permissions(_text(rendered, mode, "harness-ci.yml")) == []


def test_the_comment_workflow_never_checks_out_code(rendered):
    workflow = _load(_text(rendered, "inline", "harness-bench-comment.yml"))
    assert list(_on(workflow)) == ["workflow_run"] and _on(workflow)["workflow_run"]["workflows"] == ["harness-bench"]
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    assert not any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps)


# --- what each workflow runs ---------------------------------------------------------------------------------------


def _runs(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job["steps"])


def test_ci_installs_the_package_harness_and_the_newest_pins_and_runs_the_equivalence_test(rendered):
    job = _load(_text(rendered, "inline", "harness-ci.yml"))["jobs"]["equivalence"]
    runs = _runs(job)
    assert "python -m pip install . 'keras-harness[test]' tensorflow-cpu==2.21.0 keras==3.15.1" in runs
    assert "pytest -p no:cacheprovider -v tests/test_harness_equivalence.py" in runs
    assert job["runs-on"] == "ubuntu-latest" and "env" not in job  # tf221, Keras 3: no TF_USE_LEGACY_KERAS


def test_a_jax_project_installs_harness_jax_extra_not_tensorflow(rendered):
    """harness.toml's backend = "jax": the CPU workflow installs keras-harness[test,jax] (Keras and CPU JAX) and no
    TensorFlow, and its equivalence test runs harness check --backend jax (the generated test reads harness.toml)."""
    job = _load(_text(rendered, "jax", "harness-ci.yml"))["jobs"]["equivalence"]
    runs = _runs(job)
    assert "python -m pip install . 'keras-harness[test,jax]'" in runs and "tensorflow" not in runs, runs
    assert "pytest -p no:cacheprovider -v tests/test_harness_equivalence.py" in runs
    assert "env" not in job  # the legacy entry's TF_USE_LEGACY_KERAS is TensorFlow's
    assert "--backend jax" in (rendered["jax"] / "tox.ini").read_text()  # its checks, as harness.toml says


def test_gpu_runs_the_checks_and_asv_in_each_entry_image_on_self_hosted_gpus(rendered):
    workflow = _load(_text(rendered, "inline", "harness-gpu.yml"))
    job = workflow["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "gpu"] and job["strategy"]["matrix"]["entry"] == ["tf221", "legacy"]
    assert job["env"]["HARNESS_CHECK_DEVICES"] == "/gpu:0 /gpu:1"
    runs = _runs(job)
    assert 'docker buildx bake --file docker/harness-bake.hcl --load "${ENTRY}-gpu"' in runs
    assert "in_image python -m pytest -p no:cacheprovider -v tests/test_harness_equivalence.py" in runs
    assert "asv run --quick --python=same" in runs
    checks = re.findall(r"in_image harness check (.*?) \|\| status=1", runs.replace("\\\n", " "), re.S)
    assert [" ".join(c.split()) for c in checks] == [
        "--model mypkg.model:build --data mypkg.data:batches --devices /gpu:0 /gpu:1 --ratios 3 2 --methods "
        f"mirrored towers --batch-size 20 --samples {CHECK_SAMPLES} --tol 1e-06 --reference float64 --time-steps 0",
        "--model models/text_model.py:build_text_classifier --devices /gpu:0 /gpu:1 --ratios 3 2 --methods "
        f"mirrored towers --batch-size 10 --samples {CHECK_SAMPLES} --tol 1e-06 --reference float64 --time-steps 0"]
    assert _on(workflow) == {"push": {"branches": ["main"]}, "workflow_dispatch": None,
                              "pull_request": {"types": ["labeled"]}}


def test_the_gate_runs_bench_compare_against_the_base_and_publishes_its_summary(rendered):
    job = _load(_text(rendered, "inline", "harness-bench.yml"))["jobs"]["bench"]
    runs = _runs(job)
    assert 'args=("origin/${BASE_REF}" HEAD ' in runs and '--markdown "$out/summary.md"' in runs
    assert 'harness bench-compare "${args[@]}"' in runs
    assert 'tee -a "$GITHUB_STEP_SUMMARY" < "$out/summary.md"' in runs and 'exit "$status"' in runs
    assert job["env"]["BASE_REF"] == "${{ github.base_ref }}"
    assert job["env"]["SETUP"] == "python -m pip install 'keras-harness[bench]'"
    upload = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload and upload[0]["with"]["name"] == adopt.BENCH_ARTIFACT and upload[0]["if"] == "always()"


def test_the_nightly_runs_asv_regressions_and_bisect_and_only_the_store_job_writes(rendered):
    jobs = _load(_text(rendered, "inline", "harness-nightly.yml"))["jobs"]
    runs = _runs(jobs["bench"])
    assert 'asv run "HASHFILE:${new}"' in runs and "git rev-list --first-parent" in runs
    assert 'harness regressions "${args[@]}" --markdown' in runs and "--since" in runs
    assert 'harness bisect "${args[@]}" --mode virtualenv' in runs
    assert jobs["bench"]["permissions"] == {"contents": "read"}
    assert jobs["store"]["permissions"] == {"contents": "write"}
    assert jobs["report"]["permissions"] == {"issues": "write"}
    for job_id in ("store", "report"):  # the jobs that can write run no project code
        assert not any(str(s.get("uses", "")).startswith("actions/checkout@") for s in jobs[job_id]["steps"])


@pytest.mark.parametrize(("name", "job", "file"), [("harness-bench.yml", "bench", "reusable-bench-gate.yml"),
                                                   ("harness-nightly.yml", "nightly", "reusable-nightly.yml")])
def test_reusable_mode_calls_harness_workflow_pinned_by_the_commit(rendered, name, job, file):
    workflow = _load(_text(rendered, "reusable", name))
    assert list(workflow["jobs"]) == [job]
    call = workflow["jobs"][job]
    assert call["uses"] == f"example-org/harness/.github/workflows/{file}@{SHA}"
    declared = _on(_load((ROOT / ".github" / "workflows" / file).read_text()))["workflow_call"]["inputs"]
    assert set(call["with"]) <= set(declared), set(call["with"]) - set(declared)
    assert _on(_load(_text(rendered, "inline", name))) == _on(workflow)  # the same triggers (and gate)


# --- harness' own reusable workflows -------------------------------------------------------------------------------


def test_harness_reusable_workflows_are_the_rendered_ones():
    for rel, text in adopt.reusable_workflows().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: python -m harness.ci.adopt reusable"
    assert adopt.main(["check", str(ROOT)]) == 0


def test_the_reusable_check_fails_on_a_changed_file(tmp_path, capsys):
    assert adopt.main(["check", str(tmp_path)]) == 1  # none there yet
    assert adopt.main(["reusable", str(tmp_path)]) == 0 and adopt.main(["check", str(tmp_path)]) == 0
    path = tmp_path / ".github" / "workflows" / "reusable-nightly.yml"
    path.write_text(path.read_text().replace("timeout 45m", "timeout 90m"))
    assert adopt.main(["check", str(tmp_path)]) == 1
    assert "reusable-nightly.yml differs" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "reusable", "jobs"), [
    ("harness-bench.yml", "reusable-bench-gate.yml", ["bench"]),
    ("harness-nightly.yml", "reusable-nightly.yml", ["bench", "store", "report"])])
def test_the_inline_jobs_run_the_reusable_workflows_steps(rendered, name, reusable, jobs):
    inline = _load(_text(rendered, "inline", name))["jobs"]
    called = _load((ROOT / ".github" / "workflows" / reusable).read_text())
    assert list(called["jobs"]) == jobs and called["permissions"] == {}
    for job in jobs:
        assert inline[job]["steps"] == called["jobs"][job]["steps"], job
        assert inline[job]["permissions"] == called["jobs"][job]["permissions"], job
        assert set(inline[job].get("env", {})) == set(called["jobs"][job].get("env", {})), job


# --- the matrix, the images and tox -------------------------------------------------------------------------------


def test_the_packaged_matrix_is_docker_matrix_toml():
    assert adopt.MATRIX.read_bytes() == (ROOT / "docker" / "matrix.toml").read_bytes(), (
        "harness/ci/matrix.toml must be a copy of docker/matrix.toml: cp docker/matrix.toml harness/ci/matrix.toml")


def test_the_actions_are_pinned_as_in_harness_own_workflows():
    ours = "".join(p.read_text() for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    for pin in (adopt.CHECKOUT, adopt.SETUP_PYTHON, adopt.UPLOAD_ARTIFACT, adopt.DOWNLOAD_ARTIFACT):
        assert f"uses: {pin}\n" in ours, pin


def test_the_bake_file_has_a_target_per_entry_and_variant_with_the_matrix_build_args(rendered):
    with open(rendered["inline"] / "docker" / "harness-bake.hcl") as f:
        parsed = hcl2.load(f)
    targets = {name.strip('"'): body for block in parsed["target"] for name, body in block.items()}
    entries = {e.name: e for e in load_matrix(adopt.MATRIX)}
    dockerfile = (rendered["inline"] / "docker" / "harness.Dockerfile").read_text()
    assert set(targets) == {"_common", "tf221", "tf221-gpu", "legacy", "legacy-gpu"}
    for name in ("tf221", "legacy"):
        for variant, target in (("cpu", name), ("gpu", f"{name}-gpu")):
            args = {k: v.strip('"') for k, v in targets[target]["args"].items()}
            assert args == {**build_args(entries[name], variant, cpu_base="${CPU_BASE}"),
                            "HARNESS_REQUIREMENT": "${HARNESS_REQUIREMENT}"}, target
            assert [t.strip('"') for t in targets[target]["tags"]] == [f"my-pkg-harness:{target}"]
            assert all(f"ARG {key}=" in dockerfile for key in args), target
    assert 'default = "keras-harness[test,bench]"' in (rendered["inline"] / "docker" / "harness-bake.hcl").read_text()
    assert "pip install" in dockerfile and '"${HARNESS_REQUIREMENT}" /src' in dockerfile
    assert "USER 1000:1000" in dockerfile and 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]' in dockerfile


def test_tox_gpu_env_pins_the_newest_entry_for_cuda_and_runs_the_checks(tmp_path, rendered):
    project = _project(tmp_path)
    section = adopt.tox_gpu_section(project)
    assert (rendered["inline"] / "tox.ini").read_text() == section  # tox.ini is the section: appendable as it is
    existing = tmp_path / "tox.ini"
    existing.write_text("[tox]\nenv_list = py\n\n[testenv]\ncommands = pytest\n\n" + section)
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(existing)
    env = tox["testenv:gpu"]
    newest = {e.name: e for e in load_matrix(adopt.MATRIX)}["tf221"]
    deps = env["deps"].split()
    assert deps == [d.replace("tensorflow-cpu", "tensorflow[and-cuda]") for d in tox_deps(newest)] + [
        "keras-harness[test]"]
    assert "HARNESS_CHECK_DEVICES = /gpu:0 /gpu:1" in env["setenv"]
    commands = env["commands"].strip().splitlines()
    assert commands[0] == "pytest -p no:cacheprovider tests/test_harness_equivalence.py {posargs}"
    assert [c.split()[:4] for c in commands[1:]] == [["harness", "check", "--model", "mypkg.model:build"],
                                                     ["harness", "check", "--model",
                                                      "models/text_model.py:build_text_classifier"]]
    assert all("--devices /gpu:0 /gpu:1 " in c for c in commands[1:])


def test_a_keras_2_matrix_pins_tf_keras_and_sets_the_legacy_switch(tmp_path):
    files = adopt.ci_files(_project(tmp_path, matrix=["legacy"]), "pkg")
    job = _load(files[".github/workflows/harness-ci.yml"])["jobs"]["equivalence"]
    assert job["env"] == {"TF_USE_LEGACY_KERAS": "1"}
    assert "tensorflow-cpu==2.21.0 tf-keras==2.21.0" in _runs(job)
    assert "TF_USE_LEGACY_KERAS = 1" in files["tox.ini"] and "    tf-keras==2.21.0\n" in files["tox.ini"]


def test_the_harness_requirement_carries_its_version_and_gets_the_extras(tmp_path):
    files = adopt.ci_files(_project(tmp_path), "pkg", harness_requirement="keras-harness==0.2.0")
    assert "'keras-harness[test]==0.2.0'" in files[".github/workflows/harness-ci.yml"]
    assert "python -m pip install 'keras-harness[bench]==0.2.0'" in files[".github/workflows/harness-bench.yml"]
    assert 'default = "keras-harness[test,bench]==0.2.0"' in files["docker/harness-bake.hcl"]
    url = adopt.ci_files(_project(tmp_path), "pkg", harness_requirement="keras-harness @ git+https://x.org/h.git")
    assert "    keras-harness[test] @ git+https://x.org/h.git\n" in url["tox.ini"]
    with pytest.raises(InvalidValue, match=re.escape("got 'keras-harness; python_version > \"3\"'")):
        adopt.ci_files(_project(tmp_path), "pkg", harness_requirement='keras-harness; python_version > "3"')


# --- another default branch, a URL requirement and where it came from -------------------------------------------


def test_the_branch_is_in_every_trigger_and_condition_and_main_is_gone(rendered):
    for mode in ("trunk", "trunk-reusable"):
        for path in _workflows({mode: rendered[mode]}):
            assert not re.search(r"\bmain\b", path.read_text()), f"{mode}: {path.name} still names main"
        for name in ("harness-ci.yml", "harness-gpu.yml"):
            assert _on(_load(_text(rendered, mode, name)))["push"] == {"branches": ["trunk"]}, (mode, name)
        assert "#   - push to trunk: reviewed and merged code;" in _text(rendered, mode, "harness-gpu.yml")
        assert _text(rendered, mode, "harness-nightly.yml").startswith("# Nightly benchmarks of trunk (written")
    inline = _load(_text(rendered, "trunk", "harness-nightly.yml"))["jobs"]["bench"]
    assert inline["if"] == "github.ref == 'refs/heads/trunk'"
    called = _load(_text(rendered, "trunk-reusable", "harness-nightly.yml"))["jobs"]["nightly"]
    assert called["with"]["branch"] == "trunk"
    for root in (rendered["trunk"], rendered["trunk-reusable"]):  # the rest names no branch
        for rel in ("docker/harness.Dockerfile", "docker/harness-bake.hcl", "tox.ini"):
            assert not re.search(r"\bmain\b", (root / rel).read_text()), rel


@pytest.mark.parametrize("branch", ["on", "1.0", "release/2.x"])
def test_a_branch_yaml_would_misread_is_quoted(tmp_path, branch):
    files = adopt.ci_files(_project(tmp_path), "pkg", branch=branch, reusable=REUSABLE)
    assert _on(_load(files[".github/workflows/harness-ci.yml"]))["push"]["branches"] == [branch]
    assert _load(files[".github/workflows/harness-nightly.yml"])["jobs"]["nightly"]["with"]["branch"] == branch


def _setup_word(command: str) -> str:
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "pip", "install"], command
    return words[-1]


def _installs(root: Path, reusable: bool) -> dict[str, list[str]]:
    """file -> the harness requirements it installs, as pip gets them (shell words, YAML, HCL and ini values)."""
    bench, nightly = (_load((root / ".github" / "workflows" / name).read_text())["jobs"]
                      for name in ("harness-bench.yml", "harness-nightly.yml"))
    ci = _runs(_load((root / ".github" / "workflows" / "harness-ci.yml").read_text())["jobs"]["equivalence"])
    with open(root / "docker" / "harness-bake.hcl") as f:
        bake = hcl2.load(f)
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(root / "tox.ini")
    dockerfile = (root / "docker" / "harness.Dockerfile").read_text()
    return {
        "harness-ci.yml": [w for w in shlex.split(ci.replace("\\\n", " ")) if w.startswith("keras-harness")],
        "harness-bench.yml": [_setup_word(bench["bench"]["with"]["setup"] if reusable
                                          else bench["bench"]["env"]["SETUP"])],
        "harness-nightly.yml": [_setup_word(nightly["nightly"]["with"]["setup"] if reusable
                                            else nightly["bench"]["env"]["SETUP"])],
        "docker/harness.Dockerfile": re.findall(r'^ARG HARNESS_REQUIREMENT="([^"]*)"$', dockerfile, re.M),
        "docker/harness-bake.hcl": [body["default"].strip('"') for block in bake["variable"]
                                    for name, body in block.items() if name.strip('"') == "HARNESS_REQUIREMENT"],
        "tox.ini": [d for d in tox["testenv:gpu"]["deps"].split("\n") if d.startswith("keras-harness")],
    }


def test_a_url_requirement_is_installed_verbatim_with_its_extras_everywhere(rendered):
    for mode in ("trunk", "trunk-reusable"):
        assert _installs(rendered[mode], reusable=mode.endswith("reusable")) == {
            "harness-ci.yml": [f"keras-harness[test] @ {URL}"],
            "harness-bench.yml": [f"keras-harness[bench] @ {URL}"],
            "harness-nightly.yml": [f"keras-harness[bench] @ {URL}"],
            "docker/harness.Dockerfile": [f"keras-harness[test,bench] @ {URL}"],
            "docker/harness-bake.hcl": [f"keras-harness[test,bench] @ {URL}"],
            "tox.ini": [f"keras-harness[test] @ {URL}"]}, mode


@pytest.mark.parametrize("requirement", ["keras-harness @ file:///tmp/keras_harness-0.1.dev3-py3-none-any.whl",
                                         f"keras-harness[gpu]@{URL}"])
def test_other_url_requirements_are_installed_verbatim(tmp_path, requirement):
    url = requirement.split("@", 1)[1].strip()
    extra = "gpu," if "[gpu]" in requirement else ""
    for reusable in (None, REUSABLE):
        root = tmp_path / str(bool(reusable))
        for rel, text in adopt.ci_files(_project(tmp_path), "pkg", reusable=reusable,
                                        harness_requirement=requirement).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        installs = _installs(root, reusable=bool(reusable))
        assert installs["harness-ci.yml"] == installs["tox.ini"] == [f"keras-harness[{extra}test] @ {url}"]
        assert installs["harness-bench.yml"] == installs["harness-nightly.yml"] == [
            f"keras-harness[{extra}bench] @ {url}"]
        assert installs["docker/harness.Dockerfile"] == installs["docker/harness-bake.hcl"] == [
            f"keras-harness[{extra}test,bench] @ {url}"]


def _note_comments(text: str) -> list[str]:
    """Each ``# harness: ...`` comment of ``text``, its continuation lines (``#   ...``) joined to it."""
    notes: list[str] = []
    follows = False
    for line in (line.strip() for line in text.splitlines()):
        if line.startswith("# harness: "):
            notes.append(line[2:])
        elif follows and line.startswith("#   "):
            notes[-1] += " " + line[4:]
        follows = line.startswith("# harness: ") or (follows and line.startswith("#   "))
    return notes


def test_each_file_that_installs_harness_says_where_its_requirement_came_from(rendered, tmp_path):
    for mode in ("trunk", "trunk-reusable"):
        root = rendered[mode]
        for rel in (".github/workflows/harness-ci.yml", ".github/workflows/harness-bench.yml",
                    ".github/workflows/harness-nightly.yml", "docker/harness.Dockerfile", "docker/harness-bake.hcl",
                    "tox.ini"):
            assert _note_comments((root / rel).read_text()) == [f"harness: {NOTE}"], (mode, rel)
    for mode in ("inline", "reusable"):  # no note given: no comment
        assert not any(_note_comments(p.read_text()) for p in rendered[mode].rglob("*")
                       if p.is_file() and ".git/" not in str(p) + "/")
    short = adopt.ci_files(_project(tmp_path), "pkg", harness_requirement="keras-harness==0.3.1",
                           requirement_note="keras-harness==0.3.1 (the installed release; harness init "
                           "--harness-requirement changes it)")
    assert ("      # harness: keras-harness==0.3.1 (the installed release; harness init --harness-requirement "
            "changes it)\n      - name: install\n") in short[".github/workflows/harness-ci.yml"]


# --- the templates: Jinja2, shipped as package data -----------------------------------------------------------------


def test_every_rendered_workflow_is_valid_yaml(rendered):
    texts = [p.read_text() for root in rendered.values() for p in (root / ".github").rglob("*.y*ml")]
    texts += list(adopt.reusable_workflows().values())
    assert len(texts) == len(rendered) * 6 + 2
    for text in texts:
        assert isinstance(yaml.safe_load(text), dict), text[:200]


def test_the_templates_ship_as_package_data():
    shipped = {p.name for p in resources.files("harness.ci").joinpath("templates").iterdir()}
    used = {"harness-ci.yml.j2", "harness-gpu.yml.j2", "harness-bench.yml.j2", "harness-bench-comment.yml.j2",
            "harness-nightly.yml.j2", "reusable-bench-gate.yml.j2", "reusable-nightly.yml.j2", "_bench-job.yml.j2",
            "_nightly-jobs.yml.j2", "actionlint.yaml.j2", "harness.Dockerfile.j2",
            "harness.Dockerfile.dockerignore.j2", "harness-bake.hcl.j2", "tox-gpu.ini.j2", "harness.toml.j2",
            "_harness-settings.toml.j2"}
    assert used <= shipped and set(ci_render.template_names()) == {n for n in shipped if n.endswith(".j2")}
    # pyproject's package data for harness.ci takes every template into the wheel and the sdist
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["harness.ci"]
    for name in ci_render.template_names():
        assert any(fnmatch.fnmatch(f"templates/{name}", g) for g in globs), (name, globs)


def test_github_expressions_survive_rendering_and_no_template_mark_is_left(rendered):
    for root in rendered.values():
        for path in root.rglob("*"):
            if path.is_file() and ".git/" not in str(path) + "/":
                text = path.read_text()
                assert not re.search(r"<%=|%>|#\{%|#\{#", text), path
    text = _text(rendered, "inline", "harness-bench.yml")
    assert "group: >-\n    ${{ github.workflow }}-${{ github.event.pull_request.number }}-${{\n" in text


def test_render_template_names_a_missing_template_or_value():
    with pytest.raises(InvalidValue, match=re.escape("no CI template 'nope.yml.j2' in harness/ci/templates (known: "
                                                     "actionlint.yaml.j2, harness-bake.hcl.j2")):
        ci_render.render_template("nope.yml.j2")
    with pytest.raises(InvalidValue, match=re.escape("template 'harness-ci.yml.j2': 'devices' is undefined")):
        ci_render.render_template("harness-ci.yml.j2")
    assert ci_render.render_template("actionlint.yaml.j2").endswith("    - gpu\n")  # the trailing newline kept


def test_without_jinja2_rendering_names_the_ci_extra(monkeypatch):
    ci_render._environment.cache_clear()
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 fails, as where it is not installed
    try:
        with pytest.raises(MissingExtra, match=re.escape("Jinja2 (jinja2) is not installed") + ".*"
                           + re.escape("pip install 'keras-harness[ci]'")):
            adopt.reusable_workflows()
    finally:
        ci_render._environment.cache_clear()


# --- bad values, named ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branch", ["", "-x", "a..b", "feat branch", "x'y", "a/", "a/.b", "x.lock", "${{x}}"])
def test_a_branch_that_is_no_safe_git_branch_name_is_named(tmp_path, branch):
    with pytest.raises(InvalidValue, match=re.escape(f"(the repository's default branch); got {branch!r}")):
        adopt.ci_files(_project(tmp_path), "pkg", branch=branch)


@pytest.mark.parametrize("note", ["two\nlines", "a\rb", "tab\there"])
def test_a_requirement_note_of_more_than_one_line_is_named(tmp_path, note):
    with pytest.raises(InvalidValue, match=re.escape(f"requirement_note must be one line of text (it is written as a "
                                                     f"comment); got {note!r}")):
        adopt.ci_files(_project(tmp_path), "pkg", requirement_note=note)


@pytest.mark.parametrize("requirement", ["keras-harness @ git+https://x.org/h h", "keras-harness[$(id)]",
                                         "keras-harness @ https://x.org/h#egg=keras-harness", "keras-harness @",
                                         "'keras-harness'", "keras-harness @ ${{x}}", "keras-harness==1 @ x"])
def test_a_requirement_unsafe_to_write_is_named(tmp_path, requirement):
    with pytest.raises(InvalidValue, match=re.escape(f"got {requirement!r}")):
        adopt.ci_files(_project(tmp_path), "pkg", harness_requirement=requirement)


def test_an_unknown_matrix_entry_is_named_with_the_known_ones(tmp_path):
    known = ", ".join(e.name for e in load_matrix(adopt.MATRIX))
    for render in (lambda p: adopt.ci_files(p, "pkg"), adopt.tox_gpu_section):
        with pytest.raises(InvalidValue, match=re.escape(f"matrix entry 'tf999' is not in harness' docker/matrix.toml "
                                                         f"(known: {known})")):
            render(_project(tmp_path, matrix=["tf221", "tf999"]))


@pytest.mark.parametrize("value", [f"example-org/harness@{SHA[:12]}", "example-org/harness@main",
                                   f"example-org/harness@{SHA[:-1]}g", f"example-org/harness@{SHA}0"])
def test_a_reusable_ref_that_is_no_full_commit_sha_is_named(tmp_path, value):
    with pytest.raises(InvalidValue, match=re.escape(f"reusable workflows {value!r}: {value.split('@')[1]!r} is not "
                                                     "a full 40-hex commit SHA")):
        adopt.ci_files(_project(tmp_path), "pkg", reusable=value)


@pytest.mark.parametrize("value", [SHA, f"harness@{SHA}", f"a/b/c@{SHA}", f"example-org/harness@{SHA}@{SHA}", ""])
def test_a_reusable_value_that_is_not_owner_repo_at_sha_is_named(tmp_path, value):
    with pytest.raises(InvalidValue, match=re.escape(f"OWNER/REPO@<40-hex commit SHA> of harness' repository; "
                                                     f"got {value!r}")):
        adopt.ci_files(_project(tmp_path), "pkg", reusable=value)


def test_the_project_reusable_workflows_key_is_used_when_none_is_given(tmp_path):
    project = _project(tmp_path, **{"reusable-workflows": f"Example-Org/harness@{SHA.upper()}"})
    bench = adopt.ci_files(project, "pkg")[".github/workflows/harness-bench.yml"]
    assert f"uses: Example-Org/harness/.github/workflows/reusable-bench-gate.yml@{SHA}\n" in bench


def test_a_workload_reference_unsafe_to_write_unquoted_is_named(tmp_path):
    project = _project(tmp_path, workloads={"evil": {"model": "${{github.token}}:build"}})
    with pytest.raises(InvalidValue, match=re.escape("workload 'evil': model '${{github.token}}:build'")):
        adopt.ci_files(project, "pkg")
