"""NVIDIA GPUs through NVML: which are installed, in CUDA's numbering, and telemetry during a run.

The only module that imports ``pynvml`` (package ``nvidia-ml-py``), and only inside functions:
importing this module costs nothing and never touches the driver. Nothing here imports
TensorFlow, creates a CUDA context or allocates GPU memory.

Nothing here raises because NVML is missing or limited: no library, no driver or no GPUs give
an empty list, and a field a GPU cannot report is ``None``. Each distinct cause is reported
once per process as an ``NvmlWarning``.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.errors import InvalidValue

__all__ = [
    "FIELDS",
    "FieldStats",
    "GpuInfo",
    "GpuSample",
    "NvmlDevice",
    "NvmlWarning",
    "TelemetrySampler",
    "cuda_driver_version",
    "driver_version",
    "gpus",
    "map_visible_devices",
    "sample",
    "summarise",
]

FIELDS = ("utilization_pct", "memory_used_mib", "power_w", "temperature_c", "sm_clock_mhz", "memory_clock_mhz")
_MIB = 1024 * 1024


class NvmlWarning(RuntimeWarning):
    """NVML could not report something; the affected values are ``None`` or absent."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(cause: str, message: str) -> None:
    # One warning per cause per process: a sampler at 10 Hz must not repeat itself every tick.
    with _warned_lock:
        if cause in _warned:
            return
        _warned.add(cause)
    # Point the warning at the first caller outside this module (and contextlib, for _session).
    frame, level, ours = sys._getframe(0), 1, {__file__, contextlib.__file__}
    while frame.f_back is not None and frame.f_code.co_filename in ours:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, NvmlWarning, stacklevel=level)


