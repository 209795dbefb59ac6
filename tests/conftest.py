"""Shared test setup. The harness pytest plugin (markers, logical_devices, keras2, any_keras) is opted into here.

Tests that train models are written once for both Keras generations: the plugin's ``any_keras``
fixture runs each on Keras 3 and on Keras 2 (tf_keras, or TF 2.15's ``keras``), skipping the
generation an environment lacks with the reason. Tests that are Keras 3 only by nature (``keras.ops``,
``keras.config``, Keras 3 internals) take the ``keras3`` fixture below, which skips them where the
``keras`` package is Keras 2 (the matrix's ``tf215`` env); tests of Keras 2 behaviour alone take
``keras2``. Every module is collected in every env.
"""

import pytest

pytest_plugins = ["harness.pytest_plugin"]  # opt-in: installing harness loads it nowhere else


@pytest.fixture(scope="session")
def keras3():
    """The ``keras`` package where it is Keras 3; skips the test, saying why, where it is Keras 2 or absent."""
    from importlib import metadata

    try:
        version = metadata.version("keras")
    except metadata.PackageNotFoundError:
        pytest.skip("Keras 3 only, and the keras package is not installed")
    if int(version.split(".")[0]) < 3:
        pytest.skip(f"Keras 3 only: the keras package here is Keras {version}")
    import keras

    return keras
