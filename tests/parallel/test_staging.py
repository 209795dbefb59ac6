"""Staging (``harness.parallel.staging``): each device's next slice is copied while the step runs.

A staged fit trains the same batches in the same order as an unstaged one, and (towers) to the same bits;
on emulated devices with links, the copy of the next slice runs beside the step instead of inside it.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_models import METHODS

import harness
from harness.parallel.staging import Stager


def _fit(k, devices, method, overlap, data, **fit):
    k.utils.set_random_seed(3)
    model = k.Sequential([k.Input((6,)), k.layers.Dense(16, activation="relu"), k.layers.Dense(2)])
    parallel = harness.parallelize(model, devices, ratios=[3, 2], method=method, overlap=overlap)
    parallel.compile(optimizer=k.optimizers.Adam(0.01, clipnorm=1.0), loss="mse", metrics=["mae"])
    history = parallel.fit(*data, verbose=0, **fit).history
    stager = parallel._stager
    return (history, [w.numpy() for w in model.weights], int(parallel.optimizer.iterations.numpy()),
            stager.calls if stager is not None else 0)


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(230, 6)).astype("float32")
    return x, np.stack([x[:, 0] - x[:, 1], x[:, 2] * x[:, 3]], 1).astype("float32")


def _close(a, b, exact):
    if exact:
        return a == b
    return a.keys() == b.keys() and all(np.allclose(a[key], b[key], rtol=1e-5, atol=0) for key in a)


@pytest.mark.parametrize("method", METHODS)
def test_a_staged_fit_trains_like_an_unstaged_one(logical_devices, any_keras, method):
    """Arrays with a partial last batch and a validation split over two epochs, then a dataset read three
    batches an epoch (Keras keeps its iterator across epochs): staging ran every step, and the history, the
    weights and the step count are the unstaged fit's (towers: to the bit; mirrored: to float32 rounding,
    its replicas' sums may order differently in another graph)."""
    k, devices = any_keras, logical_devices[:2]
    x, y = _arrays()
    arrays = dict(batch_size=40, epochs=2, shuffle=False, validation_split=0.1)
    import tensorflow as tf

    def dataset():
        return (tf.data.Dataset.from_tensor_slices((x, y)).batch(30),)

    for data, fit, steps in [((x, y), arrays, 2 * 6), (None, dict(epochs=2, steps_per_epoch=3), 6)]:
        staged = _fit(k, devices, method, True, data or dataset(), **fit)
        plain = _fit(k, devices, method, False, data or dataset(), **fit)
        assert staged[3] == steps and plain[3] == 0  # every step staged, or none
        assert staged[2] == plain[2] == steps
        assert _close(staged[0], plain[0], exact=method == "towers"), (staged[0], plain[0])
        for a, b in zip(staged[1], plain[1]):
            np.testing.assert_allclose(a, b, rtol=0 if method == "towers" else 1e-5, atol=0)
    import threading

    # The staging thread ends with its fit: a process fitting many models kept one idle thread per model before.
    assert not [t.name for t in threading.enumerate() if t.name.startswith("harness-staging")]


@pytest.mark.extended  # the quick loop keeps the comparison; its planted defects run in the deeper half
@pytest.mark.covered_by("tests/parallel/test_staging.py::test_a_staged_fit_trains_like_an_unstaged_one[keras3-towers]",
                        "tests/parallel/test_staging.py::test_a_staged_fit_trains_like_an_unstaged_one[keras3-mirrored]")
def test_a_batch_staged_from_another_iterator_is_dropped(logical_devices, monkeypatch):
    """The planted defect: a stager that trains what it staged whatever iterator it came from carries the
    end of one epoch's data into the next (its first step ends it at once): the fit is no longer the
    unstaged fit, which the comparison above would see."""
    import keras

    devices = logical_devices[:2]
    x, y = _arrays()
    fit = dict(batch_size=40, epochs=2, shuffle=False)
    plain = _fit(keras, devices, "towers", False, (x, y), **fit)
    staged = _fit(keras, devices, "towers", True, (x, y), **fit)
    assert staged[0] == plain[0]
    monkeypatch.setattr(Stager, "_belongs", lambda self, pending, iterator: True)
    wrong = _fit(keras, devices, "towers", True, (x, y), **fit)
    assert wrong[2] != plain[2] or wrong[0] != plain[0], "the planted defect went unseen"


