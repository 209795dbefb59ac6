"""Model-zoo conformance: each architecture trained in parallel lands where one device does.

Every case is ``harness.compare_training(...,
reference="float64")``, and every case has a pinned outcome (harness/bench/zoo/outcomes.json,
written by ``harness check --zoo --pin-outcomes``): exact, as accurate as one device, or refused
with a reason id. A row that misses its pin is a FAIL row (an exact model refused, a refusal for
another reason, an as-accurate case drifting beyond its rounding floor), and so is any error that
is not a ``harness.errors.Refused``. The fast subset runs in the default suite; the whole zoo
(every model x method x split, Keras 3 and Keras 2) under the ``zoo`` marker (``--run-zoo`` or
``-m zoo``).
"""

import pytest

from harness.bench import zoo

FAST = [e.name for e in zoo.select(fast_only=True)]
SPLITS = list(zoo.SPLITS)
# A handful of cases: each fast model once, methods and splits taken in turn; two on Keras 2.
FAST_CASES = [(name, "3", zoo.METHODS[i % 2], SPLITS[i % 3]) for i, name in enumerate(FAST)]
FAST_CASES += [("custom_train_step", "2", "mirrored", "5:3:2"), ("subclassed_mlp", "2", "mirrored", "3:2"),
               ("gan_train_step", "2", "towers", "5:3:2")]
WHOLE = [(g, e.name) for g in zoo.GENERATIONS for e in zoo.select(keras=g)]


def _keras(generation: str):
    from harness.errors import Unavailable

    try:
        return zoo.keras_module(generation)
    except Unavailable as err:  # that generation is not installed here (tf215: no Keras 3)
        pytest.skip(str(err))


def _assert_conforms(rows):
    from harness.bench.zoo import outcomes

    assert rows, "no case ran"
    table = zoo.text_table(rows)
    assert not [r for r in rows if r.failed], f"FAIL rows:\n{table}"
    pins = outcomes.load()
    for row in rows:
        assert row.seconds > 0
        assert row.expected == outcomes.pinned(outcomes.key_of(row), pins) and outcomes.meets(row.status,
                                                                                              row.expected), table
        if row.status.startswith("refused"):
            assert len(row.status) > len("refused: ") + 10, f"a refusal names its reason:\n{table}"
            assert not row.traceback, table
        elif row.reference_single is not None:  # judged against float64 (the axis' NO_FLOAT64 cases by tol alone)
            assert row.max_deviation is not None and row.reference_parallel is not None, table
            # The parallel float64 run and the rounding floor are measured only where the float32 runs are not exact.
            assert (row.reference_exact is None) == (row.status == "exact") == (row.floor is None), table


# timeseries_fcn's 50 s and softmax_cnn's 22 s: extended. softmax_cnn's path, a convnet split 5:3:2 on Keras 3's
# towers through the zoo's runner, is the equivalence grid's cnn_bn case and the fast subset's other cases'.
_OUT_OF_QUICK = {
    "timeseries_fcn": [pytest.mark.extended],
    "softmax_cnn": [pytest.mark.extended, pytest.mark.covered_by(
        "tests/parallel/test_equivalence.py::test_parallel_step_equals_single_device[keras3-towers-5:3:2-cnn_bn]",
        "tests/zoo/test_zoo_conformance.py::test_fast_subset_conforms[subclassed_mlp-keras3-towers-even]")],
}


@pytest.mark.parametrize(("name", "generation", "method", "split"), [
    pytest.param(*case, marks=_OUT_OF_QUICK.get(case[0], [])) for case in FAST_CASES],
                         ids=[f"{n}-keras{g}-{m}-{s}" for n, g, m, s in FAST_CASES])
def test_fast_subset_conforms(logical_devices, name, generation, method, split):
    k = _keras(generation)
    (entry,) = zoo.select([name], keras=generation)
    row = zoo.run_case(entry, k, generation, method, split, logical_devices[:3])
    _assert_conforms([row])


@pytest.mark.zoo
@pytest.mark.parametrize(("generation", "name"), WHOLE, ids=[f"{n}-keras{g}" for g, n in WHOLE])
def test_whole_zoo_conforms(logical_devices, generation, name):
    # One model's cases in one test: run_zoo trains its single-device runs once for all of them.
    _keras(generation)
    rows = zoo.run_zoo([name], keras=generation, devices=logical_devices[:3])
    assert [(r.method, r.split) for r in rows] == [(m, s) for m in zoo.METHODS for s in SPLITS]
    _assert_conforms(rows)


# -- the optimizer axis: every built-in optimizer x the options people train with ------------

def _axis_fast(generation: str) -> list[tuple[str, str, str]]:
    from harness.bench.zoo import optimizers

    fast = list(optimizers.FAST)
    if generation == "2":  # Keras 2 (no gradient_accumulation_steps): a third of them
        fast = [c for c in fast if c[2] != "accumulation" and ((c[0] == "mlp" and c[1] in ("adam", "sgd", "nadam"))
                                                             or c in (("causal_lm", "adam", "clipnorm"),
                                                                      ("causal_lm", "adam", "mixed_float16")))]
    return fast


