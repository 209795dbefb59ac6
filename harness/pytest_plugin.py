"""pytest plugin: markers, device fixtures, skip rules and JUnit version properties. Opt-in.

Installing harness changes no other project's pytest run: this plugin loads only
where asked for, with ``pytest -p harness.pytest_plugin`` or, in a top-level
``conftest.py``, ``pytest_plugins = ["harness.pytest_plugin"]`` (harness' own
``tests/conftest.py`` does). It is the only harness module that imports pytest;
``harness.assert_equivalent`` needs no pytest. Importing it does not import
TensorFlow.

Each test's cost goes into the JUnit file (``--junitxml``: its markers and the TensorFlow processes it
started) and ``--time-budget STEP`` ends a run with its wall time against a budget: harness/pytest_timing.py.

It adds the markers ``gpu``, ``multi_gpu``, ``slow``, ``docker``, ``timing``, ``zoo``, ``extended``, ``browser``,
skips tests so marked from what the machine has (``--run-slow``, ``--run-docker``, ``--run-zoo``,
``--run-extended``, ``--run-timing``, ``--run-browser``; a browser test also needs Chromium: ``chromium_path``),
and the fixtures ``logical_devices``, ``gpu_devices``, ``keras2``, ``any_keras``. It marks ``keras2`` each test
that runs a Keras 2 model (``KERAS2``): a Keras 2 env selects them with ``-m keras2`` (``.ci/run``'s tf215 step).

Skips. ``--skip-report PATH`` writes every skip of the run to ``PATH``, one JSON object a line:
``{"nodeid", "reason", "where", "when"}`` (``when``: ``collect`` for a module skipped as a whole,
``setup`` or ``call`` for a test), and ``"context"``: the tags the environment declares in
``HARNESS_SKIP_CONTEXT`` (space-separated; tox's Keras 2 envs declare ``keras2``, harness docker's
container ``image``), where it declares any. ``scripts/check-skips`` holds them against the allowlist
``.ci/skip-allowlist``, so that a test skipped for a reason nobody allowed (a package the dev
environment should have installed) fails CI instead of passing it quietly. Only the process that
reports the run writes it (pytest-xdist's controller, which gets every worker's skips); xfails are
not skips.

Devices. TensorFlow fixes its devices once per process, so every device a test process uses is set
up at once, before its first TensorFlow op, by the session fixture ``harness_device_layout``:
``--logical-devices`` logical CPUs and, for GPU tests (a run with ``multi_gpu`` tests, or
``gpu_devices`` asked for) on a machine with one GPU, GPU 0 split into ``--gpu-devices`` logical
GPUs with memory limits that fit every pytest-xdist worker (``plan_gpu_split``); otherwise the
physical GPUs as they are, with memory growth on.
``logical_devices`` (CPUs) and ``gpu_devices`` (GPUs) read it. The rule: a test that touches
TensorFlow requests one of them before it does, and on a GPU machine a run with ``multi_gpu``
tests sets the layout up before the first test of each process (an autouse fixture), so that a
test touching TensorFlow without them cannot fix the devices first.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from harness.devices import gpu_count

__all__ = ["plan_gpu_split", "runs_gpu_layout_first", "xdist_workers", "chromium_path", "TestDevices", "SkipRecorder",
           "skip_record"]

GPU_DEVICES = 3  # logical GPUs made of a single GPU: the zoo's largest split, 5:3:2
_GPUS_WANTED = pytest.StashKey[bool]()  # gpu_devices was requested in this process

MARKERS = {
    "gpu": "needs at least one NVIDIA GPU (skipped without one)",
    "multi_gpu": "runs on the gpu_devices fixture's 2+ GPU devices: the physical GPUs, or one GPU split into logical "
                 "GPUs (skipped without a GPU)",
    "slow": "takes more than a few seconds (run with --run-slow)",
    "docker": "builds or runs container images (run with --run-docker)",
    "timing": "asserts measured speeds of emulated devices; must hold on a busy machine. Opt-in (--run-timing or "
              "-m timing): .ci/run's load step runs them beside two CPU hogs, slow.yml with the whole suite",
    "zoo": "model-zoo conformance beyond the fast subset: every architecture x method x split (--run-zoo or -m zoo)",
    "extended": "the deeper half of the suite, kept out of the quick loop (the optimizer axis' fast subset, asv suite "
                "runs, the gate's repeated measurements, every zoo entry's build): .ci/run runs it "
                "(--run-extended or -m extended)",
    "browser": "loads pages in a headless Chromium (run with --run-browser; skipped, saying so, where no Chromium "
               "is installed: .ci/run installs Debian's chromium)",
}
# Not among MARKERS (those skip what this machine or run lacks): it says what a test runs, for a step to select.
KERAS2 = ("keras2: runs a Keras 2 model where the environment has one: marked by this plugin where the test takes the "
          "keras2 fixture, is any_keras' keras2 run or the Keras 2 case of a parameter named generation ('keras2', "
          "or the zoo's '2'); by hand where it asks for Keras 2 otherwise (request.getfixturevalue) or its model is "
          "the environment's own keras (Keras 2 in tox's tf215 env: a model file, a subprocess) and must hold there. "
          ".ci/run's tf215 step selects them (-m keras2)")
KERAS2_GENERATIONS = ("keras2", "2")  # a ``generation`` parameter's Keras 2 values (the tests', the zoo's)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_CHROMIUM = ("browser: no Chromium on this machine (apt-get install chromium, or set HARNESS_CHROMIUM to its "
               "executable)")


def chromium_path() -> str | None:
    """The Chromium the ``browser`` tests drive: ``$HARNESS_CHROMIUM`` where set, else the first of
    ``CHROMIUM_NAMES`` on PATH; None where there is none (the tests skip, saying so)."""
    import shutil

    chosen = os.environ.get("HARNESS_CHROMIUM")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def xdist_workers() -> int:
    """Test processes of this run that share the machine: pytest-xdist's worker count, else 1."""
    try:
        return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    except ValueError:
        return 1


