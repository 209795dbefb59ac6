"""The A/A series (``harness.ci.aaseries``) on recorded values: one commit's runs judged against themselves, and
again with a planted 5% slow-down. A synthetic series keeps the arithmetic checkable; the real series on this
runner is in docs/regressions.md and tests/ci/test_gate.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.ci import aaseries
from harness.ci.asvresults import Measurement
from harness.ci.benchgate import FACTOR
from harness.errors import InvalidValue


def _runs(values, name="t.T.time_step", unit="seconds", samples=False):
    return [Measurement(name, "", unit, v, tuple(v * (1 + 0.001 * i) for i in range(5)) if samples else None,
                        {"repeat": 5} if samples else None) for v in values]


def test_a_quiet_commit_raises_no_alarm_and_the_planted_slowdown_is_caught_in_every_window():
    rng = np.random.default_rng(0)
    values = list(0.1 * (1 + 0.002 * rng.normal(size=16)))  # 0.2% noise: the gate's floor, 3%, decides
    found = aaseries.series({("t.T.time_step", ""): _runs(values)})
    entry = found.combos["t.T.time_step"]
    assert found.judged == entry["judged"] == 16 - 5  # windows of 4, each with the next pair to confirm
    assert found.alarms == 0 and entry["caught"] == entry["judged"]
    assert max(entry["detects"]) == pytest.approx(FACTOR - 1)
    assert found.detectable() == {"combinations": 1, "judged": 11, "caught": 11}
    assert "0 false alarm(s), 0.00% (at most 1%)" in found.text()
    json.dumps(found.to_json())


def test_a_throughput_is_slowed_down_by_dividing_it():
    (slow,) = [aaseries.plant(m) for m in _runs([2000.0], "t.T.track_samples_per_second", "samples/s")]
    assert slow.value == pytest.approx(2000 / 1.05)
    (slow,) = [aaseries.plant(m) for m in _runs([0.1], samples=True)]
    assert slow.value == pytest.approx(0.105) and slow.samples[0] == pytest.approx(0.105)


def test_a_noisy_combination_says_it_cannot_detect_five_percent_and_a_level_shift_counts_as_alarms():
    rng = np.random.default_rng(1)
    noisy = list(1.0 * (1 + 0.05 * rng.normal(size=14)))  # 5% noise: the threshold is about 1 + 3 x 5%
    # A runner whose every other run is 10% slower (a neighbour job in step with the rounds): the windows whose
    # head runs are the slow ones are false alarms, as the gate raises them. (A single jump is not: interleaved
    # rounds put it on both sides.)
    shifted = [1.0, 1.1] * 7
    found = aaseries.series({("a.A.time_noisy", ""): _runs(noisy), ("a.A.time_shift", ""): _runs(shifted)})
    assert found.combos["a.A.time_noisy"]["alarms"] == 0
    # 2+2 rounds estimate the noise loosely (one window saw 1.1%): most windows detect nothing under 5%
    assert np.median(found.combos["a.A.time_noisy"]["detects"]) > 0.05
    assert found.detectable()["combinations"] == 1  # the alternating one: its rounds look quiet
    assert found.combos["a.A.time_shift"]["alarms"] >= 1 and found.rate > aaseries.MAX_FALSE_ALARMS


def test_too_few_runs_or_rounds_are_refused():
    with pytest.raises(InvalidValue, match="t.T.time_step: 5 runs; an A/A series of 2\\+2 rounds needs at least 6"):
        aaseries.series({("t.T.time_step", ""): _runs([0.1] * 5)})
    with pytest.raises(InvalidValue, match="at least 2 rounds a side; got rounds=1"):
        aaseries.series({("t.T.time_step", ""): _runs([0.1] * 8)}, rounds=1)
