"""``harness check --zoo --backend jax``: the model zoo's Keras 3 entries on 3 JAX CPU devices, held to their pins.

Each run is the command in a JAX process (tests/onjax/jax_process.py: ``KERAS_BACKEND=jax``, 3 CPU devices, any
attempt to import TensorFlow failing the test): every zoo entry that builds on Keras 3, method towers, at the zoo's
splits on JAX (even on 2 devices, 3:2, 5:3:2 and 7:2:1 on 3: at the zoo's batch of 10 a one-row shard), judged by
``compare_training(reference="float64")`` and held to its pin in harness/bench/zoo/outcomes.json under ``keras``
``"jax"`` (``mobilenet_v2|jax|towers|3:2|``), beside TensorFlow's. A planted wrong pin (``HARNESS_ZOO_PINS``) makes
the run exit 1 with a FAIL row. The quick loop runs a small sample, the extended tests a larger one, slow.yml's
``zoo`` job the whole zoo (``--run-zoo``), a model a test.
"""

from __future__ import annotations

import json

import pytest
from jax_process import run_harness_cli  # tests/onjax/jax_process.py

from harness.bench import zoo
from harness.bench.zoo import outcomes
from harness.cli import main

pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

QUICK = ["subclassed_mlp", "custom_train_step"]  # one that trains (exact), one whose step is TensorFlow code
# At 7:2:1: BatchNormalization over a one-row shard (siamese), class weights, a step of its own (refused).
EXTENDED = ["siamese", "imbalanced_class_weight", "gan_train_step"]
PLANTED = ("subclassed_mlp", "jax", "towers", "5:3:2", "")  # trains exactly; planted as refused


def _zoo_on_jax(*args: str, timeout: float, env: dict | None = None) -> tuple[int, list[zoo.ZooRow], str]:
    """``harness check --zoo --backend jax ARGS --format json`` in a JAX process: exit status, rows, stderr."""
    done = run_harness_cli("check", "--zoo", "--backend", "jax", *args, "--format", "json", timeout=timeout,
                           env=env)
    assert done.returncode in (0, 1), done.stderr[-4000:]
    rows, stamp = zoo.from_json(done.stdout)
    assert "on JAX" in stamp and "TensorFlow" not in stamp, stamp
    return done.returncode, rows, done.stderr


JAX_SPLITS = tuple(zoo.splits_of(zoo.ON_JAX))


def _assert_cases(rows: list[zoo.ZooRow], names: list[str], splits=JAX_SPLITS) -> None:
    """The rows are the cases of ``names`` x ``splits`` on JAX, method towers, in order."""
    assert [(r.model, r.keras, r.method, r.split) for r in rows] == [
        (name, "jax", "towers", split) for name in names for split in splits]


def _assert_meet_their_pins(rows: list[zoo.ZooRow]) -> None:
    """Each row met its shipped pin, refused without a traceback or judged against float64."""
    pins, table = outcomes.load(), zoo.text_table(rows)
    for row in rows:
        pinned = outcomes.pinned(outcomes.key_of(row), pins)
        assert not row.failed and row.expected == pinned and outcomes.meets(row.status, pinned), table
        if row.status.startswith("refused"):
            assert not row.traceback, table
        else:  # judged against float64; the parallel float64 run and the floor only where float32 is not exact
            assert row.max_deviation is not None and row.reference_parallel is not None, table
            assert (row.reference_exact is None) == (row.status == "exact") == (row.floor is None), table
            if row.reference_exact is not None:
                assert row.reference_exact < 1e-12, table  # in float64 the split is the single-device step


def test_a_sample_meets_its_pins_and_a_planted_pin_fails(tmp_path):
    """Two models at 5:3:2 on 3 JAX devices: an exact model, and custom_train_step refused by the reason
    ``harness.parallelize`` gives on JAX (its step is TensorFlow code, never run). One of the cases is planted with a
    wrong pin (refused, for a model that trains): that row FAILs and the run exits 1; the others meet the shipped
    pins."""
    planted = json.loads(outcomes.PINS.read_text())
    planted["pins"][outcomes.case_name(PLANTED)] = "refused: custom-train-step"
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(planted))
    status, rows, _ = _zoo_on_jax("--zoo-models", *QUICK, "--zoo-splits", "5:3:2", timeout=120,
                                  env={"HARNESS_ZOO_PINS": str(pins)})
    assert status == 1
    _assert_cases(rows, QUICK, ("5:3:2",))
    failed = [r for r in rows if r.failed]
    assert [outcomes.key_of(r) for r in failed] == [PLANTED], zoo.text_table(rows)
    assert failed[0].status == "FAIL: pinned refused: custom-train-step, got exact"
    _assert_meet_their_pins([r for r in rows if not r.failed])
    assert [r.status.split(":", 2)[:2] for r in rows if r.model == "custom_train_step"] == [
        ["refused", " custom-train-step"]]