def plan_gpu_split(physical: int, wanted: int, total_mib: int | None, processes: int,
                   limit_mb: int | None = None) -> tuple[int, int | None]:
    """How the test devices use ``physical`` GPUs: ``(logical GPUs made of GPU 0, MiB each)``.

    Several GPUs are used as they are: ``(0, None)``. One GPU is split into ``wanted`` logical
    GPUs of ``limit_mb`` MiB each, or, without it, of ``harness.devices.gpu_memory_limit_mb(
    total_mib, processes, wanted)``: 90% of the card shared by ``processes``, 1 GiB of each
    process's share kept for its CUDA context.

    Raises:
        ValueError: no GPU; ``wanted`` < 2; one GPU whose memory is unknown and no ``limit_mb``;
            too little memory per logical GPU.

    Example:
        >>> plan_gpu_split(1, 3, total_mib=81559, processes=2)
        (3, 11892)
    """
    from harness.devices import gpu_memory_limit_mb

    if physical < 1:
        raise ValueError(f"no GPU to lay out; got physical={physical}")
    if physical > 1:
        return 0, None
    if wanted < 2:
        raise ValueError(f"a single GPU is split into 2 or more logical GPUs; got wanted={wanted}")
    if limit_mb is not None:
        if isinstance(limit_mb, bool) or not isinstance(limit_mb, int) or limit_mb <= 0:
            raise ValueError(f"--gpu-memory-limit-mb must be a positive int (MiB); got {limit_mb!r}")
        return wanted, limit_mb
    if total_mib is None:
        raise ValueError("NVML cannot read GPU 0's memory, so its logical GPUs get no computed limit: "
                         "pass --gpu-memory-limit-mb N (MiB per logical GPU)")
    return wanted, gpu_memory_limit_mb(total_mib, processes, wanted)


