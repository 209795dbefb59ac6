"""Planted wrong gates: each claim of tests/ci/test_gate.py must fail on a gate that is wrong.

A claim there is a function ``check_<claim>(gate, ...)`` that calls ``gate(repo, *argv)`` (``harness ARGV`` in
``repo``) and asserts on what it returns. :func:`verify_claim` runs it three ways:

- on the real gate (:class:`RecordingGate`: ``python -m harness`` in a subprocess, asv measuring for real),
  which records every measurement the gate reads (``harness.ci.asvresults.read_commit``);
- on a replay of those measurements through the real CLI, in this process (:class:`Replay`): it must reproduce
  the real exit status and stdout, and pass the check too;
- on each plant, replayed over the same measurements: it must **fail** the check (``AssertionError``).

The recording holds what the gate measured: every asv result it read (``harness.ci.asvresults.read_commit``) and
every series of interleaved pairs (``harness.ci.interleave.measure``); the replay hands them back in order and
installs nothing.

A plant replaces the gate's decision, ``harness.ci.benchgate.judge_rounds`` (every module holding it: the gate
and ``harness.ci.aaseries``), and nothing else: argument handling, more rounds, exit status and Markdown stay the
real ones, so the plants still apply where the sampling around that decision changes. ``always 0`` says "same"
and ``always 1`` says "worse" for every benchmark whatever its values (neither calibrates a threshold, so its
rows show no noise and nothing detectable); ``threshold 1.5`` is the real rule with its factor fixed at 1.5,
whatever ``--factor``. A plant that never decided anything while the check failed is an error, never a pass: the
check failed for another reason.

A replay runs no asv (0.1-0.3 s on this 2-core host, most of it asv's exact Mann-Whitney test where the real rule
calls it), so the quick test in tests/ci/test_gate.py checks its plants for about half a second beside its 20 s asv
comparison. The tests below check the machinery itself on synthetic rounds (a fixed seed), with no asv run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

pytest.importorskip("asv")

from demorepo import make_repo  # noqa: E402

from harness.ci import aaseries, asvresults, asvrun, benchgate, interleave  # noqa: E402, F401  aaseries: _holders
from harness.ci.asvresults import Measurement  # noqa: E402
from harness.ci.benchgate import Verdict  # noqa: E402

__all__ = ["PLANTS", "Call", "RecordingGate", "Replay", "ReplayError", "verify_claim", "verify_plants"]

_JUDGE = benchgate.judge_rounds  # the real decision, before any plant


def _blind(verdict: Verdict) -> Callable:
    def decide(base, head, factor=benchgate.FACTOR, history=None, source="rounds", per_process=0,
               alpha=benchgate.ALPHA):
        row = _JUDGE(base, head, factor, history, source, per_process, alpha)  # for the name and the values only
        return replace(row, verdict=verdict, threshold=None, noise=None, note="", detects=None, pairs=None)
    return decide


def _threshold_1_5(base, head, factor=benchgate.FACTOR, history=None, source="rounds", per_process=0,
                   alpha=benchgate.ALPHA):
    return _JUDGE(base, head, 1.5, history, source, per_process, alpha)


PLANTS: dict[str, Callable] = {"always 0": _blind(Verdict.SAME), "always 1": _blind(Verdict.WORSE),
                               "threshold 1.5": _threshold_1_5}


class ReplayError(RuntimeError):
    """The replay could not stand in for the real gate (never an ``AssertionError``: a plant must fail a check
    by what the check asserts, not by the machinery)."""


# ``python -c`` program: the real CLI (``python -m harness``), with a spy on the one function through which the
# gate reads asv's results, appending each commit's measurements to $GATE_RECORDING as a JSON line.
_SPY = """
import json, os, sys
from harness.ci import asvresults
from harness.cli import console

from harness.ci import interleave

_read = asvresults.read_commit
_measure = interleave.measure


def _record(entry):
    with open(os.environ["GATE_RECORDING"], "a") as out:
        out.write(json.dumps(entry) + "\\n")


def read_commit(config, machine, commit, since=None):
    found = _read(config, machine, commit, since)
    _record({"commit": commit, "found": [[m.name, m.params, m.unit, m.value, m.samples, m.stats]
                                         for m in found.values()]})
    return found


def measure(key, unit, *args, **kwargs):
    done = _measure(key, unit, *args, **kwargs)
    _record({"pairs": list(key), "unit": unit, "base": [m.value for m in done.base],
             "head": [m.value for m in done.head], "number": done.number, "stopped": done.stopped,
             "skipped": done.skipped, "per_process": done.per_process, "net": done.net, "seconds": done.seconds})
    return done


