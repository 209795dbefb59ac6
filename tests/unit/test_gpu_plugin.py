"""The plugin's GPU rules, checked without a GPU: memory limits, skip reasons, the device fixtures.

multi_gpu tests run wherever there is a GPU (one GPU is split into
logical GPUs), skip only without one, and a GPU test process sets its devices up before its first
test. The GPU code path itself (TensorFlow splitting a real GPU) runs only on GPU runners
(tests/zoo/test_zoo_gpu.py); here the driver's GPU count is monkeypatched and, in the inner pytest
runs, the layout fixture is replaced by one that records when it was set up.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import harness.pytest_plugin
from harness.devices import GPU_CONTEXT_MIB, gpu_memory_limit_mb, use_device_layout
from harness.pytest_plugin import plan_gpu_split, runs_gpu_layout_first, xdist_workers

pytest_plugins = ["pytester"]

H100_MIB = 81559  # an H100 80GB as NVML reports it

# --- the memory limit of each logical GPU -----------------------------------------------------------


def test_memory_limit_shares_90_percent_of_the_card_less_a_context_per_process():
    assert gpu_memory_limit_mb(H100_MIB, processes=2, devices=3) == (int(H100_MIB * 0.9) // 2 - 1024) // 3 == 11892
    assert gpu_memory_limit_mb(H100_MIB, processes=1, devices=3) == (73403 - 1024) // 3
    assert gpu_memory_limit_mb(16384, processes=2, devices=3) == 2116  # a 16 GB card, pytest -n 2


@pytest.mark.parametrize(("total", "processes", "devices"), [(H100_MIB, 2, 3), (16384, 2, 3), (8192, 4, 2),
                                                            (24576, 1, 3), (4096, 1, 2)])
def test_every_process_fits_on_the_card(total, processes, devices):
    limit = gpu_memory_limit_mb(total, processes, devices)
    assert limit >= 256
    assert processes * (devices * limit + GPU_CONTEXT_MIB) <= 0.9 * total


def test_too_little_memory_per_logical_gpu_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"a 4096 MiB GPU shared by 4 process\(es\), each splitting it into 3 "
                                         r"logical GPUs, leaves 0 MiB per logical GPU; at least 256 MiB"):
        gpu_memory_limit_mb(4096, processes=4, devices=3)


@pytest.mark.parametrize("bad", [{"total_mib": 0}, {"processes": 0}, {"devices": -1}, {"devices": True},
                                 {"total_mib": 8.0e3}])
def test_memory_limit_arguments_must_be_positive_ints(bad):
    args = {"total_mib": H100_MIB, "processes": 2, "devices": 3, **bad}
    (name,) = bad
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1; got {name}="):
        gpu_memory_limit_mb(**args)


# --- how the test devices use the GPUs ---------------------------------------------------------------


def test_one_gpu_is_split_with_the_computed_limit():
    assert plan_gpu_split(1, 3, total_mib=H100_MIB, processes=2) == (3, 11892)


def test_one_gpu_takes_a_given_limit_without_reading_its_memory():
    assert plan_gpu_split(1, 3, total_mib=None, processes=2, limit_mb=2048) == (3, 2048)


def test_several_gpus_are_used_as_they_are():
    assert plan_gpu_split(2, 3, total_mib=H100_MIB, processes=2) == (0, None)
    assert plan_gpu_split(8, 3, total_mib=None, processes=2) == (0, None)


@pytest.mark.parametrize(("args", "found"), [
    ((0, 3, H100_MIB, 2), "no GPU to lay out; got physical=0"),
    ((1, 1, H100_MIB, 2), "split into 2 or more logical GPUs; got wanted=1"),
    ((1, 3, None, 2), "NVML cannot read GPU 0's memory"),
    ((1, 3, 2048, 8), "leaves 0 MiB per logical GPU"),
])
def test_a_split_that_cannot_work_is_refused(args, found):
    with pytest.raises(ValueError, match=found.replace("(", r"\(").replace(")", r"\)")):
        plan_gpu_split(*args)


def test_a_bad_memory_option_is_refused():
    with pytest.raises(ValueError, match=r"--gpu-memory-limit-mb must be a positive int \(MiB\); got 0"):
        plan_gpu_split(1, 3, total_mib=H100_MIB, processes=2, limit_mb=0)


@pytest.mark.parametrize(("value", "workers"), [(None, 1), ("2", 2), ("8", 8), ("", 1), ("0", 1)])
def test_processes_sharing_the_card_are_the_xdist_workers(monkeypatch, value, workers):
    if value is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", value)
    assert xdist_workers() == workers


def _item(*markers: str):
    return SimpleNamespace(get_closest_marker=lambda name: object() if name in markers else None)


def test_the_layout_comes_first_only_with_gpus_and_multi_gpu_tests():
    items = [_item(), _item("multi_gpu"), _item("gpu")]
    assert runs_gpu_layout_first(items, gpus=1)
    assert runs_gpu_layout_first(items, gpus=4)
    assert not runs_gpu_layout_first(items, gpus=0)
    assert not runs_gpu_layout_first([_item(), _item("gpu")], gpus=1)


@pytest.mark.parametrize(("kwargs", "found"), [
    ({"cpus": 0}, "cpus must be an int >= 1; got cpus=0"),
    ({"cpus": 2, "split_gpus": -1}, "split_gpus must be an int >= 0; got split_gpus=-1"),
    ({"cpus": 2, "split_gpus": 3}, r"gpu_memory_limit_mb must be a positive int \(MiB\) when split_gpus > 0; "
                                   "got gpu_memory_limit_mb=None"),
    ({"cpus": 2, "split_gpus": 3, "gpu_memory_limit_mb": 0}, "got gpu_memory_limit_mb=0"),
])
def test_device_layout_arguments_are_checked_before_tensorflow(kwargs, found):
    with pytest.raises(ValueError, match=found):
        use_device_layout(**kwargs)


def test_device_layout_on_this_machine_in_a_fresh_process():
    pytest.importorskip("tensorflow")
    code = textwrap.dedent("""
        import tensorflow as tf
        from harness.devices import use_device_layout
        if tf.config.list_physical_devices("GPU"):
            print("has a GPU")
            raise SystemExit
        try:
            use_device_layout(2, split_gpus=3, gpu_memory_limit_mb=512)
        except ValueError as err:
            print(err)
        layout = use_device_layout(3)
        print(layout.cpus, layout.gpus, layout.split_gpus, layout.gpu_memory_limit_mb)
        print(use_device_layout(3) == layout)
        try:
            use_device_layout(2)
        except RuntimeError as err:
            print(err)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "no physical GPU to split into 3 logical GPUs; TensorFlow sees none"
    assert lines[1] == "('/device:CPU:0', '/device:CPU:1', '/device:CPU:2') () 0 None"
    assert lines[2] == "True"  # the same layout again is fine
    assert lines[3].startswith("TensorFlow is already initialised with CPU devices ['/device:CPU:0', ")
    assert "the layout (2 logical CPUs) must be set up before any TensorFlow op" in lines[3]


