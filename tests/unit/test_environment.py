"""harness.bench.environment and ``harness env``: a JSON fingerprint that never raises and keeps TF out."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.bench import environment, nvml
from harness.bench.environment import fingerprint, format_fingerprint
from harness.cli import env as env_cli
from harness.compat import flavour_of


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_tf_imports_no_tensorflow():
    code = ("import harness.bench.environment as e, sys, json; json.dumps(e.fingerprint(import_tf=False)); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; print('ok')")
    assert _python(code).strip() == "ok"


def test_with_tf_reads_the_build_and_creates_no_context():
    pytest.importorskip("tensorflow")
    code = (
        "import harness.bench.environment as e, json\n"
        "fp = e.fingerprint(import_tf=True)\n"
        "from tensorflow.python.eager import context\n"
        "ctx = context.context_safe()\n"
        "print(json.dumps({'build': fp['tensorflow']['build'], 'context': ctx is not None and "
        "ctx._context_handle is not None}))\n"
    )
    out = json.loads(_python(code).strip().splitlines()[-1])
    assert isinstance(out["build"]["is_cuda_build"], bool)
    assert out["context"] is False  # an initialised context would have claimed the GPUs' memory


def test_fingerprint_is_json_and_complete(monkeypatch):
    monkeypatch.setattr(nvml, "_warned", set())  # so NVML's cause shows up in notes in this process
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    fp = json.loads(json.dumps(fingerprint(import_tf=False)))
    assert set(fp) >= {"harness", "python", "platform", "tensorflow", "keras", "packages", "nvidia", "cpu", "memory",
                       "env", "notes"}
    assert fp["harness"]["version"] == harness.__version__
    assert fp["python"]["version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert fp["env"]["TF_USE_LEGACY_KERAS"] == "0" and fp["env"]["CUDA_VISIBLE_DEVICES"] is None
    assert fp["tensorflow"]["build"] is None
    assert fp["cpu"]["count"] and fp["memory"]["total_mib"] > 0
    if not fp["nvidia"]["gpus"]:
        assert any("NVML" in note or "nvidia-ml-py" in note for note in fp["notes"])


def test_git_commit_of_this_checkout():
    checkout = Path(__file__).resolve().parents[2]
    if Path(harness.__file__).resolve().parent != checkout / "harness":  # tox installs into .tox/ of the checkout
        pytest.skip("harness is imported from an install (e.g. tox's), not from this checkout")
    fp = fingerprint(import_tf=False)
    assert re.fullmatch(r"[0-9a-f]{40}", fp["harness"]["git_commit"] or ""), fp["harness"]
    assert isinstance(fp["harness"]["git_dirty"], bool)


def test_not_a_checkout_and_no_git_give_none(monkeypatch, tmp_path):
    fake = tmp_path / "harness"
    fake.mkdir()
    monkeypatch.setattr(harness, "__file__", str(fake / "__init__.py"))
    assert fingerprint(import_tf=False)["harness"]["git_commit"] is None
    monkeypatch.undo()
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    assert fingerprint(import_tf=False)["harness"]["git_commit"] is None


@pytest.mark.parametrize(
    ("tf", "keras", "tf_keras", "legacy", "expected"),
    [
        ("2.21.0", "3.15.1", None, None, "keras3"),
        ("2.21.0", "3.15.1", "2.21.0", "1", "tf_keras"),
        ("2.21.0", "3.15.1", "2.21.0", "0", "keras3"),  # TensorFlow reads only 1 / true / True
        ("2.15.1", "2.15.0", None, None, "keras2"),
        ("2.15.1", "3.3.0", None, "1", "keras2"),  # before 2.16 tf.keras is Keras 2 regardless
        (None, "3.0.0rc1", None, "1", "keras3"),  # no TensorFlow: the variable means nothing
        (None, None, "2.16.0", None, "tf_keras"),
        (None, None, None, None, None),
    ],
)
def test_keras_flavour(tf, keras, tf_keras, legacy, expected):
    assert flavour_of(tf, keras, tf_keras, legacy) == expected


def test_legacy_keras_requested_but_missing_is_a_note(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.setattr(environment, "_version", lambda d: {"tensorflow": "2.21.0", "keras": "3.15.1"}.get(d))
    fp = fingerprint(import_tf=False)
    assert fp["keras"]["flavour"] == "tf_keras"
    assert any("tf_keras, which is not installed" in note for note in fp["notes"])


def test_gpus_and_driver_come_from_nvml(monkeypatch):
    gpu = nvml.GpuInfo(index=0, nvml_index=1, name="NVIDIA H100 80GB HBM3", uuid="GPU-1234", pci_bus_id="0:3B:0.0",
                       memory_total_mib=81559, compute_capability="9.0", power_limit_w=700.0,
                       driver_version="550.54.15", cuda_driver_version="12.4")
    monkeypatch.setattr(nvml, "gpus", lambda: [gpu])
    monkeypatch.setattr(nvml, "driver_version", lambda: "550.54.15")
    monkeypatch.setattr(nvml, "cuda_driver_version", lambda: "12.4")
    fp = fingerprint(import_tf=False)
    assert fp["nvidia"]["driver_version"] == "550.54.15"
    assert fp["nvidia"]["gpus"] == [{"index": 0, "nvml_index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234",
                                     "pci_bus_id": "0:3B:0.0", "memory_total_mib": 81559, "compute_capability": "9.0",
                                     "power_limit_w": 700.0}]
    text = format_fingerprint(fp)
    assert "gpus         1 visible" in text
    assert "gpu:0" in text and "NVIDIA H100 80GB HBM3, 81559 MiB" in text and "GPU-1234" in text
    assert "driver 550.54.15, CUDA driver 12.4" in text


def test_format_is_readable_and_tolerates_missing_sections():
    text = format_fingerprint(fingerprint(import_tf=False))
    assert text.splitlines()[0].startswith(f"harness      {harness.__version__}")
    assert "CUDA_VISIBLE_DEVICES=" in text and "keras" in text
    assert format_fingerprint({}).startswith("harness      unknown")


def _run_env(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness")
    env_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.run(args)


def test_cli_json_no_tf(capsys):
    assert _run_env(["env", "--json", "--no-tf"]) == 0
    fp = json.loads(capsys.readouterr().out)
    assert fp["harness"]["version"] == harness.__version__ and fp["tensorflow"]["build"] is None


def test_cli_text(capsys):
    assert _run_env(["env", "--no-tf"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("harness ") and "\npython " in out


def test_cli_main_when_registered(capsys):
    from harness.cli import main

    try:
        status = main(["env", "--json", "--no-tf"])
    except SystemExit:
        pytest.skip("`env` is not registered in harness.cli yet")
    assert status == 0
    assert json.loads(capsys.readouterr().out)["harness"]["version"] == harness.__version__
