"""harness.suites without TensorFlow: a project's asv suites take their params from its configuration.

Each test writes a tiny project (harness.toml or pyproject.toml, and the thin benchmark module
``harness init`` writes) in a temporary folder and imports the module: the subclasses find the
project from their file. Discovery is checked the way asv does it (``asv_runner.discovery``), in a
process of its own, for TensorFlow.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import suites
from harness.errors import InvalidValue, Unavailable

BENCH = textwrap.dedent('''
    """asv benchmarks of this project's workloads ([tool.harness] in pyproject.toml or harness.toml)."""
    from harness import suites

    class Throughput(suites.Throughput): pass
    class StepTime(suites.StepTime): pass
    class PeakMemory(suites.PeakMemory): pass
    class Fidelity(suites.Fidelity): pass
    class TimeToAccuracy(suites.TimeToAccuracy): pass
''').lstrip()
CONFIG = textwrap.dedent('''
    devices = 3
    ratios = [3, 2, 1]
    methods = ["towers", "mirrored"]

    [workloads.classifier]
    model = "mypkg.model:build"
    batch-size = 60

    [workloads.tagger]
    model = "models/tagger.py:workload"
    data = "mypkg.data:batches"
''')
SUITES = ("Throughput", "StepTime", "PeakMemory", "Fidelity", "TimeToAccuracy")


def _project(root: Path, config: str = CONFIG, *, name: str = "harness.toml", bench: str = BENCH) -> Path:
    """Writes the project; returns its benchmark module's path."""
    (root / "benchmarks").mkdir(parents=True)
    (root / name).write_text(config)
    (root / "benchmarks" / "__init__.py").write_text("")
    module = root / "benchmarks" / "harness_suites.py"
    module.write_text(bench)
    return module


def _import(path: Path, monkeypatch, name: str = "userbench_harness_suites"):
    """Imports ``path`` as asv does (its module in ``sys.modules`` while it runs; removed after the test)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_params_come_from_the_configuration(tmp_path, monkeypatch):
    bench = _import(_project(tmp_path), monkeypatch)
    workloads, methods = ["classifier", "tagger"], ["single", "towers", "mirrored"]
    assert bench.Throughput.params == [workloads, methods, ["even", "ratio"]]
    assert bench.Throughput.param_names == ["workload", "method", "split"]
    # One device has only the whole batch: asv skips 'single' x 'ratio' before setup.
    assert bench.Throughput.skip_params == [("classifier", "single", "ratio"), ("tagger", "single", "ratio")]
    for suite in ("StepTime", "PeakMemory", "TimeToAccuracy"):
        assert getattr(bench, suite).params == [workloads, methods], suite
        assert getattr(bench, suite).param_names == ["workload", "method"], suite
        assert getattr(bench, suite).skip_params == [], suite
    assert bench.Fidelity.params == [workloads, ["towers", "mirrored"]]  # the parallel methods only
    for suite in SUITES:
        cls = getattr(bench, suite)
        assert cls.harness_project.source == tmp_path / "harness.toml", suite
        assert cls.version == suites.VERSION, suite
    # setup_cache trains every combination in one process: its timeout grows with them.
    assert bench.Throughput.timeout == bench.StepTime.timeout == bench.PeakMemory.timeout == 600
    assert bench.Fidelity.timeout == 600 * 2 * 2
    assert bench.TimeToAccuracy.timeout == 1800 * 2 * 3


def test_without_ratios_throughput_splits_evenly_only(tmp_path, monkeypatch):
    config = CONFIG.replace("ratios = [3, 2, 1]\n", "").replace('"towers", ', "")
    bench = _import(_project(tmp_path, config), monkeypatch)
    assert bench.Throughput.params == [["classifier", "tagger"], ["single", "mirrored"], ["even"]]
    assert bench.Throughput.skip_params == []
    assert bench.Fidelity.params == [["classifier", "tagger"], ["mirrored"]]


def test_pyproject_tool_harness_is_found_above_the_module(tmp_path, monkeypatch):
    config = "[project]\nname = 'mypkg'\n\n" + CONFIG.replace("[workloads.", "[tool.harness.workloads.").replace(
        "devices = 3", "[tool.harness]\ndevices = 3")
    monkeypatch.chdir(tmp_path / "..")  # not the working directory's: the module's
    bench = _import(_project(tmp_path, config, name="pyproject.toml"), monkeypatch)
    assert bench.StepTime.harness_project.source == tmp_path / "pyproject.toml"
    assert bench.StepTime.params[0] == ["classifier", "tagger"]


def test_a_subclass_keeps_what_it_sets(tmp_path, monkeypatch):
    bench = _import(_project(tmp_path, bench=BENCH.replace(
        "class Fidelity(suites.Fidelity): pass", "class Fidelity(suites.Fidelity):\n    timeout = 42\n")), monkeypatch)
    assert bench.Fidelity.timeout == 42
    assert bench.Fidelity.params[1] == ["towers", "mirrored"]


def test_harness_own_base_suites_have_no_project():
    for suite in SUITES:
        cls = getattr(suites, suite)
        assert cls.harness_project is None and cls.params == [], suite
        with pytest.raises(InvalidValue, match="subclass it in a benchmark module"):
            cls.project()


@pytest.mark.parametrize(("config", "key", "name"), [
    (CONFIG.replace("batch-size = 60", "batch-size = 0"), "workloads.classifier.batch-size", "harness.toml"),
    (CONFIG.replace('model = "mypkg.model:build"', 'model = "mypkg.model"'), "workloads.classifier.model",
     "harness.toml"),
    (CONFIG.replace("methods =", "method ="), "method: unknown key", "harness.toml"),
    (CONFIG.replace("devices = 3", "devices = 3\ntimeout = 5"), "timeout: unknown key", "harness.toml"),
    # harness.suites' own check: 2 samples cannot be split over 3 devices
    (CONFIG.replace("batch-size = 60", "batch-size = 2"), "workloads.classifier.batch-size: 2 leaves a device "
                                                          "without samples", "harness.toml"),
    ("[tool.harness]\ndevices = 2\n[tool.harness.workloads.a]\nmodel = 'm:build'\nbatch-size = 1\n",
     "tool.harness.workloads.a.batch-size", "pyproject.toml"),
])
def test_a_bad_configuration_raises_at_class_creation_naming_the_key(tmp_path, monkeypatch, config, key, name):
    path = _project(tmp_path, config, name=name)
    with pytest.raises(InvalidValue) as info:
        _import(path, monkeypatch)
    message = str(info.value)
    assert key in message and str(tmp_path / name) in message, message
    assert message.startswith("asv suite userbench_harness_suites.Throughput (harness.suites): "), message
    assert "\n" not in message


def test_no_project_raises_at_class_creation(tmp_path, monkeypatch):
    path = _project(tmp_path)
    (tmp_path / "harness.toml").unlink()
    with pytest.raises(Unavailable, match=r"^asv suite userbench_harness_suites\.Throughput \(harness\.suites\): "
                                          r"no harness\.toml, and no pyproject\.toml with a \[tool\.harness\] table"):
        _import(path, monkeypatch)


def _discover(root: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    """asv's discovery of ``root/benchmarks`` in a new process; prints the benchmarks, then TensorFlow's modules."""
    code = textwrap.dedent(f'''
        import sys
        {"sys.path.insert(0, " + repr(str(extra_path)) + ")" if extra_path else ""}
        from asv_runner._aux import update_sys_path
        from asv_runner.discovery import disc_benchmarks

        root = {str(root / "benchmarks")!r}
        update_sys_path(root)
        for benchmark in disc_benchmarks(root):
            print(benchmark.name, benchmark.params)
        print("TF:", sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras")))
    ''')
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_discovering_the_suites_imports_no_tensorflow(tmp_path):
    pytest.importorskip("asv_runner")
    _project(tmp_path)
    done = _discover(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "TF: []", done.stdout
    names = sorted(line.split(" ")[0] for line in lines[:-1])
    # The subclasses only: the module harness.suites, which `from harness import suites` binds, is not a suite.
    assert names == ["harness_suites.Fidelity.track_floor_multiple", "harness_suites.Fidelity.track_max_deviation",
                     "harness_suites.PeakMemory.peakmem_train_step", "harness_suites.StepTime.time_train_step",
                     "harness_suites.Throughput.track_samples_per_second",
                     "harness_suites.TimeToAccuracy.track_seconds_to_goal",
                     "harness_suites.TimeToAccuracy.track_steps_to_goal"], done.stdout


def test_the_tensorflow_probe_sees_a_suite_that_imports_it(tmp_path):
    # The guard above can fail: a benchmark module that imports TensorFlow (a stand-in, for speed) is reported.
    pytest.importorskip("asv_runner")
    _project(tmp_path / "project", bench=BENCH + "\nimport tensorflow\n")
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("")
    done = _discover(tmp_path / "project", extra_path=fake)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "TF: ['tensorflow']", done.stdout


def test_relative_file_references_resolve_from_the_project_root(tmp_path, monkeypatch):
    bench = _import(_project(tmp_path), monkeypatch)
    project = bench.Throughput.project()
    monkeypatch.chdir("/")  # asv runs each benchmark in a temporary folder
    assert suites._references(project, "classifier") == ("mypkg.model:build", None)
    assert suites._references(project, "tagger") == (f"{tmp_path}/models/tagger.py:workload", "mypkg.data:batches")


def test_single_has_no_ratio_split(tmp_path, monkeypatch):
    # Refused before any device or TensorFlow is touched: asv records it as skipped.
    project = _import(_project(tmp_path), monkeypatch).Throughput.project()
    with pytest.raises(NotImplementedError, match="'single': one device has only the whole batch"):
        suites.run_config(project, "classifier", "single", "ratio")
    with pytest.raises(InvalidValue, match="split must be one of even, ratio; got 'tuned'"):
        suites.run_config(project, "classifier", "mirrored", "tuned")


def test_a_cached_combination_is_a_figure_a_skip_or_an_error():
    results = {"a/mirrored": {"max_deviation": 0.0}, "b/mirrored": {"skip": "no goal"},
               "c/mirrored": {"error": "ValueError: bad", "traceback": "Traceback ..."}}
    assert suites._cached(results, "a", "mirrored") == {"max_deviation": 0.0}
    with pytest.raises(NotImplementedError, match="no goal"):
        suites._cached(results, "b", "mirrored")
    with pytest.raises(RuntimeError, match="c mirrored: ValueError: bad"):
        suites._cached(results, "c", "mirrored")
    with pytest.raises(NotImplementedError, match="no result for d/mirrored"):
        suites._cached(results, "d", "mirrored")