# --- the plugin in a pytest run of its own -------------------------------------------------------------

# Stands in for TensorFlow's device set-up: records that (and before which test) it ran.
_LAYOUT_CONFTEST = """
import pytest
from harness.pytest_plugin import TestDevices

@pytest.fixture(scope="session")
def harness_device_layout(request):
    with open("layout.log", "a") as log:
        log.write("set up\\n")
    return TestDevices(("/device:CPU:0",), GPUS, PROBLEM)

GPUS = {gpus!r}
PROBLEM = {problem!r}
"""

_TESTS = """
import os
import pytest

def test_plain():
    print("layout set up before the first test:", os.path.exists("layout.log"))

@pytest.mark.gpu
def test_gpu():
    pass

@pytest.mark.multi_gpu
def test_multi_gpu(gpu_devices):
    assert len(gpu_devices) >= 2
"""


def _run(pytester, monkeypatch, gpus: int, *args: str, layout_gpus=("/device:GPU:0", "/device:GPU:1"),
         problem=None, tests: str = _TESTS):
    monkeypatch.setattr(harness.pytest_plugin, "gpu_count", lambda: gpus)
    pytester.makeconftest(_LAYOUT_CONFTEST.format(gpus=tuple(layout_gpus), problem=problem))
    pytester.makepyfile(test_plugin_rules=tests)
    return pytester.runpytest("-p", "harness.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", "-s",
                              *args)


