"""Numerical fidelity: how far parallel training drifts from one device, tracked beside speed.

``harness.equivalence.compare_training`` (what ``harness check`` and
``assert_equivalent`` use) trains the workload on one device and with towers or
mirrored on an uneven split, from the same weights, for a few steps; the figure
is the worst ``max |dw| / max(1, max |w|)`` over weights and optimizer state.
Float32 summation order keeps it near 1e-7 on CPU; a TensorFlow or Keras
upgrade that breaks exactness shows up in the same history as a slowdown.
"""

from __future__ import annotations

from . import common

GRID = common.current_grid()


class Fidelity:
    """Max weight deviation after ``GRID.fidelity_steps`` steps, split ``GRID.fidelity_ratios``."""

    params = [list(GRID.fidelity_workloads), ["towers", "mirrored"], list(GRID.fidelity_device_counts)]
    param_names = ["workload", "method", "devices"]
    timeout = GRID.timeout

    def setup(self, workload, method, devices):
        self.devices = common.gridrun().use_devices(GRID, devices)

    def track_max_weight_deviation(self, workload, method, devices):
        return common.gridrun().fidelity_report(GRID, workload, method, self.devices).max_deviation

    track_max_weight_deviation.unit = "max |dw| relative"
