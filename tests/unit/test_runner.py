"""Per-window device figures say how they were measured (no TensorFlow needed)."""

from __future__ import annotations

import pytest

from harness.bench.measure import Window
from harness.bench.nvml import FieldStats
from harness.bench.runner import RunConfig, gpu_index, host_bound, summarize_windows, window_record
from harness.emulate import EmulatedDevice, Emulator, Event


class _FakeTelemetry:
    def window(self, t0, t1):
        return {0: {"utilization_pct": FieldStats(97.0, 100.0, 90.0, 20),
                    "power_w": FieldStats(250.0, 260.0, 240.0, 20)}}


def test_gpu_index():
    assert gpu_index("/job:localhost/replica:0/task:0/device:GPU:1") == 1
    assert gpu_index("/device:CPU:0") is None


def test_gpu_devices_carry_nvml_telemetry():
    config = RunConfig("mnist_maxing", "full", "towers", ("/device:GPU:0", "/device:GPU:1"), (820, 568))
    record = window_record(Window(0, 10.0, 12.0, 4, 4 * 1388), config, None, _FakeTelemetry())
    first, second = record["devices"]
    assert first["source"] == "nvml" and first["telemetry"]["utilization_pct"]["mean"] == 97.0
    assert first["samples_per_second"] == 820 * 4 / 2.0
    assert second["source"] == "nvml" and "telemetry" not in second  # NVML had nothing for GPU 1


def test_emulated_devices_report_busy_time_and_logical_cpus_only_a_share():
    emulator = Emulator({"/device:CPU:0": EmulatedDevice(1000.0)})
    emulator._events.append(Event("/device:CPU:0", 10.0, 10.5, 500, work=0.1))
    config = RunConfig("mnist_maxing", "tiny", "towers", ("/device:CPU:0", "/device:CPU:1"), (500, 250))
    record = window_record(Window(0, 10.0, 11.0, 1, 750), config, emulator, None)
    emulated, plain = record["devices"]
    assert emulated["source"] == "emulated" and emulated["busy_fraction"] == 0.5 and emulated["busy_rate"] == 1000
    assert emulated["host_rate"] == pytest.approx(5000) and emulated["late_steps"] == 0
    assert plain["source"] == "share" and "busy_fraction" not in plain and "host_rate" not in plain
    assert record["host_bound"] == []
    summary = summarize_windows([record])
    assert summary["samples_per_second"]["median"] == 750
    assert summary["devices"][0]["busy_rate"]["median"] == 1000
    assert summary["devices"][0]["host_rate"] == pytest.approx(5000) and summary["host_bound"] == []


def test_a_device_late_in_more_than_a_tenth_of_its_steps_is_host_bound():
    # Seed-sized rates on a host that computes the slices at 2000 samples/s: the step ran past its deadline.
    emulator = Emulator({"/device:CPU:0": EmulatedDevice(40000.0), "/device:CPU:1": EmulatedDevice(1000.0)})
    for k in range(10):
        t = 10.0 + 0.1 * k
        emulator._events.append(Event("/device:CPU:0", t, t + 0.05, 100, work=0.05, late=k < 2))  # 2 of 10
        emulator._events.append(Event("/device:CPU:1", t, t + 0.1, 100, work=0.02, late=k < 1))  # 1 of 10
    config = RunConfig("mnist_maxing", "tiny", "towers", ("/device:CPU:0", "/device:CPU:1"), (100, 100),
                       emulate=tuple(emulator.devices.values()))
    record = window_record(Window(0, 9.9, 11.0, 10, 2000), config, emulator, None)
    assert record["host_bound"] == ["/device:CPU:0"]  # 20% late: host-bound; 10%: still the emulation's
    fast, slow = record["devices"]
    assert (fast["late_steps"], fast["logged_steps"], fast["host_bound"]) == (2, 10, True)
    assert fast["host_rate"] == pytest.approx(2000) and fast["emulated_rate"] == 40000
    assert (slow["late_steps"], slow["host_bound"]) == (1, False)
    summary = summarize_windows([record, {**record, "host_bound": []}])
    assert summary["host_bound"] == [{"device": "/device:CPU:0", "emulated_rate": 40000.0,
                                      "host_rate": pytest.approx(2000), "late_share": 0.2}]
    assert host_bound({"summary": summary}) == summary["host_bound"] and host_bound({"summary": None}) == []