def _skip_reasons(result) -> dict[str, str]:
    reports = result.reprec.getreports("pytest_runtest_logreport")
    return {r.nodeid.split("::")[-1]: r.longrepr[2].removeprefix("Skipped: ") for r in reports if r.skipped}


def test_without_a_gpu_gpu_and_multi_gpu_tests_skip_saying_why(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, 0)
    result.assert_outcomes(passed=1, skipped=2)
    assert _skip_reasons(result) == {
        "test_gpu": "needs a GPU; this machine has none",
        "test_multi_gpu": "needs a GPU (one GPU is split into logical GPUs); this machine has none",
    }
    assert "layout set up before the first test: False" in result.stdout.str()
    assert not (pytester.path / "layout.log").exists()  # no GPU: TensorFlow is not even imported for it


def test_with_one_gpu_multi_gpu_tests_run_on_its_logical_gpus(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, 1)
    result.assert_outcomes(passed=3)
    assert _skip_reasons(result) == {}
    # The layout was set up before test_plain, which requests no device fixture: first in the process.
    assert "layout set up before the first test: True" in result.stdout.str()
    assert (pytester.path / "layout.log").read_text() == "set up\n"


def test_without_multi_gpu_tests_nothing_is_set_up_ahead(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, 1, "-m", "not multi_gpu")
    result.assert_outcomes(passed=2)
    assert "layout set up before the first test: False" in result.stdout.str()


def test_gpu_devices_refuses_clearly_without_a_gpu(pytester, monkeypatch):
    # the guard, on the bad case: a test that asks for GPUs but is not marked multi_gpu, on a CPU machine
    result = _run(pytester, monkeypatch, 0, tests="def test_unmarked(gpu_devices):\n    pass\n")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gpu_devices needs an NVIDIA GPU and this machine has none: mark the test "
                                 "multi_gpu (skipped without a GPU)*"])
    assert not (pytester.path / "layout.log").exists()


def test_gpu_devices_fails_with_the_reason_where_tensorflow_sees_no_gpu(pytester, monkeypatch):
    problem = "the driver shows 1 GPU(s) but TensorFlow sees none (tensorflow-cpu, or TensorFlow without its CUDA"
    result = _run(pytester, monkeypatch, 1, layout_gpus=(), problem=problem)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([f"*gpu_devices: no GPU device: {problem}*"])


def test_gpu_devices_fails_where_the_one_gpu_could_not_be_split(pytester, monkeypatch):
    problem = "GPU 0 is not split: NVML cannot read GPU 0's memory"
    result = _run(pytester, monkeypatch, 1, layout_gpus=("/device:GPU:0",), problem=problem)
    result.assert_outcomes(passed=2, errors=1)
    assert f"gpu_devices: only ['/device:GPU:0']: {problem}" in result.stdout.str()


def test_gpu_devices_fails_where_the_one_gpu_was_set_up_whole_for_cpu_tests(pytester, monkeypatch):
    # a run without multi_gpu tests whose process set its devices up for logical_devices first
    tests = "def test_cpus(logical_devices):\n    pass\n\ndef test_unmarked(gpu_devices):\n    pass\n"
    result = _run(pytester, monkeypatch, 1, layout_gpus=("/device:GPU:0",), tests=tests)
    result.assert_outcomes(passed=1, errors=1)
    assert ("gpu_devices: only ['/device:GPU:0']: GPU 0 was set up whole, for logical_devices, before a test of "
            "this process asked for gpu_devices: mark the tests that use gpu_devices multi_gpu") in result.stdout.str()


