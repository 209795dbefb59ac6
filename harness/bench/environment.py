"""The environment fingerprint: everything a result or a bug report needs to be reproduced.

Versions come from package metadata, so ``fingerprint(import_tf=False)`` never imports
TensorFlow; GPUs come from NVML (``harness.bench.nvml``), so nothing creates a CUDA context or
allocates GPU memory. A piece that cannot be found is ``None``, never an exception.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import harness
from harness.bench import nvml
from harness.compat import flavour_of

__all__ = ["fingerprint", "format_fingerprint"]

#: Shown always: they decide which GPUs and which Keras a run gets.
_KEY_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_USE_LEGACY_KERAS")
#: Shown when set: they change TensorFlow's numerics, memory or logging.
_MORE_ENV = ("KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS", "TF_DETERMINISTIC_OPS", "TF_FORCE_GPU_ALLOW_GROWTH",
             "TF_GPU_ALLOCATOR", "TF_XLA_FLAGS", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL", "NVIDIA_VISIBLE_DEVICES")
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                     "tf-nightly", "tf-nightly-cpu")
_GIT_TIMEOUT_S = 3.0


def fingerprint(import_tf: bool = True) -> dict[str, Any]:
    """Describes this machine and software stack as a JSON-serialisable dict.

    Args:
        import_tf: also import TensorFlow for its build information (CUDA and cuDNN versions it
            was built against). Importing creates no device context; ``False`` keeps TensorFlow
            out of the process entirely.

    Returns:
        Sections ``harness``, ``python``, ``platform``, ``tensorflow``, ``keras``, ``packages``,
        ``nvidia``, ``cpu``, ``memory``, ``env`` and ``notes`` (what could not be found, and why).

    Example:
        >>> fp = fingerprint(import_tf=False)
        >>> fp["keras"]["flavour"], [g["name"] for g in fp["nvidia"]["gpus"]]
        ('keras3', ['NVIDIA H100 80GB HBM3'])
    """
    notes: list[str] = []
    tensorflow = _tensorflow(import_tf, notes)
    env = {name: os.environ.get(name) for name in _KEY_ENV}
    env.update({name: os.environ[name] for name in _MORE_ENV if name in os.environ})
    return {
        "harness": _harness(),
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "platform": platform.platform(),
        },
        "tensorflow": tensorflow,
        "keras": _keras(tensorflow["version"], notes),
        "packages": {name: _version(name) for name in ("numpy", "nvidia-ml-py", "matplotlib")},
        "nvidia": _nvidia(notes),
        "cpu": _cpu(),
        "memory": {"total_mib": _ram_mib()},
        "env": env,
        "notes": notes,
    }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _harness() -> dict[str, Any]:
    here = Path(harness.__file__).resolve().parent
    # Only a checkout whose git tracks this very package counts: a venv inside some other
    # repository must not report that repository's commit.
    tracked = _git(["ls-files", "--error-unmatch", "__init__.py"], here) is not None
    status = _git(["status", "--porcelain"], here) if tracked else None
    return {
        "version": harness.__version__,
        "path": str(here),
        "git_commit": _git(["rev-parse", "HEAD"], here) if tracked else None,
        "git_dirty": None if status is None else bool(status),
    }


def _git(args: list[str], cwd: Path) -> str | None:
    """``git args`` output in ``cwd``, or ``None`` (no git, not a repository, too slow): ``harness.dist.git``."""
    from harness.dist import git

    return git(args, cwd, timeout=_GIT_TIMEOUT_S)


def _tensorflow(import_tf: bool, notes: list[str]) -> dict[str, Any]:
    distribution = next((d for d in _TF_DISTRIBUTIONS if _version(d) is not None), None)
    out: dict[str, Any] = {"version": _version(distribution) if distribution else None,
                           "distribution": distribution, "build": None}
    if not import_tf:
        return out
    try:
        import tensorflow as tf  # creates no context: nothing here lists or touches devices

        out["version"] = tf.__version__
        out["build"] = {k: _jsonable(v) for k, v in tf.sysconfig.get_build_info().items()}
    except Exception as err:  # ImportError, or a broken install failing inside TensorFlow
        notes.append(f"TensorFlow could not be imported: {type(err).__name__}: {err}")
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _keras(tf_version: str | None, notes: list[str]) -> dict[str, Any]:
    keras_version, tf_keras_version = _version("keras"), _version("tf-keras")
    legacy = os.environ.get("TF_USE_LEGACY_KERAS")
    flavour = flavour_of(tf_version, keras_version, tf_keras_version, legacy)
    if flavour == "tf_keras" and tf_keras_version is None:
        notes.append(f"TF_USE_LEGACY_KERAS={legacy!r} asks for tf_keras, which is not installed")
    return {"version": tf_keras_version if flavour == "tf_keras" else keras_version,
            "keras_package": keras_version, "tf_keras_package": tf_keras_version, "flavour": flavour}


def _nvidia(notes: list[str]) -> dict[str, Any]:
    # NVML's warnings become notes: a bug report should carry them, not scroll them by.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", nvml.NvmlWarning)
        found = nvml.gpus()
        driver, cuda = nvml.driver_version(), nvml.cuda_driver_version()
    notes.extend(str(w.message) for w in caught if issubclass(w.category, nvml.NvmlWarning))
    for w in caught:
        if not issubclass(w.category, nvml.NvmlWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    drop = {"driver_version", "cuda_driver_version"}
    return {"driver_version": driver, "cuda_driver_version": cuda,
            "gpus": [{k: v for k, v in g.as_dict().items() if k not in drop} for g in found]}


def _cpu() -> dict[str, Any]:
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    model = value.strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"model": model or platform.processor() or None, "count": os.cpu_count(), "usable": usable}


def _ram_mib() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (AttributeError, OSError, ValueError):
        return None


def _or(value: Any, missing: str = "unknown") -> str:
    return missing if value is None else str(value)


def format_fingerprint(fp: dict[str, Any]) -> str:
    """A readable multi-line block of ``fingerprint()``'s dict, for terminals and bug reports.

    Tolerates sections missing from older or hand-edited records.
    """
    h, py, plat = fp.get("harness") or {}, fp.get("python") or {}, fp.get("platform") or {}
    tf, keras, nv = fp.get("tensorflow") or {}, fp.get("keras") or {}, fp.get("nvidia") or {}
    cpu, mem = fp.get("cpu") or {}, fp.get("memory") or {}
    commit = h.get("git_commit")
    dirty = " (dirty)" if h.get("git_dirty") else ""
    source = "not a git checkout" if commit is None else f"commit {commit[:12]}{dirty}"
    lines = [
        f"harness      {_or(h.get('version'))}  {source}  {_or(h.get('path'), '')}".rstrip(),
        f"python       {_or(py.get('version'))} {_or(py.get('implementation'), '')}  {_or(py.get('executable'), '')}",
        f"platform     {_or(plat.get('platform'))}",
        f"tensorflow   {_or(tf.get('version'), 'not installed')}"
        + (f" ({tf['distribution']})" if tf.get("distribution") else "") + f"; {_build(tf.get('build'))}",
        f"keras        {_or(keras.get('version'), 'not installed')} ({_or(keras.get('flavour'))})",
        "packages     " + ", ".join(f"{k} {_or(v, '-')}" for k, v in (fp.get("packages") or {}).items()),
        f"nvidia       driver {_or(nv.get('driver_version'), 'none')}, CUDA driver "
        f"{_or(nv.get('cuda_driver_version'), 'none')}",
    ]
    gpu_list = nv.get("gpus") or []
    lines.append(f"gpus         {len(gpu_list) or 'none'} visible")
    for g in gpu_list:
        memory = f"{g['memory_total_mib']} MiB" if g.get("memory_total_mib") is not None else "? MiB"
        lines.append(f"  gpu:{g.get('index')}      {_or(g.get('name'))}, {memory}, "
                     f"cc {_or(g.get('compute_capability'))}, {_or(g.get('uuid'))}, "
                     f"pci {_or(g.get('pci_bus_id'))}, nvml {g.get('nvml_index')}")
    usable = f" ({cpu['usable']} usable)" if cpu.get("usable") not in (None, cpu.get("count")) else ""
    lines.append(f"cpu          {_or(cpu.get('model'))} x {_or(cpu.get('count'), '?')}{usable}")
    total = mem.get("total_mib")
    lines.append(f"memory       {'unknown' if total is None else f'{total / 1024:.1f} GiB'}")
    lines += [f"env          {k}={'<unset>' if v is None else v}" for k, v in (fp.get("env") or {}).items()]
    lines += [f"note         {n}" for n in fp.get("notes") or []]
    return "\n".join(lines)


def _build(build: dict[str, Any] | None) -> str:
    if not build:
        return "build info not read"
    if not build.get("is_cuda_build"):
        return "ROCm build" if build.get("is_rocm_build") else "CPU-only build"
    return f"CUDA build (CUDA {_or(build.get('cuda_version'))}, cuDNN {_or(build.get('cudnn_version'))})"
