"""scripts/device-check (docs/device-check.md): its dry run on this machine's CPU devices (Keras 3 on JAX, TensorFlow
blocked) writes the JSON with every check's figures and holds exactness for the MLP, the convnet and the
BatchNormalization convnet; a planted defect (one device's gradient scaled) makes it exit 1; a bad command line exits
2 before anything starts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check"


def _run(tmp_path: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("OUT", "XLA_FLAGS", "TF_USE_LEGACY_KERAS",
                                                                  "HARNESS_DEVICE_CHECK_PLANT")}
    environ.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", **env)
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=timeout, env=environ, cwd=ROOT)


@pytest.mark.extended
@pytest.mark.slow  # 66 s in .ci/run: slow.yml; the planted defect's dry run stays in the extended step
def test_dry_run_holds_exactness_and_records_every_check(tmp_path):
    done = _run(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((tmp_path / "device-check.json").read_text())
    assert (result["schema"], result["status"], result["exit_code"], result["mode"]) == (
        "harness-device-check/1", "ok", 0, "dry-run")
    assert result["errors"] == []

    exact = result["exactness"]
    assert exact["devices"] == ["cpu:0", "cpu:1", "cpu:2"] and exact["ratios"] == [5.0, 3.0, 2.0]
    assert exact["passed"] is True and exact["tolerance"] == 1e-5 and exact["planted_defect"] is None
    assert list(exact["models"]) == ["mlp", "conv", "conv_bn"]
    assert exact["models"]["conv_bn"]["batchnorm_layers"] == 4 and exact["models"]["conv"]["batchnorm_layers"] == 0
    for name in ("mlp", "conv", "conv_bn"):
        model = exact["models"][name]
        assert model["passed"] is True
        assert model["relative_deviation"] < 1e-5, model
        assert model["max_prediction_deviation"] < 1e-4, model
        assert len(model["loss_history_single"]) == len(model["loss_history_split"]) == 8
        assert sum(model["rows_per_device"]) == model["batch"] and min(model["rows_per_device"]) > 0

    speed = result["throughput"]
    configs = speed["configurations"]
    assert {"alone:cpu:0", "alone:cpu:1", "harness:cpu:0", "split:even", "split:measured"} <= set(configs)
    for key, config in configs.items():
        assert config["samples_per_second"] > 0, key
        assert config["windows"] and all(w["steps"] >= 2 and w["seconds"] > 0 for w in config["windows"]), key
    assert configs["split:even"]["rows_per_device"] == [speed["global_batch"] // 2] * 2
    assert speed["solver"]["ran"] is True or speed["solver"]["why_not"]
    # two CPU devices, one platform: Keras' DataParallel beside the splits, and the towers step's phases
    assert speed["dataparallel"] == {"ran": True, "global_batch": speed["global_batch"] // 2 * 2}
    assert configs["dataparallel"]["kind"] == "keras.distribution.DataParallel, even shards"
    assert configs["dataparallel"]["samples_per_second"] > 0
    phases = speed["phases"]["ms_per_step"]
    assert set(phases) == {"_runs", "run_forward", "_gathered", "run_backward", "_device_gradient", "train_step"}
    assert all(value > 0 for value in phases.values()), phases
    assert sum(phases[p] for p in phases if p != "train_step") <= phases["train_step"], phases
    if speed["solver"]["ran"]:
        assert "split:solver" in configs or speed["solver"]["measured"]

    telemetry = result["telemetry"]
    assert isinstance(telemetry["available"], bool)
    if not telemetry["available"]:  # no NVIDIA driver here: said why
        assert telemetry["notes"]

    env = result["environment"]
    assert set(env["versions"]) >= {"jax", "jaxlib", "keras", "numpy"}
    assert env["keras_backend"] == "jax" and env["harness_env"]["keras"]["flavour"] == "keras3"
    assert result["tensorflow"] == {"blocked": True, "imported": False, "import_attempts": []}

    if importlib.util.find_spec("matplotlib") is not None:
        assert result["png"] and (tmp_path / "device-check.png").stat().st_size > 1000
    else:
        assert result["png"] is None and "matplotlib" in result["png_note"]
    assert "device-check (dry-run): ok, exit 0" in done.stdout and "conv_bn relative weight deviation" in done.stdout
    # 81 s on two cores shared with a load of 4 to 5, 127 s at a load of 8 (docs/device-check.md)
    assert result["seconds"] < 300, f"the dry run took {result['seconds']:.0f} s (docs/device-check.md: 81 to 127 s)"


@pytest.mark.extended
def test_a_planted_defect_fails_exactness(tmp_path):
    done = _run(tmp_path, "--dry-run", "--checks", "exactness", HARNESS_DEVICE_CHECK_PLANT="1")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((tmp_path / "device-check.json").read_text())
    assert result["status"] == "exactness-failed" and result["exactness"]["planted_defect"]
    assert set(result["exactness"]["models"]) == {"mlp", "conv", "conv_bn"}
    for model in result["exactness"]["models"].values():
        assert model["passed"] is False and model["relative_deviation"] > 1e-3, model
    assert "FAILED" in done.stdout


@pytest.mark.parametrize("args", [["--checks", "exactness,nope"], ["--cpu-devices", "1"], ["--steps", "0"],
                                  ["--unknown-option"]])
def test_a_bad_command_line_exits_2(tmp_path, args):
    done = _run(tmp_path, *args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (tmp_path / "device-check.json").exists()
