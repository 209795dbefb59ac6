"""The gate's false alarms and power, measured: one commit's real runs judged against themselves.

``harness bench-compare C C --aa-series N`` measures commit C against itself N times as the gate measures two
commits, recording everything (``--save-runs FILE``; ``--from-runs FILE`` studies a recording again):

- ``time_`` benchmarks, in existing mode: ``PAIRS`` interleaved pairs a run (``harness.ci.interleave``: two
  processes of the one commit, sampled alternately, replaced every ``per_process`` pairs), recorded in full;
- the other benchmarks: one asv run of C a run, its value per combination (a round).

:func:`study` then judges with the gate's own sequential rule, the one object the gate stops by
(``benchgate.Stopping`` as ``interleave.pairs_rule`` and ``interleave.rounds_rule`` build it: look at the bounds
every ``interleave.BATCH`` pairs from ``interleave.MIN_PAIRS``, scaled to the recorded process pairs' size
(``Stopping.sized``), or round by round from ``--rounds`` to
``--max-rounds``, stop when settled), then ``benchgate.judge_rounds`` where it stopped, twice over:

- **real judgments**, independent: each run's pairs from its first (what the gate would have said on that run),
  and the round series cut into windows that share no run;
- **resampled judgments** (``RESAMPLED`` per combination): pairs drawn as a moving-block bootstrap from one run's
  recording (blocks of ``BLOCK`` consecutive pairs keep the host's steps and drift in them; pairs from process pairs
  drawn process pair first), each pair in its own order's place (the crossover the gate judges by, :func:`_blocks`),
  rounds drawn at random from the series.

Each judgment is made as recorded (A/A: any *worse* is a false alarm) and with head made ``p`` times slower for
each planted change in ``PLANTS`` (3%, 5%, 10%: caught when *worse*). Rates carry Clopper-Pearson 95% bounds. The
resampled judgments are many but drawn from few runs: their bounds say how well the rate is known *for these runs*;
the real judgments, fewer but independent, are the check that the resampling did not flatter the gate.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.ci.asvresults import Measurement
from harness.ci.benchgate import (
    ALPHA,
    FACTOR,
    FAMILY_ALPHA,
    Stopping,
    Verdict,
    higher_is_better,
    judgment_alpha,
    log_ratios,
)
from harness.ci.interleave import BATCH, MIN_PAIRS, pairs_rule, rounds_rule
from harness.errors import InvalidValue

__all__ = ["PLANTS", "SLOWDOWN", "MAX_FALSE_ALARMS", "RESAMPLED", "BLOCK", "PAIRS", "Rate", "Study", "plant",
           "study", "clopper_pearson", "save_run", "load_runs"]

PLANTS = (1.03, 1.05, 1.10)
SLOWDOWN = 1.05  # the change the gate is held to catch 95% of the time
MAX_FALSE_ALARMS = 0.01  # per judgment, at the upper 95% bound
RESAMPLED = 10_000  # resampled judgments per combination and plant
BLOCK = 20  # pairs per bootstrap block
PAIRS = 400  # interleaved pairs recorded per run and time_ combination


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval of a binomial rate, ``k`` of ``n`` (each side at (1 - confidence) / 2)."""
    if n <= 0 or not 0 <= k <= n:
        raise InvalidValue(f"a rate needs 0 <= k <= n and n > 0; got k={k}, n={n}")
    tail = (1 - confidence) / 2

    def cdf(x: int, p: float) -> float:  # P(Binomial(n, p) <= x), summed in log space
        if p <= 0:
            return 1.0
        if p >= 1:
            return 0.0 if x < n else 1.0
        return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                            + (n - i) * math.log1p(-p)) for i in range(x + 1))

    def solve(target, x, increasing):  # bisection on p
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (cdf(x, mid) > target) == increasing:
                hi = mid
            else:
                lo = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(1 - tail, k - 1, False)  # P(X >= k | low) = tail
    high = 1.0 if k == n else solve(tail, k, False)  # P(X <= k | high) = tail
    return low, high


@dataclass(frozen=True)
class Rate:
    """``k`` of ``n`` judgments, with the Clopper-Pearson 95% interval."""

    k: int
    n: int

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else math.nan

    @property
    def bounds(self) -> tuple[float, float]:
        return clopper_pearson(self.k, self.n) if self.n else (math.nan, math.nan)

    def text(self) -> str:
        if not self.n:
            return "-"
        low, high = self.bounds
        return f"{self.k}/{self.n} ({100 * self.value:.2f}%, 95% CI {100 * low:.2f}-{100 * high:.2f}%)"

    def to_json(self) -> dict:
        low, high = self.bounds
        return {"k": self.k, "n": self.n, "rate": self.value, "low": low, "high": high}


