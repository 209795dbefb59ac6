"""A user's model as a workload: references, the harness.Workload spec, inferred batches, bad specs.

Everything here runs without TensorFlow: references are looked up by importing the user's module (the
files written here import nothing heavy), and the inference rules work on the adapters' description
of a model (``harness.bench.workloads.infer``). Real models and runs: tests/parallel/test_user_model.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import harness
from harness.bench import workloads
from harness.bench.workloads import infer, user
from harness.bench.workloads.references import Reference, load_reference, parse_reference
from harness.cli import main
from harness.errors import InvalidType, InvalidValue

SPECS = """
NUMBER = 3

def build():
    raise AssertionError("not called: looking a reference up builds nothing")

def make_data(batch_size):
    return None

class Holder:
    @staticmethod
    def build():
        return None
"""


@pytest.fixture
def specs(tmp_path):
    """A module of the user's, written as a file: ``specs.py``."""
    path = tmp_path / "specs.py"
    path.write_text(SPECS)
    return path


def test_references_parse_as_module_or_file():
    assert parse_reference("models.text:build") == Reference("models.text:build", "models.text", "build", False)
    assert parse_reference("models/text.py:build").is_file
    assert parse_reference("text.py:Holder.build") == Reference("text.py:Holder.build", "text.py", "Holder.build",
                                                                      True)
    assert parse_reference("C:/m/x.py:build").target == "C:/m/x.py"  # split at the last ':'
    assert workloads.is_reference("x.py:build") and not workloads.is_reference("mnist_maxing")


@pytest.mark.parametrize(("text", "needle"), [
    ("models.py", "is not MODULE:ATTR or path/to/file.py:ATTR"),
    ("models.py:", "is not MODULE:ATTR"),
    (":build", "is not MODULE:ATTR"),
    ("models.py:build-it", "ATTR 'build-it' is not a Python name"),
    ("my-models:build", "'my-models' is neither a module name nor a path to a .py file"),
])
def test_a_malformed_reference_is_named(text, needle):
    with pytest.raises(InvalidValue, match="--model") as err:
        parse_reference(text)
    assert needle in str(err.value)


def test_a_file_reference_runs_the_file_once(specs):
    first = load_reference(f"{specs}:NUMBER")
    assert first == 3
    assert load_reference(f"{specs}:Holder.build") is load_reference(f"{specs}:Holder.build")
    assert str(specs.parent) in sys.path  # the file imports its neighbours, as a script does


