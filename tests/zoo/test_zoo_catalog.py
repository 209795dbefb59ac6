"""The model zoo itself: what the catalog holds, each entry builds and trains, and how rows read.

Model-zoo conformance: at least 20 real architectures at CPU size from public
definitions, every epoch ending on a partial batch, on Keras 3 and on Keras 2 where they apply.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from harness.bench import zoo
from harness.split import validate_ratios

REQUIRED_SOURCES = ("MobileNetV2", "MobileNetV3Small", "ResNet50", "EfficientNetB0", "DenseNet121", "ConvNeXtTiny")
BUILDS = [(e.name, g) for g in zoo.GENERATIONS for e in zoo.CATALOG if g == "3" or e.keras2]


def _keras(generation: str):
    from harness.errors import Unavailable

    try:
        return zoo.keras_module(generation)
    except Unavailable as err:  # that generation is not installed here (tf215: no Keras 3)
        pytest.skip(str(err))


def _length(data) -> int:
    return len(_leaves(data)[0])


def test_catalog_holds_twenty_real_architectures_with_the_required_ones():
    assert len(zoo.CATALOG) >= 20
    assert len(set(zoo.NAMES)) == len(zoo.NAMES)
    sources = " ".join(e.source for e in zoo.CATALOG)
    for name in REQUIRED_SOURCES:
        assert f"keras.applications.{name}" in sources
    assert any("Xception" in e.source or "NASNetMobile" in e.source for e in zoo.CATALOG)
    policies = {e.policy for e in zoo.CATALOG}
    assert {"mixed_float16", "mixed_bfloat16"} <= policies
    assert any(e.loss_weights is not None and isinstance(e.loss_weights, list) for e in zoo.CATALOG)
    assert any(isinstance(e.loss_weights, dict) for e in zoo.CATALOG)
    assert any(e.class_weight for e in zoo.CATALOG)
    # The Keras guides' steps of one's own (harness.parallel.custom): towers runs them, mirrored refuses them.
    steps = {"custom_train_step", "vae_train_step", "gan_train_step", "distiller_train_step", "compute_loss_aux",
             "custom_test_step"}
    assert steps <= {e.name for e in zoo.CATALOG} and any(e.validation for e in zoo.CATALOG)
    assert zoo.select(fast_only=True), "the default suite needs a fast subset"


@pytest.mark.parametrize("entry", zoo.CATALOG, ids=lambda e: e.name)
def test_data_is_deterministic_and_ends_on_a_partial_batch(entry):
    x, y, sample_weight = entry.data()
    again = entry.data()
    n = _length(x)
    assert n % entry.batch_size, f"{entry.name}: {n} samples fill every batch of {entry.batch_size}"
    assert _length(y) == n
    assert all(np.array_equal(a, b) for a, b in zip(_leaves((x, y, sample_weight)), _leaves(again)))


def _leaves(data):
    if data is None:
        return []
    if isinstance(data, dict):
        return [leaf for key in sorted(data) for leaf in _leaves(data[key])]
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in _leaves(item)]
    return [np.asarray(data)]


def test_select_and_generations_reject_unknown_names():
    with pytest.raises(ValueError, match=r"unknown zoo models \['nope'\]"):
        zoo.select(["nope"])
    with pytest.raises(ValueError, match="keras must be one of"):
        zoo.select(keras="4")
    assert all(e.keras2 for e in zoo.select(keras="2"))


def test_importing_the_zoo_does_not_import_tensorflow():
    code = ("import sys, harness.bench.zoo as z; z.CATALOG[0].data(); "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.extended
@pytest.mark.parametrize(("name", "generation"), BUILDS, ids=[f"{n}-keras{g}" for n, g in BUILDS])
def test_entry_builds_and_trains_one_step_on_one_device(logical_devices, name, generation):
    k = _keras(generation)
    (entry,) = zoo.select([name], keras=generation)
    x, y, sample_weight = entry.data()
    model = entry.build(k)
    assert model.built
    assert k.mixed_precision.global_policy().name == "float32", "build must restore the global dtype policy"
    if entry.policy:
        assert model.dtype_policy.name == entry.policy
    model.compile(optimizer=entry.optimizer(k), loss=entry.loss(k), loss_weights=entry.loss_weights,
                  metrics=entry.metrics(k) if entry.metrics else None)
    history = model.fit(x, y, sample_weight=sample_weight, class_weight=entry.class_weight,
                        batch_size=entry.batch_size, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    assert math.isfinite(history.history["loss"][0])


def test_a_float64_build_keeps_float64(logical_devices):
    # compare_training(reference="float64") builds its copy under a float64 policy: a mixed entry must not
    # turn that copy mixed.
    k = _keras("3")
    (entry,) = zoo.select(["mixed_float16"])
    previous = k.mixed_precision.global_policy().name
    k.mixed_precision.set_global_policy("float64")
    try:
        assert entry.build(k).dtype_policy.name == "float64"
    finally:
        k.mixed_precision.set_global_policy(previous)


# -- rows, statuses and tables (no TensorFlow) ------------------------------------------------------

def _raise(error: BaseException):
    try:
        raise error
    except BaseException as err:  # noqa: BLE001 - returned with its traceback
        return err


def test_only_a_refusal_is_refused_any_other_error_fails():
    from harness.errors import InvalidValue, Refused

    refused = Refused("custom-train-step", "method='mirrored' cannot train 'net': it has its own train_step")
    assert zoo.status_of_error(_raise(refused)) == (
        "refused: custom-train-step: method='mirrored' cannot train 'net': it has its own train_step")
    # harness' own errors are not refusals either: a validation error raised while checking a zoo model is a bug
    with pytest.raises(ValueError) as own:
        validate_ratios([3, 0], 2)
    assert isinstance(own.value, InvalidValue)
    assert zoo.status_of_error(own.value).startswith("FAIL: InvalidValue: ratios must be positive")
    assert zoo.status_of_error(_raise(ValueError("from elsewhere"))) == "FAIL: ValueError: from elsewhere"
    assert zoo.status_of_error(_raise(NotImplementedError("no"))) == "FAIL: NotImplementedError: no"
    assert zoo.status_of_error(_raise(AssertionError())) == "FAIL: AssertionError: (no message)"
    graph = RuntimeError("Graph execution error:\n\nDetected at node x\n  (0) INVALID_ARGUMENT: bad thing\n0 done")
    assert zoo.status_of_error(_raise(graph)) == "FAIL: RuntimeError: (0) INVALID_ARGUMENT: bad thing"


def _rows():
    return [
        zoo.ZooRow("a", "3", "towers", "even", "exact", 1e-8, 0.0, 2e-7, 2e-7, 0.0, 1.5),
        zoo.ZooRow("a", "3", "mirrored", "5:3:2", "FAIL: AssertionError: x | y", math.nan, seconds=0.2),
        zoo.ZooRow("b", "2", "towers", "3:2", "refused: not-here: not here", seconds=0.1),
        zoo.ZooRow("c", "3", "towers", "3:2", "as accurate as one device", 3e-5, 1e-6, 1e-5, 1.2e-5, 0.0, 9.0,
                   floor=2e-5, floor_multiple=1.5),
        zoo.ZooRow("c", "3", "towers", "even", "FAIL: pinned exact, got as accurate as one device", 3e-3, 1e-6, 1e-5,
                   3e-3, 1e-12, 9.0, traceback="Traceback (most recent call last):\n  planted\n"),
    ]


def test_tables_show_every_row_and_a_summary():
    rows = _rows()
    text = zoo.text_table(rows)
    assert text.splitlines()[0].split()[:4] == ["model", "keras", "method", "split"]
    summary = "5 cases of 3 models: 1 exact, 1 as accurate as one device, 1 refused, 2 FAIL"
    table, tracebacks = text.split(summary)
    assert len(table.splitlines()) == 2 + len(rows) + 1
    assert tracebacks == "\n\nc (Keras 3, towers, even) raised:\nTraceback (most recent call last):\n  planted"
    md = zoo.markdown(rows)
    assert md.startswith("| model | keras |") and "x \\| y" in md and md.endswith(summary)


def test_json_has_no_nan_and_marks_failures():
    data = json.loads(zoo.to_json(_rows()))
    assert data["summary"] == {"exact": 1, "as accurate as one device": 1, "refused": 1, "FAIL": 2}
    assert [r["failed"] for r in data["rows"]] == [False, True, False, False, True]
    assert data["rows"][3]["floor"] == 2e-5 and data["rows"][4]["traceback"].endswith("planted\n")
    assert data["rows"][1]["max_deviation"] is None
    assert data["rows"][3]["reference_parallel"] == 1.2e-5


# -- the optimizer axis ------------------------------------------------------------------------

def test_the_optimizer_axis_holds_every_built_in_optimizer_of_each_generation(keras3, keras2):
    """Every optimizer class either Keras exports (but the wrappers, checked as options) is on the axis, and
    every axis optimizer exists in at least one generation; each option applies somewhere."""
    from harness.bench.zoo import optimizers

    wrappers = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer", "OptimizerMap"}
    for k in (keras3, keras2):
        exported = {n for n in dir(k.optimizers) if n[0].isupper() and n not in wrappers
                    and isinstance(getattr(k.optimizers, n), type)}
        assert exported <= {spec.cls for spec in optimizers.OPTIMIZERS.values()}, k.__name__
    for name in optimizers.OPTIMIZERS:
        assert optimizers.applicable(keras3, name, "plain") or optimizers.applicable(keras2, name, "plain"), name
    for option in optimizers.OPTIONS:
        assert optimizers.applicable(keras3, "adam", option), option
    assert not optimizers.applicable(keras2, "adam", "accumulation")  # tf_keras has no accumulation
    assert {m for m, _, _ in optimizers.FAST} == set(optimizers.MODELS)


def test_the_optimizer_axis_names_what_it_does_not_know(keras3):
    from harness.bench.zoo import optimizers

    with pytest.raises(ValueError, match=r"unknown model 'nope', optimizer 'adamx', option 'clip'; models \["):
        optimizers.cases(keras3, ["nope"], ["adamx"], ["clip"])
    found = optimizers.cases(keras3, ["mlp"], ["adam"], ["clipnorm", "loss_scale"])
    assert [c.label for c in found] == ["adam/clipnorm", "adam/loss_scale"]
    made = found[0].entry.optimizer(keras3)
    assert type(made).__name__ == "Adam" and made.clipnorm == 0.05
    assert type(found[1].entry.optimizer(keras3)).__name__ == "LossScaleOptimizer"
    assert [c.label for c in optimizers.cases(keras3, ["causal_lm"], ["rmsprop_centered"])] == []  # UPSTREAM
    assert not optimizers.cases(keras3, ["mlp"], ["muon"], ["schedule"])[0].float64  # NO_FLOAT64


def test_the_overview_has_a_line_per_model_and_the_stamp():
    rows = _rows() + [zoo.ZooRow("mlp", "3", "towers", "3:2", "exact", 0.0, optimizer="adam/clipnorm"),
                      zoo.ZooRow("mlp", "3", "mirrored", "3:2", "as accurate as one device", 2e-6, floor=1e-6,
                                 optimizer="adam/clipnorm", floor_multiple=2.0)]
    text = zoo.overview(rows, stamp="`harness check --zoo` at commit abc")
    lines = text.splitlines()
    assert lines[0] == ("| model | keras | public definition | towers (even, 3:2, 5:3:2) | mirrored (even, 3:2, 5:3:2) "
                        "| worst dev. from one device | dev. / rounding floor |")
    assert "| c | 3 | - | FAIL, as accurate | - | 3.0e-03 | 1.5 |" in lines  # the row's floor multiple
    assert "| a | 3 | - | exact | FAIL | 1.0e-08 | - |" in lines
    assert "| 3 | clipnorm | 2 | 1 | 1 | 0 | 0 |" in lines  # the axis: counts per option
    assert lines[-2:] == ["", "`harness check --zoo` at commit abc"]
    assert "7 cases of 4 models (1 optimizer settings): 2 exact, 2 as accurate as one device, 1 refused, 2 FAIL." \
           in lines


def test_json_rows_read_back_and_render_again(tmp_path, capsys):
    from harness.cli import main

    rows = _rows()
    back, stamp = zoo.from_json(zoo.to_json(rows, stamp="`harness check --zoo` at commit abc"))
    assert stamp == "`harness check --zoo` at commit abc"
    assert [(r.model, r.status, r.traceback) for r in back] == [(r.model, r.status, r.traceback) for r in rows]
    assert back[1].max_deviation is None  # NaN was written as null
    path = tmp_path / "zoo.json"
    path.write_text(zoo.to_json(rows, stamp="`harness check --zoo` at commit abc"))
    assert main(["check", "--zoo", "--from-json", str(path), "--format", "overview"]) == 1  # its FAIL rows
    assert capsys.readouterr().out.rstrip().endswith("`harness check --zoo` at commit abc")
    path.write_text('{"rows": [{"model": 1}]}')
    assert main(["check", "--zoo", "--from-json", str(path)]) == 2
    assert "not the JSON of harness check --zoo --format json" in capsys.readouterr().err
