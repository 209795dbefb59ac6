"""The test suite's TensorFlow zygote (tests/tf_zygote.py): a forked run is the run a plain process gives."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from tf_zygote import ENV, JAX, _zygote, _zygotes, forking, python

pytestmark = pytest.mark.skipif(not forking(), reason="the zygote forks: Linux hosts, HARNESS_TEST_NO_ZYGOTE unset")


def test_a_forked_run_has_the_streams_status_argv_cwd_and_environment_of_python_c(tmp_path):
    code = ("import os, sys; print('out', sys.argv[1:], os.getcwd(), os.environ['HARNESS_RESULTS_DIR']); "
            "print('err', file=sys.stderr); print(__name__, 'tensorflow' in globals()); sys.exit(3)")
    env = {**ENV, "HARNESS_RESULTS_DIR": str(tmp_path)}
    forked = python(["-c", code, "a", "b"], env=env, cwd=str(tmp_path), timeout=120)
    plain = subprocess.run([sys.executable, "-c", code, "a", "b"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert forked.stdout == f"out ['a', 'b'] {tmp_path} {tmp_path}\n__main__ False\n"
    assert _zygotes, "the run was not forked"


# The zygote's edge cases are extended tests (20 s of the quick loop): every quick test that runs TensorFlow in a
# process of its own goes through the zygote, and the two tests left here check a run's streams, status and CLI.
@pytest.mark.extended
@pytest.mark.covered_by(
    "tests/unit/test_tf_zygote.py::test_a_forked_run_has_the_streams_status_argv_cwd_and_environment_of_python_c",
    "tests/unit/test_tf_zygote.py::test_the_cli_runs_as_python_m_harness_does")
def test_an_uncaught_exception_is_a_traceback_and_exit_1_and_each_run_sets_up_its_own_devices():
    failed = python(["-c", "raise ValueError('named')"], env=ENV, timeout=120)
    assert failed.returncode == 1 and failed.stderr.rstrip().endswith("ValueError: named")
    # A child that ends at once: its pid and its status may reach the test process in one read.
    assert [python(["-c", f"raise SystemExit({n})"], env=ENV, timeout=120).returncode for n in range(5)] == [*range(5)]
    code = ("import sys, harness; devices = harness.use_logical_devices(int(sys.argv[1])); "
            "import tensorflow as tf; print(len(tf.config.list_logical_devices('CPU')))")
    # TensorFlow fixes its devices once per process: a child that inherited a started runtime could not.
    assert [python(["-c", code, n], env=ENV, timeout=300).stdout.split()[-1] for n in ("3", "2")] == ["3", "2"]


def test_the_cli_runs_as_python_m_harness_does(tmp_path):
    forked = python(["-m", "harness", "run", "--batch", "0"], env=ENV, timeout=300, cwd=str(tmp_path))
    plain = subprocess.run([sys.executable, "-m", "harness", "run", "--batch", "0"], capture_output=True, text=True,
                           env=ENV, timeout=300, cwd=tmp_path)
    assert forked.returncode == plain.returncode == 2
    assert forked.stderr == plain.stderr and "--batch" in forked.stderr


@pytest.mark.extended
def test_a_timeout_kills_the_run_and_what_it_started_and_the_zygote_serves_on():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('started', flush=True); time.sleep(60)"
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as timeout:
        python(["-c", code], env=ENV, timeout=5)
    assert time.monotonic() - began < 30
    assert "started" in timeout.value.stdout
    assert python(["-c", "print(1)"], env=ENV, timeout=120).stdout == "1\n"


@pytest.mark.extended
def test_an_environment_tensorflow_reads_at_import_gets_a_zygote_of_its_own():
    before = set(map(id, _zygotes.values()))
    code = "import os; print(os.environ.get('TF_USE_LEGACY_KERAS'))"
    # The suite's environment may set it (the matrix images set TF_USE_LEGACY_KERAS=0): the other run asks for
    # a value it does not hold.
    own = ENV.get("TF_USE_LEGACY_KERAS")
    other = "1" if own != "1" else "0"
    assert python(["-c", code], env=ENV, timeout=120).stdout == f"{own}\n"
    assert python(["-c", code], env={**ENV, "TF_USE_LEGACY_KERAS": other}, timeout=120).stdout == f"{other}\n"
    assert len(set(map(id, _zygotes.values())) - before) == 1 + (not before)


def test_a_jax_zygote_serves_every_device_count_and_imports_no_tensorflow():
    """tests/onjax's processes fork from a zygote of numpy, JAX and Keras: JAX's backend starts in each child, so
    one zygote serves every XLA_FLAGS device count, and nothing it imported brought TensorFlow in (the children's
    guard against TensorFlow would not see a module already there). Planted, XLA_FLAGS not late: each device count
    gets a zygote of its own, and the last assertion fails."""
    pytest.importorskip("jax", reason="jax: install harness' [jax] extra (scripts/dev-env.sh does)")

    code = "import sys, jax; print(len(jax.devices()), 'tensorflow' in sys.modules, 'keras' in sys.modules)"
    env = {**ENV, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    envs = [{**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"} for devices in (3, 2)]
    seen = []
    for each in envs:
        done = python(["-c", code], env=each, timeout=120, preload=JAX)
        assert done.returncode == 0, done.stderr[-3000:]
        seen.append(done.stdout.split())
    assert seen == [["3", "False", "True"], ["2", "False", "True"]]  # keras: forked from the zygote that has it
    assert _zygote(envs[0], JAX) is _zygote(envs[1], JAX)  # one zygote for both (others: this worker's other tests)
