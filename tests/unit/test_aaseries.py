"""The A/A study (``harness.ci.aaseries``) on synthetic recorded runs: the arithmetic checkable, the rule the gate's
own. The study on real runs of this host is in docs/regressions.md; tests/ci/test_gate.py runs a real one."""

from __future__ import annotations

import json
import math
import random

import pytest

from harness.ci import aaseries
from harness.errors import InvalidValue


def _pairs_run(rng, n=120, spread=0.01, bias=1.0, label="b.time_work"):
    base, head = [], []
    for _ in range(n):
        speed = rng.choice((1.0, 1.3, 1.6))  # the host's step: shared by the pair's two samples
        base.append(0.02 * speed * math.exp(rng.gauss(0, spread)))
        head.append(0.02 * speed * bias * math.exp(rng.gauss(0, spread)))
    return {"pairs": {label: {"unit": "seconds", "number": 1, "base": base, "head": head}}, "rounds": {}}


def test_quiet_pairs_raise_no_alarm_and_catch_5_and_10_percent():
    rng = random.Random(0)
    runs = [_pairs_run(rng) for _ in range(6)]
    found = aaseries.study(runs, resampled=400)
    real, res = found.total("real"), found.total("resampled")
    assert real.alarms.n == 6 and res.alarms.n == 400 and real.alarms.k == res.alarms.k == 0
    assert res.caught[1.05].k == res.caught[1.10].k == 400 and real.caught[1.05].k == 6
    assert found.passes and "PASS" in found.text()
    combo = found.to_json()["combinations"]["b.time_work"]
    assert combo["kind"] == "pairs" and combo["resampled"]["pairs_median"] == aaseries.MIN_PAIRS == 40  # the first look


def test_a_biased_interleaving_is_a_false_alarm_and_fails_the_study():
    # Head 4% slower on "one commit": what an interleaver that favours one side would record.
    rng = random.Random(1)
    found = aaseries.study([_pairs_run(rng, bias=1.04) for _ in range(4)], resampled=200)
    assert found.total("resampled").alarms.k == 200 and not found.passes and "FAIL" in found.text()


def _process_pairs_run(rng, per_process, processes=12, offset=0.05, spread=0.01):
    """An A/A run whose pairs come ``10`` from each process pair, each pair of processes off by its own share
    (spread ``offset``), recorded with ``per_process`` (0: as recorded before process pairs)."""
    base, head = [], []
    for _ in range(processes):
        shift = rng.gauss(0, offset)
        for _ in range(10):
            base.append(0.02 * math.exp(rng.gauss(0, spread)))
            head.append(0.02 * math.exp(shift + rng.gauss(0, spread)))
    return {"pairs": {"b.time_work": {"unit": "seconds", "number": 1, "per_process": per_process, "base": base,
                                      "head": head}}, "rounds": {}}


