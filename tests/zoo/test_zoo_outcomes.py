"""Pinned zoo outcomes: a case that changes kind is a FAIL row, not a quiet pass.

Each zoo case (model x Keras x method x split, and the optimizer axis' settings) has its outcome
pinned in harness/bench/zoo/outcomes.json: exact (the default), as accurate as one device, or
refused with a reason id. The planted defects below are the ones that passed before: a refusal
raised for an exact model, a refusal for another reason, an error that is not a refusal.
"""

import json

import pytest

from harness.bench import zoo
from harness.bench.zoo import outcomes
from harness.errors import InvalidValue, Refused


def _row(status, model="m", keras="3", method="towers", split="3:2", optimizer=""):
    return zoo.ZooRow(model, keras, method, split, status, optimizer=optimizer)


def test_a_row_meets_its_pin_or_is_a_fail():
    assert outcomes.meets("exact", "exact")
    assert outcomes.meets("exact", "as accurate as one device")  # closer than required
    assert outcomes.meets("as accurate as one device", "as accurate as one device")
    assert not outcomes.meets("as accurate as one device", "exact")  # an exact case turned as accurate
    assert outcomes.meets("refused: custom-train-step: it has its own train_step", "refused: custom-train-step")
    assert not outcomes.meets("refused: jit-compile: XLA", "refused: custom-train-step")  # another reason
    assert not outcomes.meets("refused: custom-train-step: x", "exact")  # an exact model refused
    assert not outcomes.meets("exact", "refused: custom-train-step")  # a refused model trained
    assert not outcomes.meets("FAIL: ValueError: x", "exact")


def test_pins_round_trip_and_keep_the_cases_not_run(tmp_path):
    path = tmp_path / "outcomes.json"
    assert outcomes.load(path) == {}  # no file: every case must be exact
    first = [_row("exact"), _row("as accurate as one device", split="even"),
             _row("refused: custom-train-step: no", model="c"), _row("exact", optimizer="adam/plain")]
    outcomes.write(first, path)
    assert outcomes.load(path) == {("m", "3", "towers", "even", ""): "as accurate as one device",
                                   ("c", "3", "towers", "3:2", ""): "refused: custom-train-step"}
    # A later run of one case: its pin replaced (exact: unpinned), the others kept; a missed pin is re-pinned as
    # the case came out (a reviewed change of outcomes.json), never a FAIL of another kind.
    outcomes.write([_row("FAIL: pinned as accurate as one device, got exact", split="even"),
                    _row("FAIL: pinned exact, got refused: jit-compile: XLA", model="d")], path)
    assert outcomes.load(path) == {("c", "3", "towers", "3:2", ""): "refused: custom-train-step",
                                   ("d", "3", "towers", "3:2", ""): "refused: jit-compile"}
    assert outcomes.pinned(("m", "3", "towers", "even", ""), outcomes.load(path)) == "exact"


def test_a_failure_is_never_pinned(tmp_path):
    path = tmp_path / "outcomes.json"
    with pytest.raises(InvalidValue, match=r"never pinned; got m\|3\|towers\|3:2\|: FAIL: beyond tol"):
        outcomes.write([_row("exact", model="a"), _row("FAIL: beyond tol 1e-06 (max deviation 1e-3)")], path)
    assert not path.exists()  # nothing written


@pytest.mark.parametrize(("text", "named"), [
    ("not json", "not JSON"),
    ('{"pins": []}', "expected"),
    ('{"pins": {"m|3|towers": "exact"}}', "'m|3|towers'"),
    ('{"pins": {"m|3|towers|3:2|": "FAIL"}}', "got 'FAIL'"),
    ('{"pins": {"m|3|towers|3:2|": "refused: "}}', "got 'refused: '"),
])
def test_a_bad_pin_file_is_named(tmp_path, text, named):
    path = tmp_path / "outcomes.json"
    path.write_text(text)
    with pytest.raises(InvalidValue, match=named):
        outcomes.load(path)