asvresults.read_commit = read_commit
interleave.measure = measure
sys.argv[0] = "harness"
sys.exit(console())
"""


@dataclass(frozen=True)
class Call:
    """One run of the gate: its arguments, what it printed and returned, and what it read, in order."""

    argv: tuple[str, ...]
    outcome: subprocess.CompletedProcess | None  # None: synthetic reads, nothing to reproduce
    reads: tuple[tuple[str, dict], ...]  # (commit, {key: Measurement})


class RecordingGate:
    """The real gate: ``harness ARGV`` in a subprocess in ``repo``, as demorepo.run_harness runs it (HOME beside
    the repository for asv's machine file, the commits' install folder on asv's path), recording its reads."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(self, repo: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="gate-recording-") as folder:
            recording = Path(folder) / "reads.jsonl"
            env = {**os.environ, "HOME": str(repo.parent), "ASV_PYTHONPATH": str(repo.parent / f"site-{repo.name}"),
                   "GATE_RECORDING": str(recording)}
            done = subprocess.run([sys.executable, "-c", _SPY, *argv], cwd=repo, capture_output=True, text=True,
                                  env=env, timeout=timeout)
            lines = recording.read_text().splitlines() if recording.exists() else []
        self.calls.append(Call(tuple(argv), done, tuple(_measurements(json.loads(line)) for line in lines)))
        return done

    def replay(self, plant: str | None = None) -> Replay:
        return Replay(self.calls, plant)


def _measurements(read: dict) -> tuple[str, object]:
    """A recorded read: ``(commit, {key: Measurement})``, or ``("pairs", (key, Sampled))`` for interleaved pairs."""
    if "pairs" in read:
        name, params = read["pairs"]
        sides = [tuple(Measurement(name, params, read["unit"], v) for v in read[side]) for side in ("base", "head")]
        return "pairs", ((name, params), interleave.Sampled(sides[0], sides[1], read["number"], read["stopped"],
                                                            read["skipped"], read["per_process"], read["net"],
                                                            read.get("seconds", 0.0)))
    found = {}
    for name, params, unit, value, samples, stats in read["found"]:
        found[name, params] = Measurement(name, params, unit, value, None if samples is None else tuple(samples),
                                          stats)
    return read["commit"], found


class Replay:
    """The real CLI in this process over recorded measurements (asv stubbed out), the decision planted or not.

    Calls must come in the recorded order with the recorded arguments. Without a plant each call must reproduce
    the recorded exit status and stdout. A plant that asks for a measurement the real gate did not make is a
    :class:`ReplayError`. ``decisions`` counts the plant's verdicts.
    """

    def __init__(self, calls: list[Call], plant: str | None):
        if plant is not None and plant not in PLANTS:
            raise ReplayError(f"plant must be one of {', '.join(PLANTS)}; got {plant!r}")
        self.calls, self.plant, self.decisions, self._next = calls, plant, 0, 0

    def __call__(self, repo: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        from harness.cli import main

        if self._next >= len(self.calls) or self.calls[self._next].argv != argv:
            raise ReplayError(f"call {self._next + 1} was not recorded: harness {' '.join(argv)}")
        call, self._next = self.calls[self._next], self._next + 1
        reads, broken = list(call.reads), []

        def read_commit(config, machine, commit, since=None):
            if not reads or reads[0][0] != commit:
                broken.append(f"the gate asked for {commit[:12]}'s results, the real gate read "
                              f"{reads[0][0][:12] if reads else 'nothing more'}")
                raise ReplayError(broken[-1])
            return reads.pop(0)[1]

        def measure(key, unit, *args, **kwargs):
            if not reads or reads[0][0] != "pairs" or reads[0][1][0] != tuple(key):
                broken.append(f"the gate timed {key} in pairs, the real gate read "
                              f"{reads[0][0][:12] if reads else 'nothing more'}")
                raise ReplayError(broken[-1])
            return reads.pop(0)[1][1]

        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(repo)
            patch.setattr(asvrun.AsvProject, "run_commit", lambda self, *args, **kwargs: 0)
            patch.setattr(asvrun.AsvProject, "register_machine", lambda self: None)
            patch.setattr(asvrun.AsvProject, "check_build_requirements", lambda self, *commits: None)
            patch.setattr(asvrun.AsvProject, "install_into", lambda self, commit, target: None)
            patch.setattr(asvresults, "read_commit", read_commit)
            patch.setattr(interleave, "measure", measure)
            if self.plant is not None:
                decide = self._counted(PLANTS[self.plant])
                for module in _holders(_JUDGE):
                    patch.setattr(module, "judge_rounds", decide)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(argv))
        done = subprocess.CompletedProcess(["harness", *argv], code, out.getvalue(), err.getvalue())
        if broken or "internal error" in done.stderr:
            raise ReplayError(f"replay of harness {' '.join(argv)}: {broken or done.stderr[-3000:]}")
        real = call.outcome
        if self.plant is None and real is not None and (done.returncode, done.stdout) != (real.returncode, real.stdout):
            raise ReplayError(f"the replay of harness {' '.join(argv)} exited {done.returncode}, the real gate "
                              f"{real.returncode}:\n{done.stdout}\n--- real:\n{real.stdout}")
        return done

    def _counted(self, decide: Callable) -> Callable:
        def counted(*args, **kwargs):
            self.decisions += 1
            return decide(*args, **kwargs)
        return counted


def _holders(function) -> list:
    """The harness modules that hold ``function`` by name (``from benchgate import judge_rounds`` copies it: the A/A
    series, imported above so that it is in ``sys.modules`` when a plant looks)."""
    return [module for name, module in list(sys.modules.items())
            if name.split(".")[0] == "harness" and getattr(module, function.__name__, None) is function]


def verify_claim(check: Callable, *args, plants: tuple[str, ...] = tuple(PLANTS)) -> RecordingGate:
    """``check(gate, *args)`` holds on the real gate, then :func:`verify_plants`.

    Returns the real gate, whose ``calls`` hold what asv printed, for the assertions only a real run can make.
    """
    real = RecordingGate()
    check(real, *args)
    verify_plants(check, real, *args, plants=plants)
    return real


def verify_plants(check: Callable, real: RecordingGate, *args, plants: tuple[str, ...] = tuple(PLANTS)) -> None:
    """``check(gate, *args)`` holds on the replay of ``real``'s calls and fails on each of ``plants``.

    Raises:
        ReplayError: the check failed on a plant that had decided nothing yet: not because of the plant.
    """
    check(real.replay(), *args)
    for plant in plants:
        planted = real.replay(plant)
        with pytest.raises(AssertionError) as failed:
            check(planted, *args)
        if not planted.decisions:
            raise ReplayError(f"the check failed on plant {plant!r} before it decided anything, so not because of "
                              f"it: {failed.value}")


# The machinery on synthetic rounds: no asv run; a replay is a few git calls and the CLI in this process.

_KEY = ("bench.Work.time_work", "")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    repo = tmp_path_factory.mktemp("plantdemo")
    return repo, make_repo(repo)


def _argv(commit: str, *extra: str) -> tuple[str, ...]:
    return ("bench-compare", commit, commit, "--mode", "existing", "--machine", "plants", *extra)


def _rounds(rng, commit: str, slower: float, rounds: int = 2, pairs: int = 20) -> tuple:
    """``rounds`` interleaved rounds of a 20 ms benchmark (0.3% apart, ten samples 0.2% apart), head ``slower``,
    then ``pairs`` interleaved pairs (0.3% apart; none: ``--no-interleave``)."""
    def measured(seconds):
        samples = tuple(float(s) for s in seconds * (1 + 0.003 * rng.normal()) * (1 + 0.002 * rng.normal(size=10)))
        return commit, {_KEY: Measurement(*_KEY, "seconds", sorted(samples)[5], samples, {"repeat": 10})}

    def sampled(seconds):
        return tuple(Measurement(*_KEY, "seconds", float(s)) for s in seconds * (1 + 0.003 * rng.normal(size=pairs)))
    reads = tuple(read for _ in range(rounds) for read in (measured(0.02), measured(0.02 * slower)))
    if pairs:
        reads += (("pairs", (_KEY, interleave.Sampled(sampled(0.02), sampled(0.02 * slower), 1, "decided"))),)
    return reads


def test_each_plant_is_wrong_where_the_real_gate_is_right(synthetic):
    # An A/A pair and a 30% slower head, quiet rounds: the real gate's answers are determined (0, then 1 with the
    # 3% floor as its threshold); each plant gets one of them wrong, in the way its name says.
    import numpy as np

    repo, commit = synthetic
    rng = np.random.default_rng(7)
    gate = RecordingGate()
    gate.calls += [Call(_argv(commit), None, _rounds(rng, commit, slower)) for slower in (1.0, 1.3)]
    replays = {plant: gate.replay(plant) for plant in (None, *PLANTS)}
    said = {plant: [replay(repo, *call.argv).returncode for call in gate.calls] for plant, replay in replays.items()}
    assert said == {None: [0, 1], "always 0": [0, 0], "always 1": [1, 1], "threshold 1.5": [0, 0]}
    (same,) = [line for line in gate.replay()(repo, *_argv(commit)).stdout.splitlines() if "`bench.Work" in line]
    assert "20 interleaved pairs" in same and float(same.split("|")[7].strip().rstrip("%")) < 3.5, same  # ~ the floor
    (row,) = [line for line in gate.replay("always 1")(repo, *_argv(commit)).stdout.splitlines()
              if line.startswith("| + |")]
    assert [cell.strip() for cell in row.split("|")[6:8]] == ["", ""], row  # blind: no noise, nothing it could detect


def test_a_plant_asking_for_a_measurement_the_real_gate_did_not_make_is_an_error(synthetic):
    # Without more rounds recorded, a gate that finds two rounds undecided (1.05 against the 1.03 floor, t at one
    # degree of freedom) asks for one more round: the replay cannot invent it.
    import numpy as np

    repo, commit = synthetic
    gate = RecordingGate()
    argv = _argv(commit, "--no-interleave")
    gate.calls.append(Call(argv, None, _rounds(np.random.default_rng(3), commit, 1.05, pairs=0)))
    with pytest.raises(ReplayError, match="the real gate read nothing more"):
        gate.replay()(repo, *argv)


def test_a_check_that_fails_on_a_plant_before_it_decides_is_an_error_not_a_pass(synthetic):
    # --rounds 1 is refused before any verdict: a check that fails there on a plant fails for another reason.
    repo, commit = synthetic
    argv = _argv(commit, "--rounds", "1")
    gate = RecordingGate()
    gate.calls.append(Call(argv, None, ()))

    def check(gate, repo):
        done = gate(repo, *argv)
        assert done.returncode == 2 and "--rounds must be at least 2; got 1" in done.stderr
        assert getattr(gate, "plant", None) is None  # fails on every plant, whatever it decides

    with pytest.raises(ReplayError, match="before it decided anything"):
        verify_plants(check, gate, repo)


def _undecided_pairs(rng, commit: str, extra_rounds: int) -> tuple:
    """Two quiet rounds, then 40 interleaved pairs from 4 process pairs whose time varies by a third from call to
    call, head 5% slower, stopped on their budget (undecided), then ``extra_rounds`` rounds in which head measures
    the same as base: what a gate that measured the row again in rounds would read."""
    def measured(seconds):
        return commit, {_KEY: Measurement(*_KEY, "seconds", seconds, (seconds,) * 10, {"repeat": 10})}

    def sampled(seconds):
        return tuple(Measurement(*_KEY, "seconds", float(s)) for s in seconds * (1 + 0.3 * rng.uniform(-1, 1, 40)))
    reads = (measured(0.02), measured(0.021), measured(0.021), measured(0.02))
    reads += (("pairs", (_KEY, interleave.Sampled(sampled(0.02), sampled(0.021), 1, "budget", per_process=10))),)
    return reads + tuple(read for _ in range(extra_rounds) for read in (measured(0.02), measured(0.02)))


@pytest.mark.parametrize("policy", ["fail", "warn"])
def test_an_undecided_interleaved_row_keeps_its_pairs_verdict_inconclusive_never_a_silent_pass(synthetic, policy):
    # The row's noise label reads "40 interleaved pairs in 4 process pairs": a gate that tells pairs' rows by the
    # label's end measured it again in asv rounds, and the rounds' "same" passed it (exit 0). Its pairs could not tell
    # 5% from no change: inconclusive, exit 3 (--inconclusive fail) or said and exit 0 (warn); the rounds unread.
    import numpy as np

    repo, commit = synthetic
    argv = _argv(commit, "--inconclusive", policy)
    gate = RecordingGate()
    gate.calls.append(Call(argv, None, _undecided_pairs(np.random.default_rng(11), commit, extra_rounds=4)))
    done = gate.replay()(repo, *argv)
    assert done.returncode == (3 if policy == "fail" else 0), done.stdout + done.stderr
    assert done.stdout.startswith("### :grey_question: Inconclusive: 1 benchmark could not tell 1.03x"), done.stdout
    (row,) = [line for line in done.stdout.splitlines() if "`bench.Work" in line]
    assert row.startswith("| ~ |") and "40 interleaved pairs in 4 process pairs" in row, row
    assert "could not tell 1.03x from no change in 4 values" in row, row
    assert "measuring once more" not in done.stderr, done.stderr