AXIS_FAST = [(g, *case) for g in zoo.GENERATIONS for case in _axis_fast(g)]
AXIS_WHOLE = [(g, model, optimizer) for g in zoo.GENERATIONS for model in ("mlp", "causal_lm")
              for optimizer in ("sgd", "sgd_nesterov", "adam", "adam_amsgrad", "adamw", "adamax", "nadam", "rmsprop",
                                "rmsprop_centered", "adagrad", "adadelta", "adafactor", "ftrl", "lion", "lamb", "muon",
                                "schedule_free_adamw")]


def _axis_rows(generation, model, optimizer, option=None, methods=zoo.METHODS, devices=None, splits=("3:2",)):
    """The axis' rows of one model and optimizer (one option, or all); [] where it has no such case, which
    must then be one this Keras lacks or cannot train on one device (``UPSTREAM``)."""
    from harness.bench.zoo import optimizers

    k = _keras(generation)
    rows = zoo.run_optimizer_axis([model], [optimizer], [option] if option else None, methods=list(methods),
                                  splits=list(splits), keras=generation, devices=devices)
    if not rows:
        lacking = not any(optimizers.applicable(k, optimizer, o) for o in ([option] if option else optimizers.OPTIONS))
        upstream = generation == "3" and (model, optimizer) in {(m, o) for m, o, _ in optimizers.UPSTREAM}
        assert lacking or upstream, f"no case of {model} {optimizer} {option or ''} on Keras {generation}"
    return rows


@pytest.mark.extended
@pytest.mark.parametrize(("generation", "model", "optimizer", "option"), AXIS_FAST,
                         ids=[f"keras{g}-{m}-{o}-{p}" for g, m, o, p in AXIS_FAST])
def test_optimizer_axis_fast_subset_conforms(logical_devices, generation, model, optimizer, option):
    rows = _axis_rows(generation, model, optimizer, option, devices=logical_devices[:2])
    assert [(r.method, r.optimizer) for r in rows] == [(m, f"{optimizer}/{option}") for m in zoo.METHODS]
    _assert_conforms(rows)
    if generation == "2" and optimizer == "nadam":  # Keras 2's Nadam drifts under mirrored: refused by name
        named = f"refused: optimizer-drifts: {_keras('2').__name__}.optimizers.Nadam "  # tf_keras, or TF 2.15's keras
        assert rows[1].status.startswith(named), zoo.text_table(rows)


@pytest.mark.zoo
@pytest.mark.parametrize(("generation", "model", "optimizer"), AXIS_WHOLE,
                         ids=[f"keras{g}-{m}-{o}" for g, m, o in AXIS_WHOLE])
def test_whole_optimizer_axis_conforms(logical_devices, generation, model, optimizer):
    rows = _axis_rows(generation, model, optimizer, devices=logical_devices[:2])
    if rows:  # else: a case this Keras does not have (asserted in _axis_rows)
        _assert_conforms(rows)


# -- pins the quick loop holds: a sample of "as accurate" ones, one refusal per reason id --------------------
#: ``model|keras|method|split|optimizer`` -> the outcome pinned for it; the cheapest of each kind (seconds here)
PINNED_SAMPLE = {
    "mixed_bfloat16|3|mirrored|3:2|": "as accurate as one device",  # 0.4 s
    "mixed_float16|2|towers|3:2|": "as accurate as one device",
    "mlp|3|mirrored|3:2|adagrad/mixed_float16": "as accurate as one device",
    "compute_loss_aux|3|mirrored|3:2|": "refused: custom-train-step",
    "causal_lm|2|mirrored|3:2|nadam/plain": "refused: optimizer-drifts",
    "convnext_tiny|3|towers|even|": "refused: towers-unsupported-layer",
}


def test_the_sample_covers_every_refusal_reason_and_is_what_the_pins_say():
    """The sample is drawn from the pins: each case is pinned as the sample says (a re-pin that changes one fails
    here first), and every reason id a pin refuses with has a case in it."""
    from harness.bench.zoo import outcomes

    pins = {outcomes.case_name(key): outcome for key, outcome in outcomes.load().items()}
    assert {case: pins.get(case, "exact") for case in PINNED_SAMPLE} == PINNED_SAMPLE
    reasons = {outcome for outcome in pins.values() if outcome.startswith("refused: ")}
    assert reasons == {o for o in PINNED_SAMPLE.values() if o.startswith("refused: ")}, reasons
    multiples = {outcomes.case_name(key) for key in outcomes.load_multiples()}
    assert {c for c, o in PINNED_SAMPLE.items() if o == "as accurate as one device"} <= multiples


@pytest.mark.parametrize("case", list(PINNED_SAMPLE))
def test_a_sampled_pin_holds(logical_devices, case):
    """Each sampled case run as the zoo runs it, held to its pin (and an "as accurate" one to twice its pinned
    floor multiple): what the whole zoo (``-m zoo``) holds for every case, held here for one of each kind."""
    model, generation, method, split, label = case.split("|")
    _keras(generation)
    if label:
        optimizer, option = label.split("/")
        rows = _axis_rows(generation, model, optimizer, option, methods=[method], devices=logical_devices[:2],
                          splits=(split,))
    else:
        (entry,) = zoo.select([model], keras=generation)
        rows = [zoo.run_case(entry, zoo.keras_module(generation), generation, method, split, logical_devices[:3])]
    assert [outcome_of(r.status) for r in rows] == [PINNED_SAMPLE[case]], zoo.text_table(rows)
    _assert_conforms(rows)


def outcome_of(status: str) -> str:
    from harness.bench.zoo import outcomes

    return outcomes.outcome_of(status)