def test_the_shipped_pins_name_real_cases():
    """Every pin is a case the zoo has, with an outcome a case can have; the file ships in the package."""
    from harness.bench.zoo import optimizers

    pins = outcomes.load()
    assert pins, "harness/bench/zoo/outcomes.json holds the pins of the cases that are not exact"
    models = set(zoo.NAMES)
    for (model, keras, method, split, optimizer), outcome in pins.items():
        known = keras in (*zoo.GENERATIONS, zoo.ON_JAX)
        assert known and method in zoo.methods_of(keras) and split in zoo.splits_of(keras), (model, outcome)
        if optimizer:
            assert keras != zoo.ON_JAX, (model, optimizer)  # the optimizer axis runs on TensorFlow
            name, option = optimizer.split("/")
            assert model in optimizers.MODELS and name in optimizers.OPTIMIZERS and option in optimizers.OPTIONS
        else:
            assert model in models, model
    data = json.loads(outcomes.PINS.read_text())
    assert list(data["pins"]) == sorted(data["pins"])  # written in order: reviewable diffs


def test_a_refusal_raised_for_an_exact_model_fails_its_case(logical_devices, monkeypatch, keras3):
    """Planted: harness refuses a model that trains exactly. Before the pins, any refusal passed."""
    import harness.parallel as parallel

    def refusing(*args, **kwargs):
        raise Refused("planted", "planted refusal of a model harness trains exactly")

    monkeypatch.setattr(parallel, "parallelize", refusing)
    (entry,) = zoo.select(["subclassed_mlp"])
    k = keras3  # the Keras 3 cases: skipped where the keras package is Keras 2
    row = zoo.run_case(entry, k, "3", "towers", "3:2", logical_devices[:3])
    assert row.failed and row.status == ("FAIL: pinned exact, got refused: planted: planted refusal of a model "
                                         "harness trains exactly"), row.status


def test_an_error_that_is_not_a_refusal_fails_with_its_traceback(logical_devices, monkeypatch, keras3):
    """Planted: cloning breaks with a ValueError inside harness. Before, harness' own ValueError was a refusal."""
    from harness.parallel.adapters import base

    def broken(self, *args, **kwargs):
        raise ValueError("planted: cloning broke")

    monkeypatch.setattr(base.Adapter, "clone", broken)
    (entry,) = zoo.select(["subclassed_mlp"])
    k = keras3  # the Keras 3 cases: skipped where the keras package is Keras 2
    row = zoo.run_case(entry, k, "3", "mirrored", "3:2", logical_devices[:3])
    assert row.failed and row.status == "FAIL: ValueError: planted: cloning broke", row.status
    assert "Traceback (most recent call last)" in row.traceback and "in broken" in row.traceback
    assert "raised:\n" in zoo.text_table([row]) and "planted: cloning broke" in zoo.text_table([row])


def test_a_downgrade_is_not_pinned_unless_named_and_every_change_is_printed(tmp_path, monkeypatch, capsys):
    """``--pin-outcomes`` re-pins what a run came out as; one that moved a case further from one device (exact ->
    as accurate -> refused, or to another refusal) writes nothing unless ``--allow-downgrade`` names that case."""
    from harness.cli import main

    pins = tmp_path / "pins.json"
    monkeypatch.setenv("HARNESS_ZOO_PINS", str(pins))
    pins.write_text(json.dumps({"pins": {"m|3|towers|even|": "as accurate as one device",
                                         "c|3|towers|3:2|": "refused: custom-train-step"}}))
    before = pins.read_text()
    run = tmp_path / "run.json"
    run.write_text(zoo.to_json([_row("exact", split="even"),  # an upgrade: pinned without asking
                                _row("as accurate as one device"),  # m|3|towers|3:2|: exact -> as accurate
                                _row("refused: jit-compile: XLA", model="c")]))  # another reason
    pin = ["check", "--zoo", "--from-json", str(run), "--pin-outcomes", "--format", "json"]
    assert main(pin) == 1
    err = capsys.readouterr().err
    assert "pin m|3|towers|even|: as accurate as one device -> exact (upgrade)" in err
    assert "pin m|3|towers|3:2|: exact -> as accurate as one device (downgrade)" in err
    assert "pin c|3|towers|3:2|: refused: custom-train-step -> refused: jit-compile (changed)" in err
    assert "not pinned: 2 case(s) moved further from one device" in err and "is unchanged" in err
    assert pins.read_text() == before
    assert main([*pin, "--allow-downgrade", "m|3|towers|3:2|"]) == 1  # the other one is still not named
    assert pins.read_text() == before
    assert main([*pin, "--allow-downgrade", "m|3|towers|3:2|", "c|3|*"]) == 0
    assert outcomes.load(pins) == {("m", "3", "towers", "3:2", ""): "as accurate as one device",
                                   ("c", "3", "towers", "3:2", ""): "refused: jit-compile"}


