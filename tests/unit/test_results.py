"""Run records: summary figures, ids, the JSON round trip, and atomic writes under SIGKILL."""

import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path

import pytest

from harness.bench.results import (
    cleanup_temp,
    default_results_dir,
    load_records,
    new_record,
    record_path,
    summarize,
    write_record,
)

REPO = Path(__file__).resolve().parents[2]


def test_summarize_figures():
    summary = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary["median"] == 3.0
    assert summary["mean"] == 22.0
    assert (summary["min"], summary["max"], summary["n"]) == (1.0, 100.0, 5)
    assert summary["iqr"] == 2.0  # inclusive quartiles 2 and 4, as numpy.percentile
    assert summary["spread"] == pytest.approx(2.0 / 3.0)


def test_summarize_edge_cases():
    assert summarize([]) == dict.fromkeys(["median", "mean", "min", "max", "iqr", "spread"], None) | {"n": 0}
    assert summarize([5]) == {"median": 5.0, "mean": 5.0, "min": 5.0, "max": 5.0, "iqr": 0.0, "spread": None, "n": 1}
    assert summarize([0, 0])["spread"] is None
    with pytest.raises(ValueError, match=r"values=\[1.0, nan\]"):
        summarize([1.0, math.nan])


def test_default_results_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path / "mine"))
    assert default_results_dir() == tmp_path / "mine"
    monkeypatch.delenv("HARNESS_RESULTS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_results_dir() == tmp_path / "xdg" / "harness" / "results"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_results_dir() == tmp_path / "home" / ".cache" / "harness" / "results"


def test_new_record_fields():
    now = datetime(2026, 11, 22, 10, 15, 0, 999, tzinfo=timezone.utc)
    record = new_record("run", {"ratios": [3, 2]}, {"python": "3.11"}, now=now)
    assert record["schema"] == 1
    assert record["kind"] == "run"
    assert record["status"] == "running"
    assert record["created"] == "2026-11-22T10:15:00+00:00"
    assert record["id"].startswith("20261122T101500Z-") and len(record["id"]) == len("20261122T101500Z-a1b2c3")
    assert record_path(record, "/r") == Path("/r") / f"run-{record['id']}.json"


def test_record_ids_sort_by_time_and_are_unique():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    times = [start + timedelta(seconds=s) for s in (0, 1, 59, 3600, 86400 * 40)]
    ids = [new_record("compare", {}, {}, now=t)["id"] for t in times]
    assert sorted(ids) == ids
    assert len({new_record("run", {}, {}, now=start)["id"] for _ in range(200)}) == 200


def test_bad_kind_is_named():
    with pytest.raises(ValueError, match=r"kind='benchmark'"):
        new_record("benchmark", {}, {})


def test_write_load_round_trip(tmp_path):
    record = new_record("run", {"ratios": [3, 2], "batch": 1000}, {"devices": ["cpu:0", "cpu:1"]})
    path = write_record(record, tmp_path)
    assert path == tmp_path / f"run-{record['id']}.json"
    record["windows"] = [{"samples_per_s": 2123.5, "per_device": (1200, 923.5)}]
    record["status"] = "complete"
    assert write_record(record, tmp_path) == path  # a rewrite replaces the same file
    [loaded] = load_records(tmp_path, kind="run")
    assert loaded == {**record, "windows": [{"samples_per_s": 2123.5, "per_device": [1200, 923.5]}]}
    assert os.listdir(tmp_path) == [path.name]  # no temp files left behind
    later = new_record("compare", {}, {}, now=datetime.now(timezone.utc) + timedelta(seconds=5))
    write_record(later, tmp_path)
    assert [r["id"] for r in load_records(tmp_path)] == [record["id"], later["id"]]
    assert [r["id"] for r in load_records(tmp_path, kind="compare")] == [later["id"]]


def test_non_finite_floats_are_written_as_null(tmp_path):
    record = new_record("run", {}, {})
    record["summary"] = {"median": math.nan, "max": math.inf, "min": -math.inf, "n": 0}
    text = write_record(record, tmp_path).read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["summary"] == {"median": None, "max": None, "min": None, "n": 0}
    assert record["summary"]["median"] != record["summary"]["median"]  # the caller's dict is untouched


def test_numpy_dataclass_and_enum_values_are_stored_as_json(tmp_path):
    import numpy as np

    @dataclasses.dataclass(frozen=True)
    class Window:
        samples_per_s: float
        sizes: tuple

    class Method(str, Enum):
        TOWERS = "towers"

    record = new_record("run", {"method": Method.TOWERS, "ratios": np.array([3.0, 2.0])}, {})
    record["windows"] = [Window(np.float32(1.5), (np.int64(600), 400)), Window(math.nan, ())]
    loaded = json.loads(write_record(record, tmp_path).read_text())
    assert loaded["config"] == {"method": "towers", "ratios": [3.0, 2.0]}
    assert loaded["windows"] == [{"samples_per_s": 1.5, "sizes": [600, 400]}, {"samples_per_s": None, "sizes": []}]


def test_circular_record_is_refused(tmp_path):
    record = new_record("run", {}, {})
    record["config"]["self"] = record["config"]
    with pytest.raises(ValueError, match=r"circular reference at record\['config'\]\['self'\]"):
        write_record(record, tmp_path)


def test_unserialisable_value_names_its_key_and_writes_nothing(tmp_path):
    record = new_record("run", {"optimizer": {"schedule": [1, object()]}}, {})
    target = tmp_path / "not-yet"
    with pytest.raises(TypeError, match=r"record\['config'\]\['optimizer'\]\['schedule'\]\[1\]"):
        write_record(record, target)
    assert not target.exists()


def test_non_string_key_is_named(tmp_path):
    record = new_record("run", {"per_device": {0: 1.0}}, {})
    with pytest.raises(TypeError, match=r"key 0 .* in record\['config'\]\['per_device'\]"):
        write_record(record, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_directory_is_created(tmp_path):
    target = tmp_path / "a" / "b"
    path = write_record(new_record("compare", {}, {}), target)
    assert path.parent == target and path.is_file()


def test_default_directory_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path))
    record = new_record("run", {}, {})
    write_record(record)
    assert [r["id"] for r in load_records()] == [record["id"]]


