"""``harness init``: what it writes, and that it never overwrites without --force (no TensorFlow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.project import load_project

MODEL = ["--model", "digits.model:build", "--no-measure"]  # the references are made up


def _files(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def test_writes_a_loadable_config_and_every_file(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "digits"\n')
    assert main(["init", str(tmp_path), *MODEL, "--model", "text=nlp/text.py:make", "--data",
                 "text=nlp/data.py:batches", "--ratios", "3", "2", "--methods", "towers", "mirrored"]) == 0
    project = load_project(tmp_path)
    assert [(w.name, w.model, w.data) for w in project.workloads] == [
        ("model", "digits.model:build", None), ("text", "nlp/text.py:make", "nlp/data.py:batches")]
    assert project.split() == (3.0, 2.0) and project.methods == ("towers", "mirrored")
    files = _files(tmp_path)
    for path in ("tests/test_harness_equivalence.py", "benchmarks/__init__.py", "benchmarks/harness_suites.py",
                 "asv.conf.json", "tox.ini", ".github/workflows/harness-ci.yml", ".github/workflows/harness-gpu.yml",
                 ".github/workflows/harness-bench.yml", ".github/workflows/harness-nightly.yml"):
        assert path in files, path
    conf = json.loads(files["asv.conf.json"])
    assert conf["project"] == "digits" and conf["benchmark_dir"] == "benchmarks"
    from harness.ci.adopt import requirement_with
    from harness.dist import default_requirement

    assert requirement_with(default_requirement()[0], ("bench",)) in conf["matrix"]["req"]
    assert "class StepTime(suites.StepTime)" in files["benchmarks/harness_suites.py"]
    assert "[testenv:gpu]" in files["tox.ini"]
    compile(files["tests/test_harness_equivalence.py"], "t.py", "exec")
    assert "harness init: write" in capsys.readouterr().err  # progress, one line a file, on stderr


def test_a_second_run_changes_nothing_keeps_edits_and_refuses_to_overwrite_others(tmp_path, capsys):
    assert main(["init", str(tmp_path), *MODEL]) == 0
    before = _files(tmp_path)
    assert main(["init", str(tmp_path), *MODEL]) == 0  # the same files: unchanged
    assert _files(tmp_path) == before
    (tmp_path / "asv.conf.json").write_text("{}\n")  # the adopter's edit of a file harness init wrote: kept
    assert main(["init", str(tmp_path), *MODEL]) == 0
    assert (tmp_path / "asv.conf.json").read_text() == "{}\n"
    capsys.readouterr()
    (tmp_path / ".harness" / "init.json").unlink()  # now no file is harness init's: each that differs stops it
    (tmp_path / "harness.toml").unlink()
    assert main(["init", str(tmp_path), *MODEL, "--devices", "3"]) == 2
    err = capsys.readouterr().err
    assert "asv.conf.json" in err and "--force" in err and "nothing was written" in err
    assert not (tmp_path / "harness.toml").exists()  # all or nothing: not even the missing file
    assert main(["init", str(tmp_path), *MODEL, "--devices", "3", "--force"]) == 0
    assert json.loads((tmp_path / "asv.conf.json").read_text())["benchmark_dir"] == "benchmarks"
    assert load_project(tmp_path).devices == 3


def test_an_existing_tox_ini_gets_the_gpu_env_only_with_force(tmp_path, capsys):
    (tmp_path / "tox.ini").write_text("[tox]\nenv_list = py311\n")
    assert main(["init", str(tmp_path), *MODEL]) == 2
    assert "tox.ini" in capsys.readouterr().err and not (tmp_path / "harness.toml").exists()
    assert main(["init", str(tmp_path), *MODEL, "--force"]) == 0
    text = (tmp_path / "tox.ini").read_text()
    assert text.startswith("[tox]\nenv_list = py311\n") and text.count("[testenv:gpu]") == 1
    assert main(["init", str(tmp_path), *MODEL, "--force"]) == 0  # not appended twice
    assert (tmp_path / "tox.ini").read_text().count("[testenv:gpu]") == 1


def test_dry_run_prints_every_file_and_writes_none(tmp_path, capsys):
    assert main(["init", str(tmp_path), *MODEL, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "=== would write: harness.toml" in out and 'model = "digits.model:build"' in out
    assert "=== would write: .github/workflows/harness-bench.yml" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, said", [
    (["--model", "my model=digits.model:build"], "'my model' is not an identifier"),
    (["--model", "digits.model:build", "--data", "other=digits.data:batches"], "--data for 'other'"),
    (["--model", "digits.model:build", "--matrix", "tf999"], "matrix entry 'tf999' is not in"),
    (["--model", "digits.model:build", "--ratios", "3", "2", "1"], "ratios: must be 2 positive numbers"),
    (["--model", "digits.model"], "model: must be MODULE:ATTR"),
    (["--model", "a=digits.model:build", "--model", "a=digits.model:other"], "workload 'a' given twice"),
    (["--model", "digits.model:build", "--reusable", "owner/harness@main"], "main"),
    (["--model", "digits.model:build", "--branch=-x"], "--branch must be a git branch name"),
    (["--model", "digits.model:build", "--harness-requirement", "keras-harness; rm -rf /"], "harness_requirement"),
    (["--devices", "3"], "no harness.toml"),
    (["--model", "digits.model:build", "--backend", "jax", "--methods", "mirrored"], "methods: must be a list of "
     "towers on backend \"jax\""),
])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, argv, said):
    assert main(["init", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_init_imports_no_tensorflow(tmp_path):
    code = ("import sys; from harness.cli import main; "
            f"main(['init', {str(tmp_path)!r}, '--model', 'digits.model:build', '--no-measure']); "
            "print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("False")


SHA = "0123456789abcdef0123456789abcdef01234567"
URL_REQUIREMENT = f"keras-harness @ git+https://example.org/harness.git@{SHA}"
WORKFLOWS = (".github/workflows/harness-ci.yml", ".github/workflows/harness-gpu.yml",
             ".github/workflows/harness-bench.yml", ".github/workflows/harness-nightly.yml")


def _git(root, *argv):
    return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def _repo(root, branch):
    root.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "-q", "-b", branch)
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "--allow-empty", "-m", "base")
    return root


def test_the_requirement_and_the_branch_reach_every_file_and_a_rerun_keeps_them(tmp_path, capsys):
    repo = _repo(tmp_path / "repo", "trunk")
    assert main(["init", str(repo), *MODEL, "--harness-requirement", URL_REQUIREMENT]) == 0
    err = capsys.readouterr().err
    assert "on branch trunk" in err and URL_REQUIREMENT in err
    files = _files(repo)
    project = load_project(repo)
    assert project.extra["harness-requirement"] == URL_REQUIREMENT and project.extra["branch"] == "trunk"
    for path in WORKFLOWS:
        assert "trunk" in files[path] or path.endswith("bench.yml"), path  # the gate: pull requests, any branch
        assert "refs/heads/main" not in files[path] and "[main]" not in files[path], path
    conf = json.loads(files["asv.conf.json"])
    assert conf["branches"] == ["trunk"] and f"keras-harness[bench] @ git+https://example.org/harness.git@{SHA}" \
        in conf["matrix"]["req"]
    for path in ("asv.conf.json", "tox.ini", "docker/harness.Dockerfile", "docker/harness-bake.hcl",
                 ".github/workflows/harness-ci.yml"):
        assert f"git+https://example.org/harness.git@{SHA}" in files[path], path
    for path in WORKFLOWS:  # no index name left
        assert "'keras-harness[bench]'" not in files[path] and "keras-harness[bench]==" not in files[path], path
    assert f"harness.git@{SHA}" in files[".github/workflows/harness-bench.yml"]
    # harness init alone: re-rendered from harness.toml, with its requirement and branch: nothing changes
    assert main(["init", str(repo)]) == 0
    assert _files(repo) == files
    # --branch alone changes the branch, in harness.toml too; the workloads stay
    assert main(["init", str(repo), "--branch", "release"]) == 0
    assert load_project(repo).extra["branch"] == "release" and load_project(repo).workload("model")
    assert "release" in _files(repo)[".github/workflows/harness-ci.yml"]


def test_the_default_branch_comes_from_git(tmp_path):
    from harness.cli.init import default_branch

    assert default_branch(tmp_path)[0] == "main"  # no repository: main
    master = _repo(tmp_path / "master", "master")
    assert default_branch(master) == ("master", "the repository's only branch of main, master, trunk")
    _git(master, "checkout", "-q", "-b", "feature")
    assert default_branch(master)[0] == "master"  # not the branch checked out for a change
    _git(master, "checkout", "-q", "master")
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(master), str(clone))  # origin/HEAD: the remote's default branch
    _git(clone, "branch", "-q", "main")
    assert default_branch(clone) == ("master", "the remote's default branch (origin/HEAD)")
    odd = _repo(tmp_path / "odd", "develop")
    assert default_branch(odd) == ("develop", "the checked-out branch (no origin/HEAD)")


def test_the_default_requirement_is_this_harness_said_where_it_came_from(tmp_path):
    from harness.dist import default_requirement

    spec, why = default_requirement()
    assert main(["init", str(tmp_path), *MODEL]) == 0
    text = (tmp_path / "harness.toml").read_text()
    assert f"harness-requirement = {json.dumps(spec)}  # how CI installs harness: {why}" in text
    assert load_project(tmp_path).extra["harness-requirement"] == spec


def test_a_jax_adopter_gets_backend_jax_towers_and_a_workflow_without_tensorflow(tmp_path, capsys):
    assert main(["init", str(tmp_path), *MODEL, "--backend", "jax", "--devices", "3", "--ratios", "5", "3", "2",
                 "--harness-requirement", "keras-harness==0.3.1"]) == 0
    project = load_project(tmp_path)
    assert (project.backend, project.methods, project.devices) == ("jax", ("towers",), 3)
    assert project.check_argv(project.workloads[0])[:3] == ["check", "--backend", "jax"]
    files = _files(tmp_path)
    ci = files[".github/workflows/harness-ci.yml"]
    assert "run: python -m pip install . 'keras-harness[test,jax]==0.3.1'\n" in ci, ci
    installs = [line for line in ci.splitlines() if "pip install" in line]
    assert installs and not any("tensorflow" in line or "keras==" in line for line in installs), installs
    assert "TF_USE_LEGACY_KERAS" not in ci and "env:" not in ci, ci
    assert "JAX CPU devices" in ci
    assert "`harness check --backend jax --model digits.model:build`" in capsys.readouterr().err
    assert main(["init", str(tmp_path)]) == 0  # re-rendered from harness.toml: still JAX
    assert _files(tmp_path) == files
    capsys.readouterr()
    assert main(["init", str(tmp_path), "--backend", "tensorflow"]) == 2  # a re-run's backend is harness.toml's
    assert "edit it to change --backend" in capsys.readouterr().err


def test_the_generated_python_passes_harness_own_ruff_rules(tmp_path):
    """tests/test_harness_equivalence.py and benchmarks/ as an adopter's ruff sees them (harness a third-party
    package there), with the rules harness holds its own code to (pyproject.toml's [tool.ruff]); both backends."""
    from test_workflows import _tool  # the linter, or a skip where the lint extra is absent

    from harness.project import read_toml

    ruff = _tool("ruff")

    config = read_toml(Path(__file__).resolve().parents[2] / "pyproject.toml")["tool"]["ruff"]
    rules = ["--isolated", "--line-length", str(config["line-length"]), "--target-version", config["target-version"],
             "--select", ",".join(config["lint"]["select"]), "--ignore", ",".join(config["lint"]["ignore"])]
    for backend in ("tensorflow", "jax"):
        repo = tmp_path / backend
        repo.mkdir()
        assert main(["init", str(repo), *MODEL, "--backend", backend]) == 0
        done = subprocess.run([ruff, "check", *rules, "tests", "benchmarks"], cwd=repo, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_with_one_model_an_unnamed_data_is_its(tmp_path):
    assert main(["init", str(tmp_path), "--model", "text=nlp/text.py:make", "--data", "nlp/data.py:batches",
                 "--no-measure"]) == 0
    assert load_project(tmp_path).workload("text").data == "nlp/data.py:batches"


def _generated(repo, rel):
    return json.loads((repo / ".harness" / "init.json").read_text())["files"][rel]


def _as_an_older_harness_wrote(repo, rel, old_text, *, edit=None):
    """The repository as if an older harness had written ``rel`` as ``old_text`` (its record too), then the adopter
    applied ``edit`` (old, new) to it."""
    record_path = repo / ".harness" / "init.json"
    record = json.loads(record_path.read_text())
    record["files"][rel] = old_text
    record_path.write_text(json.dumps(record))
    (repo / rel).write_text(old_text.replace(*edit) if edit else old_text)


def test_a_rerun_after_a_template_change_keeps_the_adopters_edits(tmp_path, capsys):
    repo = _repo(tmp_path / "repo", "main")
    assert main(["init", str(repo), *MODEL, "--harness-requirement", "keras-harness==0.3.1"]) == 0
    ci, nightly, gate = WORKFLOWS[0], WORKFLOWS[3], WORKFLOWS[2]
    new = {rel: (repo / rel).read_text() for rel in (ci, nightly, gate)}
    last = new[ci].splitlines()[-1]
    assert new[ci].count(last) == 1
    # harness-ci.yml: an older template wrote its last line otherwise; the adopter added a step comment at the top
    _as_an_older_harness_wrote(repo, ci, new[ci].replace(last, last + "  # old"),
                               edit=("\n", "\n# ours: a note of the team's\n", 1))
    # harness-nightly.yml: the older template's last line, edited by the adopter in that very line
    last_n = new[nightly].splitlines()[-1]
    _as_an_older_harness_wrote(repo, nightly, new[nightly].replace(last_n, last_n + "  # old"),
                               edit=(last_n + "  # old", last_n + "  # ours"))
    # harness-bench.yml: as the older harness wrote it, not edited
    _as_an_older_harness_wrote(repo, gate, new[gate].replace("\n", "\n# old template\n", 1))
    capsys.readouterr()
    assert main(["init", str(repo)]) == 0  # no --force needed
    err = capsys.readouterr().err
    text = (repo / ci).read_text()  # merged: the template's change and the adopter's edit
    assert "# ours: a note of the team's" in text and text.splitlines()[-1] == last and "# old" not in text
    assert f"merged    {ci}" in err
    assert (repo / nightly).read_text().splitlines()[-1] == last_n + "  # ours"  # overlapping: kept as it is
    assert f"kept      {nightly}: you edited it since harness init wrote it" in err and "--force" in err
    assert _generated(repo, nightly).endswith("  # old\n")  # still the base: the next run tries again
    assert (repo / gate).read_text() == new[gate] and f"update    {gate}" in err  # untouched: the new template
    assert _generated(repo, ci) == new[ci]
    assert main(["init", str(repo), "--force"]) == 0  # --force: the template's text, the edits gone
    assert (repo / nightly).read_text() == new[nightly] and (repo / ci).read_text() == new[ci]


# In the adopter's tests/ (pytest loads it before the generated test imports check_workload): harness check's rows
# stand in for its process (seconds of TensorFlow a workload), judged by harness.project.judge as a real check is.
_CANNED_CHECK = '''
import harness.project

ROWS = {
    "noisy": [{"model": "models:noisy", "method": "mirrored", "verdict": "exact", "exact": True, "passed": True,
               "baseline": False, "max_deviation": 0.0, "random_layers": ["GaussianNoise", "Dropout"],
               "with_randomness": {"verdict": "FAIL", "max_deviation": 0.03}}],
    "plain": [{"model": "models:plain", "method": "mirrored", "verdict": "exact", "exact": True, "passed": True,
               "baseline": False, "max_deviation": 0.0, "random_layers": []}],
}


def _check(project, name, devices=None, timeout=1800):
    return harness.project.judge(project, project.workload(name), ROWS[name], 0, "harness check (canned rows)")


harness.project.check_workload = _check
'''


def test_the_generated_test_warns_on_a_pass_naming_the_random_layers_that_were_off(tmp_path):
    # a pass judged with Dropout and GaussianNoise off says so (pytest's warnings summary), by class; a
    # workload without random layers passes silently. One pytest process, about 2 s.
    assert main(["init", str(tmp_path), "--model", "noisy=models:noisy", "--model", "plain=models:plain",
                 "--no-measure", "--harness-requirement", "keras-harness", "--branch", "main"]) == 0
    (tmp_path / "tests" / "conftest.py").write_text(_CANNED_CHECK)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "tests/test_harness_equivalence.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "2 passed, 1 warning" in said, said
    warned = [line.strip() for line in said.splitlines() if "RandomLayersOff" in line]
    assert len(warned) == 1 and warned[0].endswith(
        "RandomLayersOff: workload 'noisy' passed with its random layers off in training (as at inference: each "
        "device draws its own numbers, equal in distribution, not in value): GaussianNoise, Dropout"), said
    assert "test_parallel_training_comes_out_as_expected[noisy]" in said, said


def test_harness_toml_comes_from_its_template_and_reads_back_as_given(tmp_path, monkeypatch):
    # harness.toml is rendered from its template (harness.toml.j2, harness/ci/templates) like the other generated
    # files; every value harness init fills in reads back (harness.project) as it was given: a string with quotes, a
    # backslash, characters beyond ASCII, a control character; a float %g would round; an integer %g would make a float
    from harness.ci import render

    rendered: list[str] = []
    real = render.render_template
    monkeypatch.setattr(render, "render_template", lambda name, **values: rendered.append(name) or real(name, **values))
    emulate = 'say "400"\\ é 😀 \x7f,250'
    requirement = "keras-harness>=0.2,<1"
    assert main(["init", str(tmp_path), "--model", "text=nlp/text.py:make", "--data", "text=nlp/data.py:batches",
                 "--model", "digits.model:build", "--ratios", "3", "0.3333333333333333", "--methods", "towers",
                 "mirrored", "--emulate", emulate, "--matrix", "tf221", "legacy", "--batch-size", "1000000",
                 "--no-measure", "--harness-requirement", requirement, "--branch", "release/2.x"]) == 0
    assert "harness.toml.j2" in rendered
    text = (tmp_path / "harness.toml").read_text()
    assert text.isascii() and not re.search(r"<%=|%>|#\{%|#\{#", text), text
    project = load_project(tmp_path)
    assert (project.devices, project.ratios, project.methods, project.emulate, project.matrix) == (
        2, (3.0, 0.3333333333333333), ("towers", "mirrored"), emulate, ("tf221", "legacy"))
    assert [(w.name, w.model, w.data, w.batch_size, w.expect) for w in project.workloads] == [
        ("text", "nlp/text.py:make", "nlp/data.py:batches", 1000000, {}), ("model", "digits.model:build", None,
                                                                          1000000, {})]
    assert project.extra == {"harness-requirement": requirement, "branch": "release/2.x"}
    assert main(["init", str(tmp_path), "--branch", "main"]) == 0  # a re-run sets the branch line, the rest kept
    assert (tmp_path / "harness.toml").read_text() == text.replace('branch = "release/2.x"  # the branch the '
                                                                   'workflows test and benchmark: --branch',
                                                                   'branch = "main"  # the branch the workflows test '
                                                                   'and benchmark: --branch')
