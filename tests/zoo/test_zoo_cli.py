"""``harness check --zoo``: the conformance table from the command line."""

import json
import os
import subprocess
import sys

import pytest
from tf_zygote import ENV, python

from harness.bench import zoo
from harness.cli import main

MODELS = ["subclassed_mlp", "imbalanced_class_weight"]  # two of the fast subset


def test_check_zoo_prints_json_rows_and_progress(tmp_path, any_keras):
    generation = any_keras.__version__.split(".")[0]  # --keras: the generation any_keras gives (TF 2.15's or tf_keras)
    args = ["check", "--zoo", "--zoo-models", *MODELS, "--methods", "towers", "--zoo-splits", "3:2",
            "--keras", generation, "--format", "json"]
    done = python(["-m", "harness", *args], timeout=300, env={**ENV, "HARNESS_RESULTS_DIR": str(tmp_path)})
    assert done.returncode in (0, 1), done.stderr[-4000:]
    data = json.loads(done.stdout)
    rows = data["rows"]
    assert [(r["model"], r["keras"], r["method"], r["split"]) for r in rows] == [
        (m, generation, "towers", "3:2") for m in MODELS]
    assert all(zoo.kind_of(r["status"]) in zoo.KINDS for r in rows), rows
    assert [r["failed"] for r in rows] == [zoo.kind_of(r["status"]) == "FAIL" for r in rows]
    assert done.returncode == (1 if any(r["failed"] for r in rows) else 0)
    assert sum(data["summary"].values()) == len(rows)
    assert f"[1/2] subclassed_mlp keras {generation} towers 3:2: " in done.stderr
    assert f"[2/2] imbalanced_class_weight keras {generation} towers 3:2: " in done.stderr


def test_unknown_zoo_model_is_rejected_by_argparse(capsys):
    assert main(["check", "--zoo", "--zoo-models", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_check_zoo_runs_the_optimizer_axis_alone_when_it_is_chosen(tmp_path, keras3):
    """``--zoo-optimizers``/``--zoo-options``/``--zoo-axis-models`` alone run the optimizer axis only,
    one row per optimizer/option, with its own column. The CLI's default generation, Keras 3 (its pinned exact
    outcomes): skipped where the keras package is Keras 2 (the CLI refuses ``--keras 3`` there)."""
    args = ["check", "--zoo", "--zoo-axis-models", "mlp", "--zoo-optimizers", "adam", "sgd", "--zoo-options",
            "global_clipnorm", "--methods", "mirrored"]
    done = python(["-m", "harness", *args], timeout=300, env={**ENV, "HARNESS_RESULTS_DIR": str(tmp_path)})
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


@pytest.mark.extended
def test_pin_outcomes_writes_the_pins_and_a_missed_pin_fails(tmp_path, keras3):
    """``--pin-outcomes`` pins what the cases came out as; a case that then misses its pin exits 1."""
    pins = tmp_path / "pins.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HARNESS_RESULTS_DIR": str(tmp_path),
           "HARNESS_ZOO_PINS": str(pins)}
    args = [sys.executable, "-m", "harness", "check", "--zoo", "--zoo-models", "subclassed_mlp", "--methods", "towers",
            "--zoo-splits", "3:2", "--format", "json"]
    # Planted: the case pinned as refused. The model trains exactly, so it misses its pin: a FAIL row, exit 1.
    pins.write_text(json.dumps({"pins": {"subclassed_mlp|3|towers|3:2|": "refused: custom-train-step"}}))
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["rows"]
    assert row["status"] == "FAIL: pinned refused: custom-train-step, got exact" and row["expected"] == (
        "refused: custom-train-step")
    done = subprocess.run([*args, "--pin-outcomes"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(pins.read_text())["pins"] == {}  # exact: unpinned
    assert f"pinned the outcomes of 1 cases in {pins}" in done.stderr
    assert subprocess.run(args, capture_output=True, text=True, timeout=300, env=env).returncode == 0
