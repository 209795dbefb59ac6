"""harness.project: a repository's [tool.harness] / harness.toml, checked key by key (no TensorFlow)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.errors import InvalidValue, Unavailable
from harness.project import find_config, load_project

GOOD = textwrap.dedent("""
    devices = 2
    ratios = [3, 2]
    methods = ["mirrored", "towers"]

    [workloads.classifier]
    model = "pkg.models:build"
    data = "pkg.data:batches"
    batch-size = 32
""")


def test_reads_harness_toml(tmp_path):
    (tmp_path / "harness.toml").write_text(GOOD)
    project = load_project(tmp_path)
    assert project.source == tmp_path / "harness.toml" and project.root == tmp_path
    (entry,) = project.workloads
    assert (entry.name, entry.model, entry.data, entry.batch_size) == ("classifier", "pkg.models:build",
                                                                        "pkg.data:batches", 32)
    assert project.split() == (3.0, 2.0) and project.methods == ("mirrored", "towers")


def test_reads_the_pyproject_table_from_a_subfolder(tmp_path):
    body = GOOD.replace("[workloads.", "[tool.harness.workloads.")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.harness]\n' + body)
    (tmp_path / "tests").mkdir()
    project = load_project(tmp_path / "tests" / "test_x.py")  # a file: its folder, then upwards
    assert project.source == tmp_path / "pyproject.toml"
    assert project.workload("classifier").model == "pkg.models:build"


def test_a_pyproject_without_the_table_is_passed_over(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(Unavailable, match="no harness.toml.*harness init"):
        find_config(tmp_path)


def test_even_split_by_default(tmp_path):
    (tmp_path / "harness.toml").write_text('devices = 3\n[workloads.a]\nmodel = "m.py:build"\n')
    assert load_project(tmp_path).split() == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("edit, key", [
    (("ratios = [3, 2]", "ratios = [3, 2, 1]"), "ratios"),
    (("ratios = [3, 2]", "ratios = [3, -2]"), "ratios"),
    (('methods = ["mirrored", "towers"]', 'methods = ["keras"]'), "methods"),
    (("devices = 2", "devices = 0"), "devices"),
    (("devices = 2", "devises = 2"), "devises"),
    (('model = "pkg.models:build"', 'model = "pkg.models"'), "workloads.classifier.model"),
    (("batch-size = 32", "batch-size = 0"), "workloads.classifier.batch-size"),
    (("batch-size = 32", "batch_size = 32"), "workloads.classifier.batch_size"),
    (("[workloads.classifier]", '[workloads."my model"]'), "workloads.my model"),
    (("devices = 2", 'devices = 2\nbackend = "torch"'), "backend"),
    (("devices = 2", 'devices = 2\nbackend = "jax"'), "methods"),  # mirrored is TensorFlow's
])
def test_a_bad_value_is_one_line_naming_the_file_and_key(tmp_path, edit, key):
    (tmp_path / "harness.toml").write_text(GOOD.replace(*edit))
    with pytest.raises(InvalidValue) as err:
        load_project(tmp_path)
    assert f"harness.toml: {key}:" in str(err.value) and "\n" not in str(err.value)


def test_no_workloads_and_bad_toml(tmp_path):
    (tmp_path / "harness.toml").write_text("devices = 2\n")
    with pytest.raises(InvalidValue, match="workloads: must hold at least one"):
        load_project(tmp_path)
    (tmp_path / "harness.toml").write_text("devices = \n")
    with pytest.raises(InvalidValue, match="is not valid TOML"):
        load_project(tmp_path)


def test_check_argv_is_harness_check_with_the_float64_verdict(tmp_path):
    (tmp_path / "harness.toml").write_text(GOOD)
    project = load_project(tmp_path)
    argv = project.check_argv(project.workload("classifier"))
    assert argv[:5] == ["check", "--model", "pkg.models:build", "--data", "pkg.data:batches"]
    assert argv[argv.index("--ratios") + 1:argv.index("--ratios") + 3] == ["3", "2"]
    assert "--reference" in argv and "--json" in argv and argv[argv.index("--logical-cpus") + 1] == "2"
    gpus = project.check_argv(project.workload("classifier"), devices=["/gpu:0", "/gpu:1"])
    assert "--logical-cpus" not in gpus and gpus[gpus.index("--devices") + 1:][:2] == ["/gpu:0", "/gpu:1"]
    from harness.cli import _parser

    parsed = _parser().parse_args(argv)  # harness check accepts every argument it is given
    assert parsed.reference == "float64" and parsed.models == ["pkg.models:build"] and parsed.time_steps == 0
    with pytest.raises(InvalidValue, match="no workload 'other'.*configured: classifier"):
        project.workload("other")


def test_a_jax_project_checks_with_backend_jax_and_towers(tmp_path):
    (tmp_path / "harness.toml").write_text(GOOD.replace('methods = ["mirrored", "towers"]\n', 'backend = "jax"\n'))
    project = load_project(tmp_path)
    assert project.backend == "jax" and project.methods == ("towers",)  # towers by default on JAX
    argv = project.check_argv(project.workload("classifier"))
    assert argv[:7] == ["check", "--backend", "jax", "--model", "pkg.models:build", "--data", "pkg.data:batches"]
    assert argv[argv.index("--methods") + 1] == "towers"
    from harness.cli import _parser

    parsed = _parser().parse_args(argv)
    assert parsed.backend == "jax" and parsed.models == ["pkg.models:build"] and parsed.data == "pkg.data:batches"
    (tmp_path / "harness.toml").write_text(GOOD)
    tensorflow = load_project(tmp_path)
    assert tensorflow.backend == "tensorflow" and "--backend" not in tensorflow.check_argv(tensorflow.workloads[0])


def test_loading_imports_no_tensorflow(tmp_path):
    (tmp_path / "harness.toml").write_text(GOOD)
    code = f"import sys; from harness.project import load_project; load_project({str(tmp_path)!r}); " \
           "print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_a_workload_that_cannot_load_is_a_failed_check_with_harness_own_line(tmp_path):
    from harness.project import check_workload

    (tmp_path / "harness.toml").write_text('[workloads.gone]\nmodel = "nosuch_pkg.models:build"\n')
    result = check_workload(load_project(tmp_path), "gone", timeout=120)
    assert not result.passed
    assert "workload 'gone' (nosuch_pkg.models:build)" in result.message
    assert "no module named 'nosuch_pkg'" in result.message and "exited 2" in result.message


def test_expect_is_one_outcome_or_one_per_method(tmp_path):
    (tmp_path / "harness.toml").write_text(GOOD + 'expect = { towers = "custom-train-step" }\n'
                                           '[workloads.text]\nmodel = "pkg.text:build"\nexpect = "as accurate"\n')
    project = load_project(tmp_path)
    classifier, text = project.workload("classifier"), project.workload("text")
    assert (classifier.expected("towers"), classifier.expected("mirrored")) == ("custom-train-step", "exact")
    assert (text.expected("towers"), text.expected("mirrored")) == ("as accurate", "as accurate")
    assert classifier.check_samples == 166  # an epoch of 8 full steps of 20 and a partial one


@pytest.mark.parametrize("expect, key", [
    ('"roughly"', "workloads.classifier.expect"),
    ('"Exact"', "workloads.classifier.expect"),
    ('{ keras = "exact" }', "workloads.classifier.expect.keras"),
    ('{ towers = 1 }', "workloads.classifier.expect.towers"),
    ("[]", "workloads.classifier.expect"),
])
def test_a_bad_expectation_is_named(tmp_path, expect, key):
    (tmp_path / "harness.toml").write_text(GOOD + f"expect = {expect}\n")
    with pytest.raises(InvalidValue) as err:
        load_project(tmp_path)
    assert f"harness.toml: {key}:" in str(err.value) and "\n" not in str(err.value)


def _row(method, verdict, deviation=0.0, **more):
    return {"model": "pkg.models:build", "method": method, "verdict": verdict, "max_deviation": deviation,
            "exact": verdict == "exact", "passed": verdict != "FAIL", "baseline": False, **more}


@pytest.mark.parametrize("expect, rows, passed, said", [
    ('"exact"', [_row("mirrored", "exact"), _row("towers", "exact")], True, []),
    # exact is expected: an as-accurate method is a slip, named with what was expected and how to rerun
    ('"exact"', [_row("mirrored", "as accurate as one device", 1.5e-4), _row("towers", "exact")], False,
     ["mirrored: as accurate as one device, max deviation 1.500e-04 -- expected 'exact'", "rerun: harness check"]),
    ('"as accurate"', [_row("mirrored", "as accurate as one device", 1.5e-4), _row("towers", "exact")], True,
     ["towers: exact, max deviation 0.000e+00 (better than expected 'as accurate'"]),
    ('"exact"', [_row("mirrored", "FAIL", 2e-2, why="float64 runs differ"), _row("towers", "exact")], False,
     ["mirrored: FAIL, max deviation 2.000e-02 (float64 runs differ) -- expected 'exact'", "batch statistic"]),
    # a refusal is met by its own id only; a method that starts refusing is not exact
    ('{ towers = "custom-train-step" }', [_row("mirrored", "exact"), {
        "method": "towers", "refused": "custom-train-step", "error": "it has its own train_step"}], True, []),
    ('"exact"', [_row("mirrored", "exact"), {"method": "towers", "refused": "custom-train-step", "error": "own"}],
     False, ["towers: refused (custom-train-step): own -- expected 'exact'"]),
    # a method of the project's with no row is no verdict
    ('"exact"', [_row("mirrored", "exact")], False, ["towers: no verdict"]),
    # randomness off decides; the random layers and the run with them on are named
    ('"exact"', [_row("mirrored", "exact", random_layers=["Dropout", "RandomFlip"],
                      with_randomness={"verdict": "FAIL", "max_deviation": 2.9e-2}), _row("towers", "exact")], True,
     ["with randomness off: Dropout, RandomFlip draw per device", "with them on: FAIL, 2.900e-02"]),
])
def test_each_method_is_held_to_what_the_workload_expects(tmp_path, expect, rows, passed, said):
    from harness.project import judge

    (tmp_path / "harness.toml").write_text(GOOD + f"expect = {expect}\n")
    project = load_project(tmp_path)
    result = judge(project, project.workload("classifier"), rows, 0 if passed else 1, "harness check --model x")
    assert result.passed is passed, result.message
    for part in said:
        assert part in result.message, result.message
    assert ("did NOT come out as expected" in result.message) is not passed


_NOISY = {"random_layers": ["GaussianNoise", "Dropout"], "with_randomness": {"verdict": "FAIL", "max_deviation": 3e-2}}


@pytest.mark.parametrize("expect, rows, named", [
    # both methods judged with the random layers off: named once each, in model order
    ('"exact"', [_row("mirrored", "exact", **_NOISY), _row("towers", "exact", **_NOISY)], ["GaussianNoise", "Dropout"]),
    ('"exact"', [_row("mirrored", "exact", random_layers=[]), _row("towers", "exact")], None),  # none to name
    # every method refused the model: nothing ran with them off, nothing to warn of
    ('"custom-train-step"', [{"method": m, "refused": "custom-train-step", "error": "own", "random_layers": ["Dropout"]}
                             for m in ("mirrored", "towers")], None),
    # a failure says it in its message, not in a warning
    ('"exact"', [_row("mirrored", "FAIL", 2e-2, **_NOISY), _row("towers", "exact", **_NOISY)], None),
])
def test_a_pass_with_random_layers_off_warns_naming_them(tmp_path, expect, rows, named):
    # the generated test says, on a pass, which random layers were off (its RandomLayersOff warning)
    from harness.project import RandomLayersOff, judge

    (tmp_path / "harness.toml").write_text(GOOD + f"expect = {expect}\n")
    project = load_project(tmp_path)
    result = judge(project, project.workload("classifier"), rows, 0, "harness check --model x")
    warning = result.randomness_warning()
    if named is None:
        assert warning is None, warning
        return
    assert result.passed and isinstance(warning, RandomLayersOff) and issubclass(RandomLayersOff, UserWarning)
    said = str(warning)
    assert said.startswith("workload 'classifier' passed with its random layers off in training"), said
    assert said.endswith(": " + ", ".join(named)), said