def test_rebalance_and_throttle_are_validated_and_recorded():
    emulate = (EmulatedDevice(1000.0), EmulatedDevice(1000.0))
    devices = ("/device:CPU:0", "/device:CPU:1")
    config = RunConfig("mnist_maxing", "tiny", "towers", devices, (100, 100), emulate=emulate, rebalance_every=5,
                       throttle=[[1, 400.0, 7]])
    assert config.throttle == ((1, 400.0, 7),)
    record = config.to_json()
    assert record["rebalance_every"] == 5 and record["throttle"] == [{"device": 1, "rate": 400.0, "at_step": 7}]
    for kwargs, needle in [
        ({"rebalance_every": 0}, "rebalance_every must be an int >= 1 (steps per window); got rebalance_every=0"),
        ({"throttle": ((2, 400.0, 7),)}, "throttle device index must be 0..1 (2 devices); got 2"),
        ({"throttle": ((1, 0.0, 7),)}, "throttle rate must be a positive number of samples/s; got 0.0"),
        ({"throttle": ((1, 400.0, -1),)}, "throttle step must be an int >= 0; got -1"),
        ({"throttle": ((1, 400.0),)}, "a throttle entry is (device_index, rate, at_step); got (1, 400.0)"),
        ({"throttle": ((1, 400.0, 7),), "emulate": None}, "it needs emulate=..."),
    ]:
        with pytest.raises(ValueError) as info:
            RunConfig("mnist_maxing", "tiny", "towers", devices, (100, 100), **{"emulate": emulate, **kwargs})
        assert needle in str(info.value)
    with pytest.raises(ValueError, match="needs a parallel method"):
        RunConfig("mnist_maxing", "tiny", "single", devices[:1], (100,), rebalance_every=5)


def test_rebalanced_windows_count_the_samples_each_device_did():
    # With rebalancing, batches change within a window: a device's samples/s is what its logged steps did.
    emulator = Emulator({"/device:CPU:0": EmulatedDevice(1000.0), "/device:CPU:1": EmulatedDevice(400.0)})
    emulator._events.extend([Event("/device:CPU:0", 10.0, 10.1, 100), Event("/device:CPU:1", 10.0, 10.25, 100),
                             Event("/device:CPU:0", 10.25, 10.39, 143), Event("/device:CPU:1", 10.25, 10.39, 57)])
    config = RunConfig("mnist_maxing", "tiny", "towers", ("/device:CPU:0", "/device:CPU:1"), (100, 100),
                       emulate=tuple(emulator.devices.values()), rebalance_every=1)
    record = window_record(Window(0, 10.0, 10.4, 2, 400), config, emulator, None, (143, 57))
    assert [d["batch"] for d in record["devices"]] == [143, 57]
    assert [d["samples_per_second"] for d in record["devices"]] == pytest.approx([243 / 0.4, 157 / 0.4])


def test_compare_marks_host_bound_rows_and_warns_once(capsys):
    from harness.cli.compare import _warn_host_bound, comparison_table

    def row(label, bound):
        entries = [{"device": "/device:CPU:0", "emulated_rate": 40000.0, "host_rate": rate, "late_share": 1.0}
                   for rate in bound]
        return {"label": label, "status": "complete", "error": None, "config": {"batches": [100, 100]},
                "summary": {"samples_per_second": {"median": 9000.0, "spread": 0.01}, "devices": [],
                            "host_bound": entries}}

    rows = [row("even towers", [8000.0]), row("ratio towers", [9500.0]), row("CPU:1 alone", [])]
    table = comparison_table(rows).splitlines()
    assert table[2].endswith("HOST-BOUND: CPU:0") and table[3].endswith("HOST-BOUND: CPU:0")
    assert table[4].endswith("ok")
    _warn_host_bound(rows)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("harness compare: warning: 2 of 3 configurations (even towers, ratio towers): host-bound:")
    assert "this host computes its slices at 9500" in line  # the device's best rate over the configurations


