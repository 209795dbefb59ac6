"""harness.compat: which Keras the environment and a model are, decided without TensorFlow."""

import pytest

from harness import compat


@pytest.fixture
def versions(monkeypatch):
    table = {}
    monkeypatch.setattr(compat, "_version", lambda name: table.get(name))
    return table


def test_keras_3_is_the_default(versions):
    versions.update({"keras": "3.15.1", "tensorflow": "2.21.0"})
    flavour = compat.keras_flavour({})
    assert (flavour.major, flavour.package, flavour.version) == (3, "keras", "3.15.1")


def test_tf_2_15_keras_package_is_keras_2(versions):
    versions.update({"keras": "2.15.0", "tensorflow-cpu": "2.15.1"})
    flavour = compat.keras_flavour({})
    assert (flavour.major, flavour.package) == (2, "keras") and "2.15.1 with keras 2.15.0" in flavour.why


def test_legacy_keras_is_keras_2_only_when_requested_and_installed(versions):
    versions.update({"keras": "3.15.1", "tf-keras": "2.21.0", "tensorflow": "2.21.0"})
    assert compat.keras_flavour({"TF_USE_LEGACY_KERAS": "1"}).major == 2
    assert compat.keras_flavour({"TF_USE_LEGACY_KERAS": "0"}).major == 3
    versions.pop("tf-keras")
    missing = compat.keras_flavour({"TF_USE_LEGACY_KERAS": "1"})  # TF switches anyway and then fails to import
    assert missing.major == 2 and "tf-keras (not installed)" in missing.why


def _model_of(module: str):
    cls = type("Sequential", (), {"__module__": module})
    return cls()


@pytest.mark.parametrize("module", ["tf_keras.src.engine.sequential", "keras.src.engine.sequential"])
def test_keras_2_models_are_known_by_their_class(module):
    assert compat.is_keras2_model(_model_of(module))


def test_keras_3_models_are_not_keras_2():
    assert not compat.is_keras2_model(_model_of("keras.src.models.sequential"))


def test_the_keras_module_of_a_wrapper_is_the_keras_of_its_base_class():
    # harness's Keras 2 wrappers live in harness modules; their base classes name the Keras.
    base = type("Model", (), {"__module__": "tf_keras.src.engine.training"})
    wrapper = type("TowersModel", (base,), {"__module__": "harness.parallel.towers"})()
    assert compat.keras_module_name(wrapper) == "tf_keras"
    assert compat.keras_module_name(_model_of("keras.src.models.sequential")) == "keras"
    assert compat.keras_module_name(_model_of("keras.src.engine.sequential")) == "keras"  # TF 2.15's Keras 2