@pytest.mark.timing
@pytest.mark.parametrize("method", METHODS)
def test_staging_hides_the_slice_copy_behind_the_step(logical_devices, any_keras, method):
    """On emulated devices with links, the next slice's copy is logged as a copy of its bytes at bytes /
    bandwidth + latency, runs while a step runs, and leaves the step's own link charges (weights, gradients,
    outputs); the steps follow each other faster than with the copy inside each step (``overlap=False``).
    A step (50 ms of compute, ~35 ms of link) outlasts the copy (40 ms) and what a loaded host delays the
    copy's thread by (at 10 ms steps, beside two CPU hogs, 3 of 8 copies started after their step ended)."""
    k, devices = any_keras, logical_devices[:2]
    features, rows, gb_per_s, latency_us, rate = 2000, 40, 0.004, 100.0, 400.0
    x = np.random.default_rng(0).normal(size=(rows * 8, features)).astype("float32")
    y = np.zeros((rows * 8, 8), "float32")
    emulate = ",".join([f"{rate:g}@{gb_per_s}/{latency_us:g}"] * 2)
    slice_bytes = x[: rows // 2].nbytes
    copy_seconds = latency_us / 1e6 + slice_bytes / (gb_per_s * 1e9)  # 20 rows of 8 kB over 4 MB/s: 40 ms
    gaps = {}
    for overlap in (True, False):
        model = k.Sequential([k.Input((features,)), k.layers.Dense(8)])
        parallel = harness.parallelize(model, devices, ratios=[1, 1], method=method, emulate=emulate,
                                       overlap=overlap)
        parallel.compile(optimizer="sgd", loss="mse")
        parallel.fit(x, y, batch_size=rows, epochs=1, verbose=0)
        events = [e for e in parallel.emulator._events if e.device == devices[1]]
        steps = [e for e in events if not e.copy]
        copies = [e for e in events if e.copy]
        gaps[overlap] = float(np.median(np.diff([e.start for e in steps])))
        weight_bytes = sum(w.numpy().nbytes for w in model.trainable_weights)
        own = 2 * weight_bytes + y[: rows // 2].nbytes  # weights in, gradients and outputs out
        assert len(steps) == 8
        if not overlap:
            assert not copies and {e.moved for e in steps} == {own + slice_bytes}
            continue
        assert len(copies) >= 8 and {e.moved for e in copies} == {slice_bytes}  # the last one may be dropped
        assert [e.link for e in copies] == pytest.approx([copy_seconds] * len(copies), rel=1e-9)
        assert {e.moved for e in steps} == {own}
        # Each copy after the first (staged before the first step) overlaps a step of its device.
        beside = [c for c in copies[1:] if any(s.start < c.end and c.start < s.end for s in steps)]
        assert len(beside) >= len(copies) - 2, (copies, steps)
    assert gaps[True] < gaps[False] - copy_seconds / 2, gaps


@pytest.mark.extended
def test_a_train_function_made_again_mid_fit_keeps_the_staged_batch(logical_devices, any_keras, monkeypatch):
    """``time_devices`` (what ``ratios="auto"`` and ``Rebalance`` call) makes the train function again while a
    batch is staged: the fit still trains every batch once, in order, as the unstaged fit (then a
    ``train_on_batch`` runs Keras' own function). The planted defect, a retrace that drops the staged batch,
    skips one batch: the weights differ."""
    k, devices = any_keras, logical_devices[:2]
    x, y = _arrays()

    class Retime(k.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.time_devices()

    def fit(overlap):
        k.utils.set_random_seed(3)
        model = k.Sequential([k.Input((6,)), k.layers.Dense(4), k.layers.Dense(2)])
        parallel = harness.parallelize(model, devices, ratios=[3, 2], method="towers", overlap=overlap)
        parallel.compile(optimizer=k.optimizers.SGD(0.05), loss="mse")
        parallel.fit(x, y, batch_size=40, epochs=1, shuffle=False, verbose=0, callbacks=[Retime()])
        parallel.train_on_batch(x[:40], y[:40])
        return [w.numpy() for w in model.weights]

    plain = fit(False)
    for a, b in zip(fit(True), plain):
        np.testing.assert_array_equal(a, b)
    retrace = Stager.retrace

    def dropping(self, keras_function):
        retrace(self, keras_function)
        self.drain()

    monkeypatch.setattr(Stager, "retrace", dropping)
    assert any(not np.array_equal(a, b) for a, b in zip(fit(True), plain)), "the planted defect went unseen"


@pytest.mark.parametrize("method", METHODS)
def test_an_overlapped_step_pays_only_what_its_transfers_add_beyond_its_compute(logical_devices, any_keras, method):
    """The link model's overlapped step, as the emulator charges it: the device off the merge device reads the
    weights while its forward pass runs and sends its gradients and outputs while its backward pass runs (a
    third and two thirds of its compute: emulate.FORWARD_SHARE, an assumption). Those transfers are no ops of
    their own on a CPU: one deadline models them (``EmulatedDevice.overlapped_seconds``), so what this checks is
    the emulator's charge, not a concurrency it could observe (figures made so are labelled modelled:
    ``harness compare``'s status, ``harness run``'s "emulated, modelled link"). The concurrency that does run,
    the next slice's copy beside the step, is observed by its timestamps in
    test_staging_hides_the_slice_copy_behind_the_step. The step lasts the slowest of those paths, within 10%,
    and the link time it logs is what they add to the compute. Without the overlap (test_emulate) every
    transfer adds to the step."""
    k, devices = any_keras, logical_devices[:2]
    features, rows, gb_per_s, latency_us, rate = 2000, 40, 0.004, 100.0, 500.0
    x = np.random.default_rng(0).normal(size=(rows * 6, features)).astype("float32")
    y = np.zeros((rows * 6, 8), "float32")
    model = k.Sequential([k.Input((features,)), k.layers.Dense(8)])
    emulate = ",".join([f"{rate:g}@{gb_per_s}/{latency_us:g}"] * 2)
    parallel = harness.parallelize(model, devices, ratios=[1, 1], method=method, emulate=emulate)
    parallel.compile(optimizer="sgd", loss="mse")
    parallel.fit(x, y, batch_size=rows, epochs=1, verbose=0)
    steps = [e for e in parallel.emulator._events if e.device == devices[1] and not e.copy]
    weights = [w.numpy() for w in model.trainable_weights]
    weight_bytes = sum(w.nbytes for w in weights)

    def link(size, transfers):
        return transfers * latency_us / 1e6 + size / (gb_per_s * 1e9)

    compute = (rows // 2) / rate  # 40 ms
    reads = link(weight_bytes, len(weights))  # 16 ms: beside the forward pass (13 ms)
    sent = weight_bytes + y[: rows // 2].nbytes  # its gradients and outputs
    sends = link(sent, len(weights) + 1)
    forward_end = max(compute / 3, reads)
    # The last tensor out leaves after the backward pass: one of the average size sent.
    end = max(forward_end + 2 * compute / 3 + link(sent / (len(weights) + 1), 1), forward_end + sends)
    # (with these figures the overlap would hide more than 20 ms of the 73 ms the transfers take one after another)
    busy = [e.end - e.start for e in steps]
    assert float(np.median(busy)) == pytest.approx(end, rel=0.10), (busy, end)
    assert [e.link for e in steps] == pytest.approx([end - compute] * len(steps), rel=1e-6)
