"""A multi-worker run killed mid-epoch resumes from the chief's backup to the weights of an uninterrupted run.

Each worker runs tests/parallel/multiworker_resume_worker.py: ``parallelize(model, cluster, [3, 1])`` with
Adam (optimizer state a resume must keep), 150 samples in batches of 32 (a partial last batch), 3 epochs,
``harness.parallel.backup.BackupAndRestore``. Run A is uninterrupted; run B loses worker 1 (SIGKILL) in
epoch 1 and is launched again, unchanged, on the same backup directory: it runs epochs 1 and 2 only and
ends with A's weights, bit for bit. Only the chief writes (its checkpoint, and the plain ``.keras`` model);
Keras' own ``BackupAndRestore`` resumes to other weights (it loses the optimizer state).
"""

import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.launch import launch

WORKER = Path(__file__).with_name("multiworker_resume_worker.py")
KILL = ["--die-at-epoch", "1", "--die-at-step", "2"]  # worker 1 dies before step 2 of epoch 1
STEPS = 5 * 3  # 150 samples in batches of 32: 5 steps an epoch, 3 epochs


def _cluster_run(*args, timeout_s: float = 240.0):
    out, err = io.StringIO(), io.StringIO()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    start = time.monotonic()
    result = launch([sys.executable, str(WORKER), *map(str, args)], 2, env=env, out=out, err=err,
                    timeout_s=timeout_s, grace_s=2.0)
    reports = {}
    for line in out.getvalue().splitlines():
        prefix, _, text = line.partition("] ")
        if text.startswith("RESULT "):
            reports[int(prefix.split()[1])] = json.loads(text[len("RESULT "):])
    return result, reports, out.getvalue() + err.getvalue(), time.monotonic() - start