def pytest_addoption(parser):
    group = parser.getgroup("harness")
    group.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    group.addoption("--run-docker", action="store_true", default=False, help="run tests marked docker")
    group.addoption("--run-timing", action="store_true", default=False,
                    help="run the tests marked timing (speeds of emulated devices; also selected by -m timing)")
    group.addoption("--run-extended", action="store_true", default=False,
                    help="run the extended tests too (marked extended; also selected by -m extended)")
    group.addoption("--run-zoo", action="store_true", default=False,
                    help="run the whole model zoo (tests marked zoo; also selected by -m zoo)")
    group.addoption("--run-browser", action="store_true", default=False,
                    help="run the tests marked browser (headless Chromium: chromium_path())")
    group.addoption(
        "--logical-devices", type=int, default=4,
        help="logical CPU devices the logical_devices fixture creates (default 4)",
    )
    group.addoption("--gpu-devices", type=int, default=GPU_DEVICES,
                    help=f"logical GPUs the gpu_devices fixture makes of a single GPU (default {GPU_DEVICES})")
    group.addoption("--gpu-memory-limit-mb", type=int, default=None,
                    help="MiB per logical GPU (default: 90%% of the card shared by the xdist workers, "
                         "less 1 GiB per worker)")
    group.addoption("--require-gpu", action="store_true", default=False,
                    help="stop at once where the machine has no GPU, instead of skipping the gpu/multi_gpu tests")
    group.addoption("--skip-report", metavar="PATH", default=None,
                    help="write every skip of the run to PATH, one JSON object a line (nodeid, reason, where, "
                         "when); scripts/check-skips checks them against .ci/skip-allowlist")
    group.addoption("--time-budget", metavar="STEP", default=None,
                    help="end the run with its wall time against STEP's budget in --time-budget-file (harness "
                         "test-time; the README's test command: quick)")
    group.addoption("--time-budget-file", metavar="PATH", default=None,
                    help="the budget file (TOML) of --time-budget (default: .ci/test-budget.toml under the rootdir)")


def pytest_configure(config):
    path = config.getoption("--skip-report", None)
    if path and not hasattr(config, "workerinput"):  # pytest-xdist: its controller writes, from all workers
        config.pluginmanager.register(SkipRecorder(path), "harness-skip-recorder")
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.addinivalue_line("markers", KERAS2)
    from harness.pytest_timing import TimingPlugin  # JUnit properties of each test's cost; the budget line

    config.pluginmanager.register(TimingPlugin(config, MARKERS), "harness-timing")
    if config.getoption("--require-gpu", False) and gpu_count() == 0:
        raise pytest.UsageError("--require-gpu: this machine has no NVIDIA GPU that the driver shows (/proc/driver/"
                                "nvidia/gpus, CUDA_VISIBLE_DEVICES); the gpu and multi_gpu tests cannot run")


def skip_record(report) -> dict[str, str] | None:
    """A skipped test's or module's ``{"nodeid", "reason", "where", "when"}``; None for any other report.

    ``reason`` is what ``pytest.skip`` was given (without pytest's ``Skipped: `` prefix); ``where``
    is ``file:line`` of the skip as ``-rs`` shows it (the test's own line for a skip marker).

    Example:
        >>> from types import SimpleNamespace
        >>> skip_record(SimpleNamespace(skipped=True, nodeid="t.py::test_a", when="setup",
        ...                             longrepr=("/r/t.py", 4, "Skipped: no GPU")))
        {'nodeid': 't.py::test_a', 'reason': 'no GPU', 'where': '/r/t.py:4', 'when': 'setup'}
    """
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, line, text = longrepr
        where = f"{path}:{line}" if line is not None else str(path)
    else:
        text, where = str(longrepr), ""
    text = str(text)
    if text.startswith("Skipped: "):
        text = text[len("Skipped: "):]
    return {"nodeid": report.nodeid, "reason": text, "where": where, "when": getattr(report, "when", "collect")}


class SkipRecorder:
    """Collects the run's skips (``skip_record``) and writes them to ``path`` at the end, one JSON line each.

    Registered by ``pytest_configure`` where ``--skip-report`` is given, in the process that reports
    the run: pytest-xdist's controller gets each worker's test reports, and each module skipped at
    collection once.
    """

    def __init__(self, path: str):
        self.path = path
        self.records: list[dict] = []

    def _add(self, report) -> None:
        record = skip_record(report)
        if record is not None:
            context = os.environ.get("HARNESS_SKIP_CONTEXT", "").split()
            self.records.append({**record, "context": context} if context else record)

    def pytest_runtest_logreport(self, report):
        self._add(report)

    def pytest_collectreport(self, report):
        self._add(report)

    def pytest_sessionfinish(self, session):
        with open(self.path, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(r, sort_keys=True) + "\n" for r in self.records)