def test_an_as_accurate_pin_records_its_floor_multiple_and_a_run_past_twice_it_fails(tmp_path, monkeypatch, capsys):
    """An "as accurate" case may drift only within ``MULTIPLE_SLACK`` (2) times the floor multiple it was pinned
    at: a case that slid from 1.2 x to 5 x its rounding floor is still "as accurate" by the verdict's factor (8),
    and a FAIL row against its pin; re-pinning it is a downgrade that needs --allow-downgrade."""
    from harness.cli import main

    def accurate(multiple, split="3:2"):
        return zoo.ZooRow("m", "3", "towers", split, "as accurate as one device", floor_multiple=multiple)

    pins = tmp_path / "pins.json"
    monkeypatch.setenv("HARNESS_ZOO_PINS", str(pins))
    outcomes.write([accurate(1.2345), accurate(0.5, split="even")], pins)
    assert outcomes.load_multiples(pins) == {("m", "3", "towers", "3:2", ""): 1.23,
                                             ("m", "3", "towers", "even", ""): 0.5}
    assert outcomes.judged("as accurate as one device", "as accurate as one device", 2.4, 1.23) == \
        "as accurate as one device"  # within 2 x
    slid = outcomes.judged("as accurate as one device", "as accurate as one device", 5.0, 1.23)
    assert slid.startswith("FAIL: pinned as accurate as one device at 1.23 x") and "got as accurate" in slid
    assert outcomes.judged("as accurate as one device", "as accurate as one device", float("inf"), 1.23) != \
        "as accurate as one device"
    assert outcomes.judged("exact", "as accurate as one device", None, 1.23) == "exact"
    # From a run's JSON: held to today's pins and multiples, the slid case FAILs and is not re-pinned unasked.
    run = tmp_path / "run.json"
    run.write_text(zoo.to_json([accurate(5.0), accurate(0.9, split="even")]))
    before = pins.read_text()
    assert main(["check", "--zoo", "--from-json", str(run), "--format", "json"]) == 1
    assert [r["failed"] for r in json.loads(capsys.readouterr().out)["rows"]] == [True, False]
    pin = ["check", "--zoo", "--from-json", str(run), "--pin-outcomes", "--format", "json"]
    assert main(pin) == 1
    err = capsys.readouterr().err
    assert ("pin m|3|towers|3:2|: multiple 5.00 x, first pinned 1.23 x (+307%), last 1.23 x (downgrade: past 1.25 x "
            "the first pin and 2 x the last)") in err and pins.read_text() == before
    # 0.5 -> 0.9 is within twice the last pin, and was pinned silently before the first pin was kept.
    assert ("pin m|3|towers|even|: multiple 0.900 x, first pinned 0.500 x (+80%), last 0.500 x (downgrade: past "
            "1.25 x the first pin)") in err and "not pinned: 2 case(s)" in err
    assert main([*pin, "--allow-downgrade", "m|3|towers|3:2|"]) == 1 and pins.read_text() == before
    assert main([*pin, "--allow-downgrade", "m|3|towers|*|"]) == 0
    assert outcomes.load_multiples(pins) == {("m", "3", "towers", "3:2", ""): 5.0,
                                             ("m", "3", "towers", "even", ""): 0.9}
    assert outcomes.load_first_multiples(pins) == {("m", "3", "towers", "3:2", ""): 1.23,
                                                   ("m", "3", "towers", "even", ""): 0.5}
    # A pin that stops being "as accurate" loses its multiple, and its first one.
    outcomes.write([zoo.ZooRow("m", "3", "towers", "even", "exact")], pins)
    assert outcomes.load_multiples(pins) == {("m", "3", "towers", "3:2", ""): 5.0}
    assert outcomes.load_first_multiples(pins) == {("m", "3", "towers", "3:2", ""): 1.23}


