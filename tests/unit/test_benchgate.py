"""The gate's rule without asv runs: direction, factor, significance, failures, exit status, Markdown."""

from __future__ import annotations

import math

import pytest

from harness.ci.benchgate import Row, Verdict, exit_status, higher_is_better, judge, markdown

_STATS = ({"repeat": 10}, [0.0] * 10)


def always(*_):
    return True


def never(*_):
    return False


def test_time_benchmarks_get_worse_upwards_and_throughput_downwards():
    step = "throughput.Time.time_train_step"
    assert judge(step, "seconds", 1.0, 1.3, _STATS, _STATS, 1.1, always)[0] is Verdict.WORSE
    assert judge(step, "seconds", 1.3, 1.0, _STATS, _STATS, 1.1, always)[0] is Verdict.BETTER
    verdict, ratio = judge("throughput.T.track_samples_per_second", "samples/s", 2000.0, 1500.0, factor=1.1)
    assert verdict is Verdict.WORSE and ratio == pytest.approx(2000 / 1500)
    assert judge("tuner.T.track_efficiency", "fraction", 0.99, 0.80, factor=1.1)[0] is Verdict.WORSE
    assert higher_is_better("x.track_samples_per_second", "") and not higher_is_better("x.peakmem_step", "bytes")


def test_within_the_factor_or_not_significant_is_the_same():
    assert judge("a.time_x", "seconds", 1.0, 1.09, _STATS, _STATS, 1.1, always)[0] is Verdict.SAME
    # 30% slower but the samples overlap: asv's test says not different, so not a regression.
    assert judge("a.time_x", "seconds", 1.0, 1.3, _STATS, _STATS, 1.1, never)[0] is Verdict.SAME


def test_failures_and_skips():
    assert judge("a.time_x", "seconds", 1.0, None)[0] is Verdict.ERROR
    assert judge("a.time_x", "seconds", None, 1.0)[0] is Verdict.FIXED
    assert judge("a.time_x", "seconds", None, None)[0] is Verdict.SAME
    assert judge("a.time_x", "seconds", math.nan, 1.0)[0] is Verdict.SKIPPED
    with pytest.raises(ValueError, match="factor must be > 1; got factor=1.0"):
        judge("a.time_x", "seconds", 1.0, 1.0, factor=1.0)


def _row(verdict: Verdict) -> Row:
    return Row("s.B.time_x", "2, towers", "seconds", 1.0, None if verdict is Verdict.ERROR else 1.5, verdict, 1.5)


def test_exit_status_errors_win_over_regressions():
    assert exit_status([_row(Verdict.SAME), _row(Verdict.BETTER)]) == 0
    assert exit_status([_row(Verdict.SAME), _row(Verdict.WORSE)]) == 1
    assert exit_status([_row(Verdict.WORSE), _row(Verdict.ERROR)]) == 2
    assert exit_status([]) == 0


def test_markdown_lists_the_worst_first():
    text = markdown([_row(Verdict.SAME), _row(Verdict.WORSE)], "a" * 40, "b" * 40, 1.1)
    lines = text.splitlines()
    assert lines[0] == "### :x: Performance regression: `bbbbbbbbbbbb` vs `aaaaaaaaaaaa` (factor 1.1)"
    table = [line for line in lines if line.startswith("| ")]
    assert table[1].startswith("| + | `s.B.time_x (2, towers)` | 1 | 1.5 | 1.50x |")
