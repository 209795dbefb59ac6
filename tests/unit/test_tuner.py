"""The tuner's verify step when a probe never reached a device's memory ceiling (no TensorFlow)."""

import pytest

from harness.bench.tuning.probe import DeviceProbe, Point, _OutOfMemory
from harness.bench.tuning.tuner import _even_solo, _memory_ceilings


class _Split:
    def __init__(self, batches):
        self.batches = tuple(batches)
        self.global_batch = sum(batches)


def _probe(device: str, ceiling: int, stopped_by: str, max_batch: int, rate: float) -> DeviceProbe:
    """A probe that stopped growing at ``ceiling``; alone, its device runs out of memory above ``max_batch``."""
    probe = DeviceProbe(device, ceiling=ceiling, stopped_by=stopped_by)
    tried = []

    def run(batch: int, max_steps: int, min_seconds: float) -> Point:
        tried.append(batch)
        if batch > max_batch:
            raise _OutOfMemory(f"emulated out of memory on {device}: batch slice of {batch} samples exceeds "
                               f"its MAXBATCH {max_batch}")
        return Point(batch, True, batch / rate, 1)

    probe._runner = run
    probe.tried = tried
    return probe


def test_even_split_beyond_an_unprobed_ceiling_shrinks_to_fit():
    # Beside two CPU hogs, `harness tune --emulate F:600,S:300` stopped growing the slow device before its
    # ceiling (step time), so it looked unlimited; the even split of the tuned batch gave it 362 > 300 and
    # verify crashed with the emulated out-of-memory error instead of measuring an even split that fits.
    probes = [(_probe("/cpu:0", 600, "oom", 600, 4000.0), None),
              (_probe("/cpu:1", 150, "step time", 300, 2000.0), None)]
    split = _Split([480, 244])
    ceilings = _memory_ceilings(probes, split.global_batch)
    assert ceilings == [600, 724]  # the slow device looks unlimited: its probe never ran out of memory
    said = []
    even, rates = _even_solo(probes, split, ceilings, 0.1, said.append)
    assert even == (150, 150) and ceilings == [600, 150]
    assert rates == [pytest.approx(4000.0), pytest.approx(2000.0)]
    assert probes[1][0].tried == [362, 150]  # it ran out of memory at 362 once, then fitted what it fitted probed
    assert any("/cpu:1 ran out of memory alone at 362 (it fitted 150 while probed)" in line for line in said)


def test_out_of_memory_at_a_batch_the_probe_fitted_is_raised():
    probes = [(_probe("/cpu:0", 600, "oom", 600, 4000.0), None),
              (_probe("/cpu:1", 400, "step time", 300, 2000.0), None)]
    split = _Split([480, 244])
    with pytest.raises(_OutOfMemory, match="batch slice of 362 samples exceeds its MAXBATCH 300") as caught:
        _even_solo(probes, split, _memory_ceilings(probes, split.global_batch), 0.1, lambda line: None)
    assert caught.value.device_index == 1


def test_even_split_equal_to_the_tuned_one_is_not_measured_again():
    probes = [(_probe("/cpu:0", 600, "oom", 600, 4000.0), None), (_probe("/cpu:1", 600, "oom", 600, 4000.0), None)]
    even, rates = _even_solo(probes, _Split([300, 300]), [600, 600], 0.1, lambda line: None)
    assert even == (300, 300) and rates is None and probes[0][0].tried == []


def test_each_device_works_at_once_keeps_the_order_and_raises_the_first_error():
    import time

    from harness.bench.tuning.tuner import each_device

    began = time.perf_counter()
    assert each_device(lambda i: (time.sleep(0.3), i * i)[1], 3) == [0, 1, 4]
    assert time.perf_counter() - began < 0.8  # three 0.3 s works at once, not one after another (0.9 s)
    finished = []

    def work(i):
        time.sleep(0.05 * (3 - i))
        finished.append(i)
        if i:
            raise ValueError(f"device {i}")
        return i

    with pytest.raises(ValueError, match="device 1"):  # device order, after every device finished
        each_device(work, 3)
    assert sorted(finished) == [0, 1, 2]
    assert each_device(lambda i: i, 2, concurrent=False) == [0, 1]