def _describe(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # a pynvml error's __str__ itself calls into the library
        text = ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def _session() -> Iterator[Any]:
    """Yields the initialised ``pynvml`` module, or ``None`` when NVML is unavailable."""
    try:
        import pynvml as lib
    except ImportError as err:
        _warn_once("import", f"pynvml (package nvidia-ml-py) cannot be imported ({err}); "
                             "no GPU information or telemetry: pip install 'keras-harness[bench]'")
        yield None
        return
    try:
        lib.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ... or OSError from the loader
        _warn_once(f"init:{type(err).__name__}", f"NVML did not start ({_describe(err)}); "
                                                 "no GPU information or telemetry")
        yield None
        return
    try:
        yield lib
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def _call(lib: Any, field: str, function: str, *args: Any) -> Any:
    """``lib.function(*args)``, or ``None`` (warned once per field and cause) when it fails."""
    try:
        return getattr(lib, function)(*args)
    except Exception as err:  # one field failing must not lose the others
        _warn_once(f"{field}:{type(err).__name__}", f"NVML cannot read {field} ({_describe(err)}); it is None")
        return None


# --- which GPUs CUDA sees, in which order ---------------------------------------------------------


@dataclass(frozen=True)
class NvmlDevice:
    """What the CUDA numbering depends on, for one device in NVML's enumeration."""

    name: str | None
    uuid: str | None
    pci_bus_id: str | None


def _bus_key(bus_id: str | None) -> tuple[int, ...] | None:
    """``"00000000:3B:00.0"`` -> ``(0, 0x3B, 0, 0)``; ``None`` when it does not parse."""
    if bus_id is None:
        return None
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return tuple(int(part, 16) for part in (domain, bus, device, function))
    except (AttributeError, ValueError):
        return None


def _resolve(token: str, devices: Sequence[NvmlDevice], enumerated: list[int]) -> tuple[int | None, str]:
    """Position in ``devices`` that one CUDA_VISIBLE_DEVICES entry names, or ``None`` and why not."""
    if token.isdigit():
        i = int(token)
        if i < len(enumerated):
            return enumerated[i], ""
        return None, f"names no GPU (there are {len(enumerated)})"
    if token[:4].upper() == "GPU-":
        hits = [p for p in enumerated if (devices[p].uuid or "").lower().startswith(token.lower())]
        if len(hits) == 1:
            return hits[0], ""
        return None, "matches no GPU's UUID" if not hits else f"matches {len(hits)} GPUs' UUIDs"
    if token[:4].upper() == "MIG-":
        return None, "is a MIG device, which harness.bench.nvml does not map"
    return None, "is neither an index nor a GPU-UUID"


def map_visible_devices(
    devices: Sequence[NvmlDevice], visible: str | None, order: str | None = None
) -> tuple[list[int], list[str]]:
    """Which of NVML's devices CUDA (and so TensorFlow) exposes, in CUDA's numbering.

    NVML enumerates in PCI bus order; CUDA numbers by ``CUDA_DEVICE_ORDER`` (default
    ``FASTEST_FIRST``, which equals PCI bus order when all GPUs are the same model), then keeps
    the ``CUDA_VISIBLE_DEVICES`` entries in the order given: indices, ``GPU-`` UUIDs or unique
    UUID prefixes. Like CUDA, the list ends at the first entry that is invalid or repeated;
    ``""`` and ``"-1"`` hide every GPU. Pure: no NVML, no environment.

    Args:
        devices: NVML's devices, in NVML index order.
        visible: the value of ``CUDA_VISIBLE_DEVICES``, ``None`` when unset.
        order: the value of ``CUDA_DEVICE_ORDER``, ``None`` when unset.

    Returns:
        Positions in ``devices`` (CUDA index ``i`` is ``devices[result[i]]``), and notes worth a
        warning: entries CUDA ignores, and an order that may differ from PCI bus order.

    Example:
        >>> ids = [NvmlDevice("A100", "GPU-aa", "0:1:0.0"), NvmlDevice("A100", "GPU-bb", "0:2:0.0")]
        >>> map_visible_devices(ids, "1,0")
        ([1, 0], [])
    """
    keys = [_bus_key(d.pci_bus_id) for d in devices]
    bus_keys = [k for k in keys if k is not None]
    enumerated = list(range(len(devices)))
    if len(bus_keys) == len(keys):  # every bus id parsed
        enumerated.sort(key=lambda p: bus_keys[p])
    if visible is None:
        return enumerated, _order_notes(devices, order)
    chosen: list[int] = []
    notes: list[str] = []
    by_index = False
    tokens = [t.strip() for t in visible.split(",")]
    for token in tokens:
        position, why = _resolve(token, devices, enumerated)
        if position is not None and position in chosen:
            why = "repeats a GPU already listed"
        if why:
            if visible.strip() and not (token == "-1" and not chosen):  # "-1" alone hides all: no note
                notes.append(f"CUDA_VISIBLE_DEVICES={visible!r}: entry {token!r} {why}; CUDA ignores it "
                             "and every entry after it")
            break
        assert position is not None  # _resolve gives a reason whenever it gives no position
        by_index = by_index or token.isdigit()
        chosen.append(position)
    return chosen, (_order_notes(devices, order) if by_index else []) + notes


def _order_notes(devices: Sequence[NvmlDevice], order: str | None) -> list[str]:
    names = sorted({d.name for d in devices if d.name})  # an unreadable name is not a different model
    if (order or "").strip().upper() == "PCI_BUS_ID" or len(names) < 2:
        return []
    return [f"GPUs of different models ({', '.join(names)}): harness.bench.nvml assumes CUDA numbers them in PCI bus "
            f"order, but CUDA_DEVICE_ORDER={order!r} may put the fastest first; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
            "so that NVML, CUDA and TensorFlow agree"]


def _visible(lib: Any) -> list[tuple[Any, NvmlDevice, int]]:
    """``(handle, ids, nvml_index)`` of each GPU CUDA exposes, in CUDA order."""
    count = _call(lib, "the GPU count", "nvmlDeviceGetCount") or 0
    if count == 0:
        _warn_once("no-gpus", "NVML reports no NVIDIA GPUs")
    handles, ids = [], []
    for i in range(count):
        handle = _call(lib, "a GPU handle", "nvmlDeviceGetHandleByIndex", i)
        handles.append(handle)
        pci = _call(lib, "PCI bus id", "nvmlDeviceGetPciInfo", handle) if handle is not None else None
        ids.append(NvmlDevice(
            name=_text(_call(lib, "name", "nvmlDeviceGetName", handle)) if handle is not None else None,
            uuid=_text(_call(lib, "UUID", "nvmlDeviceGetUUID", handle)) if handle is not None else None,
            pci_bus_id=_text(getattr(pci, "busId", None)),
        ))
    positions, notes = map_visible_devices(
        ids, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER")
    )
    for note in notes:
        _warn_once(f"visible:{note}", note)
    return [(handles[p], ids[p], p) for p in positions]


# --- static information ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as CUDA numbers it; ``None`` where NVML cannot tell."""

    index: int  #: CUDA / TensorFlow index among visible GPUs: ``/gpu:{index}``
    nvml_index: int  #: NVML's index (all GPUs, PCI bus order); what ``nvidia-smi`` shows
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    memory_total_mib: int | None
    compute_capability: str | None
    power_limit_w: float | None
    driver_version: str | None
    cuda_driver_version: str | None

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict."""
        return asdict(self)


def _driver(lib: Any) -> str | None:
    return _text(_call(lib, "the driver version", "nvmlSystemGetDriverVersion"))


def _cuda_driver(lib: Any) -> str | None:
    version = _call(lib, "the CUDA driver version", "nvmlSystemGetCudaDriverVersion")
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"


def gpus() -> list[GpuInfo]:
    """The NVIDIA GPUs CUDA will expose, in CUDA's order; ``[]`` when NVML is unavailable.

    Honours ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (see ``map_visible_devices``).
    Never imports TensorFlow, creates a CUDA context or allocates GPU memory.

    Example:
        >>> [(g.index, g.name, g.memory_total_mib) for g in gpus()]
        [(0, 'NVIDIA H100 80GB HBM3', 81559)]
    """
    with _session() as lib:
        if lib is None:
            return []
        visible = _visible(lib)
        driver, cuda = (_driver(lib), _cuda_driver(lib)) if visible else (None, None)
        return [_info(lib, index, entry, driver, cuda) for index, entry in enumerate(visible)]


def _info(lib: Any, index: int, entry: tuple[Any, NvmlDevice, int], driver: str | None, cuda: str | None) -> GpuInfo:
    handle, ids, nvml_index = entry
    memory = cc = limit = None
    if handle is not None:
        memory = _call(lib, "total memory", "nvmlDeviceGetMemoryInfo", handle)
        cc = _call(lib, "compute capability", "nvmlDeviceGetCudaComputeCapability", handle)
        limit = _call(lib, "power limit", "nvmlDeviceGetEnforcedPowerLimit", handle)
    return GpuInfo(
        index=index, nvml_index=nvml_index, name=ids.name, uuid=ids.uuid, pci_bus_id=ids.pci_bus_id,
        memory_total_mib=None if memory is None else int(memory.total) // _MIB,
        compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
        power_limit_w=None if limit is None else limit / 1000.0,
        driver_version=driver, cuda_driver_version=cuda,
    )


def driver_version() -> str | None:
    """The NVIDIA driver version (``"550.54.15"``), or ``None`` when NVML is unavailable."""
    with _session() as lib:
        return None if lib is None else _driver(lib)


def cuda_driver_version() -> str | None:
    """The newest CUDA version the driver supports (``"12.4"``), or ``None`` when unavailable."""
    with _session() as lib:
        return None if lib is None else _cuda_driver(lib)


# --- telemetry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU; ``None`` where NVML cannot read the field."""

    time: float  #: ``time.perf_counter()``, the clock ``harness.bench.measure`` stamps steps with
    gpu: int  #: CUDA index, as ``GpuInfo.index``
    utilization_pct: float | None
    memory_used_mib: float | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None


@dataclass(frozen=True)
class FieldStats:
    """Mean, max and min of one field over some samples; ``None`` when ``count`` is 0."""

    mean: float | None
    max: float | None
    min: float | None
    count: int


def _read_sample(lib: Any, gpu: int, handle: Any) -> GpuSample:
    now = time.perf_counter()
    util = _call(lib, "utilisation", "nvmlDeviceGetUtilizationRates", handle)
    memory = _call(lib, "memory used", "nvmlDeviceGetMemoryInfo", handle)
    power = _call(lib, "power", "nvmlDeviceGetPowerUsage", handle)
    temp = _call(lib, "temperature", "nvmlDeviceGetTemperature", handle, getattr(lib, "NVML_TEMPERATURE_GPU", 0))
    sm = _call(lib, "SM clock", "nvmlDeviceGetClockInfo", handle, getattr(lib, "NVML_CLOCK_SM", 1))
    mem_clock = _call(lib, "memory clock", "nvmlDeviceGetClockInfo", handle, getattr(lib, "NVML_CLOCK_MEM", 2))
    return GpuSample(
        time=now, gpu=gpu,
        utilization_pct=None if util is None else float(util.gpu),
        memory_used_mib=None if memory is None else memory.used / _MIB,
        power_w=None if power is None else power / 1000.0,  # NVML reports milliwatts
        temperature_c=None if temp is None else float(temp),
        sm_clock_mhz=None if sm is None else float(sm),
        memory_clock_mhz=None if mem_clock is None else float(mem_clock),
    )


def _targets(lib: Any, indices: Sequence[int] | None) -> list[tuple[int, Any]]:
    """``(cuda_index, handle)`` of each requested GPU NVML can read."""
    handles = {i: h for i, (h, _, _) in enumerate(_visible(lib)) if h is not None}
    wanted = sorted(handles) if indices is None else list(indices)
    missing = [i for i in wanted if i not in handles]
    if missing:
        _warn_once(f"missing:{missing}", f"no readable visible GPU with index {missing} (readable: "
                                         f"{sorted(handles)}); not sampled")
    return [(i, handles[i]) for i in wanted if i in handles]


def _check_indices(indices: Sequence[int] | None) -> tuple[int, ...] | None:
    if indices is None:
        return None
    if isinstance(indices, (str, bytes)) or not all(isinstance(i, int) and i >= 0 for i in indices):
        raise InvalidValue(f"indices must be non-negative GPU indices or None; got indices={indices!r}")
    return tuple(dict.fromkeys(indices))


def sample(indices: Sequence[int] | None = None) -> list[GpuSample]:
    """One reading of each visible GPU (or of the CUDA ``indices``); ``[]`` without NVML."""
    targets = _check_indices(indices)
    with _session() as lib:
        return [] if lib is None else [_read_sample(lib, i, h) for i, h in _targets(lib, targets)]


def _stats(values: list[float]) -> FieldStats:
    if not values:
        return FieldStats(None, None, None, 0)
    return FieldStats(statistics.fmean(values), max(values), min(values), len(values))


def summarise(samples: Sequence[GpuSample], gpus: Sequence[int] = ()) -> dict[int, dict[str, FieldStats]]:
    """Per GPU, per field in ``FIELDS``: mean, max, min and count of the readings.

    Args:
        samples: readings, e.g. ``TelemetrySampler.samples``.
        gpus: GPUs to include even when no sample is theirs (every field has count 0).
    """
    out: dict[int, dict[str, FieldStats]] = {}
    for gpu in sorted(set(gpus) | {s.gpu for s in samples}):
        mine = [s for s in samples if s.gpu == gpu]
        out[gpu] = {f: _stats([v for v in (getattr(s, f) for s in mine) if v is not None]) for f in FIELDS}
    return out


class TelemetrySampler:
    """Reads every GPU's utilisation, memory, power, temperature and clocks on a background thread.

    A no-op when NVML is unavailable: no thread, no samples, an empty summary.

    Args:
        indices: CUDA indices of the GPUs to read (``GpuInfo.index``); ``None`` for all visible.
        interval: seconds between readings (default 0.1, i.e. 10 Hz).

    Example:
        >>> with TelemetrySampler() as telemetry:
        ...     t0 = time.perf_counter(); model.fit(x, y); t1 = time.perf_counter()
        >>> telemetry.window(t0, t1)[0]["power_w"].mean
        312.4
    """

    def __init__(self, indices: Sequence[int] | None = None, interval: float = 0.1) -> None:
        if not (isinstance(interval, (int, float)) and math.isfinite(interval) and interval > 0):
            raise InvalidValue(f"interval must be a positive number of seconds; got interval={interval!r}")
        self.indices = _check_indices(indices)
        self.interval = float(interval)
        self._samples: list[GpuSample] = []
        self._gpus: tuple[int, ...] = ()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: contextlib.ExitStack | None = None
        self._started = False

    @property
    def is_running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def samples(self) -> list[GpuSample]:
        """A copy of the readings so far, in time order."""
        with self._lock:
            return list(self._samples)

    def start(self) -> TelemetrySampler:
        """Starts sampling; returns ``self``. A sampler starts once.

        Raises:
            RuntimeError: if it was started before.
        """
        if self._started:
            raise RuntimeError("a TelemetrySampler starts only once; create a new one")
        self._started = True
        stack = contextlib.ExitStack()
        lib = stack.enter_context(_session())
        targets = [] if lib is None else _targets(lib, self.indices)
        if not targets:
            stack.close()
            return self
        self._session, self._gpus = stack, tuple(i for i, _ in targets)
        self._thread = threading.Thread(target=self._run, args=(lib, targets), name="harness-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops sampling, joins the thread and shuts NVML down. Safe to call twice."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 10 * self.interval))
            if self._thread.is_alive():  # stuck in a driver call: leave NVML up rather than pull it away
                _warn_once("sampler-stuck", "the GPU telemetry thread did not stop in time; NVML left running")
                return
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, lib: Any, targets: list[tuple[int, Any]]) -> None:
        due = time.perf_counter()
        try:
            while True:
                readings = [_read_sample(lib, i, h) for i, h in targets]
                with self._lock:
                    self._samples.extend(readings)
                due = max(due + self.interval, time.perf_counter())  # fell behind: skip, don't burst
                if self._stopping.wait(due - time.perf_counter()):
                    return
        except Exception as err:  # never let telemetry take a run down
            _warn_once(f"sampler:{type(err).__name__}", f"GPU telemetry stopped early ({_describe(err)})")

    def summary(self) -> dict[int, dict[str, FieldStats]]:
        """``summarise`` of every sample so far; ``{}`` when nothing is sampled."""
        return summarise(self.samples, self._gpus)

    def window(self, t0: float, t1: float) -> dict[int, dict[str, FieldStats]]:
        """``summarise`` of the samples with ``t0 <= time <= t1`` (``time.perf_counter()`` stamps).

        Raises:
            ValueError: if ``t1 < t0``.
        """
        if not t1 >= t0:
            raise InvalidValue(f"a window needs t0 <= t1; got t0={t0!r}, t1={t1!r}")
        return summarise([s for s in self.samples if t0 <= s.time <= t1], self._gpus)