@pytest.mark.extended  # about a minute on a 2-core host; the whole zoo: the zoo marker's tests below
def test_a_larger_sample_meets_its_pins():
    # At 7:2:1, the split with a one-row shard (BatchNormalization's statistics over it: siamese).
    status, rows, _ = _zoo_on_jax("--zoo-models", *EXTENDED, "--zoo-splits", "7:2:1", timeout=900)
    _assert_cases(rows, [e.name for e in zoo.select(EXTENDED, keras=zoo.ON_JAX)], ("7:2:1",))
    _assert_meet_their_pins(rows)
    assert status == 0


@pytest.mark.zoo  # the whole JAX zoo, a model a test (docs/zoo.md has its time): slow.yml's zoo job runs it
@pytest.mark.parametrize("model", [e.name for e in zoo.select(keras=zoo.ON_JAX)])
def test_every_zoo_model_meets_its_pins_on_jax(model):
    status, rows, stderr = _zoo_on_jax("--zoo-models", model, timeout=3600)
    _assert_cases(rows, [model])
    _assert_meet_their_pins(rows)
    assert status == 0
    assert f"[{len(rows)}/{len(rows)}] " in stderr  # progress, one line per case


def test_the_jax_pins_are_keyed_apart_from_tensorflows():
    """Keras 3 on JAX is pinned under ``jax``, so neither backend is held to (or re-pins) the other's outcomes."""
    pins = outcomes.load()
    on_jax = {key: outcome for key, outcome in pins.items() if key[1] == zoo.ON_JAX}
    assert on_jax, "outcomes.json pins the JAX zoo's cases that are not exact"
    assert all(method == "towers" and not optimizer for _, _, method, _, optimizer in on_jax)
    assert on_jax[("custom_train_step", "jax", "towers", "3:2", "")] == "refused: custom-train-step"
    assert outcomes.pinned(("custom_train_step", "3", "towers", "3:2", ""), pins) == "exact"  # on TensorFlow


@pytest.mark.parametrize(("args", "named"), [
    (["--methods", "mirrored"], "--methods mirrored: on --backend jax the zoo checks method towers"),
    (["--keras", "2"], "--keras 2: on --backend jax the zoo runs Keras 3"),
    (["--zoo-options", "clipnorm"], "--zoo-options: the optimizer axis runs on TensorFlow"),
])
def test_what_is_tensorflows_is_refused_by_name(capsys, args, named):
    """No rows of a method, generation or axis that cannot run on JAX: one line, exit 2, before anything starts."""
    assert main(["check", "--zoo", "--backend", "jax", *args]) == 2
    assert named in capsys.readouterr().err


def test_the_runner_keeps_jax_to_towers_and_the_model_zoo():
    with pytest.raises(ValueError, match=r"unknown methods or splits \['mirrored'\]; methods \['towers'\]"):
        zoo.run_zoo(["subclassed_mlp"], methods=["mirrored"], keras=zoo.ON_JAX)
    with pytest.raises(ValueError, match="the optimizer axis runs on TensorFlow"):
        zoo.run_optimizer_axis(keras=zoo.ON_JAX)
    assert zoo.methods_of(zoo.ON_JAX) == ("towers",) and zoo.methods_of("3") == zoo.METHODS
    assert zoo.select(keras=zoo.ON_JAX) == zoo.select(keras="3")


def test_the_overview_shows_keras_3_on_jax():
    rows = [zoo.ZooRow("resnet50", "jax", "towers", split, "exact", max_deviation=1e-7)
            for split in zoo.splits_of(zoo.ON_JAX)]
    rows.append(zoo.ZooRow("xception", "jax", "towers", "3:2", "as accurate as one device", max_deviation=1e-5,
                           floor_multiple=1.2))
    text = zoo.overview(rows)
    assert "| model | keras | public definition | towers (even, 3:2, 5:3:2, 7:2:1) |" in text  # no mirrored column
    assert "| resnet50 | 3 on JAX | keras.applications.ResNet50 | exact | 1.0e-07 | - |" in text
    assert "| xception | 3 on JAX | keras.applications.Xception | as accurate | 1.0e-05 | 1.2 |" in text
    assert zoo.text_table(rows).splitlines()[2].split("  ")[:3] == ["resnet50", "3 on JAX", "towers"]