@pytest.mark.parametrize("section", ["multiples", "first_multiples"])
def test_a_multiple_that_is_not_a_number_is_refused(tmp_path, section):
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"pins": {}, section: {"m|3|towers|3:2|": "1.2"}}))
    with pytest.raises(InvalidValue, match=rf"{section}: .*'m\|3\|towers\|3:2\|': '1.2'"):
        outcomes.load_first_multiples(path)


# Pins that cannot creep: each re-pin held to the multiple first pinned, not the last one, so that
# re-pins each within the slack of the one before cannot add up. Each test below re-pins a run's JSON through the
# CLI (no TensorFlow, milliseconds).


def _accurate(multiple, split="3:2"):
    return zoo.ZooRow("m", "3", "towers", split, "as accurate as one device", floor_multiple=multiple)


def _repin(tmp_path, capsys, multiple, *allowed):
    """Re-pins case m|3|towers|3:2| from a run at ``multiple``: the exit status and what it printed on stderr."""
    from harness.cli import main

    run = tmp_path / "run.json"
    run.write_text(zoo.to_json([_accurate(multiple)]))
    capsys.readouterr()
    allow = ["--allow-downgrade", *allowed] if allowed else []
    status = main(["check", "--zoo", "--from-json", str(run), "--pin-outcomes", "--format", "json", *allow])
    return status, capsys.readouterr().err


CASE = ("m", "3", "towers", "3:2", "")


@pytest.fixture
def pins(tmp_path, monkeypatch):
    """A pins file with case m|3|towers|3:2| first pinned "as accurate" at 1.0 x its floor."""
    path = tmp_path / "pins.json"
    monkeypatch.setenv("HARNESS_ZOO_PINS", str(path))
    outcomes.write([_accurate(1.0)], path)
    return path


def test_re_pins_in_small_steps_are_stopped_past_a_quarter_over_the_first_pin(tmp_path, capsys, pins):
    """1 -> 1.1 -> 1.2 are pinned, each printed against the first pin; 1.3 (only 8% over the last, 30% over the
    first) is a downgrade, not written. Held to the last pin instead, the walk would never stop."""
    for multiple, share in ((1.1, "+10%"), (1.2, "+20%")):
        status, err = _repin(tmp_path, capsys, multiple)
        assert status == 0, err
        assert f"pin m|3|towers|3:2|: multiple {multiple:.2f} x, first pinned 1.00 x ({share})" in err
        assert "downgrade" not in err
        assert outcomes.load_multiples(pins)[CASE] == multiple and outcomes.load_first_multiples(pins)[CASE] == 1.0
    before = pins.read_text()
    status, err = _repin(tmp_path, capsys, 1.3)
    assert status == 1 and pins.read_text() == before, err
    assert ("pin m|3|towers|3:2|: multiple 1.30 x, first pinned 1.00 x (+30%), last 1.20 x (downgrade: past 1.25 x "
            "the first pin)") in err and "not pinned: 1 case(s)" in err


