"""The layers hold (import-linter's contracts in pyproject.toml) and the contracts catch what they forbid.

The contracts: CLI and pytest plugin on top, then ``harness.ci``, ``harness.bench``, the core
library; the core imports none of the optional dependencies; only the pytest plugin imports
pytest; no import cycles between sibling modules at any depth (function-level imports included).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The checkout this test file is in (its pyproject.toml holds the contracts, its harness/ is the code they
# check), not the installed package's location: tox installs harness into site-packages, where neither is.
ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "pyproject.toml").is_file() or not (ROOT / "harness").is_dir():
    pytest.skip(f"needs a source checkout (pyproject.toml and harness/ in {ROOT}): the import contracts are "
                "in pyproject.toml", allow_module_level=True)
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]


def _lint(cwd: Path, config: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([*LINT, "--no-logo", "--no-cache", "--config", str(config)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    done = _lint(ROOT, ROOT / "pyproject.toml", pythonpath=ROOT)  # this checkout's harness, not an installed one
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.fixture(scope="module")
def copy_of_harness(tmp_path_factory) -> Path:
    """A copy of the package and of its contracts, to break on purpose."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "harness", root / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "pyproject.toml").read_text()
    (root / "contracts.toml").write_text(text[text.index("[tool.importlinter]"):])
    return root


@pytest.mark.parametrize("module, line, broken", [
    ("split.py", "from harness.bench import runner", "harness.split is not allowed to import harness.bench"),
    ("parallel/towers.py", "import matplotlib", "is not allowed to import matplotlib"),
    ("bench/runner.py", "import pytest", "is not allowed to import pytest"),
    ("bench/results.py", "from harness.ci import matrix", "is not allowed to import harness.ci"),
    ("compat.py", "def _f():\n    from harness import parallel", "No cycles are allowed"),
])
def test_a_forbidden_import_breaks_a_contract(copy_of_harness, module, line, broken):
    path = copy_of_harness / "harness" / module
    original = path.read_text()
    try:
        path.write_text(original + f"\n{line}  # noqa\n")
        done = _lint(copy_of_harness, copy_of_harness / "contracts.toml", pythonpath=copy_of_harness)
    finally:
        path.write_text(original)
    assert done.returncode != 0, done.stdout[-3000:]
    assert broken in done.stdout, done.stdout[-3000:]
