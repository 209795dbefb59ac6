"""harness.bench.tuning.splits: the even, ratio and tuned splits every command and suite takes (no TensorFlow)."""

from __future__ import annotations

import math
import sys

import pytest

from harness.bench.tuning.solver import StepModel
from harness.bench.tuning.splits import TUNED_MARGIN, split_batches, usable_ceilings
from harness.errors import InvalidValue, Refused

FAST, SLOW = StepModel(0.002, 0.001), StepModel(0.002, 0.002)  # 1000 and 500 samples/s less the fixed cost


def test_even_and_ratio():
    assert split_batches("even", 10, 3) == (4, 3, 3)
    assert split_batches("ratio", 1000, 2, ratios=[3, 2]) == (600, 400)
    with pytest.raises(InvalidValue, match="one ratio per device"):
        split_batches("ratio", 1000, 3, ratios=[3, 2])
    with pytest.raises(InvalidValue, match="split must be one of even, ratio, tuned; got 'uneven'"):
        split_batches("uneven", 10, 2)


def test_tuned_gives_the_faster_device_more_within_its_ceiling():
    free = split_batches("tuned", 300, 2, models=[FAST, SLOW], ceilings=[None, None])
    assert sum(free) == 300 and free[0] > free[1]
    capped = split_batches("tuned", 300, 2, models=[FAST, SLOW], ceilings=[150, None])
    assert capped[0] <= math.floor(150 * (1 - TUNED_MARGIN)) and sum(capped) == 300


def test_the_margin_is_held_here_and_a_batch_beyond_memory_is_refused():
    assert usable_ceilings([100, None], unbounded=7) == [95, 7]
    assert usable_ceilings([100], unbounded=7, margin=0) == [100]
    with pytest.raises(InvalidValue, match="margin must be a fraction"):
        usable_ceilings([100], unbounded=7, margin=1.0)
    with pytest.raises(Refused, match="global batch 200 exceeds") as err:
        split_batches("tuned", 200, 2, models=[FAST, SLOW], ceilings=[100, 100])
    assert err.value.reason == "no-tuned-split"


def test_the_asv_suites_split_with_it_and_keep_a_fallback_for_older_commits(monkeypatch):
    """harness.bench.gridrun (the asv suites' splits) takes the shared function; on an older harness without it,
    its fallback gives the same batches."""
    from harness.bench import gridrun
    rows = [{"fixed_s": 0.002, "per_sample_s": 0.001, "ceiling": 400},
            {"fixed_s": 0.002, "per_sample_s": 0.002, "ceiling": None}]
    shared = {split: gridrun._split(split, 600, rows, 300) for split in ("even", "ratio", "tuned")}
    monkeypatch.setitem(sys.modules, "harness.bench.tuning.splits", None)  # import fails: an older commit
    older = {split: gridrun._split(split, 600, rows, 300) for split in ("even", "ratio", "tuned")}
    assert shared == older and shared["even"] == (300, 300) and shared["tuned"][0] > shared["tuned"][1]
    assert shared["ratio"] == split_batches("ratio", 600, 2, ratios=[m.samples_per_second(300) for m in (FAST, SLOW)])


@pytest.mark.parametrize("value, said", [("-1", "a ratio must be a positive finite number; got '-1'"),
                                         ("inf", "got 'inf'"), ("three", "not a number: 'three'")])
def test_compare_checks_each_ratio_at_the_edge(capsys, value, said):
    from harness.cli import main

    assert main(["compare", "--ratios", "3", value]) == 2
    assert said in capsys.readouterr().err


def test_compare_splits_its_ratios_with_the_one_function(monkeypatch, tmp_path):
    """``harness compare --ratios 3 2``: each value checked by argparse, the count by compare, then the even and
    ratio rows come from ``splits.split_batches`` given the parsed ratios as they are (no other arithmetic)."""
    from harness.bench.tuning import splits
    from harness.cli import compare, main, options
    from harness.emulate import parse_emulate

    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path))
    # No TensorFlow in this process: its devices, once made, would be every later test's in this worker.
    monkeypatch.setattr(options, "setup_devices", lambda args: options.DeviceSetup(
        ("/device:CPU:0", "/device:CPU:1"), parse_emulate(args.emulate), "emulated"))
    monkeypatch.setattr(compare, "_execute", lambda config, setup, out: {  # no training: a run's record, made up
        "status": "complete", "config": config.to_json(), "summary": {"samples_per_second": {"median": 100.0}}})
    monkeypatch.setattr(compare, "_report", lambda args, out, rows, setup: 0)
    calls, shared = [], splits.split_batches

    def spy(*args, **kwargs):
        calls.append((args, kwargs.get("ratios"), shared(*args, **kwargs)))
        return calls[-1][-1]

    monkeypatch.setattr(splits, "split_batches", spy)
    assert main(["compare", "--model", "wide_mlp", "--emulate", "2000,1000", "--ratios", "3", "2", "--batch", "100",
                 "--no-tune", "--no-stock", "--methods", "towers", "--seconds", "0.1", "--windows", "1"]) == 0
    assert calls == [(("even", 100, 2), [3.0, 2.0], (50, 50)), (("ratio", 100, 2), [3.0, 2.0], (60, 40))]
    assert main(["compare", "--emulate", "2000,1000", "--ratios", "3", "2", "1"]) == 2  # the count, at the edge
    assert len(calls) == 2
