"""``BackupAndRestore``: a parallel model's training resumes after a lost worker, exactly where it stopped.

At the end of every epoch the chief (worker 0, or the only process) writes the
whole training state to one file, ``<directory>/backup.npz``: every variable of
the trained model (the mirrored clone's, not the template's: weights,
BatchNormalization's moving statistics, Keras 3's seed states) and every
variable of the optimizer (its step count and slots: Adam's moments, SGD's
momentum), with the number of epochs done. It writes a temporary file and
renames it over the last one, so a worker killed while writing leaves the
previous checkpoint whole. Other workers write nothing: their state is the
chief's, bit for bit.

When ``fit`` starts again (a relaunch of the same program), every worker reads
the chief's file, sets the variables and skips the epochs already done, so the
resumed run ends with the weights of an uninterrupted one. Across workers they
first agree: each worker's epoch and checksum of the file it read are
all-gathered, and a worker that read another checkpoint (or none: a directory
that is not on storage every worker sees) stops the run with an error naming
each worker's, instead of training on mixed states.

Why not ``keras.callbacks.BackupAndRestore`` (Keras 3): it calls
``model.save_weights``, which for a parallel model writes the plain template's
weights and no optimizer state (a resumed Adam restarts its step count and
moments: 2 workers, Adam, 3 epochs resumed after 1: 0.097 from the
uninterrupted weights); and it does nothing for multi-worker runs: every worker
writes the same ``latest.weights.h5`` in the same directory (on one host h5py's
file lock then fails one of them: ``BlockingIOError: unable to lock file``) and
every worker deletes the directory at the end. ``tf_keras``' (Keras 2) writes
a checkpoint of the model object, but a parallel model shows it no
distribution strategy (the strategy is inside the step), so every worker takes
itself for the chief and writes ``<backup_dir>/chief``: one deletes the
other's temporary files (``NotFoundError: .../chief/ckpt-3_temp``).

Limits: the data must come in the same order on every epoch (``shuffle=False``,
or a dataset whose order does not depend on the run); a checkpoint is taken at
epoch ends only (a resumed run repeats the unfinished epoch from its start).

``BackupAndRestore`` is a callback of the ``keras`` package; ``backup_class(k)``
makes the same callback for another Keras module (``tf_keras``).
"""

from __future__ import annotations

import functools
import io
import json
import os
import zlib
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from harness.compat import callback_class
from harness.errors import Failed, InvalidValue
from harness.parallel.collective import gather_worker_rows

