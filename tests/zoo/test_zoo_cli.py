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
