"""Shared test setup. The harness pytest plugin (markers, logical_devices) loads via its entry point.

Where the ``keras`` package is Keras 2 (TF 2.15, the matrix's ``tf215`` env), harness's parallel
core cannot run, so the folders that train models are not collected; the reason goes into the
JUnit file (property ``not_collected``), which ``harness matrix`` shows in its table.
"""

from harness.compat import keras_flavour

_FLAVOUR = keras_flavour()
_KERAS_PACKAGE_IS_2 = _FLAVOUR.package == "keras" and _FLAVOUR.major == 2
NOT_COLLECTED = ("parallel", "regressions", "bench")
REASON = f"{_FLAVOUR.why}: harness's parallel core needs Keras 3 (Keras 2 port pending)"

collect_ignore = list(NOT_COLLECTED) if _KERAS_PACKAGE_IS_2 else []


def pytest_report_header(config):
    if _KERAS_PACKAGE_IS_2:
        return f"not collected: tests/{{{','.join(NOT_COLLECTED)}}}: {REASON}"
    return None


def pytest_sessionstart(session):
    if not _KERAS_PACKAGE_IS_2:
        return
    try:
        from _pytest.junitxml import xml_key

        xml = session.config.stash.get(xml_key, None)
    except ImportError:
        xml = None
    if xml is not None:
        xml.add_global_property("not_collected", f"{','.join(NOT_COLLECTED)}: {REASON}")