def test_runs_of_process_pairs_are_judged_and_resampled_by_process_pair():
    # Processes off by 5% each, their pairs 1% apart, 100 independent A/A runs: judged pair by pair (per_process 0)
    # a run's tight bounds sit on whatever its few process pairs add up to, and false alarms abound; judged by
    # process pair they stay near the rule's 1%. The resampled judgments (each draw's pairs from one process pair)
    # follow the real ones down.
    seeds = [random.Random(4).random() + k for k in range(100)]
    as_pairs = aaseries.study([_process_pairs_run(random.Random(s), 0) for s in seeds], resampled=300)
    by_process = aaseries.study([_process_pairs_run(random.Random(s), 10) for s in seeds], resampled=300)
    assert as_pairs.total("real").alarms.value >= 0.05, as_pairs.text()  # 10 of 100 here
    assert by_process.total("real").alarms.value <= 0.02, by_process.text()  # none of 100 here
    # 4.0% against 10.7%: resampling one run centres on that run's own offsets ("for these runs")
    assert by_process.total("resampled").alarms.value < as_pairs.total("resampled").alarms.value / 2
    # and a 10% change is still caught (88 of 100: the first look's lower bound at half of alpha, Stopping.alpha_at)
    assert by_process.total("real").caught[1.10].value > 0.8
    picked = aaseries._blocks(45, random.Random(0), 10)  # each ten from one process pair, the last one short
    assert len(picked) == 45 and all(len({i // 10 for i in picked[k:k + 10]}) == 1 for k in range(0, 40, 10))


def _order_run(rng, handicap=0.06, processes=12, per_process=10, spread=0.005):
    """An A/A run where a pair's second sample runs ``handicap`` slower than its first (the other process just ran
    on that CPU): base-first pairs read head slower, head-first ones faster, by as much."""
    base, head = [], []
    for k in range(processes * per_process):
        second = math.exp(handicap + rng.gauss(0, spread))
        first = math.exp(rng.gauss(0, spread))
        b, h = (first, second) if k % 2 == 0 else (second, first)
        base.append(0.02 * b)
        head.append(0.02 * h)
    return {"pairs": {"b.time_work": {"unit": "seconds", "number": 1, "per_process": per_process, "base": base,
                                      "head": head}}, "rounds": {}}


def test_the_resampling_keeps_the_crossover_the_gate_judges_by():
    # The gate takes each process pair's base-first and head-first medians apart, so a second-sample handicap
    # cancels (benchgate.judged_values). A resampling that moves a pair to the other order's place measures another
    # gate: each value then mixes the two orders, a spread of about the handicap where the gate's has none.
    for per_process in (10, 0):
        picked = aaseries._blocks(120, random.Random(5), per_process)
        assert len(picked) == 120 and all(i % 2 == k % 2 for k, i in enumerate(picked)), per_process
    found = aaseries.study([_order_run(random.Random(s)) for s in range(3)], resampled=300)
    real, res = (found.to_json()["combinations"]["b.time_work"][which] for which in ("real", "resampled"))
    assert res["pairs_median"] == real["pairs_median"] == aaseries.MIN_PAIRS, found.text()
    assert res["detects_median"] < 0.04 and real["detects_median"] < 0.04, found.text()


def test_the_study_stops_where_the_gate_does():
    # One rule (benchgate.Stopping), three ways in: interleave's looks on measurements as they arrive, the study's
    # stop_at on a recorded series' log ratios, a judged row's done; on the same pairs they agree at every look.
    from harness.ci import interleave
    from harness.ci.asvresults import Measurement
    from harness.ci.benchgate import judge_rounds, log_ratios

    rule = interleave.pairs_rule()
    for seed in range(30):
        rng = random.Random(seed)
        run = _process_pairs_run(rng, 10, processes=30, offset=rng.choice((0.0, 0.01, 0.03)))["pairs"]["b.time_work"]
        base = [Measurement("b.time_work", "", "seconds", v) for v in run["base"]]
        head = [Measurement("b.time_work", "", "seconds", v * rng.choice((1.0, 1.05))) for v in run["head"]]
        looked = next((n for n in range(1, len(base) + 1) if rule.stops(base[:n], head[:n])), len(base))
        assert looked == rule.stop_at(log_ratios(base, head)), seed
        for n in range(rule.first, len(base) + 1, rule.every):
            row = judge_rounds(base[:n], head[:n], rule.factor, source="interleaved pairs",
                               per_process=rule.per_process)
            assert rule.done(row) == rule.settles(log_ratios(base[:n], head[:n])), (seed, n)


def test_noisy_pairs_resolve_less_and_say_so():
    # 15% spread a pair, 120 pairs: 3% is beyond what they resolve (caught rarely); detects says about 14% (alpha
    # spent over the looks: its first look's bound at half of it).
    rng = random.Random(2)
    found = aaseries.study([_pairs_run(rng, spread=0.15) for _ in range(5)], resampled=300)
    res = found.combos["b.time_work"]["resampled"]
    assert res.caught[1.03].value < 0.6 and res.alarms.value <= 0.02
    detects = found.to_json()["combinations"]["b.time_work"]["resampled"]["detects_median"]
    assert 0.05 < detects < 0.16


def test_rounds_are_judged_in_windows_that_share_no_run():
    rng = random.Random(3)
    runs = [{"pairs": {}, "rounds": {"b.track_rate": {"unit": "samples/s",
                                                      "value": 1000 * (1 + 0.002 * rng.gauss(0, 1))}}}
            for _ in range(25)]
    found = aaseries.study(runs, rounds=2, max_rounds=6, resampled=400)
    combo = found.combos["b.track_rate"]
    assert combo["kind"] == "rounds" and combo["real"].alarms.n == 2  # 25 runs: two windows of 12
    assert combo["resampled"].caught[1.05].k == 400 and found.passes
    with pytest.raises(InvalidValue, match="11 runs; a window of 6\\+6 rounds needs at least 12"):
        aaseries.study(runs[:11], max_rounds=6)


def test_clopper_pearson_matches_the_beta_quantiles():
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 10_000), (3, 24), (24, 24), (950, 1000)):
        low, high = aaseries.clopper_pearson(k, n)
        want_low = 0.0 if k == 0 else stats.beta.ppf(0.025, k, n - k + 1)
        want_high = 1.0 if k == n else stats.beta.ppf(0.975, k + 1, n - k)
        assert low == pytest.approx(want_low, abs=1e-6) and high == pytest.approx(want_high, abs=1e-6)
    with pytest.raises(InvalidValue, match="k=5, n=3"):
        aaseries.clopper_pearson(5, 3)


def test_saved_runs_load_and_a_bad_file_is_named(tmp_path):
    path = tmp_path / "runs.jsonl"
    run = _pairs_run(random.Random(4), n=20)
    aaseries.save_run(path, run)
    aaseries.save_run(path, run)
    assert aaseries.load_runs(path) == [json.loads(json.dumps(run))] * 2
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(InvalidValue, match="bad.jsonl:1: not a recorded run"):
        aaseries.load_runs(tmp_path / "bad.jsonl")
    with pytest.raises(InvalidValue, match="no recorded runs at"):
        aaseries.load_runs(tmp_path / "missing.jsonl")


def test_the_cli_studies_saved_runs_and_names_a_bad_option(tmp_path, capsys):
    from harness.cli import main

    path = tmp_path / "runs.jsonl"
    rng = random.Random(5)
    for _ in range(4):
        aaseries.save_run(path, _pairs_run(rng))
    assert main(["bench-compare", "x", "y", "--from-runs", str(path), "--resampled", "400", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["runs"] == 4 and found["passes"] and found["resampled"]["caught"]["5%"]["n"] == 400
    assert main(["bench-compare", "x", "y", "--save-runs", str(path)]) == 2
    assert "--save-runs and --aa-pairs go with --aa-series N" in capsys.readouterr().err
    assert main(["bench-compare", "x", "y", "--from-runs", str(path), "--aa-series", "3"]) == 2
    (tmp_path / "biased.jsonl").write_text("".join(json.dumps(_pairs_run(rng, bias=1.04)) + "\n" for _ in range(3)))
    assert main(["bench-compare", "x", "y", "--from-runs", str(tmp_path / "biased.jsonl"), "--resampled", "50"]) == 1


def test_a_pull_request_of_many_noisy_combinations_raises_at_most_its_family_s_false_alarms():
    # 20 track_ combinations whose rounds spread by 10% (beyond the 3% factor), judged by the gate's rounds rule (a
    # look at 2 rounds a side, then every round to 6) in 100 pull requests of one commit against itself. Each
    # judgment at --family-alpha 0.05 / 20, spent over its looks: at most 5% of the pull requests say worse. Looking
    # five times at one bound at the judgment's level said worse in 12% of them (2.4 times the level a judgment).
    rng = random.Random(11)
    runs = [{"pairs": {}, "rounds": {f"b.track_r{c}": {"unit": "samples/s", "value": 1000 * (1 + 0.1 * rng.gauss(0, 1))}
                                     for c in range(20)}} for _ in range(12 * 100)]
    found = aaseries.study(runs, resampled=0, family_alpha=0.05)
    assert found.alpha == 0.05 / 20 and found.per_pull_request().n == 100
    assert found.per_pull_request().value <= 0.05, found.text()
    assert found.total("real").alarms.value <= 0.05 / 20, found.text()
    assert "per pull request, its 20 combination(s) judged at once" in found.text()