@pytest.mark.parametrize(("tuned", "stock"), [((481, 240), (360, 360)), ((480, 240), (360, 360))])
def test_the_stock_baseline_runs_on_every_even_split_whatever_its_remainder(tuned, stock, monkeypatch):
    """Keras' fit splits a global batch in equal parts: on an odd global batch (721 over two devices, what the
    tuner chose beside two CPU hogs once) the even split is 361/360, and the stock row was left out without a
    word; it now runs on 360/360 and says why."""
    from harness.bench.tuning import tuner

    ran = {}

    def parallel(model, size, devices, specs, batches, method, *rest, **kw):
        ran[method] = tuple(batches)
        return {"batches": list(batches), "status": "complete", "host_bound": []}

    monkeypatch.setattr(tuner, "_even_solo", lambda probes, split, ceilings, *a: (
        tuple(b for b in ((split.global_batch + 1) // 2, split.global_batch // 2)), [1.0, 1.0]))
    out = _fake_verify(monkeypatch, tuned, parallel, [1.0, 1.0], compare_even=True)
    assert ran["keras"] == stock, ran
    assert ("note" in out["keras"]) == (sum(tuned) % 2 == 1), out["keras"]


@pytest.mark.parametrize(("ratio_faster", "kept"), [(True, "ratio"), (False, "tuned")])
def test_the_verification_keeps_the_faster_of_the_tuned_and_the_ratio_split(ratio_faster, kept, monkeypatch):
    """The ratio split (the global batch divided by the devices' speeds alone) is measured beside the tuned one
    and the faster is kept, with how much faster; the fake runs here measure what the test says."""

    def parallel(model, size, devices, specs, batches, method, *rest, **kw):
        ratio = tuple(batches) == (600, 300)
        speed = 1100.0 if ratio == ratio_faster else 1000.0
        return {"batches": list(batches), "status": "complete", "host_bound": [], "samples_per_second": speed}

    out = _fake_verify(monkeypatch, (500, 400), parallel, [4000.0, 2000.0], compare_even=False)  # 2:1 alone
    assert out["ratio"]["batches"] == [600, 300]
    assert out["kept"]["split"] == kept and out["kept"]["faster"] == pytest.approx(1.1)
    assert out["kept"]["why"] == f"1.100x the {'tuned' if kept == 'ratio' else 'ratio'} split's measured samples/s"


def _fake_verify(monkeypatch, tuned, parallel, solo, compare_even: bool) -> dict:
    """``tuner._verify`` of the split ``tuned`` over two devices whose runs are ``parallel`` (a fake of
    ``tuner._parallel``) and whose speeds alone are ``solo``: nothing trains."""
    import harness.bench.tuning.probe
    import harness.bench.tuning.solver
    from harness.bench.tuning import tuner

    split = _Split(tuned)
    split.samples_per_second = 1.0
    monkeypatch.setattr(tuner, "_parallel", parallel)
    monkeypatch.setattr(tuner, "_solo", lambda probes, batches, *a, **k: list(solo))
    monkeypatch.setattr(harness.bench.tuning.probe, "release_probes", lambda probes: list(probes))
    monkeypatch.setattr(harness.bench.tuning.solver, "predict",
                        lambda models, batches: type("P", (), {"samples_per_second": 1.0})())
    probes = [(_probe("/cpu:0", 900, "oom", 900, 4000.0), None), (_probe("/cpu:1", 900, "oom", 900, 2000.0), None)]
    return tuner._verify("m", "tiny", ("/cpu:0", "/cpu:1"), None, probes, split, None, "towers", 0.1, 1,
                         compare_even, 0, lambda line: None)


def test_a_verification_that_is_the_tuned_runs_record_is_not_warned_of_twice():
    # harness tune beyond the host (tests/parallel/test_tune.py), beside two CPU hogs: the ratio split came out as the
    # tuned one, whose record it then is ({**tuned}), and its host-bound entries were warned of as "verify ratio" too
    from harness.bench.tuning.tuner import host_bound_entries

    entry = {"device": "/device:CPU:0", "emulated_rate": 18112.0, "host_rate": 4035.0, "late_share": 1.0}
    tuned = {"batches": [180, 76], "host_bound": [entry]}
    same = {**tuned, "note": "the tuned split is the ratio split"}
    record = {"devices": [], "verify": {"tuned": tuned, "ratio": same, "even": dict(tuned),
                                        "keras": {"batches": [180, 76], "host_bound": [entry]},
                                        "kept": {"split": "tuned", "batches": [180, 76]}}}
    assert [e["phase"] for e in host_bound_entries(record)] == ["verify tuned", "verify keras"]
    record["verify"]["ratio"] = {"batches": [170, 86], "host_bound": [entry]}  # measured on its own
    assert [e["phase"] for e in host_bound_entries(record)] == ["verify tuned", "verify ratio", "verify keras"]
