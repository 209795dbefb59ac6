"""The emulated rates timing tests may use on this host, from ``harness calibrate``.

An emulated device is only an emulation while the host computes its slice
faster than the emulated time (``harness.emulate``). Timing tests therefore take
their rates from a calibration of this host, made once per test process while
whatever else runs beside the suite runs: each test scales its nominal rates
down, when needed, to a quarter of what the host sustained. Their assertions
compare figures measured within one run, and each run must say it was not
host-bound, so a machine too slow even for that fails with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from tf_process import ENV

# A quarter of the calibrated rate: the load beside a test may grow after the calibration (another
# xdist worker starting a TensorFlow process, two CPU hogs) and slow the host two- or threefold.
SHARE = 0.25
CALIBRATE = ["calibrate", "--model", "mnist_maxing", "--devices", "2", "--batch", "100", "--seconds", "0.3",
             "--windows", "3", "--json", "--no-save"]


@dataclass(frozen=True)
class Emulation:
    """This host's calibration: the rate it computes two busy devices' slices of ``mnist_maxing`` tiny at."""

    sustained: float  # samples/s per device, 100 samples per device per step, both devices at once
    outside_ms: float  # the host's work per step outside the devices

    def factor(self, *rates: float) -> float:
        """The scale (at most 1) that brings the fastest of ``rates`` to ``SHARE`` of the sustained rate."""
        return min(1.0, SHARE * self.sustained / max(rates))

    def scale(self, *rates: float) -> list[int]:
        """``rates`` times ``factor(*rates)``, whole samples/s: their ratios kept, all well within the host."""
        f = self.factor(*rates)
        return [max(1, round(r * f)) for r in rates]


@pytest.fixture(scope="session")
def emulation() -> Emulation:
    """``harness calibrate`` of this host, once per test process (xdist worker)."""
    done = subprocess.run([sys.executable, "-m", "harness", *CALIBRATE], capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = json.loads(done.stdout)["result"]["workloads"]
    print(f"calibration: {entry['sustained_rate']:.0f} samples/s per device sustained, "
          f"{entry['outside_ms']:.1f} ms per step outside the devices")
    return Emulation(entry["sustained_rate"], entry["outside_ms"])