def test_the_walk_1_to_1_9_to_3_7_is_stopped_at_each_step(tmp_path, capsys, pins):
    """1 -> 1.9 -> 3.7 x, each step within twice the last pin, went unasked before. Now 1.9 is refused; accepted
    by name it is written with its first pin kept, so 3.7 is refused too and still printed against 1.0."""
    before = pins.read_text()
    status, err = _repin(tmp_path, capsys, 1.9)
    assert status == 1 and pins.read_text() == before
    assert "pin m|3|towers|3:2|: multiple 1.90 x, first pinned 1.00 x (+90%), last 1.00 x (downgrade" in err
    status, err = _repin(tmp_path, capsys, 1.9, "m|3|*")
    assert status == 0 and "multiple 1.90 x, first pinned 1.00 x (+90%)" in err
    assert outcomes.load_multiples(pins)[CASE] == 1.9 and outcomes.load_first_multiples(pins)[CASE] == 1.0
    status, err = _repin(tmp_path, capsys, 1.9)  # no increase: nothing printed, nothing to ask
    assert status == 0 and "pin m|" not in err
    accepted = pins.read_text()
    status, err = _repin(tmp_path, capsys, 3.7)
    assert status == 1 and pins.read_text() == accepted
    assert "pin m|3|towers|3:2|: multiple 3.70 x, first pinned 1.00 x (+270%), last 1.90 x (downgrade" in err
    status, err = _repin(tmp_path, capsys, 2.0)  # the smallest raise past an accepted multiple is asked for again
    assert status == 1 and pins.read_text() == accepted and "(+100%), last 1.90 x (downgrade" in err


def test_a_lower_multiple_leaves_the_first_pin_and_tightens_the_last(tmp_path, capsys, pins):
    """A case that improves keeps its first pin (what it was reviewed at), and is held to twice its new last pin as
    well: 1 -> 0.5 is pinned silently; 0.9 is an increase, printed, within both; 0.5 -> 1.1 is within 1.25 x the
    first pin but past twice the last, a downgrade as before."""
    status, err = _repin(tmp_path, capsys, 0.5)
    assert status == 0 and "pin m|" not in err
    assert outcomes.load_multiples(pins)[CASE] == 0.5 and outcomes.load_first_multiples(pins)[CASE] == 1.0
    status, err = _repin(tmp_path, capsys, 0.9)
    assert status == 0 and "pin m|3|towers|3:2|: multiple 0.900 x, first pinned 1.00 x (-10%), last 0.500 x" in err
    assert "downgrade" not in err
    assert _repin(tmp_path, capsys, 0.5)[0] == 0
    before = pins.read_text()
    status, err = _repin(tmp_path, capsys, 1.1)
    assert status == 1 and "(+10%), last 0.500 x (downgrade: past 2 x the last)" in err and pins.read_text() == before


def test_a_file_without_first_pins_was_first_pinned_at_its_multiples(tmp_path, capsys, monkeypatch):
    """Pins written before first pins were kept: each case's first pin is its multiple there, and the next write
    records it so (not the multiple that write pins)."""
    path = tmp_path / "pins.json"
    monkeypatch.setenv("HARNESS_ZOO_PINS", str(path))
    path.write_text(json.dumps({"pins": {"m|3|towers|3:2|": "as accurate as one device",
                                         "m|3|towers|even|": "as accurate as one device"},
                                "multiples": {"m|3|towers|3:2|": 1.0, "m|3|towers|even|": 0.5}}))
    assert outcomes.load_first_multiples(path) == outcomes.load_multiples(path)
    status, err = _repin(tmp_path, capsys, 1.2)
    assert status == 0 and "multiple 1.20 x, first pinned 1.00 x (+20%)" in err
    data = json.loads(path.read_text())
    assert data["first_multiples"] == {"m|3|towers|3:2|": 1.0, "m|3|towers|even|": 0.5}
    assert data["multiples"] == {"m|3|towers|3:2|": 1.2, "m|3|towers|even|": 0.5}


def test_the_shipped_pins_keep_a_first_multiple_for_every_multiple():
    data = json.loads(outcomes.PINS.read_text())
    assert set(data["first_multiples"]) == set(data["multiples"])  # every "as accurate" pin with a multiple
    assert list(data["first_multiples"]) == sorted(data["first_multiples"])  # in order: reviewable diffs
    assert outcomes.load_first_multiples().keys() == outcomes.load_multiples().keys()
