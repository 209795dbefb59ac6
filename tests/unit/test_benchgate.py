"""The gate's rule without asv runs: direction, factor, significance, failures, exit status, Markdown."""

from __future__ import annotations

import math

import pytest

from harness.ci.asvresults import Measurement
from harness.ci.benchgate import (
    Noise,
    Row,
    Verdict,
    after_rerun,
    exit_status,
    higher_is_better,
    is_borderline,
    judge,
    judge_rounds,
    markdown,
)
from harness.ci.noise import relative_noise

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


def test_exit_status_no_verdict_wins_over_regressions_and_nothing_measured_is_no_pass():
    assert exit_status([_row(Verdict.SAME), _row(Verdict.BETTER)]) == 0
    assert exit_status([_row(Verdict.SAME), _row(Verdict.WORSE)]) == 1
    crashed = [_row(Verdict.WORSE), _row(Verdict.ERROR)]
    assert exit_status(crashed) == 3  # a crash is neither a slow-down nor a pass
    assert markdown(crashed, "a" * 40, "b" * 40, 1.1).startswith(
        "### :grey_question: No verdict, an infrastructure error: 1 benchmark failed on head:")
    assert exit_status([]) == 3  # asked to compare, measured nothing
    assert "no benchmark was compared" in markdown([], "a" * 40, "b" * 40, 1.1).splitlines()[0]
    assert exit_status([_row(Verdict.SKIPPED), _row(Verdict.SKIPPED)]) == 3


def test_markdown_lists_the_worst_first():
    text = markdown([_row(Verdict.SAME), _row(Verdict.WORSE)], "a" * 40, "b" * 40, 1.1)
    lines = text.splitlines()
    assert lines[0] == "### :x: Performance regression: `bbbbbbbbbbbb` vs `aaaaaaaaaaaa` (factor 1.1)"
    table = [line for line in lines if line.startswith("| ")]
    assert table[1].startswith("| + | `s.B.time_x (2, towers)` | 1 | 1.5 | 1.50x |")


def _rounds(name: str, unit: str, *values: float) -> list[Measurement]:
    return [Measurement(name, "", unit, v) for v in values]


def test_the_threshold_follows_the_noise_of_the_rounds():
    # Quiet rounds: the factor decides (30% slower fails, and 10% is the smallest detectable change).
    row = judge_rounds(_rounds("a.time_x", "s", 1.0, 1.0), _rounds("a.time_x", "s", 1.3, 1.3), 1.1)
    assert row.verdict is Verdict.WORSE and row.threshold == pytest.approx(1.1) and row.detectable == pytest.approx(0.1)
    assert row.noise == Noise(0.0, "A/A (2+2 rounds)")
    # Rounds that disagree by 20% among themselves: a 30% change is within 3 x their noise.
    noisy = judge_rounds(_rounds("a.time_x", "s", 1.0, 1.2), _rounds("a.time_x", "s", 1.3, 1.5), 1.1)
    assert noisy.noise.value == pytest.approx(relative_noise([1 / 1.1, 1.2 / 1.1, 1.3 / 1.4, 1.5 / 1.4]))
    assert noisy.threshold > 1.3 and noisy.verdict is Verdict.SAME
    # Noise from main's history replaces the rounds' own.
    calm = judge_rounds(_rounds("a.time_x", "s", 1.0, 1.2), _rounds("a.time_x", "s", 1.3, 1.5), 1.1,
                        noise=Noise(0.01, "history (n=30)"))
    assert calm.verdict is Verdict.WORSE and calm.threshold == pytest.approx(1.1)
    loud = judge_rounds(_rounds("t.T.track_samples_per_second", "samples/s", 2000, 2000),
                        _rounds("t.T.track_samples_per_second", "samples/s", 1500, 1500), 1.1, k=3,
                        noise=Noise(0.2, "history (n=30)"))
    assert loud.threshold == pytest.approx(1.6) and loud.verdict is Verdict.SAME


def test_a_single_value_per_side_is_not_judged():
    row = judge_rounds(_rounds("a.time_x", "s", 1.0), _rounds("a.time_x", "s", 3.0), 1.1)
    assert row.verdict is Verdict.UNJUDGED and "no spread to judge against" in row.note
    assert exit_status([row]) == 3 and "No verdict" in markdown([row], "a" * 40, "b" * 40, 1.1)
    assert exit_status([row, _row(Verdict.SAME)]) == 0


def test_failures_in_any_round_and_skips():
    assert judge_rounds(_rounds("a.time_x", "s", 1.0, 1.0), _rounds("a.time_x", "s", 1.0, None)).verdict \
        is Verdict.ERROR
    assert judge_rounds(_rounds("a.time_x", "s", None, None), _rounds("a.time_x", "s", 1.0, 1.0)).verdict \
        is Verdict.FIXED
    assert judge_rounds([], _rounds("a.time_x", "s", 1.0, 1.0)).verdict is Verdict.SKIPPED


def test_borderline_means_worse_by_less_than_twice_the_detectable_change():
    def worse(ratio):
        return judge_rounds(_rounds("a.time_x", "s", 1.0, 1.0), _rounds("a.time_x", "s", ratio, ratio), 1.1)

    assert is_borderline(worse(1.15)) and not is_borderline(worse(1.25)) and not is_borderline(worse(1.05))


def test_accuracy_directions():
    assert higher_is_better("convergence.C.track_final_accuracy", "accuracy")
    assert not higher_is_better("convergence.C.track_steps_to_accuracy", "steps")
    assert not higher_is_better("convergence.C.track_seconds_to_accuracy", "s")


def test_a_rerun_confirms_or_clears_a_worse_verdict():
    first = judge_rounds(_rounds("a.time_x", "s", 1.0, 1.0), _rounds("a.time_x", "s", 1.15, 1.15), 1.1)
    (base,), (slow,), (same,) = (_rounds("a.time_x", "s", v) for v in (1.0, 1.14, 1.02))
    confirmed = after_rerun(first, base, slow)
    assert confirmed.verdict is Verdict.WORSE and confirmed.note == "confirmed by a rerun (1.14x)"
    assert confirmed.rounds == (3, 3)
    cleared = after_rerun(first, base, same)
    assert cleared.verdict is Verdict.SAME and cleared.note == "1.15x at first, 1.02x in a rerun: not confirmed"
    failed = after_rerun(first, base, _rounds("a.time_x", "s", None)[0])
    assert failed.verdict is Verdict.ERROR
