"""harness.bench.nvml: GPU listing in CUDA order, field-by-field degradation, telemetry sampler.

Every scenario swaps in a small fake ``pynvml`` through ``monkeypatch.setitem(sys.modules, ...)``,
so nothing leaks between tests and the real library is never patched.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time
import types
from types import SimpleNamespace

import pytest

from harness.bench import nvml
from harness.bench.nvml import NvmlDevice, NvmlWarning, TelemetrySampler, map_visible_devices

H100 = "NVIDIA H100 80GB HBM3"
UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000",
         "GPU-aaaa3333-0000-0000-0000-000000000000"]


class FakeGpu:
    def __init__(self, name, uuid, bus, utils=(50,)):
        self.name, self.uuid, self.bus = name, uuid, bus
        self.utils = itertools.cycle(utils)


def make_pynvml(gpus, *, init_error=None, unsupported=()):
    """A stand-in for the ``pynvml`` module: the calls harness.bench.nvml makes, nothing else."""
    lib = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value=999):
            super().__init__(value)
            self.value = value

        def __str__(self):
            return f"fake NVML error {self.value}"

    class NVMLError_NotSupported(NVMLError):  # pynvml's names
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    lib.NVMLError, lib.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    lib.NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    lib.NVML_TEMPERATURE_GPU, lib.NVML_CLOCK_SM, lib.NVML_CLOCK_MEM = 0, 1, 2
    lib.calls = {"init": 0, "shutdown": 0}

    def nvmlInit():
        if init_error is not None:
            raise getattr(lib, init_error)(9)
        lib.calls["init"] += 1

    def nvmlShutdown():
        lib.calls["shutdown"] += 1

    def field(name, fn):
        def call(*args):
            if name in unsupported:
                raise NVMLError_NotSupported(3)
            return fn(*args)
        setattr(lib, name, call)

    lib.nvmlInit, lib.nvmlShutdown = nvmlInit, nvmlShutdown
    field("nvmlDeviceGetCount", lambda: len(gpus))
    field("nvmlDeviceGetHandleByIndex", lambda i: gpus[i])
    field("nvmlDeviceGetName", lambda h: h.name)
    field("nvmlDeviceGetUUID", lambda h: h.uuid)
    field("nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=h.bus.encode()))  # bytes, as older pynvml
    field("nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(total=80 * 1024**3, used=2 * 1024**3))
    field("nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0))
    field("nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000)
    field("nvmlSystemGetDriverVersion", lambda: "550.54.15")
    field("nvmlSystemGetCudaDriverVersion", lambda: 12040)
    field("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=next(h.utils), memory=10))
    field("nvmlDeviceGetPowerUsage", lambda h: 312_500)
    field("nvmlDeviceGetTemperature", lambda h, sensor: 61)
    field("nvmlDeviceGetClockInfo", lambda h, kind: {1: 1980, 2: 2619}[kind])
    return lib


def two_gpus(**kwargs):
    gpus = [FakeGpu(H100, UUIDS[0], "00000000:1B:00.0", (10, 50, 90)),
            FakeGpu(H100, UUIDS[1], "00000000:3B:00.0", (20,))]
    return make_pynvml(gpus, **kwargs)


def nvml_warnings(recwarn):
    return [str(w.message) for w in recwarn if issubclass(w.category, NvmlWarning)]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setattr(nvml, "_warned", set())  # "once per process" must not span tests
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


@pytest.fixture
def use(monkeypatch):
    def install(lib):
        monkeypatch.setitem(sys.modules, "pynvml", lib)
        return lib
    return install


def test_importing_the_module_imports_no_pynvml_and_no_tensorflow():
    code = "import sys, harness.bench.nvml; print('pynvml' in sys.modules, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


# --- degradation ---------------------------------------------------------------------------------


def test_no_library_gives_nothing_and_warns_once(use, recwarn):
    use(None)  # a None entry makes `import pynvml` raise ImportError
    assert nvml.gpus() == []
    assert nvml.sample() == []
    assert nvml.driver_version() is None and nvml.cuda_driver_version() is None
    (message,) = nvml_warnings(recwarn)
    assert "nvidia-ml-py" in message


def test_driver_not_loaded_gives_nothing_and_warns_once(use, recwarn):
    lib = use(two_gpus(init_error="NVMLError_DriverNotLoaded"))
    assert nvml.gpus() == [] and nvml.gpus() == []
    (message,) = nvml_warnings(recwarn)
    assert "NVMLError_DriverNotLoaded" in message
    assert lib.calls["shutdown"] == 0  # never shut down what did not start


def test_zero_gpus(use, recwarn):
    lib = use(make_pynvml([]))
    assert nvml.gpus() == []
    assert nvml_warnings(recwarn) == ["NVML reports no NVIDIA GPUs"]
    assert lib.calls["init"] == lib.calls["shutdown"] == 1


def test_two_gpus_all_fields(use, recwarn):
    lib = use(two_gpus())
    first, second = nvml.gpus()
    assert first == nvml.GpuInfo(
        index=0, nvml_index=0, name=H100, uuid=UUIDS[0], pci_bus_id="00000000:1B:00.0", memory_total_mib=81920,
        compute_capability="9.0", power_limit_w=700.0, driver_version="550.54.15", cuda_driver_version="12.4",
    )
    assert (second.index, second.uuid) == (1, UUIDS[1])
    assert nvml.driver_version() == "550.54.15" and nvml.cuda_driver_version() == "12.4"
    assert nvml_warnings(recwarn) == []
    assert lib.calls["init"] == lib.calls["shutdown"] == 3


def test_unsupported_field_is_none_with_exactly_one_warning(use, recwarn):
    use(two_gpus(unsupported={"nvmlDeviceGetPowerUsage"}))
    readings = [s for _ in range(3) for s in nvml.sample()]
    assert len(readings) == 6
    assert all(s.power_w is None for s in readings)
    assert all(s.temperature_c == 61 and s.sm_clock_mhz == 1980 and s.memory_used_mib == 2048 for s in readings)
    (message,) = nvml_warnings(recwarn)
    assert "power" in message and "NVMLError_NotSupported" in message


def test_unsupported_name_keeps_the_gpu(use, recwarn):
    use(two_gpus(unsupported={"nvmlDeviceGetName", "nvmlDeviceGetCudaComputeCapability"}))
    found = nvml.gpus()
    assert [(g.name, g.compute_capability, g.uuid) for g in found] == [(None, None, UUIDS[0]), (None, None, UUIDS[1])]
    assert len(nvml_warnings(recwarn)) == 2  # two distinct causes


# --- CUDA_VISIBLE_DEVICES and order ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1,0", [UUIDS[1], UUIDS[0]]),
        (" 1 ", [UUIDS[1]]),
        (f"{UUIDS[1]},{UUIDS[0]}", [UUIDS[1], UUIDS[0]]),
        ("GPU-bbbb", [UUIDS[1]]),  # a unique prefix is enough
        ("gpu-AAAA1111", [UUIDS[0]]),
        ("-1", []),
        ("", []),
    ],
)
def test_visible_devices_select_and_reorder(use, monkeypatch, recwarn, visible, expected):
    use(two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = nvml.gpus()
    assert [g.uuid for g in found] == expected
    assert [g.index for g in found] == list(range(len(expected)))
    assert nvml_warnings(recwarn) == []


@pytest.mark.parametrize(("visible", "kept", "why"), [
    ("0,7,1", 1, "'7' names no GPU"),
    ("1,x,0", 1, "'x' is neither"),
    ("0,0,1", 1, "repeats"),
    ("0,-1,1", 1, "'-1'"),
    ("GPU-zzz,0", 0, "matches no GPU"),
    ("MIG-1234,0", 0, "MIG"),
])
def test_invalid_entry_ends_the_list_with_a_warning(use, monkeypatch, recwarn, visible, kept, why):
    use(two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert len(nvml.gpus()) == kept
    (message,) = nvml_warnings(recwarn)
    assert why in message and "CUDA ignores it" in message


def test_ambiguous_uuid_prefix_ends_the_list():
    ids = [NvmlDevice(H100, u, f"0:{i}:0.0") for i, u in enumerate(UUIDS)]
    positions, (note,) = map_visible_devices(ids, "GPU-bbbb,GPU-aaaa,0", None)
    assert positions == [1]
    assert "matches 2 GPUs' UUIDs" in note


def test_nvml_order_is_remapped_to_pci_bus_order():
    ids = [NvmlDevice(H100, "GPU-b", "00000000:3B:00.0"), NvmlDevice(H100, "GPU-a", "0000:1b:00.0")]
    assert map_visible_devices(ids, None) == ([1, 0], [])
    assert map_visible_devices(ids, "0") == ([1], [])


def test_unparsable_bus_ids_keep_nvml_order():
    ids = [NvmlDevice(H100, "GPU-b", None), NvmlDevice(H100, "GPU-a", "0000:1b:00.0")]
    assert map_visible_devices(ids, None) == ([0, 1], [])


@pytest.mark.parametrize(("visible", "order", "warned"), [
    (None, None, True),
    ("1,0", "FASTEST_FIRST", True),
    (None, "PCI_BUS_ID", False),
    ("1,0", " pci_bus_id ", False),
    (f"{UUIDS[1]}", None, False),  # UUIDs name GPUs exactly: the order cannot matter
])
def test_mixed_models_warn_unless_pci_bus_order(visible, order, warned):
    ids = [NvmlDevice("NVIDIA A100-SXM4-40GB", UUIDS[0], "0:1:0.0"), NvmlDevice(H100, UUIDS[1], "0:2:0.0")]
    notes = [n for n in map_visible_devices(ids, visible, order)[1] if "CUDA_DEVICE_ORDER" in n]
    assert bool(notes) == warned
    if warned:
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in notes[0] and "PCI bus order" in notes[0]


def test_mixed_models_warn_once_per_process(use, recwarn):
    gpus = [FakeGpu("NVIDIA A100-SXM4-40GB", UUIDS[0], "0:1:0.0"), FakeGpu(H100, UUIDS[1], "0:2:0.0")]
    use(make_pynvml(gpus))
    assert len(nvml.gpus()) == 2 and len(nvml.gpus()) == 2
    (message,) = nvml_warnings(recwarn)
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in message


# --- telemetry ------------------------------------------------------------------------------------


def test_sampler_reads_at_10_hz_and_summarises(use, recwarn):
    lib = use(two_gpus())
    with TelemetrySampler() as telemetry:
        assert telemetry.is_running
        time.sleep(0.55)
    assert not telemetry.is_running
    assert lib.calls["init"] == lib.calls["shutdown"]
    samples = telemetry.samples
    for gpu in (0, 1):
        times = [s.time for s in samples if s.gpu == gpu]
        assert 3 <= len(times) <= 8, times
        assert 0.07 < statistics.median(b - a for a, b in zip(times, times[1:])) < 0.2
    summary = telemetry.summary()
    assert sorted(summary) == [0, 1]
    util = summary[0]["utilization_pct"]
    assert (util.max, util.min) == (90, 10) and 10 < util.mean < 90
    assert summary[1]["power_w"] == nvml.FieldStats(312.5, 312.5, 312.5, util.count)
    assert set(summary[0]) == set(nvml.FIELDS)
    assert nvml_warnings(recwarn) == []


def test_window_keeps_only_samples_inside(use):
    use(two_gpus())
    with TelemetrySampler([1], interval=0.02) as telemetry:
        time.sleep(0.1)
        t0 = time.perf_counter()
        time.sleep(0.1)
        t1 = time.perf_counter()
        time.sleep(0.05)
    inside = [s for s in telemetry.samples if t0 <= s.time <= t1]
    window = telemetry.window(t0, t1)
    assert list(window) == [1]
    assert window[1]["sm_clock_mhz"].count == len(inside) < len(telemetry.samples)
    empty = telemetry.window(t1 + 100, t1 + 200)
    assert empty[1]["temperature_c"] == nvml.FieldStats(None, None, None, 0)
    with pytest.raises(ValueError, match="t0=2, t1=1"):
        telemetry.window(2, 1)


def test_sampler_without_library_is_a_no_op(use, recwarn):
    use(None)
    with TelemetrySampler() as telemetry:
        assert not telemetry.is_running
    assert telemetry.samples == [] and telemetry.summary() == {} and telemetry.window(0, 1e12) == {}
    assert len(nvml_warnings(recwarn)) == 1


def test_sampler_skips_unknown_indices_with_a_warning(use, recwarn):
    use(two_gpus())
    with TelemetrySampler([1, 5], interval=0.05) as telemetry:
        time.sleep(0.06)
    assert {s.gpu for s in telemetry.samples} == {1}
    (message,) = nvml_warnings(recwarn)
    assert "[5]" in message


@pytest.mark.filterwarnings("ignore::harness.bench.nvml.NvmlWarning")
def test_sampler_arguments_and_single_start(use):
    use(None)
    with pytest.raises(ValueError, match="interval=0"):
        TelemetrySampler(interval=0)
    with pytest.raises(ValueError, match="indices=\\[-1\\]"):
        TelemetrySampler([-1])
    telemetry = TelemetrySampler().start()
    with pytest.raises(RuntimeError, match="starts only once"):
        telemetry.start()
    telemetry.stop()
    telemetry.stop()


# --- the real library -----------------------------------------------------------------------------


def test_real_library_degrades_without_a_driver(recwarn):
    pytest.importorskip("pynvml")
    found = nvml.gpus()
    if found:
        pytest.skip("an NVIDIA driver is present; the gpu-marked test covers this machine")
    assert len(nvml_warnings(recwarn)) == 1
    assert nvml.sample() == [] and nvml.driver_version() is None


@pytest.mark.gpu
def test_real_gpus_and_telemetry():
    found = nvml.gpus()
    assert found, "gpu marker says there is a GPU, but NVML lists none"
    assert all(g.name and g.uuid and g.uuid.startswith(("GPU-", "MIG-")) for g in found)
    assert all(g.pci_bus_id and g.memory_total_mib for g in found)
    assert [g.index for g in found] == list(range(len(found)))
    assert nvml.driver_version() is not None
    with TelemetrySampler([0]) as telemetry:
        time.sleep(1.0)
    assert telemetry.summary()[0]["memory_used_mib"].count >= 5