def test_a_module_reference_imports_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "usermodels_cwd.py").write_text("def build():\n    return 'model'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_reference("usermodels_cwd:build")() == "model"


@pytest.mark.parametrize(("attr", "error", "needle"), [
    ("missing", InvalidValue, "specs.py has no attribute 'missing'"),
    ("Holder.gone", InvalidValue, "specs.py:Holder has no attribute 'gone'"),
    ("NUMBER", InvalidType, "names int 3, which is not callable"),
])
def test_a_bad_attribute_is_named(specs, attr, error, needle):
    with pytest.raises(error) as err:
        user.resolve(f"{specs}:{attr}")
    assert needle in str(err.value) and str(specs) in str(err.value)


def test_no_such_file_module_or_a_failing_import_is_one_line(tmp_path):
    with pytest.raises(InvalidValue, match=r"no such file .*nowhere\.py"):
        load_reference(f"{tmp_path}/nowhere.py:build")
    with pytest.raises(InvalidValue, match="no module named 'no_such_module_harness'"):
        load_reference("no_such_module_harness:build")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_dependency_harness\n")
    with pytest.raises(InvalidValue) as err:
        load_reference(f"{broken}:build")
    assert "importing" in str(err.value) and "ModuleNotFoundError: No module named 'no_such_dependency_harness'" \
        in str(err.value) and "\n" not in str(err.value)


def test_data_must_be_callable(specs):
    with pytest.raises(InvalidType, match="--data .*names int 3, which is not callable"):
        user.resolve(f"{specs}:build", f"{specs}:NUMBER")
    assert user.resolve(f"{specs}:build", f"{specs}:make_data").spec.data is load_reference(f"{specs}:make_data")
    with pytest.raises(InvalidValue, match="--data 'd.py:f' is data for a model of your own"):
        workloads.get("mnist_maxing", "d.py:f")


def test_the_public_workload_spec_checks_its_fields():
    assert harness.Workload is user.Workload
    def build():
        return None
    spec = harness.Workload(build=build, goal=0.9, validation_data=lambda batch: None)
    assert spec.goal == 0.9 and spec.data is None
    with pytest.raises(InvalidType, match="Workload.build must be a zero-argument callable"):
        harness.Workload(build="model")
    with pytest.raises(InvalidType, match="Workload.data must be a callable"):
        harness.Workload(build=build, data=[1, 2])
    with pytest.raises(InvalidValue, match=r"goal is an accuracy in \(0, 1\]; got goal=1.5"):
        harness.Workload(build=build, goal=1.5, validation_data=lambda batch: None)
    with pytest.raises(InvalidValue, match="give validation_data too"):
        harness.Workload(build=build, goal=0.5)


def test_a_workload_spec_in_a_file_is_taken_as_it_is(tmp_path):
    path = tmp_path / "full.py"
    path.write_text(textwrap.dedent("""
        import harness

        def build():
            return None

        workload = harness.Workload(build=build, loss="mse", name="mine")
    """))
    found = user.resolve(f"{path}:workload")
    assert found.spec.name == "mine" and found.spec.loss == "mse" and found.source == "user"


def test_check_model_takes_keras_models_only():
    with pytest.raises(InvalidValue, match=r"returned builtins.int, not a keras.Model"):
        user.check_model(42, "x.py:build")
    keras_like = type("Model", (), {"__module__": "keras.src.models.model"})
    assert isinstance(user.check_model(keras_like(), "x.py:build"), keras_like)


# -- inferred batches ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("loss", "kind"), [
    ("sparse_categorical_crossentropy", "sparse"), ("SparseCategoricalCrossentropy", "sparse"),
    ("categorical_crossentropy", "one_hot"), ("kld", "one_hot"), ("KLDivergence", "one_hot"),
    ("binary_crossentropy", "binary"), ("BinaryFocalCrossentropy", "binary"), ("hinge", "binary"),
    ("mse", "regression"), ("mae", "regression"), ("huber", "regression"), ("logcosh", "regression"),
    ("msle", "positive"), ("poisson", "positive"), ("my_loss", None), ("ctc", None),
])
def test_loss_kinds_by_name(loss, kind):
    assert infer.loss_kind(loss) == kind


def test_loss_kinds_of_objects_go_by_their_keras_class():
    keras_loss = type("SparseCategoricalCrossentropy", (), {"__module__": "keras.src.losses.losses"})
    subclass = type("Mine", (keras_loss,), {"__module__": "mymodels"})
    base = type("Loss", (), {"__module__": "keras.src.losses.loss"})
    custom = type("Custom", (base,), {"__module__": "mymodels"})

    def mean_squared_error(y, p):  # the user's own function, whatever its name
        return y

    assert infer.loss_kind(keras_loss()) == infer.loss_kind(subclass()) == "sparse"
    assert infer.loss_kind(custom()) is None
    assert infer.loss_kind(mean_squared_error) is None


def _io(inputs, outputs, embeddings, input_tree=None, output_tree=None):
    """A model's description as ``Adapter.io_description`` gives it (one input and output: their trees are 0)."""
    return {"inputs": inputs, "outputs": outputs, "embeddings": embeddings,
            "input_tree": 0 if input_tree is None else input_tree,
            "output_tree": 0 if output_tree is None else output_tree}


def test_inferred_batches_follow_the_input_specs_and_the_loss():
    io = _io([("tokens", (None, 12), "int64"), ("features", (None, 5), "float32")], [("out", (None, 7), "float32")],
             [300, None], input_tree={"features": 1, "tokens": 0})
    plan = infer.plan_data(io, "sparse_categorical_crossentropy", "m.py:build")
    x, y = plan.synthesize(64, seed=3)
    assert set(x) == {"tokens", "features"}
    assert x["tokens"].dtype == np.int64 and x["tokens"].shape == (64, 12)
    assert 0 <= x["tokens"].min() and x["tokens"].max() < 300
    assert x["features"].dtype == np.float32 and x["features"].shape == (64, 5)
    assert y.dtype == np.int32 and y.shape == (64,) and 0 <= y.min() and y.max() < 7
    again = plan.synthesize(64, seed=3)
    assert np.array_equal(again[0]["tokens"], x["tokens"]) and np.array_equal(again[1], y)
    assert plan.sample_bytes() == 12 * 8 + 5 * 4 + 4
    assert "ids in [0, 300)" in " ".join(plan.text())


