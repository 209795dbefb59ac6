"""The compatibility table from pytest JUnit XML: states, counts, versions, reasons, errors."""

import json

import pytest

from harness.ci import compat_report
from harness.cli import main

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="2" tests="6" time="12.5">
<properties><property name="python" value="3.11.7"/><property name="tensorflow" value="2.21.0"/>
<property name="keras" value="3.15.1"/><property name="tf_keras" value="2.21.0"/>
<property name="TF_USE_LEGACY_KERAS" value="{legacy}"/></properties>
<testcase classname="tests.unit.test_split" name="test_a" time="0.1"/>
<testcase classname="tests.unit.test_split" name="test_b" time="0.1"/>
<testcase classname="tests.upstream.test_batches" name="test_c" time="1">
  <failure message="AssertionError">boom</failure></testcase>
<testcase classname="tests.upstream.test_compile_modes" name="test_d" time="1">
  <skipped type="pytest.xfail" message="XLA: resource on another device (TF 2.21)"/></testcase>
<testcase classname="tests.parallel.test_api" name="test_e" time="0">
  <skipped type="pytest.skip" message="needs a GPU; this machine has none"/></testcase>
<testcase classname="tests.parallel.test_api" name="test_f" time="0">
  <skipped type="pytest.skip" message="needs a GPU; this machine has none"/></testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def junit(tmp_path):
    def write(name, legacy="0"):
        path = tmp_path / f"{name}.xml"
        path.write_text(JUNIT.replace("{legacy}", legacy))
        return path
    return write


def test_cells_count_and_judge_each_suite(junit):
    result = compat_report.read_junit(junit("tf221"))
    assert result.env == "tf221" and result.seconds == 12.5
    assert result.versions["tensorflow"] == "2.21.0"
    assert {name: cell.state for name, cell in result.cells.items()} == {
        "parallel": "skip", "unit": "pass", "upstream": "fail"}
    upstream = result.cells["upstream"]
    assert (upstream.failed, upstream.xfailed) == (1, 1)
    assert upstream.reasons == ["XLA: resource on another device (TF 2.21)"]
    assert result.cells["parallel"].reasons == ["needs a GPU; this machine has none"]


def test_markdown_shows_versions_states_and_reasons(junit):
    table = compat_report.markdown_table([compat_report.read_junit(junit("tf221")),
                                          compat_report.read_junit(junit("legacy", legacy="1"))])
    assert "| env | versions | parallel | unit | upstream | time |" in table
    assert "| tf221 | TF 2.21.0, Keras 3.15.1, Python 3.11.7 |" in table
    assert "| legacy | TF 2.21.0, tf-keras 2.21.0, Python 3.11.7 |" in table
    assert "**fail** (0 passed, 1 failed, 1 xfailed)" in table
    assert "- XLA: resource on another device (TF 2.21) (tf221/upstream, legacy/upstream)" in table
    assert "2 env(s) x 3 suite(s): 2 pass, 2 fail, 2 skip." in table


def test_an_env_that_never_ran_is_an_error_row():
    broken = compat_report.EnvResult("tf215", {}, {}, error="no test results (exit 1)")
    table = compat_report.markdown_table([broken])
    assert "| tf215 | - |" in table and "- tf215: no test results (exit 1)" in table and "1 error" in table


def test_not_junit_is_named(tmp_path):
    bad = tmp_path / "x.xml"
    bad.write_text("not xml")
    with pytest.raises(ValueError, match="x.xml is not JUnit XML"):
        compat_report.read_junit(bad)


def test_cli_builds_the_table_from_junit_and_fails_on_a_failing_cell(junit, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["matrix", "--from-junit", str(junit("tf221")), "--out", str(out),
                 "--markdown", str(tmp_path / "docs" / "compat.md")])
    assert code == 1  # the upstream cell failed
    data = json.loads((out / "compatibility.json").read_text())
    assert data[0]["cells"]["unit"]["state"] == "pass"
    assert (tmp_path / "docs" / "compat.md").read_text().startswith("# Compatibility")
    assert "| tf221 |" in capsys.readouterr().out


def test_cli_rejects_unknown_envs_and_suites(capsys):
    assert main(["matrix", "--envs", "tf999"]) == 2
    assert "got ['tf999']" in capsys.readouterr().err
    assert main(["matrix", "--envs", "tf221", "--suites", "nonsense"]) == 2
    assert "got ['nonsense']" in capsys.readouterr().err
    # The matrix's entry without TensorFlow runs tests/onjax alone
    assert main(["matrix", "--envs", "tf221,jax011"]) == 2
    assert "--envs jax011 has no TensorFlow: its suite is onjax alone" in capsys.readouterr().err


def test_junit_files_carry_the_versions(tmp_path):
    # the plugin's sessionstart hook, end to end: a real pytest run writes the properties
    import subprocess
    import sys

    test = tmp_path / "test_one.py"
    test.write_text("def test_ok():\n    pass\n")
    xml = tmp_path / "out.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", str(test)],
                   check=True, capture_output=True, cwd=tmp_path)
    result = compat_report.read_junit(xml)
    assert result.versions["python"].count(".") == 2 and "tensorflow" in result.versions
