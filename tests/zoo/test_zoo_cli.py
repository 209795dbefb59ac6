"""``harness check --zoo``: the conformance table from the command line (issue 15, point 4)."""

import json
import os
import subprocess
import sys

from harness.bench import zoo
from harness.cli import main

MODELS = ["subclassed_mlp", "imbalanced_class_weight"]  # two of the fast subset


def test_check_zoo_prints_json_rows_and_progress(tmp_path):
    args = ["check", "--zoo", "--zoo-models", *MODELS, "--methods", "towers", "--zoo-splits", "3:2",
            "--format", "json"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HARNESS_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode in (0, 1), done.stderr[-4000:]
    data = json.loads(done.stdout)
    rows = data["rows"]
    assert [(r["model"], r["keras"], r["method"], r["split"]) for r in rows] == [
        (m, "3", "towers", "3:2") for m in MODELS]
    assert all(zoo.kind_of(r["status"]) in zoo.KINDS for r in rows), rows
    assert [r["failed"] for r in rows] == [zoo.kind_of(r["status"]) == "FAIL" for r in rows]
    assert done.returncode == (1 if any(r["failed"] for r in rows) else 0)
    assert sum(data["summary"].values()) == len(rows)
    assert "[1/2] subclassed_mlp keras 3 towers 3:2: " in done.stderr
    assert "[2/2] imbalanced_class_weight keras 3 towers 3:2: " in done.stderr


def test_unknown_zoo_model_is_rejected_by_argparse(capsys):
    assert main(["check", "--zoo", "--zoo-models", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_check_zoo_runs_the_optimizer_axis_alone_when_it_is_chosen(tmp_path):
    """Issue 30: ``--zoo-optimizers``/``--zoo-options``/``--zoo-axis-models`` alone run the optimizer axis only,
    one row per optimizer/option, with its own column."""
    args = ["check", "--zoo", "--zoo-axis-models", "mlp", "--zoo-optimizers", "adam", "sgd", "--zoo-options",
            "global_clipnorm", "--methods", "mirrored"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HARNESS_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["model", "optimizer", "keras", "method"]
    rows = [line.split() for line in lines[2:4]]
    assert [row[:5] for row in rows] == [["mlp", "adam/global_clipnorm", "3", "mirrored", "3:2"],
                                        ["mlp", "sgd/global_clipnorm", "3", "mirrored", "3:2"]]
    assert all(row[-1] == "exact" for row in rows), lines
    assert "2 cases of 1 models (2 optimizer settings): 2 exact" in done.stdout
    assert "[1/2] mlp adam/global_clipnorm keras 3 mirrored 3:2: exact" in done.stderr


def test_unknown_axis_option_is_rejected_by_argparse(capsys):
    assert main(["check", "--zoo", "--zoo-options", "clip"]) == 2
    assert "invalid choice: 'clip'" in capsys.readouterr().err
