"""Numerical fidelity: how far parallel training drifts from one device, tracked beside speed.

``harness.equivalence.compare_training`` (what ``harness check`` and
``assert_equivalent`` use) trains the workload on one device and with towers or
mirrored on an uneven split, from the same weights, for a few steps; the figure
is the worst ``max |dw| / max(1, max |w|)`` over weights and optimizer state.
Float32 summation order keeps it near 1e-7 on CPU; a TensorFlow or Keras
upgrade that breaks exactness shows up in the same history as a slowdown.

Where the devices are emulated, every combination runs once in one TensorFlow process
(``setup_cache``), as the throughput suite's runs do; on real GPUs each keeps its own.
"""

from __future__ import annotations

import itertools

from . import common

GRID = common.current_grid()
PARAMS = [list(GRID.fidelity_workloads), ["towers", "mirrored"], list(GRID.fidelity_device_counts)]
_EMULATED = GRID.emulate is not None


def _key(workload: str, method: str, devices: int) -> str:
    return f"{workload}/{method}/{devices}"


def compare_every_combination() -> dict:
    """asv ``setup_cache`` on emulated grids: ``{combination key: max deviation | {"error": why, "traceback"}}``;
    a combination that raises does not take the others' figures along."""
    import traceback

    grid, gridrun = common.current_grid(), common.gridrun()
    out: dict[str, object] = {}
    for workload, method, devices in itertools.product(*PARAMS):
        try:
            out[_key(workload, method, devices)] = gridrun.fidelity_report(
                grid, workload, method, gridrun.use_devices(grid, devices)).max_deviation
        except Exception as err:  # noqa: BLE001
            out[_key(workload, method, devices)] = {"error": f"{type(err).__name__}: {err}",
                                                    "traceback": traceback.format_exc()}
    return out


compare_every_combination.timeout = GRID.timeout * 4  # type: ignore[attr-defined]  # asv reads it


def _own_process():
    """Real GPUs: no shared run (each combination's own process compares)."""
    return None


class Fidelity:
    """Max weight deviation after ``GRID.fidelity_steps`` steps, split ``GRID.fidelity_ratios``."""

    params = PARAMS
    param_names = ["workload", "method", "devices"]
    timeout = GRID.timeout
    setup_cache = staticmethod(compare_every_combination if _EMULATED else _own_process)

    def setup(self, cache, workload, method, devices):
        if cache is None:
            self.devices = common.gridrun().use_devices(GRID, devices)
            return
        entry = cache[_key(workload, method, devices)]
        if isinstance(entry, dict):
            raise RuntimeError(f"{method} on {devices} device(s): {entry['error']}\n{entry['traceback']}")
        self.deviation = entry

    def track_max_weight_deviation(self, cache, workload, method, devices):
        if cache is None:
            return common.gridrun().fidelity_report(GRID, workload, method, self.devices).max_deviation
        return self.deviation

    track_max_weight_deviation.unit = "max |dw| relative"