@pytest.mark.parametrize(("loss", "shape", "dtype", "check"), [
    ("categorical_crossentropy", (64, 4), np.float32, lambda y: np.all(y.sum(-1) == 1)),
    ("binary_crossentropy", (64, 4), np.float32, lambda y: set(np.unique(y)) <= {0.0, 1.0}),
    ("mse", (64, 4), np.float32, lambda y: y.min() < 0 < y.max()),
    ("poisson", (64, 4), np.float32, lambda y: y.min() >= 0),
])
def test_labels_fit_the_loss(loss, shape, dtype, check):
    io = _io([("x", (None, 3), "float32")], [("out", (None, 4), "float32")], [None])
    _, y = infer.plan_data(io, loss, "m.py:build").synthesize(64)
    assert y.shape == shape and y.dtype == dtype and check(y)


def test_several_outputs_get_labels_each_by_name():
    io = _io([("x", (None, 3), "float32")], [("cls", (None, 5), "float32"), ("reg", (None, 2), "float32")], [None],
             output_tree={"cls": 0, "reg": 1})
    _, y = infer.plan_data(io, {"cls": "sparse_categorical_crossentropy", "reg": "mse"}, "m").synthesize(8)
    assert y["cls"].shape == (8,) and y["reg"].shape == (8, 2)
    with pytest.raises(InvalidValue, match="output 'reg' .* no entry for it"):
        infer.plan_data(io, {"cls": "mse"}, "m")


@pytest.mark.parametrize(("io", "loss", "needle"), [
    (_io([("ids", (None, 8), "int32")], [("o", (None, 2), "float32")], [None]), "mse",
     "integer input 'ids' (int32) of the model from m.py:build: no Embedding reads it"),
    (_io([("text", (None, None), "int32")], [("o", (None, 2), "float32")], [100]), "mse",
     "input 'text' has shape (None, None), a dimension of unknown size"),
    (_io([("s", (None, 1), "string")], [("o", (None, 2), "float32")], [None]), "mse",
     "input 's' (string)"),
    (_io([("x", (None, 3), "float32")], [("o", (None, 2), "float32")], [None]), "my_loss",
     "its loss 'my_loss' is not one of Keras' losses harness knows"),
    (None, "mse", "it has no Input specs (a subclassed model"),
])
def test_what_cannot_be_inferred_is_one_line_suggesting_data(io, loss, needle):
    with pytest.raises(InvalidValue) as err:
        infer.plan_data(io, loss, "m.py:build")
    text = str(err.value)
    assert needle in text and "pass --data MODULE:ATTR" in text and "\n" not in text


# -- the command line: bad specs exit 2 with one line, before TensorFlow starts ------------------------------

@pytest.mark.parametrize(("argv", "needle"), [
    (["run", "--model", "{dir}/nowhere.py:build"], "no such file"),
    (["compare", "--model", "{dir}/specs.py:missing"], "specs.py has no attribute 'missing'"),
    (["tune", "--model", "{dir}/specs.py:NUMBER"], "which is not callable"),
    (["calibrate", "--model", "no_such_module_harness:build"], "no module named 'no_such_module_harness'"),
    (["calibrate", "--data", "{dir}/specs.py:make_data"], "--data '{dir}/specs.py:make_data' is data for a model"),
    (["run", "--data", "{dir}/specs.py:make_data"], "the built-in workload 'mnist_maxing' makes its own"),
    (["check", "--model", "{dir}/specs.py:missing"], "specs.py has no attribute 'missing'"),
    (["check", "--models", "dense", "--data", "{dir}/specs.py:make_data"], "the built-in model 'dense' makes its own"),
])
def test_a_bad_spec_on_the_command_line_is_one_line_and_exit_2(specs, capsys, argv, needle):
    argv = [a.format(dir=specs.parent) for a in argv]
    assert main([*argv, "--no-save"] if argv[0] != "check" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"harness {argv[0]}: error: ") and needle.format(dir=specs.parent) in err


def test_check_still_refuses_an_unknown_name(capsys):
    assert main(["check", "--models", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_a_bad_spec_starts_no_tensorflow(specs):
    code = ("import sys\nfrom harness.cli import main\n"
            f"status = main(['run', '--model', '{specs}:missing', '--logical-cpus', '2', '--no-save'])\n"
            "print(status, 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stderr
