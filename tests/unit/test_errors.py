"""harness' own errors (harness.errors) and what the CLI and the parallel core do with them.

A ``HarnessError`` is a failure harness diagnosed: the CLI prints one line and exits 2 (bad input), or 3 for a
step that failed (``Failed``: no verdict). Anything else is an internal error: the CLI prints its traceback and says
so, and exits 3 (no verdict), never 1 (a negative verdict). A ``Refused``
carries a reason id; an error of Keras while cloning a model is not a refusal and propagates as it is.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import harness
from harness import errors
from harness.cli import main
from harness.errors import Failed, HarnessError, InvalidType, InvalidValue, NotSupported, Refused, Unavailable

# -- the hierarchy -----------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "builtin"), [
    (InvalidValue, ValueError), (InvalidType, TypeError), (Unavailable, RuntimeError), (Failed, RuntimeError),
    (Refused, ValueError), (NotSupported, NotImplementedError),
])
def test_each_error_is_a_harness_error_and_the_builtin_it_replaces(cls, builtin):
    assert issubclass(cls, HarnessError) and issubclass(cls, builtin)
    assert getattr(harness, cls.__name__) is cls  # exported by the package


def test_refused_carries_its_reason_and_str_is_the_message():
    err = Refused("custom-train-step", "model 'net' defines its own train_step")
    assert err.reason == "custom-train-step"
    assert str(err) == "model 'net' defines its own train_step"
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))  # crosses processes (xdist, multiprocessing) whole
    assert type(again) is Refused and again.reason == err.reason and str(again) == str(err)
    assert NotSupported("masked-batchnorm", "no").reason == "masked-batchnorm"


@pytest.mark.parametrize("reason", ["", "Custom", "custom train step", "custom_train_step", "-x", None, 3])
def test_a_refusal_needs_a_kebab_case_reason(reason):
    with pytest.raises(InvalidValue, match="kebab-case id") as info:
        Refused(reason, "message")
    assert repr(reason) in str(info.value)
    with pytest.raises(TypeError):
        Refused("no-message")  # type: ignore[call-arg]  # the message is required too


def test_the_dedicated_errors_fit_the_hierarchy():
    from harness.ci.tracking.history import CommitsNotInRepo
    from harness.compat import Keras2NotSupported
    from harness.extras import MissingExtra

    assert issubclass(MissingExtra, Unavailable) and issubclass(MissingExtra, RuntimeError)
    assert issubclass(CommitsNotInRepo, InvalidValue)
    assert issubclass(Keras2NotSupported, Refused) and issubclass(Keras2NotSupported, RuntimeError)
    assert Keras2NotSupported("keras2-batchnorm", "why").reason == "keras2-batchnorm"


def test_a_missing_extra_is_unavailable():
    from harness.extras import require

    with pytest.raises(Unavailable, match=r"charts: no_such_package_xyz is not installed .*harness\[bench\]"):
        require("no_such_package_xyz", package="no_such_package_xyz", extra="bench", purpose="charts")


def test_harness_errors_imports_nothing():
    """The bottom layer: no harness module, no TensorFlow (the import-linter contracts check the layers)."""
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "re"}, imported


def test_validation_raises_the_harness_errors():
    from harness.split import split_batch

    with pytest.raises(InvalidValue, match=r"got ratios=\[3, -1\]"):
        split_batch(10, [3, -1])
    with pytest.raises(InvalidType, match="got batch_size='10'"):
        split_batch("10", [1])  # type: ignore[arg-type]


# -- the CLI's exit statuses ----------------------------------------------------------------------


def test_a_bad_option_value_exits_2_with_one_line_naming_it(capsys):
    assert main(["run", "--emulate", "1000,500", "--ratios", "3", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err], err  # one line, no traceback
    assert err.startswith("harness run: error: ") and "-1" in err and "ratios" in err


def test_a_usage_error_still_exits_2(capsys):
    assert main(["run", "--method", "nope"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "Traceback" not in err


def _raise_from_env(monkeypatch, error: BaseException) -> None:
    """``harness env`` raises ``error`` (its parser takes the module's ``run`` when ``main`` builds it)."""
    import harness.cli.env

    def run(args):
        raise error

    monkeypatch.setattr(harness.cli.env, "run", run)


@pytest.mark.parametrize("error", [
    InvalidValue("--thing must be >= 1; got --thing 0"), InvalidType("devices must be an int; got devices='x'"),
    Unavailable("harness docker needs a Docker engine; none answers"),
    Refused("custom-train-step", "model 'net' defines its own train_step"),
    NotSupported("masked-batchnorm", "masked inputs to BatchNormalization layer 'bn' are not synchronised"),
])
def test_a_harness_error_exits_2_with_its_message_and_no_traceback(monkeypatch, capsys, error):
    _raise_from_env(monkeypatch, error)
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err == f"harness env: error: {error}\n"


def test_a_step_that_failed_exits_3_no_verdict_with_its_message_and_no_traceback(monkeypatch, capsys):
    _raise_from_env(monkeypatch, Failed("asv run failed with exit status 3"))
    assert main(["env"]) == 3
    assert capsys.readouterr().err == "harness env: error: asv run failed with exit status 3 (no verdict)\n"


@pytest.mark.parametrize("error", [KeyError("window"), ZeroDivisionError("division by zero"),
                                   ValueError("an undiagnosed ValueError is a bug too"),
                                   RuntimeError("so is a RuntimeError harness did not raise on purpose")])
def test_any_other_exception_is_an_internal_error_exit_3_with_its_traceback(monkeypatch, capsys, error):
    _raise_from_env(monkeypatch, error)
    assert main(["env"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):"), err
    assert f"{type(error).__name__}: " in err and "in run" in err  # the exception and where it was raised
    last = err.strip().splitlines()[-1]
    assert last.startswith("harness env: internal error: ") and "please report it" in last
    assert last.endswith("no verdict (exit 3)")


@pytest.mark.parametrize("error", [InvalidValue("bad"), KeyError("window")])
def test_debug_shows_the_exception_itself(monkeypatch, error):
    _raise_from_env(monkeypatch, error)
    with pytest.raises(type(error)):
        main(["--debug", "env"])


def test_keyboard_interrupt_is_not_an_internal_error(monkeypatch):
    _raise_from_env(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        main(["env"])


# -- refusals of the parallel core vs errors of cloning ---------------------------------------------
# These build small Keras models (no training); logical_devices first, as every TensorFlow test here.


def _custom_layer(k, fails_with: type[BaseException]):
    class Custom(k.layers.Layer):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.dense = k.layers.Dense(units)

        def call(self, x):
            return self.dense(x)

        def get_config(self):
            raise fails_with("Custom.get_config is broken on purpose")

    return Custom


@pytest.mark.parametrize("fails_with", [TypeError, NotImplementedError, AttributeError])
def test_a_clone_that_fails_is_not_a_refusal(logical_devices, any_keras, fails_with):
    import tensorflow as tf

    from harness.parallel.adapters import adapter_for

    k = any_keras
    x = k.Input((3,))
    model = k.Model(x, _custom_layer(k, fails_with)(2, name="custom")(x), name="functional")
    with pytest.raises(fails_with, match="broken on purpose") as info:
        adapter_for(model).clone(model, tf.distribute.get_strategy(), sync_batchnorm=False)
    assert not isinstance(info.value, HarnessError)  # Keras' failure as it is: a bug or a case to look at


def test_a_subclassed_model_keras_has_no_config_of_is_refused(logical_devices, any_keras):
    import numpy as np
    import tensorflow as tf

    from harness.parallel.adapters import adapter_for

    k = any_keras

    class Net(k.Model):
        def __init__(self, thing, **kwargs):
            super().__init__(**kwargs)
            self.thing, self.dense = thing, k.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Net(object(), name="net")
    model(np.zeros((1, 3), "float32"))
    with pytest.raises(Refused, match=r"method='mirrored' needs a model .* can clone .*cannot clone 'net' \(Net\)") \
            as info:
        adapter_for(model).clone(model, tf.distribute.get_strategy(), sync_batchnorm=False)
    assert info.value.reason == "not-cloneable"


def test_every_refusal_harness_raises_is_registered():
    """harness.errors.REFUSALS lists every reason id raised in harness' source (what a workload's expect and the zoo's
    pins name), and no id that nothing raises."""
    import re
    from pathlib import Path

    import harness
    from harness.errors import REFUSALS

    sources = [path.read_text() for path in Path(harness.__file__).parent.rglob("*.py")]
    refusals = {"Refused"}  # Refused and its subclasses, wherever harness defines one
    while True:
        found = {name for text in sources for name, bases in re.findall(r"^class (\w+)\(([^)]*)\)", text, re.M)
                 if refusals & {b.strip() for b in bases.split(",")}}
        if found <= refusals:
            break
        refusals |= found
    assert {"NotSupported", "SparseLayoutError", "Keras2NotSupported"} <= refusals
    calls = "|".join(sorted(refusals))
    raised = {reason for text in sources for reason in re.findall(rf'\b(?:{calls})\(\s*"([a-z0-9-]+)"', text)}
    assert raised, "no Refused(...) found: the pattern no longer matches how harness raises them"
    assert raised == set(REFUSALS), (sorted(raised - set(REFUSALS)), sorted(set(REFUSALS) - raised))