def _deviation(a: dict, b: dict) -> float:
    assert len(a["weights"]) == len(b["weights"])
    return max(float(np.max(np.abs(np.asarray(p, np.float32) - np.asarray(q, np.float32))))
               for p, q in zip(a["weights"], b["weights"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(keras, *parts)``: run A, the killed run B and its relaunch (``parts``: "a", "killed", "resumed"; all by
    default), each run once per Keras module (``keras3``, ``keras2`` or ``any_keras``' module: Keras 3's ``keras``,
    ``tf_keras``, or TF 2.15's ``keras``, Keras 2) and test module. A test that needs the killed run's checkpoint
    alone (the quick loop's) starts one cluster, not three."""
    done: dict = {}

    def get(keras, *parts: str) -> dict:
        flavour = f"{keras.__name__}-{keras.__version__}"
        if flavour not in done:
            done[flavour] = {"root": tmp_path_factory.mktemp(keras.__name__)}
        run = done[flavour]
        root, flags = run["root"], ["--audit", run["root"], "--keras", keras.__name__]
        wanted = parts or ("a", "killed", "resumed")
        if "a" in wanted and "a" not in run:
            run["a"] = _cluster_run(root / "a", "--save", root / "a.keras", *flags)
            assert run["a"][0].status == 0 and sorted(run["a"][1]) == [0, 1], run["a"][2][-6000:]
        if ("killed" in wanted or "resumed" in wanted) and "killed" not in run:
            run["killed"] = _cluster_run(root / "b", *KILL, *flags)
            run["checkpoints"] = sorted(os.listdir(root / "b")) if (root / "b").exists() else None
            if run["checkpoints"]:  # kept aside: the relaunch deletes it when it ends
                shutil.copy(root / "b" / "backup.npz", root / "killed.npz")
        if "resumed" in wanted and "resumed" not in run:
            run["resumed"] = _cluster_run(root / "b", "--save", root / "b.keras", *flags)
        return run

    return get


# The clusters (Keras 2's three: 48 s; Keras 3's kill-and-relaunch: 22 s) run in the extended step; backup and
# restore stays in the quick loop in one process (test_a_plain_keras_model_in_one_process_resumes_exactly_too, the
# refusals below) and across workers in test_workers_that_read_different_checkpoints_stop_with_an_error_naming_each.
_RESUME = "tests/parallel/test_multiworker_resume.py::"


@pytest.mark.extended
@pytest.mark.covered_by(f"{_RESUME}test_a_plain_keras_model_in_one_process_resumes_exactly_too[keras3]",
                        f"{_RESUME}test_a_plain_keras_model_in_one_process_resumes_exactly_too[keras2]",
                        f"{_RESUME}test_workers_that_read_different_checkpoints_stop_with_an_error_naming_each[keras3]")
def test_a_killed_run_relaunched_resumes_from_the_backup_to_the_uninterrupted_weights(runs, any_keras):
    run = runs(any_keras)
    (result, reports, output, _) = run["killed"]
    assert (result.status, result.first_failure) == (137, 1), output[-6000:]
    assert "[worker 1] dying at epoch 1 step 2" in output and reports == {}
    assert run["checkpoints"] == ["backup.npz"]  # the chief's epoch-0 backup, whole (no .tmp left)

    a = run["a"][1]
    result, resumed, output, _ = run["resumed"]
    assert result.status == 0 and sorted(resumed) == [0, 1], output[-6000:]
    for i in (0, 1):
        assert (a[i]["epochs_run"], a[i]["restored_epoch"]) == ([0, 1, 2], None)
        # It resumed: epoch 0 was not run again, and every worker started from the checkpoint's epoch.
        assert (resumed[i]["epochs_run"], resumed[i]["restored_epoch"]) == ([1, 2], 1), resumed[i]
        # The same weights as the uninterrupted run, bit for bit, on every worker.
        assert _deviation(resumed[i], a[0]) == 0.0, _deviation(resumed[i], a[0])
        assert resumed[i]["iterations"] == a[i]["iterations"] == STEPS  # Adam's step count restored too
        assert resumed[i]["loss"] == a[i]["loss"][1:]
    assert not (run["root"] / "b" / "backup.npz").exists()  # deleted by the chief when fit ended


@pytest.mark.extended  # the same clusters as the test above
def test_only_the_chief_writes_the_backup_and_the_plain_model(runs, any_keras, logical_devices):
    run = runs(any_keras)
    for name, directory, model in (("a", "a", "a.keras"), ("resumed", "b", "b.keras")):
        reports = run[name][1]
        assert reports[1]["written"] == [] and not reports[1]["saved"], reports[1]  # worker 1 wrote nothing
        assert reports[0]["saved"]
        allowed = {("os.mkdir", directory), ("open", f"{directory}/backup.npz.tmp"),
                   ("os.rename", f"{directory}/backup.npz"), ("os.remove", f"{directory}/backup.npz"),
                   ("open", model)}
        written = {tuple(w) for w in reports[0]["written"]}
        assert {("os.rename", f"{directory}/backup.npz"), ("open", model)} <= written <= allowed, written

    # The chief's .keras file is the plain single-device model with the resumed weights.
    keras = any_keras
    loaded = keras.models.load_model(run["root"] / "b.keras")
    assert type(loaded) is keras.Sequential
    saved = {"weights": [w.tolist() for w in loaded.get_weights()]}
    assert _deviation(saved, run["resumed"][1][0]) == 0.0


@pytest.mark.extended
@pytest.mark.slow  # 64 s in .ci/run (10 TensorFlow processes): slow.yml
def test_keras_own_backup_and_restore_resumes_to_other_weights(runs, tmp_path, keras3):
    """The control: the test tells a lost optimizer state apart. Keras 3's callback saves the parallel model's
    template (weights only); each worker gets its own directory (in one directory both write the same
    latest.weights.h5 and h5py's lock fails one of them). Keras 3 only: Keras 2's callback checkpoints the
    optimizer too (and on several workers each takes itself for the chief, harness/parallel/backup.py)."""
    a = runs(keras3)["a"][1]
    stock = ["--stock", "--per-worker"]
    result, _, output, _ = _cluster_run(tmp_path, *KILL, *stock)
    assert (result.status, result.first_failure) == (137, 1), output[-6000:]
    result, resumed, output, _ = _cluster_run(tmp_path, *stock)
    assert result.status == 0, output[-6000:]
    assert resumed[0]["epochs_run"] == [1, 2]  # it resumed at the same epoch ...
    assert resumed[0]["iterations"] == STEPS - 5  # ... with Adam's step count (and moments) started afresh
    assert _deviation(resumed[0], a[0]) > 1e-3


@pytest.mark.keras2_extended  # 9 s: a Keras 2 cluster; the check across workers is harness' own, alike for each Keras
@pytest.mark.covered_by(f"{_RESUME}test_workers_that_read_different_checkpoints_stop_with_an_error_naming_each[keras3]",
                        f"{_RESUME}test_a_plain_keras_model_in_one_process_resumes_exactly_too[keras2]")
def test_workers_that_read_different_checkpoints_stop_with_an_error_naming_each(runs, tmp_path, any_keras):
    """A backup directory not every worker sees (each its own here): the chief finds a checkpoint, worker 1 none."""
    run = runs(any_keras, "killed")  # its checkpoint alone: one cluster
    assert (run["root"] / "killed.npz").exists(), run["killed"][2][-4000:]
    (tmp_path / "worker0").mkdir()
    shutil.copy(run["root"] / "killed.npz", tmp_path / "worker0" / "backup.npz")
    result, reports, output, _ = _cluster_run(tmp_path, "--per-worker", "--keras", any_keras.__name__)
    assert result.status == 1 and reports == {}, output[-6000:]
    assert "harness.errors.Failed: the workers read different checkpoints from " in output, output[-6000:]
    assert "(worker 0: epoch 1 (crc32 " in output and "), worker 1: no checkpoint)" in output


def test_bad_arguments_and_checkpoints_of_another_model_are_refused_by_name(tmp_path, logical_devices, any_keras):
    from harness.parallel.backup import backup_class

    keras, BackupAndRestore = any_keras, backup_class(any_keras)
    # The variable's name: its path in Keras 3, its TF name in Keras 2 (tf_keras, TF 2.15's keras).
    kernel = r"sequential(_\d+)?/d/kernel" if keras.__version__.startswith("3.") else r"d/kernel:0"
    with pytest.raises(ValueError, match="directory must be a non-empty path; got directory=''"):
        BackupAndRestore("")
    with pytest.raises(ValueError, match="delete_checkpoint must be True or False; got delete_checkpoint='no'"):
        BackupAndRestore(tmp_path, delete_checkpoint="no")

    def model(units):
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, name="d")])
        m.compile(optimizer="adam", loss="mse")
        return m

    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    model(2).fit(x, y, epochs=1, verbose=0, callbacks=[BackupAndRestore(tmp_path, delete_checkpoint=False)])
    assert os.listdir(tmp_path) == ["backup.npz"]
    with pytest.raises(ValueError, match=rf"variable '{kernel}' was saved as float32\[3, 2\]; this "
                                         r"model's '.*' is float32\[3, 4\]"):
        model(4).fit(x, np.ones((8, 4), "float32"), epochs=1, verbose=0, callbacks=[BackupAndRestore(tmp_path)])
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    backup = BackupAndRestore(tmp_path)
    backup.set_model(plain)
    with pytest.raises(ValueError, match=r"needs a compiled model; Sequential '.*' has no optimizer"):
        backup.on_train_begin()


def test_a_plain_keras_model_in_one_process_resumes_exactly_too(tmp_path, logical_devices, any_keras):
    from harness.parallel.backup import backup_class

    keras, BackupAndRestore = any_keras, backup_class(any_keras)

    rng = np.random.RandomState(0)
    x = rng.rand(40, 3).astype("float32")
    y = x @ rng.rand(3, 2).astype("float32")

    def fit(callbacks, epochs=3):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
        m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        m.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
        return m

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt

    reference = fit([]).get_weights()
    with pytest.raises(KeyboardInterrupt):
        fit([BackupAndRestore(tmp_path), Stop()])
    backup = BackupAndRestore(tmp_path)
    resumed = fit([backup])
    assert backup.restored_epoch == 2 and int(resumed.optimizer.iterations.numpy()) == 9
    assert all(np.array_equal(a, b) for a, b in zip(reference, resumed.get_weights()))
    # A later fit of the model starts at its own initial_epoch: the resume hook is cleared (Keras 3: its
    # _initial_epoch; Keras 2: its _training_state, which fit asks for the epoch to start at).
    if keras.__version__.startswith("3."):
        assert resumed._initial_epoch is None
    else:
        assert resumed._training_state is None
