"""Per-window device figures say how they were measured (no TensorFlow needed)."""

from __future__ import annotations

from harness.emulate import EmulatedDevice, Emulator
from harness.measure import Window
from harness.nvml import FieldStats
from harness.runner import RunConfig, _summary, _window_record, gpu_index


class _FakeTelemetry:
    def window(self, t0, t1):
        return {0: {"utilization_pct": FieldStats(97.0, 100.0, 90.0, 20),
                    "power_w": FieldStats(250.0, 260.0, 240.0, 20)}}


def test_gpu_index():
    assert gpu_index("/job:localhost/replica:0/task:0/device:GPU:1") == 1
    assert gpu_index("/device:CPU:0") is None


def test_gpu_devices_carry_nvml_telemetry():
    config = RunConfig("mnist_maxing", "full", "towers", ("/device:GPU:0", "/device:GPU:1"), (820, 568))
    record = _window_record(Window(0, 10.0, 12.0, 4, 4 * 1388), config, None, _FakeTelemetry())
    first, second = record["devices"]
    assert first["source"] == "nvml" and first["telemetry"]["utilization_pct"]["mean"] == 97.0
    assert first["samples_per_second"] == 820 * 4 / 2.0
    assert second["source"] == "nvml" and "telemetry" not in second  # NVML had nothing for GPU 1


def test_emulated_devices_report_busy_time_and_logical_cpus_only_a_share():
    emulator = Emulator({"/device:CPU:0": EmulatedDevice(1000.0)})
    emulator._events.append(("/device:CPU:0", 10.0, 10.5, 500))
    config = RunConfig("mnist_maxing", "tiny", "towers", ("/device:CPU:0", "/device:CPU:1"), (500, 250))
    record = _window_record(Window(0, 10.0, 11.0, 1, 750), config, emulator, None)
    emulated, plain = record["devices"]
    assert emulated["source"] == "emulated" and emulated["busy_fraction"] == 0.5 and emulated["busy_rate"] == 1000
    assert plain["source"] == "share" and "busy_fraction" not in plain
    summary = _summary([record])
    assert summary["samples_per_second"]["median"] == 750
    assert summary["devices"][0]["busy_rate"]["median"] == 1000