def test_the_real_layout_where_the_driver_shows_a_gpu_tensorflow_cannot_use(tmp_path):
    # tensorflow-cpu on a GPU machine, in a fresh process: the real layout fixture (no stand-in) sets
    # up the CPUs before the first test, and gpu_devices fails saying why instead of skipping.
    pytest.importorskip("tensorflow")
    (tmp_path / "test_real.py").write_text(textwrap.dedent("""
        import pytest

        def test_first_touches_tensorflow():
            import tensorflow as tf
            assert len(tf.config.list_logical_devices("CPU")) == 4  # set up before this test

        def test_cpus(logical_devices):
            assert len(logical_devices) == 4

        @pytest.mark.multi_gpu
        def test_gpus(gpu_devices):
            pass
    """))
    code = ("import sys, pytest, harness.pytest_plugin\n"
            "harness.pytest_plugin.gpu_count = lambda: 1  # what the driver would say on a GPU machine\n"
            "sys.exit(pytest.main(['-p', 'harness.pytest_plugin', '-p', 'no:cacheprovider', '-p', 'no:xdist', '-q',\n"
            "                      'test_real.py']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"})
    # "2 passed, 1 warning, 1 error" where harness is installed (tox): imported here before pytest.main,
    # its plugin module cannot be assertion-rewritten, and pytest warns so
    assert re.search(r"\b2 passed, (\d+ warnings?, )?1 error\b", done.stdout), done.stdout[-3000:] + done.stderr[-3000:]
    assert ("gpu_devices: no GPU device: the driver shows 1 GPU(s) but TensorFlow sees none (tensorflow-cpu, "
            "or TensorFlow without its CUDA libraries?)") in done.stdout


def test_require_gpu_stops_a_run_without_a_gpu(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, 0, "--require-gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--require-gpu: this machine has no NVIDIA GPU*the gpu and multi_gpu tests "
                                 "cannot run*"])
    result = _run(pytester, monkeypatch, 1, "--require-gpu")
    result.assert_outcomes(passed=3)


def test_the_gpu_options_are_documented(pytestconfig):
    assert pytestconfig.getoption("--gpu-devices") == 3
    assert pytestconfig.getoption("--gpu-memory-limit-mb") is None
    assert pytestconfig.getoption("--require-gpu") is False


# --- the GPU runners run the GPU tests -------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def gpu_test_problems(workflow_text: str) -> list[str]:
    """What keeps gpu.yml's pytest steps from running the GPU tests, the whole zoo and keeping JUnit."""
    steps = (yaml.safe_load(workflow_text)["jobs"].get("gpu") or {}).get("steps") or []
    runs = [str(step.get("run", "")) for step in steps if "pytest" in str(step.get("run", ""))]
    problems = [] if runs else ["no pytest step"]
    for run in runs:
        if "--require-gpu" not in run:
            problems.append(f"a pytest step without --require-gpu (GPU tests could quietly skip): {run[:80]!r}")
        if re.search(r"not (multi_)?gpu\b", run):
            problems.append(f"a pytest step deselects GPU tests: {run[:80]!r}")
        if "--junitxml" not in run:
            problems.append(f"a pytest step keeps no JUnit file: {run[:80]!r}")
    if not any("--run-zoo" in run and "multi_gpu" in run for run in runs):
        problems.append("no step runs the whole model zoo on GPUs (--run-zoo, multi_gpu)")
    return problems


def _gpu_yml() -> str:
    return (ROOT / ".github" / "workflows" / "gpu.yml").read_text()


def test_gpu_workflow_runs_the_gpu_tests_and_the_whole_zoo():
    assert gpu_test_problems(_gpu_yml()) == []


@pytest.mark.parametrize(("old", "new", "found"), [
    ("--require-gpu -m \"not docker\"", "-m \"not docker\"", "without --require-gpu"),
    ("-m \"not docker\"", "-m \"not docker and not multi_gpu\"", "deselects GPU tests"),
    ("--junitxml=\"/out/junit-$1.xml\"", "", "keeps no JUnit file"),
    ("--run-zoo", "", "no step runs the whole model zoo"),
])
def test_the_workflow_guard_reports_a_planted_problem(old, new, found):
    text = _gpu_yml()
    assert old in text
    problems = gpu_test_problems(text.replace(old, new))
    assert any(found in p for p in problems), problems


def test_tox_gpu_env_runs_what_the_workflow_runs():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    commands = parser["testenv:gpu"]["commands"]
    assert "pytest -n 2 -p no:cacheprovider --require-gpu -m \"not docker\"" in commands
    assert "--require-gpu --run-zoo -m \"zoo and multi_gpu\" tests/zoo" in commands
    assert "TF_FORCE_GPU_ALLOW_GROWTH = true" in parser["testenv:gpu"]["setenv"]