def test_load_skips_unreadable_files_with_one_warning_each(tmp_path):
    good = new_record("run", {}, {})
    write_record(good, tmp_path)
    (tmp_path / "run-broken.json").write_text('{"schema": 1, "kind": "run", "id": "x"')
    (tmp_path / "notes.json").write_text("[1, 2]")
    (tmp_path / f".run-{good['id']}.json.abc.tmp").write_text("{")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_records(tmp_path)
    assert [r["id"] for r in records] == [good["id"]]
    assert len(caught) == 2
    assert "run-broken.json" in str(caught[0].message) + str(caught[1].message)
    assert "notes.json" in str(caught[0].message) + str(caught[1].message)
    assert load_records(tmp_path / "missing") == []


def test_cleanup_temp_removes_only_stale_temp_files(tmp_path):
    stale, fresh = tmp_path / ".run-x.json.1.tmp", tmp_path / ".run-y.json.2.tmp"
    keep = write_record(new_record("run", {}, {}), tmp_path)
    for path in (stale, fresh):
        path.write_text("{")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert cleanup_temp(tmp_path) == [stale]
    assert sorted(tmp_path.iterdir()) == sorted([fresh, keep])
    assert cleanup_temp(tmp_path, older_than_s=0) == [fresh]
    with pytest.raises(ValueError, match="older_than_s=-1"):
        cleanup_temp(tmp_path, older_than_s=-1)


# --- atomicity under SIGKILL -------------------------------------------------------------------

PAYLOAD_CHARS = 4_000_000  # several MB, so that most of the writer's time is spent writing

ATOMIC_WRITER = f"""
import sys
from harness.bench.results import new_record, write_record
record = new_record("run", {{"ratios": [3, 2]}}, {{"host": "test"}})
record["id"] = "20260101T000000Z-000000"
record["windows"] = [{{"window": i, "samples_per_s": 1000.0 + i}} for i in range(2000)]
record["payload"] = "x" * {PAYLOAD_CHARS}
print("ready", flush=True)
iteration = 0
while True:
    iteration += 1
    record["iteration"] = iteration
    record["status"] = "complete" if iteration % 2 else "running"
    write_record(record, sys.argv[1])
"""

# Writes in place, many small flushed chunks: what write_record guards against.
NAIVE_WRITER = f"""
import json, sys
path = sys.argv[1] + "/run-20260101T000000Z-000000.json"
data = json.dumps({{"windows": list(range(2000)), "payload": "x" * {PAYLOAD_CHARS}}})
chunks = [data[i:i + 4096] for i in range(0, len(data), 4096)]
with open(path, "w") as f:
    f.write(data)
print("ready", flush=True)
while True:
    with open(path, "w") as f:
        for chunk in chunks:
            f.write(chunk)
            f.flush()
"""


def _kill_writers(script: str, directories: list, seed: int) -> None:
    """Starts one writer per directory, then SIGKILLs each at a random moment of its loop."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = []
    try:
        for directory in directories:
            directory.mkdir()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", script, str(directory)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                )
            )
        for proc in procs:
            line = proc.stdout.readline()
            assert line == b"ready\n", proc.stderr.read().decode() if proc.poll() is not None else line
        start = time.monotonic()
        rng = random.Random(seed)
        for proc, moment in sorted(zip(procs, (rng.uniform(0.02, 0.4) for _ in procs)), key=lambda pm: pm[1]):
            time.sleep(max(0.0, start + moment - time.monotonic()))
            assert proc.poll() is None, proc.stderr.read().decode()  # still writing when killed
            proc.send_signal(signal.SIGKILL)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
@pytest.mark.parametrize("seed", [0, 1])
def test_write_record_is_atomic_under_sigkill(tmp_path, seed):
    directories = [tmp_path / f"w{i}" for i in range(4)]
    _kill_writers(ATOMIC_WRITER, directories, seed)
    for directory in directories:
        target = directory / "run-20260101T000000Z-000000.json"
        leftovers = [p.name for p in directory.iterdir() if p != target]
        assert all(name.startswith(f".{target.name}.") and name.endswith(".tmp") for name in leftovers), leftovers
        if not target.exists():  # killed before the first write finished
            assert load_records(directory) == []
            continue
        record = json.loads(target.read_text())  # complete JSON, never a torn file
        assert len(record["payload"]) == PAYLOAD_CHARS
        assert record["windows"][-1] == {"window": 1999, "samples_per_s": 2999.0}
        assert record["status"] == ("complete" if record["iteration"] % 2 else "running")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert load_records(directory) == [record]
        assert len(cleanup_temp(directory, older_than_s=0)) == len(leftovers)
        assert list(directory.iterdir()) == [target]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_naive_writer_killed_the_same_way_leaves_a_torn_file(tmp_path):
    # Shows the kill test above can catch a torn write: the naive writer is caught mid-write.
    directories = [tmp_path / f"w{i}" for i in range(4)]
    _kill_writers(NAIVE_WRITER, directories, seed=0)
    torn = 0
    for directory in directories:
        try:
            json.loads((directory / "run-20260101T000000Z-000000.json").read_text())
        except json.JSONDecodeError:
            torn += 1
    assert torn >= 1