def junit_versions() -> dict[str, str]:
    """The versions a compatibility table needs, read without importing TensorFlow."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version(),
                "TF_USE_LEGACY_KERAS": os.environ.get("TF_USE_LEGACY_KERAS", "")}
    for key, names in (("tensorflow", ("tensorflow", "tensorflow-cpu", "tf-nightly")), ("keras", ("keras",)),
                       ("tf_keras", ("tf-keras",))):
        for name in names:
            try:
                versions[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def add_junit_property(config, name: str, value: str) -> None:
    """A global property of the ``--junitxml`` file, if one is written (``harness.ci.compat_report`` reads them)."""
    try:
        from _pytest.junitxml import xml_key  # pytest >= 7: LogXML lives in the config's stash

        xml = config.stash.get(xml_key, None)
    except ImportError:
        xml = getattr(config, "_xml", None)
    if xml is not None:
        xml.add_global_property(name, value)


def pytest_sessionstart(session):
    for key, value in junit_versions().items():  # the versions a compatibility table needs
        add_junit_property(session.config, key, value)


def pytest_itemcollected(item):
    """Marks ``keras2`` (``KERAS2``) a test that runs a Keras 2 model: it takes the ``keras2`` fixture (directly or
    through another fixture), is ``any_keras``' keras2 run, or is the Keras 2 case of a ``generation`` parameter.
    Marked as collected, before any ``-m`` selects."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if ("keras2" in getattr(item, "fixturenames", ()) or params.get("any_keras") == "keras2"
            or params.get("generation") in KERAS2_GENERATIONS):
        item.add_marker(pytest.mark.keras2)


def pytest_collection_modifyitems(config, items):
    gpus = gpu_count()
    reasons = {
        "gpu": None if gpus >= 1 else "needs a GPU; this machine has none",
        "multi_gpu": None if gpus >= 1 else "needs a GPU (one GPU is split into logical GPUs); this machine has none",
        "slow": None if config.getoption("--run-slow") else "slow: run with --run-slow",
        "docker": None if config.getoption("--run-docker") else "docker: run with --run-docker",
        "zoo": None if config.getoption("--run-zoo") or "zoo" in (config.getoption("markexpr") or "")
        else "whole model zoo: run with --run-zoo or -m zoo",
        "timing": None if config.getoption("--run-timing") or "timing" in (config.getoption("markexpr") or "")
        else "timing: run with --run-timing or -m timing",
        "extended": None if config.getoption("--run-extended") or "extended" in (config.getoption("markexpr") or "")
        else "extended: run with --run-extended or -m extended",
        "browser": "browser: run with --run-browser" if not config.getoption("--run-browser")
        else None if chromium_path() else NO_CHROMIUM,
    }
    for item in items:
        for name, reason in reasons.items():
            if reason and item.get_closest_marker(name) is not None:  # keywords hold folder names too
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass(frozen=True)
class TestDevices:
    """This test process's devices (the ``harness_device_layout`` fixture)."""

    __test__ = False  # not a test class, whatever its name

    cpus: tuple[str, ...]
    gpus: tuple[str, ...]
    gpu_problem: str | None = None  # why there are no GPU devices (or too few), on a machine with GPUs


def runs_gpu_layout_first(items, gpus: int) -> bool:
    """Whether each test process sets up its devices before its first test: GPUs, and multi_gpu tests to run."""
    return gpus >= 1 and any(item.get_closest_marker("multi_gpu") is not None for item in items)


@pytest.fixture(scope="session")
def harness_device_layout(request) -> TestDevices:
    """Every device of this test process, set up at once before TensorFlow starts (see the module docstring)."""
    from harness.devices import use_device_layout
    from harness.emulate import inter_op_threads

    config = request.config
    cpus = config.getoption("--logical-devices")
    problem, split, limit = None, 0, None
    # GPU 0 is split only for GPU tests: where a run has none, a test asking for CPUs gets GPU 0 whole.
    for_gpu_tests = runs_gpu_layout_first(request.session.items, gpu_count()) or config.stash.get(_GPUS_WANTED, False)
    if gpu_count() >= 1:
        import tensorflow as tf

        physical = len(tf.config.list_physical_devices("GPU"))
        if physical == 0:
            problem = (f"the driver shows {gpu_count()} GPU(s) but TensorFlow sees none "
                       "(tensorflow-cpu, or TensorFlow without its CUDA libraries?)")
        elif for_gpu_tests:
            try:
                split, limit = plan_gpu_split(physical, config.getoption("--gpu-devices"), _gpu0_memory_mib(),
                                              xdist_workers(), config.getoption("--gpu-memory-limit-mb"))
            except ValueError as err:  # the CPU tests still run; gpu_devices fails with the reason
                problem = f"GPU 0 is not split: {err}"
    try:
        # Emulated devices sleep on inter-op threads (harness.emulate.inter_op_threads).
        layout = use_device_layout(cpus, split, limit, inter_op_threads=inter_op_threads(cpus))
    except RuntimeError as err:
        raise RuntimeError(f"{err} In a pytest run: request logical_devices or gpu_devices before a test touches "
                           "TensorFlow (the harness plugin does so before the first test where the run has "
                           "multi_gpu tests and the machine a GPU).") from err
    return TestDevices(layout.cpus, layout.gpus, problem)


