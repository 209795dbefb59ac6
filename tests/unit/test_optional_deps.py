"""The library and the CLI work without the optional dependencies; a missing one is one line naming its extra.

Each case runs in a fresh interpreter where pytest, matplotlib, nvidia-ml-py (pynvml), asv, the
Docker SDK and the other test/CI packages cannot be imported, as after ``pip install keras-harness`` plus
TensorFlow: the modules are hidden by an import hook, so the test needs no second environment.
"""

import subprocess
import sys

import pytest

HIDDEN = ("pytest", "_pytest", "pluggy", "xdist", "hypothesis", "matplotlib", "pynvml", "asv", "docker", "yaml",
          "hcl2", "importlinter", "grimp")

_PRELUDE = f"""
import importlib.abc, sys
HIDDEN = {HIDDEN!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True, text=True, timeout=timeout,
                          env={"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1",
                               "HARNESS_RESULTS_DIR": "/nonexistent-not-written", "PATH": "/usr/bin:/bin"})


def _cli(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return _python(f"from harness.cli import main\nsys.exit(main({list(argv)!r}))", timeout)


def test_the_hook_hides_the_optional_modules():
    done = _python("import matplotlib")  # the bad case: without the hook this import succeeds here
    assert done.returncode != 0 and "No module named 'matplotlib'" in done.stderr


def test_help_and_the_public_api_need_no_optional_dependency():
    done = _cli("--help")
    assert done.returncode == 0, done.stderr
    done = _python("import harness\nharness.parallelize, harness.assert_equivalent, harness.compare_training\n"
                   "print('pytest' in sys.modules, 'matplotlib' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_assert_equivalent_raises_assertion_error_without_pytest(any_keras):
    code = ("import harness\n"
            "devices = harness.use_logical_devices(2)\n"
            f"import numpy as np, tensorflow as tf, {any_keras.__name__} as keras\n"
            "class Centred(keras.losses.Loss):  # centres the batch: a loss that no split decomposes\n"
            "    def call(self, y, p):\n"
            "        return tf.square(y - p - tf.reduce_mean(y - p))  # TF ops: Keras 2 has no keras.ops\n"
            "build = lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])\n"
            "x = np.random.RandomState(0).rand(24, 3).astype('float32'); y = x.sum(1, keepdims=True)\n"
            "try:\n"
            "    harness.assert_equivalent(build, x, y, devices=devices, ratios=[3, 1], method='towers',\n"
            "                              loss=Centred(), batch_size=8, tol=0.0)\n"
            "except AssertionError as err:\n"
            "    print('AssertionError', 'pytest' in sys.modules)\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["AssertionError", "False"], done.stdout


def test_env_and_an_emulated_run_need_no_optional_dependency():
    done = _cli("env")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    done = _cli("run", "--emulate", "900,400", "--seconds", "1", "--windows", "1", "--no-save", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "samples/s" in done.stdout


def test_a_chart_without_matplotlib_is_one_line_naming_the_extra():
    code = ("from harness.cli import options\n"
            "from harness.bench.report import bar_chart\n"
            "print(options.chart('compare', lambda: bar_chart(['a'], [1.0], '/tmp/never.png', title='t')))\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["harness compare: chart skipped: charts: matplotlib is not installed (No module named "
                     "'matplotlib'); pip install 'keras-harness[bench]'"]


@pytest.mark.parametrize("argv, extra", [
    (["bench-compare", "HEAD", "HEAD"], "pip install 'keras-harness[bench]'"),
])
def test_a_command_whose_extra_is_missing_says_which_to_install(argv, extra):
    done = _cli(*argv)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and extra in lines[0], done.stderr
