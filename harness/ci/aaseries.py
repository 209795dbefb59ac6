"""The gate's false-alarm rate and what it catches, measured: one commit's rounds judged against themselves.

``harness bench-compare COMMIT COMMIT --aa-series N`` runs the suite N times on one commit. Every window of
``2 x rounds`` consecutive runs is one judgment as the gate makes it (``benchgate.judge_rounds``; base and head
interleaved: runs 1, 3 as base, 2, 4 as head), a worse verdict standing only where the window's next pair of
runs confirms it (``benchgate.after_rerun``, as the gate measures a borderline result again). Any worse verdict
is a false alarm: the two sides are one commit. The same windows judged again with head's values and samples
made ``SLOWDOWN`` slower (``plant``) tell what the gate catches on this runner, combination by combination: a
slow-down it cannot see is one below what that combination's noise lets it detect.

Windows overlap (a run serves several), so the judgments are not independent; the alarm count is a measure of
the rate per judgment, not of its confidence interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.ci.asvresults import Key, Measurement
from harness.ci.benchgate import FACTOR, NOISE_K, Verdict, after_rerun, higher_is_better, is_borderline, judge_rounds
from harness.errors import InvalidValue

__all__ = ["SLOWDOWN", "MAX_FALSE_ALARMS", "Series", "plant", "series"]

SLOWDOWN = 1.05  # the planted change: 5% slower
MAX_FALSE_ALARMS = 0.01  # the rate per judgment the gate's defaults are held to


@dataclass(frozen=True)
class Series:
    """What an A/A series found: per combination, its judgments, false alarms, the planted slow-down's catches,
    and the smallest change the gate could detect in each window (``detects``)."""

    rounds: int  # per side in each judgment
    runs: int  # of the commit, in order
    combos: dict  # "name (params)": {"judged", "alarms", "caught", "detects"}

    @property
    def judged(self) -> int:
        return sum(c["judged"] for c in self.combos.values())

    @property
    def alarms(self) -> int:
        return sum(c["alarms"] for c in self.combos.values())

    @property
    def rate(self) -> float:
        return self.alarms / self.judged if self.judged else math.nan

    def detectable(self) -> dict:
        """The combinations whose every window could detect ``SLOWDOWN`` (threshold at or below it): their
        judgments and how many caught the planted slow-down."""
        able = {name: c for name, c in self.combos.items() if c["detects"] and max(c["detects"]) <= SLOWDOWN - 1}
        return {"combinations": len(able), "judged": sum(c["judged"] for c in able.values()),
                "caught": sum(c["caught"] for c in able.values())}

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "runs": self.runs, "judged": self.judged, "alarms": self.alarms,
                "false_alarm_rate": self.rate, "max_false_alarm_rate": MAX_FALSE_ALARMS, "slowdown": SLOWDOWN,
                "detectable": self.detectable(), "combinations": self.combos}

    def text(self) -> str:
        able = self.detectable()
        lines = [f"A/A series: {self.runs} runs of one commit, {self.judged} judgments of "
                 f"{self.rounds}+{self.rounds} interleaved rounds: {self.alarms} false alarm(s), "
                 f"{100 * self.rate:.2f}% "
                 f"(at most {100 * MAX_FALSE_ALARMS:g}%)",
                 f"planted {100 * (SLOWDOWN - 1):.0f}% slow-down: caught in {able['caught']} of {able['judged']} "
                 f"judgments of the {able['combinations']} combination(s) whose noise lets the gate detect it",
                 "", "| benchmark | judged | false alarms | planted caught | detects (min-max) |",
                 "|---|---|---|---|---|"]
        for name, c in sorted(self.combos.items()):
            detects = "-" if not c["detects"] else f"{100 * min(c['detects']):.1f}-{100 * max(c['detects']):.1f}%"
            lines.append(f"| `{name}` | {c['judged']} | {c['alarms']} | {c['caught']} | {detects} |")
        return "\n".join(lines)


def plant(measurement: Measurement, slowdown: float = SLOWDOWN) -> Measurement:
    """``measurement`` made ``slowdown`` times slower: a time multiplied, a throughput divided (samples too)."""
    if measurement.value is None or math.isnan(measurement.value):
        return measurement
    scale = 1 / slowdown if higher_is_better(measurement.name, measurement.unit) else slowdown
    samples = None if measurement.samples is None else tuple(s * scale for s in measurement.samples)
    return replace(measurement, value=measurement.value * scale, samples=samples)


def series(runs: Mapping[Key, Sequence[Measurement]], rounds: int = 2, factor: float = FACTOR, k: float = NOISE_K,
           different=None) -> Series:
    """Judges every window of ``2 x rounds`` consecutive runs of each combination (see the module), with and
    without the planted slow-down.

    Raises:
        InvalidValue: ``rounds`` < 2, or a combination has fewer than ``2 x rounds + 2`` runs (a window and the
            pair that confirms a borderline result).
    """
    if rounds < 2:
        raise InvalidValue(f"an A/A judgment needs at least 2 rounds a side; got rounds={rounds}")
    combos: dict = {}
    for (name, params), measured in sorted(runs.items()):
        measured = [m for m in measured if m.ok]
        label = f"{name} ({params})" if params else name
        if not measured:
            continue  # skipped, or failed in every run: nothing to judge
        width = 2 * rounds
        if len(measured) < width + 2:
            raise InvalidValue(f"{label}: {len(measured)} runs; an A/A series of {rounds}+{rounds} rounds needs at "
                               f"least {width + 2}")
        entry: dict[str, Any] = {"judged": 0, "alarms": 0, "caught": 0, "detects": []}
        for start in range(len(measured) - width - 1):
            window, confirm = measured[start:start + width], measured[start + width:start + width + 2]
            base, head = window[0::2], window[1::2]
            for planted in (False, True):
                heads = [plant(m) for m in head] if planted else head
                row = judge_rounds(base, heads, factor, k, different=different)
                if is_borderline(row):
                    row = after_rerun(row, confirm[0], plant(confirm[1]) if planted else confirm[1])
                worse = row.verdict is Verdict.WORSE
                if planted:
                    entry["caught"] += worse
                else:
                    entry["judged"] += 1
                    entry["alarms"] += worse
                    if row.detectable is not None:
                        entry["detects"].append(row.detectable)
        combos[label] = entry
    return Series(rounds, max((len(v) for v in runs.values()), default=0), combos)
