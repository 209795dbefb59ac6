"""pytest plugin: markers, a logical-devices fixture and ``assert_equivalent``.

Loaded automatically (entry point ``pytest11``) wherever harness is installed.
Importing it does not import TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pytest

__all__ = ["assert_equivalent", "gpu_count"]

MARKERS = {
    "gpu": "needs at least one NVIDIA GPU (skipped without one)",
    "multi_gpu": "needs at least two NVIDIA GPUs (skipped otherwise)",
    "slow": "takes more than a few seconds (run with --run-slow)",
    "docker": "builds or runs container images (run with --run-docker)",
    "timing": "asserts measured speeds of emulated devices; must hold on a busy machine (.ci/run also runs "
              "these beside two CPU hogs)",
    "zoo": "model-zoo conformance beyond the fast subset: every architecture x method x split (--run-zoo or -m zoo)",
}


def gpu_count() -> int:
    """NVIDIA GPUs the driver exposes, counted without creating a TF context."""
    root = "/proc/driver/nvidia/gpus"
    try:
        count = len(os.listdir(root))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def assert_equivalent(
    build_model: Callable[[], object],
    x,
    y,
    *,
    devices,
    ratios: Sequence[float] | None = None,
    method: str = "mirrored",
    batch_size: int = 32,
    epochs: int = 1,
    optimizer="sgd",
    loss="mse",
    tol: float = 1e-6,
    reference: str | None = None,
    **kwargs,
):
    """Fails unless parallel training matches single-device training within ``tol``.

    Trains ``build_model()`` once on one device and once with ``parallelize``
    from the same initial weights and batches, then compares every weight,
    every optimizer variable and the per-epoch loss by
    ``max |Δ| / max(1, max |reference|)``.

    With ``reference="float64"`` a float64 copy of the model is trained on one
    device too, and a parallel run that is not within ``tol`` still passes when
    it is as accurate as one device: no farther from the float64 run than twice
    the single-device float32 run, plus 1e-7
    (``EquivalenceReport.verdict``). Float32 rounding alone can put a correct
    parallel step of a real CNN 1e-5 from the single-device step.

    Args:
        build_model: returns a new, built Keras model.
        x, y: training data.
        devices, ratios, method: as for ``harness.parallelize``.
        batch_size, epochs, optimizer, loss: the training run.
        tol: the largest deviation accepted.
        reference: None, or ``"float64"`` (see above and ``harness.compare_training``).
        **kwargs: passed to ``harness.compare_training`` (``metrics``,
            ``sample_weight``, ``class_weight``, ``sync_batchnorm``, ``seed``).

    Returns:
        The ``EquivalenceReport``.

    Raises:
        AssertionError: with a table of the worst-differing variables (and, with a
            reference, both runs' distances from it and the variables farthest from it).
        ValueError: ``reference`` not None or ``"float64"``.

    Example:
        >>> assert_equivalent(build, x, y, devices=logical_devices[:2], ratios=[3, 2])
        >>> assert_equivalent(build_cnn, x, y, devices=logical_devices[:2], ratios=[3, 2], reference="float64")
    """
    from harness.equivalence import compare_training

    report = compare_training(
        build_model, x, y, devices=devices, ratios=ratios, method=method, batch_size=batch_size,
        epochs=epochs, optimizer=optimizer, loss=loss, reference=reference, **kwargs,
    )
    if report.verdict(tol) == "FAIL":
        if report.reference is None:
            raise AssertionError(f"parallel training differs from single-device (tol={tol:g}): "
                                 f"{report.summary()}\n{report.table()}")
        raise AssertionError(
            f"parallel training differs from single-device (tol={tol:g}) and is less accurate than one device: "
            f"{report.reference_parallel:.3e} from the {report.reference} run (parallel) vs "
            f"{report.reference_single:.3e} (single device); as accurate needs parallel <= 2 x single + 1e-7. "
            f"{report.summary()}\n{report.table()}"
        )
    return report


def pytest_addoption(parser):
    group = parser.getgroup("harness")
    group.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    group.addoption("--run-docker", action="store_true", default=False, help="run tests marked docker")
    group.addoption("--run-zoo", action="store_true", default=False,
                    help="run the whole model zoo (tests marked zoo; also selected by -m zoo)")
    group.addoption(
        "--logical-devices", type=int, default=4,
        help="logical CPU devices the logical_devices fixture creates (default 4)",
    )


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


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
    """A global property of the ``--junitxml`` file, if one is written (``harness.compat_report`` reads them)."""
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


def pytest_collection_modifyitems(config, items):
    gpus = gpu_count()
    reasons = {
        "gpu": None if gpus >= 1 else "needs a GPU; this machine has none",
        "multi_gpu": None if gpus >= 2 else f"needs 2+ GPUs; this machine has {gpus}",
        "slow": None if config.getoption("--run-slow") else "slow: run with --run-slow",
        "docker": None if config.getoption("--run-docker") else "docker: run with --run-docker",
        "zoo": None if config.getoption("--run-zoo") or "zoo" in (config.getoption("markexpr") or "")
        else "whole model zoo: run with --run-zoo or -m zoo",
    }
    for item in items:
        for name, reason in reasons.items():
            if reason and item.get_closest_marker(name) is not None:  # keywords hold folder names too
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def logical_devices(request) -> list[str]:
    """``--logical-devices`` logical CPU devices (default 4), created once per process.

    TensorFlow fixes its devices at start-up: request this fixture before any
    test of the process touches TensorFlow (pytest-xdist gives each worker its
    own process).
    """
    from harness.devices import use_logical_devices

    return use_logical_devices(request.config.getoption("--logical-devices"))


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

