"""Shared test setup. The harness pytest plugin (markers, logical_devices) loads via its entry point.

Where the ``keras`` package is Keras 2 (TF 2.15, the matrix's ``tf215`` env), the suites written
for Keras 3 models cannot run, so of the folders that train models only the Keras 2 files
(``RUN_ON_KERAS2``: Keras 2 models; device listing and the watchdog, which take any Keras) are collected; the
reason goes into the JUnit file (property ``not_collected``), which ``harness matrix`` shows.
"""

from pathlib import Path

from harness.compat import keras_flavour
from harness.testing import add_junit_property

_FLAVOUR = keras_flavour()
_KERAS_PACKAGE_IS_2 = _FLAVOUR.package == "keras" and _FLAVOUR.major == 2
NOT_COLLECTED = ("parallel", "regressions", "bench")
RUN_ON_KERAS2 = ("test_keras2.py", "test_on_keras2.py", "test_conformance.py", "test_device_listing.py",
                 "test_watchdog.py")
REASON = f"{_FLAVOUR.why}: these suites build Keras 3 models (Keras 2 runs their Keras 2 files)"

_HERE = Path(__file__).parent
collect_ignore = [str(p.relative_to(_HERE)) for folder in NOT_COLLECTED for p in sorted((_HERE / folder).glob("*.py"))
                  if p.name not in RUN_ON_KERAS2] if _KERAS_PACKAGE_IS_2 else []


def pytest_report_header(config):
    if _KERAS_PACKAGE_IS_2:
        return f"not collected: tests/{{{','.join(NOT_COLLECTED)}}}: {REASON}"
    return None


def pytest_sessionstart(session):
    if _KERAS_PACKAGE_IS_2:
        add_junit_property(session.config, "not_collected", f"{','.join(NOT_COLLECTED)}: {REASON}")
