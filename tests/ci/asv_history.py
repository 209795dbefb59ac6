"""Synthetic asv histories for tests: a git repository of N empty commits and real asv result files for them.

The results are written by asv's own ``Results.add_result`` + ``save`` (asv 0.6's
format: ``<machine>/<hash8>-<env>.json``, ``<machine>/machine.json``,
``benchmarks.json``), so ``harness regressions`` reads them as it reads the
nightly ``asv-results`` branch.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DAY_MS", "make_repo", "benchmark", "write_benchmarks", "write_commit", "write_history", "levels"]

DAY_MS = 86_400_000
START_S = 1_735_689_600  # 2025-01-01T00:00:00Z: commit i is dated START_S + i days
ENV = "existing-py_usr_bin_python3.11"


def make_repo(path: Path, n: int) -> list[str]:
    """A git repository at ``path`` with ``n`` empty commits on ``main``, one a day; their hashes, oldest first.

    One ``git fast-import`` writes them all (fast; a commit per subprocess would take seconds).
    """
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    stream = []
    for i in range(n):
        message = f"commit {i + 1}\n".encode()
        stream.append(b"commit refs/heads/main\nmark :%d\n" % (i + 1))
        stream.append(b"author T <t@example.invalid> %d +0000\n" % (START_S + i * 86400))
        stream.append(b"committer T <t@example.invalid> %d +0000\n" % (START_S + i * 86400))
        stream.append(b"data %d\n%s" % (len(message), message))
        if i:
            stream.append(b"from :%d\n" % i)
        stream.append(b"\n")
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=b"".join(stream), check=True)
    done = subprocess.run(["git", "-C", str(path), "rev-list", "--reverse", "main"], capture_output=True, text=True,
                          check=True)
    return done.stdout.split()


def commit_date_ms(index: int) -> int:
    """asv's ``date`` of commit ``index`` (0-based) of :func:`make_repo`: milliseconds since the epoch."""
    return (START_S + index * 86400) * 1000


def benchmark(name: str, unit: str = "seconds", params: Sequence[Sequence[str]] = (),
              param_names: Sequence[str] = ()) -> dict:
    """A ``benchmarks.json`` entry as ``asv run`` writes it (params as reprs: ``"'even'"``, ``"2"``)."""
    kind = name.split(".")[-1].split("_")[0]
    return {"name": name, "type": {"time": "time", "track": "track", "peakmem": "peakmemory"}.get(kind, kind),
            "unit": unit, "params": [list(p) for p in params], "param_names": list(param_names),
            "version": "1" * 64, "code": f"def {name.split('.')[-1]}(self): pass", "timeout": 60}


def write_benchmarks(results: Path, benchmarks: Sequence[dict], machine: str = "ci") -> None:
    """``benchmarks.json`` and ``<machine>/machine.json``."""
    from asv.util import write_json

    write_json(str(results / "benchmarks.json"), {b["name"]: b for b in benchmarks}, api_version=2)
    write_json(str(results / machine / "machine.json"),
               {"machine": machine, "arch": "x86_64", "cpu": "test", "num_cpu": "2", "os": "Linux", "ram": "1"},
               api_version=1)


def write_commit(results: Path, machine: str, commit: str, date_ms: int, benchmarks: Sequence[dict],
                 values: dict[str, list], rng: random.Random | None = None, env: str = ENV) -> None:
    """One result file: ``values[name]`` has one value per parameter combination (None failed, NaN skipped).

    ``time_`` values are recorded as asv records them: 10 samples (0.5% apart: noise within one job) whose
    median is the value, with asv's statistics (its weight comes from their confidence interval).
    """
    from asv.results import Results
    from asv.runner import BenchmarkResult

    rng = rng or random.Random(0)
    result = Results({"machine": machine, "python": "3.11"}, {}, commit, date_ms, "3.11", env, {})
    for bench in benchmarks:
        row = values[bench["name"]]
        timed = bench["type"] == "time"
        samples = [[v * (1 + rng.gauss(0, 0.005)) for _ in range(10)] if timed and _ok(v) else None for v in row]
        numbers = [1 if s is not None else None for s in samples]
        result.add_result(bench, BenchmarkResult(result=list(row), samples=samples, number=numbers, errcode=0,
                                                 stderr="", profile=None), record_samples=True)
    result.save(str(results))


def levels(n: int, noise: float, seed: int, step_at: int | None = None, step: float = 0.0,
           base: float = 1.0) -> list[float]:
    """``n`` commit levels: ``base`` times Gaussian noise (relative sigma ``noise``), times ``1 + step`` from
    index ``step_at`` on."""
    rng = random.Random(seed)
    return [base * (1 + rng.gauss(0, noise)) * (1 + step if step_at is not None and i >= step_at else 1)
            for i in range(n)]


def write_history(results: Path, commits: Sequence[str], benchmarks: Sequence[dict],
                  series: dict[str, list[list]], machine: str = "ci",
                  order: Sequence[int] | None = None) -> None:
    """Result files for every commit: ``series[name][i]`` is commit ``i``'s list of values (one per combination).

    ``order``: the order the files are written in (default: oldest first); dates always follow the commits.
    """
    write_benchmarks(results, benchmarks, machine)
    rng = random.Random(1)
    for i in order if order is not None else range(len(commits)):
        write_commit(results, machine, commits[i], commit_date_ms(i), benchmarks,
                     {name: list(values[i]) for name, values in series.items()}, rng)


def _ok(value) -> bool:
    return value is not None and value == value