def test_the_stock_method_splits_evenly_and_is_no_parallel_method():
    devices = ("/device:CPU:0", "/device:CPU:1")
    RunConfig("mnist_maxing", "tiny", "keras", devices, (128, 128))
    RunConfig("mnist_maxing", "tiny", "keras", devices[:1], (256,))
    with pytest.raises(ValueError) as info:
        RunConfig("mnist_maxing", "tiny", "keras", devices, (160, 96))
    assert str(info.value) == ("method 'keras' splits the global batch evenly (stock MirroredStrategy); got batches "
                               "[160, 96]: use 2 equal batches such as [128, 128]")
    with pytest.raises(ValueError, match="rebalance_every needs a parallel method .* got method 'keras'"):
        RunConfig("mnist_maxing", "tiny", "keras", devices, (128, 128), rebalance_every=5)
    with pytest.raises(ValueError, match="unknown method 'stock'; choose from single, towers, mirrored, keras"):
        RunConfig("mnist_maxing", "tiny", "stock", devices, (128, 128))


def test_versus_stock_pairs_each_harness_row_with_the_stock_row_it_replaces():
    from harness.cli.compare import versus_stock

    def row(label, method, devices, value):
        summary = None if value is None else {"samples_per_second": {"median": value}}
        return {"label": label, "config": {"method": method, "devices": devices}, "summary": summary}

    one, two = ["/device:CPU:0"], ["/device:CPU:0", "/device:CPU:1"]
    rows = [row("CPU:0 alone", "single", one, 90.0), row("CPU:0 whole", "single", one, 95.0),
            row("CPU:0 keras", "keras", one, 100.0), row("even keras", "keras", two, 80.0),
            row("even towers", "towers", two, 120.0), row("even mirrored", "mirrored", two, None),
            row("ratio towers", "towers", two, 130.0)]
    assert versus_stock(rows) == [
        {"row": "CPU:0 whole", "baseline": "CPU:0 keras", "ratio": 0.95, "modelled": False},
        {"row": "even towers", "baseline": "even keras", "ratio": 1.5, "modelled": False},
        {"row": "even towers", "baseline": "CPU:0 keras", "ratio": 1.2, "modelled": False},
    ]  # a row that did not complete, and the ratio split (no stock row splits so), are left out
    assert versus_stock(rows[:2] + rows[4:]) == []  # no stock rows: nothing to compare with


def test_on_emulated_links_a_ratio_of_rows_charged_differently_is_withheld_and_the_rest_say_modelled():
    """The link model charges harness' overlapped rows their copies beside the step and the stock baseline its
    copies inside its step: their ratio would be the model's charging, not the methods'. Rows charged alike
    (serial: harness without the overlap beside stock) keep their ratio, labelled modelled."""
    from harness.cli.compare import _status, charging, overlap_gain, versus_stock

    link = {"rate": 600.0, "max_batch": None, "overhead_ms": 0.0, "link": {"gb_per_s": 0.004, "latency_us": 10.0}}
    two = ["/device:CPU:0", "/device:CPU:1"]

    def row(label, method, value, overlap=True, emulate=(link, link)):
        return {"label": label, "status": "complete", "config": {
            "method": method, "devices": two, "emulate": list(emulate), "overlap": overlap},
                "summary": {"samples_per_second": {"median": value}, "devices": []}}

    rows = [row("even keras", "keras", 100.0), row("even towers", "towers", 190.0),
            row("even mirrored", "mirrored", 120.0, overlap=False), row("tuned towers", "towers", 200.0),
            row("tuned towers no overlap", "towers", 90.0, overlap=False)]
    assert [charging(r) for r in rows] == ["serial", "overlapped", "serial", "overlapped", "serial"]
    assert charging(row("even towers", "towers", 1.0, emulate=({**link, "link": None},) * 2)) is None
    found = versus_stock(rows)
    assert found[0] == {"row": "even towers", "baseline": "even keras", "ratio": None, "withheld": (
        "modelled links charged unequally (even towers: overlapped; even keras: serial)")}
    assert found[1] == {"row": "even mirrored", "baseline": "even keras", "ratio": 1.2, "modelled": True}
    assert overlap_gain(rows) == [{"row": "tuned towers", "baseline": "tuned towers no overlap",
                                   "ratio": 200.0 / 90.0, "modelled": True}]
    assert _status(rows[0]) == "ok; modelled links: copies inside the step"
    assert _status(rows[1]).startswith("ok; modelled links: copies beside the step (forward share 0.33, assumed)")
