"""scripts/figures: every measured figure it regenerates is a stamped block naming its command."""

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "figures"


def _figures(root: Path | None = None):
    loader = importlib.machinery.SourceFileLoader("figures_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("figures_script", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if root is not None:
        module.ROOT = root
    return module


def _stamped(command: str, name: str) -> str:
    return (f"<!-- figure {name} -->\n```text\n$ {command}\nsome output\n```\n*`{command}` at commit 0123456789ab, "
            f"2026-11-26, TF 2.21.0, Keras 3.15.1, tf-keras 2.21.0, 2 CPU cores, 41 s wall;\n`scripts/figures "
            f"{name}` regenerates it.*\n<!-- /figure -->\n")


def _tree(tmp_path: Path, figures, readme: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    other = [name for name in figures.FIGURES if name not in readme]
    (tmp_path / "docs" / "other.md").write_text("".join(_stamped(figures.FIGURES[n][0], n) for n in other))
    return tmp_path


def test_every_figure_in_the_docs_is_stamped_with_its_command():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no problems" in done.stdout


@pytest.mark.parametrize(("plant", "found"), [
    (lambda block: block.replace("*`harness calibrate` at commit 0123456789ab", "*ran"), "has no stamp"),
    (lambda block: block.replace("$ harness calibrate\n", "$ harness calibrate --devices 3\n"), "does not start"),
    (lambda block: block.replace("figure calibrate -->", "figure calibration -->"), "'calibration' is not one"),
    (lambda block: "", "figure 'calibrate' is in no document"),
], ids=["no-stamp", "other-command", "unknown-name", "missing"])
def test_the_check_fails_on_a_planted_problem(tmp_path, plant, found):
    figures = _figures()
    good = "intro\n\n" + _stamped("harness calibrate", "calibrate") + "\nafter\n"
    figures = _figures(_tree(tmp_path, figures, good))
    assert figures.problems() == []
    (tmp_path / "README.md").write_text(plant(good))
    assert any(found in line for line in figures.problems()), figures.problems()


def test_write_replaces_only_the_named_blocks(tmp_path):
    figures = _figures()
    calibrate, tune = _stamped("harness calibrate", "calibrate"), _stamped("harness tune", "tune")
    readme = "intro\n\n" + calibrate + "\nmiddle\n\n" + tune
    figures = _figures(_tree(tmp_path, figures, readme))
    changed = figures.write({"tune": "```text\n$ harness tune\nnew\n```\n*stamp*\n"})
    text = (tmp_path / "README.md").read_text()
    assert changed == [tmp_path / "README.md"]
    assert "$ harness tune\nnew\n```\n*stamp*\n<!-- /figure -->\n" in text
    assert text.startswith("intro\n\n" + _stamped("harness calibrate", "calibrate") + "\nmiddle\n\n")


@pytest.mark.extended
def test_a_figure_runs_and_comes_out_stamped():
    done = subprocess.run([sys.executable, str(SCRIPT), "--print", "calibrate"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = _figures()
    block = done.stdout
    assert block.startswith("<!-- figure calibrate -->\n```text\n$ harness calibrate\n")
    assert "mnist_maxing" in block and figures.STAMP.search(block), block


def test_a_block_shows_the_table_without_log_noise_or_local_paths():
    figures = _figures()
    output = ("[worker 0] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
              "I0000 00:00:1795661703.315681    8882 port.cc:153] oneDNN custom operations are on.\n"
              "[1/2] progress\nrecord: /root/.cache/harness/results/x.json\n"
              "device  ceiling\n------  -------\nCPU:0      1088\nchart: /root/x.png\n\n")
    assert figures.shown("tune", output) == "device  ceiling\n------  -------\nCPU:0      1088"
    table = "model      method\nconv/kernel   (3, 3, 8, 8)   1.2e-06\nloss per epoch: single [1.0]\ndense ok"
    assert figures.shown("check-stock", table) == "model      method\ndense ok"
    with pytest.raises(RuntimeError, match="no output line matches"):
        figures.shown("tune", "Traceback (most recent call last):\n  boom")