@dataclass
class _Tally:
    alarms: Rate = Rate(0, 0)
    caught: dict = field(default_factory=dict)  # plant -> Rate
    detects: list = field(default_factory=list)  # the A/A judgments' detects
    pairs: list = field(default_factory=list)  # pairs (or rounds) each A/A judgment used
    said: list = field(default_factory=list)  # each A/A judgment's false alarm, in order (a run's, a window's)

    def add(self, aa: bool, planted: dict) -> None:
        self.alarms = Rate(self.alarms.k + aa, self.alarms.n + 1)
        self.said.append(aa)
        for slowdown, worse in planted.items():
            rate = self.caught.get(slowdown, Rate(0, 0))
            self.caught[slowdown] = Rate(rate.k + worse, rate.n + 1)

    @property
    def detects_median(self) -> float | None:
        return _middle(self.detects)

    @property
    def pairs_median(self) -> int | None:
        return _middle(self.pairs)

    def to_json(self) -> dict:
        return {"false_alarms": self.alarms.to_json(),
                "caught": {f"{100 * (p - 1):.0f}%": rate.to_json() for p, rate in sorted(self.caught.items())},
                "detects_median": self.detects_median, "pairs_median": self.pairs_median}


def _middle(values: list):
    """The upper median of ``values`` (one of them, not an average), or None."""
    return sorted(values)[len(values) // 2] if values else None


@dataclass
class Study:
    """Per combination, its kind ("pairs" or "rounds"), and the real and resampled tallies."""

    runs: int
    combos: dict  # label -> {"kind": ..., "real": _Tally, "resampled": _Tally}
    alpha: float = ALPHA  # each judgment's level (benchgate.judgment_alpha over the combinations)
    family_alpha: float = FAMILY_ALPHA

    def per_pull_request(self) -> Rate:
        """False alarms per pull request: the i-th real judgment of every combination made at once (run i's pairs,
        window i's rounds), an alarm where any of them says worse."""
        said = [c["real"].said for c in self.combos.values()]
        prs = max((len(s) for s in said), default=0)
        return Rate(sum(any(s[i] for s in said if i < len(s)) for i in range(prs)), prs)

    def total(self, which: str) -> _Tally:
        tally = _Tally()
        for combo in self.combos.values():
            part = combo[which]
            tally.alarms = Rate(tally.alarms.k + part.alarms.k, tally.alarms.n + part.alarms.n)
            for p, rate in part.caught.items():
                have = tally.caught.get(p, Rate(0, 0))
                tally.caught[p] = Rate(have.k + rate.k, have.n + rate.n)
        return tally

    @property
    def passes(self) -> bool:
        """False alarms within ``MAX_FALSE_ALARMS`` at the resampled upper bound, and no more than that share of the
        real judgments."""
        resampled, real = self.total("resampled").alarms, self.total("real").alarms
        return resampled.n > 0 and resampled.bounds[1] <= MAX_FALSE_ALARMS and real.value <= MAX_FALSE_ALARMS

    def to_json(self) -> dict:
        return {"runs": self.runs, "max_false_alarms": MAX_FALSE_ALARMS, "plants": list(PLANTS),
                "passes": self.passes, "alpha": self.alpha, "family_alpha": self.family_alpha,
                "per_pull_request": self.per_pull_request().to_json(), "real": self.total("real").to_json(),
                "resampled": self.total("resampled").to_json(),
                "combinations": {label: {"kind": c["kind"], "real": c["real"].to_json(),
                                         "resampled": c["resampled"].to_json()} for label, c in self.combos.items()}}

    def text(self) -> str:
        lines = [f"A/A study: {self.runs} runs of one commit, judged by the gate's rule against themselves "
                 f"(false alarms allowed: {100 * MAX_FALSE_ALARMS:g}% at the upper 95% bound)",
                 f"per pull request, its {len(self.combos)} combination(s) judged at once (each at alpha "
                 f"{self.alpha:.3g}, --family-alpha {self.family_alpha:g}): false alarms "
                 f"{self.per_pull_request().text()}", ""]
        for which, title in (("real", "real judgments (independent)"), ("resampled", "resampled judgments")):
            tally = self.total(which)
            lines.append(f"{title}: false alarms {tally.alarms.text()}")
            for p, rate in sorted(tally.caught.items()):
                lines.append(f"  planted {100 * (p - 1):.0f}% slower: caught {rate.text()}")
        lines += ["", "| benchmark | kind | real: alarms | real: 5% caught | resampled: alarms | resampled: 5% caught "
                  "| detects (median) | pairs (median) |", "|---|---|---|---|---|---|---|---|"]
        for label, c in sorted(self.combos.items()):
            real, res = c["real"], c["resampled"]
            detects, used = res.detects_median, res.pairs_median
            lines.append(f"| `{label}` | {c['kind']} | {real.alarms.text()} | "
                         f"{real.caught.get(SLOWDOWN, Rate(0, 0)).text()} | {res.alarms.text()} | "
                         f"{res.caught.get(SLOWDOWN, Rate(0, 0)).text()} | "
                         f"{'-' if detects is None else f'{100 * detects:.1f}%'} | {used if used else '-'} |")
        lines += ["", f"{'PASS' if self.passes else 'FAIL'}: false alarms "
                  f"{'within' if self.passes else 'beyond'} {100 * MAX_FALSE_ALARMS:g}%"]
        return "\n".join(lines)


def plant(measurement: Measurement, slowdown: float = SLOWDOWN) -> Measurement:
    """``measurement`` made ``slowdown`` times slower: a time multiplied, a throughput divided (samples too)."""
    if measurement.value is None or math.isnan(measurement.value):
        return measurement
    scale = 1 / slowdown if higher_is_better(measurement.name, measurement.unit) else slowdown
    samples = None if measurement.samples is None else tuple(s * scale for s in measurement.samples)
    return Measurement(measurement.name, measurement.params, measurement.unit, measurement.value * scale, samples,
                       measurement.stats)


def _judge(rule: Stopping, base, head, tally: _Tally) -> None:
    """One judgment as the gate makes it, as recorded and with each planted change: where ``rule`` (the gate's, as
    the gate builds it: ``interleave.pairs_rule``, ``interleave.rounds_rule``) stops (``Stopping.stop_at`` on the
    pairs' log ratios, a planted change added to each), then its verdict there (``benchgate.judge_rounds`` on the
    measurements, planted with :func:`plant`)."""
    ratios = log_ratios(base, head)
    if ratios is None:
        raise InvalidValue(f"{base[0].name}: a recorded value is zero or missing: no pairs to judge")
    source = "interleaved pairs" if rule.see else "rounds"
    worse = {}
    for slowdown in (1.0, *PLANTS):
        size = rule.stop_at([r + math.log(slowdown) for r in ratios])
        heads = head[:size] if slowdown == 1.0 else [plant(m, slowdown) for m in head[:size]]
        row = rule.judge(base[:size], heads, source=source)
        worse[slowdown] = row.verdict is Verdict.WORSE
        if slowdown == 1.0:
            if row.detects is not None and math.isfinite(row.detects):
                tally.detects.append(row.detects)
            tally.pairs.append(size)
    tally.add(worse.pop(1.0), worse)


def study(runs: Sequence[Mapping], factor: float = FACTOR, rounds: int = 2, max_rounds: int = 6,
          resampled: int = RESAMPLED, seed: int = 0, min_pairs: int = MIN_PAIRS, batch: int = BATCH,
          family_alpha: float = FAMILY_ALPHA) -> Study:
    """Judges recorded A/A runs (:func:`load_runs`' format) as the module says, each judgment at the level the gate
    gives it where all the study's combinations are judged at once (``benchgate.judgment_alpha``).

    Raises:
        InvalidValue: fewer than 2 runs, or a round series shorter than one window (``2 x max_rounds`` runs).
    """
    if len(runs) < 2:
        raise InvalidValue(f"an A/A study needs at least 2 runs; got {len(runs)}")
    rng = random.Random(seed)
    combos: dict = {}
    labels = sorted({label for run in runs for label in run.get("pairs", {})})
    round_labels = sorted({label for run in runs for label in run.get("rounds", {})} - set(labels))
    alpha = judgment_alpha(len(labels) + len(round_labels), family_alpha)
    for label in labels:
        recorded = [run["pairs"][label] for run in runs if label in run.get("pairs", {})]
        series = [(_side(label, r, "base"), _side(label, r, "head"),
                   replace(pairs_rule(factor, alpha=alpha), first=min_pairs, every=batch).sized(
                       int(r.get("per_process", 0))))
                  for r in recorded]
        real, res = _Tally(), _Tally()
        for base, head, rule in series:
            _judge(rule, base, head, real)
        for _ in range(resampled):
            base, head, rule = series[rng.randrange(len(series))]
            picked = _blocks(len(base), rng, rule.per_process)
            _judge(rule, [base[i] for i in picked], [head[i] for i in picked], res)
        combos[label] = {"kind": "pairs", "real": real, "resampled": res}
    for label in round_labels:
        values = [_round(label, run["rounds"][label]) for run in runs if label in run.get("rounds", {})]
        values = [m for m in values if m.ok]
        width = 2 * max_rounds
        if len(values) < width:
            raise InvalidValue(f"{label}: {len(values)} runs; a window of {max_rounds}+{max_rounds} rounds needs at "
                               f"least {width}")
        real, res = _Tally(), _Tally()
        rule = rounds_rule(factor, first=rounds, alpha=alpha, max_rounds=max_rounds)
        for start in range(0, len(values) - width + 1, width):  # windows that share no run
            window = values[start:start + width]
            _judge(rule, window[0::2], window[1::2], real)
        for _ in range(resampled):
            window = [values[rng.randrange(len(values))] for _ in range(width)]
            _judge(rule, window[0::2], window[1::2], res)
        combos[label] = {"kind": "rounds", "real": real, "resampled": res}
    return Study(len(runs), combos, alpha, family_alpha)


def _blocks(length: int, rng: random.Random, per_process: int = 0) -> list[int]:
    """Indices of ``length`` pairs as a block bootstrap: blocks of ``BLOCK`` consecutive pairs, each starting at an
    even pair anywhere in the run. Where the pairs came ``per_process`` from each process pair, a two-stage
    bootstrap: a process pair drawn at random, then as many of its pairs drawn from it (a block that straddled two
    process pairs would hide the offset between processes the gate judges by; a process pair drawn twice whole would
    be two identical values, a spread of none).

    Either way the crossover is kept: a pair lands where its order does (an even index is a base-first pair, an odd
    one head-first, as ``interleave`` takes them and ``benchgate.judged_values`` reads them), so that the study
    judges what the gate judges: each order's median apart, the second sample's handicap cancelling between them.
    """
    if per_process:
        groups = [range(start, min(start + per_process, length)) for start in range(0, length, per_process)]
        picked: list[int] = []
        while len(picked) < length:
            group = groups[rng.randrange(len(groups))]
            orders = (group[0::2], group[1::2])
            picked.extend(orders[j % 2][rng.randrange(len(orders[j % 2]))] for j in range(len(group)))
        return picked[:length]
    block = min(BLOCK - BLOCK % 2, length - length % 2) or length
    picked = []
    while len(picked) < length:
        start = 2 * rng.randrange((length - block) // 2 + 1)
        picked.extend(range(start, start + block))
    return picked[:length]


def _name(label: str) -> tuple[str, str]:
    name, _, params = label.partition(" (")
    return name, params[:-1] if params else ""


def _side(label: str, recorded: Mapping, side: str) -> list[Measurement]:
    name, params = _name(label)
    return [Measurement(name, params, recorded["unit"], float(v)) for v in recorded[side]]


def _round(label: str, recorded: Mapping) -> Measurement:
    name, params = _name(label)
    return Measurement(name, params, recorded["unit"], recorded["value"])


def save_run(path: Path | str, run: Mapping) -> None:
    """Appends one run (``{"run", "commit", "pairs": {label: {"unit", "number", "base", "head"}},
    "rounds": {label: {"unit", "value"}}}``) to ``path``, a JSON line."""
    with Path(path).open("a") as out:
        out.write(json.dumps(run) + "\n")


def load_runs(path: Path | str) -> list[dict]:
    """The runs :func:`save_run` wrote.

    Raises:
        InvalidValue: the file is missing, or a line is not a run.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidValue(f"no recorded runs at {path}")
    runs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            run = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidValue(f"{path}:{number}: not JSON ({err.msg})") from None
        if not isinstance(run, dict) or not ({"pairs", "rounds"} & set(run)):
            raise InvalidValue(f"{path}:{number}: not a recorded run (no 'pairs' or 'rounds')")
        runs.append(run)
    return runs
