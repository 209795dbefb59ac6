"""Installing harness changes no other project's pytest run: its plugin loads only where asked for.

A throwaway project defines ``--run-slow`` itself and marks tests ``slow``, ``gpu`` and ``docker``
(markers of its own meaning). In this environment, where harness is installed, its run gives the
outcome its own rules give; the same project with harness' plugin forced in (what an auto-loaded
``pytest11`` plugin did) does not even start.
"""

import subprocess
import sys
from importlib import metadata

PROJECT_CONFTEST = '''
import pytest

def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="the project's own option")

def pytest_configure(config):
    for name in ("slow", "gpu", "docker"):
        config.addinivalue_line("markers", f"{name}: the project's own marker")

def pytest_collection_modifyitems(config, items):
    if not config.getoption("--run-slow"):
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(pytest.mark.skip(reason="the project's own rule"))
'''

PROJECT_TESTS = '''
import pytest

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.gpu
def test_gpu_marked_but_runs_anywhere():
    pass

@pytest.mark.docker
def test_docker_marked_but_runs_anywhere():
    pass
'''


def _project(tmp_path):
    (tmp_path / "conftest.py").write_text(PROJECT_CONFTEST)
    (tmp_path / "test_project.py").write_text(PROJECT_TESTS)
    return tmp_path


def _pytest(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rs",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_harness_registers_no_auto_loaded_pytest_plugin():
    plugins = [ep for ep in metadata.entry_points(group="pytest11") if ep.value.split(".")[0] == "harness"]
    assert plugins == []


def test_a_project_with_its_own_run_slow_gets_its_own_outcome(tmp_path):
    project = _project(tmp_path)
    done = _pytest(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed, 1 skipped" in done.stdout
    assert "the project's own rule" in done.stdout
    done = _pytest(project, "--run-slow")
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout + done.stderr


def test_the_plugin_forced_into_that_project_breaks_it(tmp_path):
    # The bad case: what auto-loading did to such a project.
    done = _pytest(_project(tmp_path), "-p", "harness.pytest_plugin")
    assert done.returncode != 0
    assert "option dest 'run_slow' already used" in done.stdout + done.stderr
