"""``harness init``: what it writes, and that it never overwrites without --force (no TensorFlow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.cli import main
from harness.project import load_project

MODEL = ["--model", "digits.model:build"]


def _files(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


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
    assert "keras-harness[bench]" in conf["matrix"]["req"]
    assert "class StepTime(suites.StepTime)" in files["benchmarks/harness_suites.py"]
    assert "[testenv:gpu]" in files["tox.ini"]
    compile(files["tests/test_harness_equivalence.py"], "t.py", "exec")
    assert "harness init: write" in capsys.readouterr().err  # progress, one line a file, on stderr


def test_a_second_run_changes_nothing_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["init", str(tmp_path), *MODEL]) == 0
    before = _files(tmp_path)
    assert main(["init", str(tmp_path), *MODEL]) == 0  # the same files: unchanged
    assert _files(tmp_path) == before
    capsys.readouterr()
    (tmp_path / "asv.conf.json").write_text("{}\n")
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
])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, argv, said):
    assert main(["init", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_init_imports_no_tensorflow(tmp_path):
    code = ("import sys; from harness.cli import main; "
            f"main(['init', {str(tmp_path)!r}, '--model', 'digits.model:build']); print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("False")
