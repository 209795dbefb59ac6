"""One worker of a multi-worker backup-and-resume run (started by tests/parallel/test_multiworker_resume.py).

Every worker trains ``parallelize(model, cluster, ratios)`` (Dense-tanh-Dense, Adam: optimizer state that
a resume must keep) on the same data (shuffle=False, a partial last batch) with a backup callback writing
to BACKUP; ``--die-at-epoch K --die-at-step S``: worker 1 kills itself (SIGKILL) before step S of epoch K.
After fit the chief saves the plain model to ``--save`` (.keras). Each worker prints one JSON line:
``RESULT {...}``: the epochs it ran, the epoch it resumed at, the final weights, and the files it wrote
(seen by an audit hook: creating, writing, renaming or removing a file under ``--audit``).

Usage: python multiworker_resume_worker.py BACKUP [--save PATH] [--epochs N] [--keras MODULE] [--stock] [--per-worker]
           [--die-at-epoch K --die-at-step S] [--audit ROOT]
"""

import argparse
import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from file_audit import audit_writes  # noqa: E402  (beside this script)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("backup", help="the backup directory")
    p.add_argument("--save", default=None, help="the chief saves the plain model here (.keras) after fit")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=150)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ratios", default="3:1")
    p.add_argument("--keras", default="keras", help="the Keras module of the model: keras (default) or tf_keras")
    p.add_argument("--stock", action="store_true", help="Keras' own BackupAndRestore instead of harness'")
    p.add_argument("--per-worker", action="store_true", help="each worker backs up into BACKUP/worker<i>")
    p.add_argument("--die-at-epoch", type=int, default=None)
    p.add_argument("--die-at-step", type=int, default=0)
    p.add_argument("--audit", default=None, help="record this process' file writes under this directory")
    args = p.parse_args()
    written = audit_writes(args.audit) if args.audit else []

    import harness

    cluster = harness.use_cluster(timeout_s=120)  # first: it starts this worker's server
    import numpy as np

    from harness.parallel.backup import backup_class

    keras = importlib.import_module(args.keras)  # keras (Keras 3, or TF 2.15's Keras 2) or tf_keras

    keras.utils.set_random_seed(0)
    template = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)])
    rng = np.random.RandomState(0)
    x = rng.rand(args.samples, 6).astype("float32")
    y = np.stack([x.sum(1), x[:, 0] - x[:, 1]], axis=1).astype("float32")
    ratios = [float(r) for r in args.ratios.split(":")]

    parallel = harness.parallelize(template, cluster, ratios=ratios)
    parallel.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    directory = os.path.join(args.backup, f"worker{cluster.index}") if args.per_worker else args.backup
    backup = keras.callbacks.BackupAndRestore(directory) if args.stock else backup_class(keras)(directory)
    epochs_run: list = []

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(epoch)

        def on_train_batch_begin(self, batch, logs=None):
            if cluster.index == 1 and epochs_run[-1] == args.die_at_epoch and batch == args.die_at_step:
                import signal

                print(f"dying at epoch {epochs_run[-1]} step {batch}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    history = parallel.fit(x, y, batch_size=args.batch, epochs=args.epochs, verbose=0, shuffle=False,
                           callbacks=[backup, Record()])
    saved = False
    if args.save and cluster.is_chief:
        template.save(args.save)  # the plain single-device model
        saved = True
    print("RESULT " + json.dumps({
        "worker": cluster.index, "epochs_run": epochs_run, "loss": history.history["loss"],
        "restored_epoch": getattr(backup, "restored_epoch", None),
        "iterations": int(parallel.optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in template.get_weights()], "saved": saved, "written": written,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