__all__ = ["BackupAndRestore", "backup_class", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "backup.npz"
_FORMAT = 1


class _BackingUp:
    """What ``BackupAndRestore`` does, apart from the Keras it is a callback of (``backup_class``)."""

    model: Any  # set by the Keras callback this is mixed into (``set_model``)

    def __init__(self, directory, delete_checkpoint: bool = True):
        super().__init__()
        if isinstance(directory, os.PathLike):
            directory = os.fspath(directory)
        if not isinstance(directory, str) or not directory:
            raise InvalidValue(f"BackupAndRestore directory must be a non-empty path; got directory={directory!r}")
        if not isinstance(delete_checkpoint, bool):
            raise InvalidValue(f"BackupAndRestore delete_checkpoint must be True or False; "
                               f"got delete_checkpoint={delete_checkpoint!r}")
        self.directory = directory
        self.path = _join(directory, CHECKPOINT_NAME)
        self.delete_checkpoint = delete_checkpoint
        self.restored_epoch: int | None = None  # the epoch the last fit resumed at; None: it started afresh
        self.written: list[str] = []  # the files this process wrote (none but on the chief)

    # -- what is saved ------------------------------------------------------------
    def _state(self) -> list:
        """The trained model's variables, then the optimizer's, each once, in creation order."""
        model = self.model
        core = getattr(model, "core", model)  # a parallel model trains its clone (or the template itself)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise InvalidValue(f"BackupAndRestore needs a compiled model; {type(model).__name__} {model.name!r} "
                               "has no optimizer: call compile() before fit()")
        if callable(getattr(model, "build_optimizer", None)):  # a parallel model: slots in its strategy's scope
            model.build_optimizer()
        elif hasattr(optimizer, "build"):  # a plain model: Keras builds its optimizer in the first step only
            built = getattr(optimizer, "built", None)
            if not (getattr(optimizer, "_built", False) if built is None else built):
                optimizer.build(core.trainable_variables)
        variables = optimizer.variables
        if callable(variables) and not isinstance(variables, (list, tuple)):  # a legacy Keras 2 optimizer
            variables = variables()
        found, seen = [], set()
        for v in list(core.variables) + list(variables):
            if id(v) not in seen:
                seen.add(id(v))
                found.append(v)
        return found

    def _is_chief(self) -> bool:
        cluster = getattr(self.model, "cluster", None)
        return cluster is None or cluster.is_chief

    # -- Keras hooks -------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self.restored_epoch = None
        variables = self._state()
        loaded = self._read(variables)
        self._agree(loaded)
        if loaded is None:
            return
        epoch, values, _ = loaded
        for v, value in zip(variables, values):
            v.assign(value)
        self.restored_epoch = epoch
        self._set_initial_epoch(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self._is_chief():
            self._write(epoch + 1, self._state())

    def on_train_end(self, logs=None):
        self._set_initial_epoch(None)
        if self.delete_checkpoint and self._is_chief() and tf.io.gfile.exists(self.path):
            _remove(self.path)

    # -- the epoch fit starts at ----------------------------------------------------------
    def _set_initial_epoch(self, epoch: int | None) -> None:
        from harness.parallel.adapters import adapter_for

        adapter = getattr(self.model, "_adapter", None) or adapter_for(self.model)
        adapter.set_initial_epoch(self.model, epoch)

    # -- the file -------------------------------------------------------------------------
    def _write(self, epoch: int, variables: list) -> None:
        buffer = io.BytesIO()
        meta = {"format": _FORMAT, "epoch": epoch, "names": [_name(v) for v in variables]}
        arrays: dict[str, Any] = {f"v{i}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
        _makedirs(self.directory)
        temporary = self.path + ".tmp"
        _write_bytes(temporary, buffer.getvalue())
        _replace(temporary, self.path)  # atomic: a kill leaves the previous checkpoint or this one, whole
        if self.path not in self.written:
            self.written.append(self.path)

    def _read(self, variables: list):
        """``(epoch, values, crc32)`` of the checkpoint, or None where there is none."""
        if not tf.io.gfile.exists(self.path):
            return None
        data = _read_bytes(self.path)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as stored:
                meta = json.loads(str(stored["meta"]))
                values = [stored[f"v{i}"] for i in range(len(meta["names"]))]
        except (OSError, ValueError, KeyError) as err:
            raise InvalidValue(f"{self.path} is not a harness BackupAndRestore checkpoint: {err}") from err
        if meta.get("format") != _FORMAT:
            raise InvalidValue(f"{self.path} has checkpoint format {meta.get('format')!r}; this harness reads "
                               f"{_FORMAT}")
        names = meta["names"]
        if len(values) != len(variables):
            raise InvalidValue(
                f"{self.path} holds {len(values)} variables; model {self.model.name!r} and its optimizer have "
                f"{len(variables)}: the checkpoint is of another model or optimizer (use another directory)")
        for name, value, v in zip(names, values, variables):
            shape, dtype = tuple(v.shape), np.dtype(_dtype_name(v))
            if value.shape != shape or value.dtype != dtype:
                raise InvalidValue(
                    f"{self.path}: variable {name!r} was saved as {value.dtype}{list(value.shape)}; this model's "
                    f"{_name(v)!r} is {dtype}{list(shape)}: the checkpoint is of another model (use another "
                    "directory)")
        return int(meta["epoch"]), values, zlib.crc32(data)

    # -- every worker resumes from the same checkpoint -------------------------------------
    def _agree(self, loaded) -> None:
        """All-gathers each worker's (epoch, checksum) and raises unless they are the chief's."""
        cluster = getattr(self.model, "cluster", None)
        if cluster is None or cluster.workers < 2:
            return
        mine = [-1.0, -1.0] if loaded is None else [float(loaded[0]), float(loaded[2])]
        rows = gather_worker_rows(cluster.strategy, cluster.index, cluster.workers, mine)
        if all(row == rows[0] for row in rows):
            return

        def say(row):
            return "no checkpoint" if row[0] < 0 else f"epoch {int(row[0])} (crc32 {int(row[1]):08x})"

        found = ", ".join(f"worker {i}: {say(row)}" for i, row in enumerate(rows))
        raise Failed(
            f"the workers read different checkpoints from {self.path} ({found}): every worker restores from the "
            "chief's directory, so it must be on storage every worker sees (a shared or network file system, "
            "or a gs:// path)")


def _name(v) -> str:
    return str(getattr(v, "path", None) or getattr(v, "name", "?"))


def _dtype_name(v) -> str:
    dtype = v.dtype
    return getattr(dtype, "name", None) or str(dtype)


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name if "://" in directory else os.path.join(directory, name)


def _write_bytes(path: str, data: bytes) -> None:
    if "://" in path:  # gs://, hdfs://: TensorFlow's file systems
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(data)
        return
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _read_bytes(path: str) -> bytes:
    if "://" in path:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _makedirs(directory: str) -> None:
    if "://" in directory:
        tf.io.gfile.makedirs(directory)
    else:
        os.makedirs(directory, exist_ok=True)


def _remove(path: str) -> None:
    if "://" in path:
        tf.io.gfile.remove(path)
    else:
        os.remove(path)


def _replace(source: str, target: str) -> None:
    if "://" in target:
        tf.io.gfile.rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


class BackupAndRestore(_BackingUp, keras.callbacks.Callback):
    """Backs up a parallel model's training state every epoch (the chief only) and resumes from it exactly.

    Pass it to every worker's ``fit``, with the same ``directory`` (one that
    every worker can read: a shared file system, or a ``gs://`` path). At each
    epoch end the chief writes ``directory/backup.npz``: the trained model's
    variables (the parallel model's clone, not the template's), the
    optimizer's (its step count and slots) and the number of epochs done,
    atomically. When the same program is started again after a lost worker,
    ``fit`` restores that state on every worker and runs only the epochs left:
    the final weights are those of an uninterrupted run. The workers first
    check that they all read the same checkpoint.

    A callback of the ``keras`` package (Keras 3); for a ``tf_keras`` (Keras 2)
    model use ``backup_class(tf_keras)``, the same callback for that Keras.
    Works on a single-process parallel model or plain Keras model too.

    Args:
        directory: the chief's backup directory (created if missing); its
            ``backup.npz`` is this callback's.
        delete_checkpoint: delete the checkpoint when ``fit`` ends normally
            (a later ``fit`` then starts afresh), as Keras' own callback does.

    Attributes:
        restored_epoch: the epoch the last ``fit`` resumed at (the epochs done
            before it), or None where it found no checkpoint.
        written: the files this process wrote (the chief's checkpoint; empty on other workers).

    Raises:
        ValueError: an empty ``directory``; when training starts, an uncompiled
            model, or a checkpoint of another model or optimizer (naming the variable).
        RuntimeError: when training starts, if the workers read different
            checkpoints (naming each worker's epoch).

    Examples:
        >>> cluster = harness.use_cluster()           # under `harness launch --workers 2 -- ...`
        >>> parallel = harness.parallelize(model, cluster, ratios=[3, 1])
        >>> parallel.compile(optimizer="adam", loss="mse")
        >>> backup = BackupAndRestore("/shared/run1/backup")
        >>> parallel.fit(x, y, batch_size=64, epochs=10, shuffle=False, callbacks=[backup])
        >>> if cluster.is_chief:
        ...     model.save("/shared/run1/model.keras")  # the plain single-device model
    """


@functools.cache
def backup_class(k) -> type:
    """``BackupAndRestore`` as a callback of Keras module ``k`` (``keras``, or ``tf_keras`` for its models).

    Args:
        k: a Keras module, e.g. ``harness.compat.keras_module_of(model)``.

    Returns:
        ``BackupAndRestore`` itself for ``keras``, else a subclass of ``k.callbacks.Callback`` that does the same.

    Examples:
        >>> import tf_keras
        >>> backup = backup_class(tf_keras)("/shared/run1/backup")
    """
    return callback_class(BackupAndRestore, _BackingUp, k)