def _gpu0_memory_mib() -> int | None:
    from harness.bench import nvml

    found = nvml.gpus()  # CUDA's numbering: found[0] is TensorFlow's GPU 0
    return found[0].memory_total_mib if found else None


@pytest.fixture(scope="session", autouse=True)
def _harness_gpu_layout_first(request) -> None:
    # A test that touches TensorFlow without the device fixtures would fix the devices with GPU 0
    # whole, and gpu_devices could no longer split it: on GPU machines, set them up first.
    if runs_gpu_layout_first(request.session.items, gpu_count()):
        request.getfixturevalue("harness_device_layout")


@pytest.fixture(scope="session")
def logical_devices(request) -> list[str]:
    """``--logical-devices`` logical CPU devices (default 4), created once per process.

    TensorFlow fixes its devices at start-up: request this fixture before any
    test of the process touches TensorFlow (pytest-xdist gives each worker its
    own process).
    """
    return list(request.getfixturevalue("harness_device_layout").cpus)


@pytest.fixture(scope="session")
def gpu_devices(request) -> list[str]:
    """GPU device names for ``multi_gpu`` tests, set up once per process.

    The physical GPUs where there are several (memory growth on, so that xdist workers share
    them); on a one-GPU machine, GPU 0 split into ``--gpu-devices`` logical GPUs (default 3, the
    zoo's largest split), each limited to ``--gpu-memory-limit-mb`` or to ``plan_gpu_split``'s share
    of the card. A test needing more devices than it gives skips, saying so.

    Fails, saying why, without a GPU (mark the test ``multi_gpu``: it is skipped there) and where
    TensorFlow sees no GPU. Request it before the test touches TensorFlow.

    Example:
        >>> @pytest.mark.multi_gpu
        ... def test_on_gpus(gpu_devices):
        ...     assert_equivalent(build, x, y, devices=gpu_devices[:2], ratios=[3, 2])
    """
    if gpu_count() == 0:
        pytest.fail("gpu_devices needs an NVIDIA GPU and this machine has none: mark the test multi_gpu "
                    "(skipped without a GPU)", pytrace=False)
    request.config.stash[_GPUS_WANTED] = True
    devices = request.getfixturevalue("harness_device_layout")
    if not devices.gpus:
        pytest.fail(f"gpu_devices: no GPU device: {devices.gpu_problem}", pytrace=False)
    if len(devices.gpus) < 2:
        why = devices.gpu_problem or (
            "GPU 0 was set up whole, for logical_devices, before a test of this process asked for gpu_devices: "
            "mark the tests that use gpu_devices multi_gpu (GPU 0 is then split before the first test)")
        pytest.fail(f"gpu_devices: only {list(devices.gpus)}: {why}", pytrace=False)
    return list(devices.gpus)


@pytest.fixture(scope="session")
def keras2():
    """The environment's Keras 2 module: ``keras`` where it is Keras 2 (TF <= 2.15), else ``tf_keras``.

    Skips the test, saying why, where neither is installed; models built with
    it are Keras 2 models, which ``harness.parallelize`` trains as such.
    """
    from harness.compat import keras_flavour

    flavour = keras_flavour()
    if flavour.major == 2 and flavour.package == "keras":
        import keras

        return keras
    return pytest.importorskip("tf_keras", reason="no Keras 2 here (tf-keras, or TF 2.15's keras; the matrix's "
                                                  "legacy and tf215 envs have one)")


@pytest.fixture(scope="session", params=["keras3", "keras2"])
def any_keras(request):
    """Each Keras generation in turn: Keras 3 (``keras`` >= 3), then Keras 2 (the ``keras2`` fixture).

    A test written once with it runs on both generations where both are
    installed; the generation missing here is skipped, saying why.
    """
    if request.param == "keras2":
        return request.getfixturevalue("keras2")
    from importlib import metadata

    try:
        major = int(metadata.version("keras").split(".")[0])
    except metadata.PackageNotFoundError:
        major = 0
    if major < 3:
        pytest.skip("no Keras 3 here (the keras package is Keras 2 or absent)")
    import keras

    return keras

