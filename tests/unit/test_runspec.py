"""One run specification (harness/bench/runspec.py) under both forms of a run: ``RunConfig`` (named devices, one
process) and ``ClusterPlan`` (device counts per worker): each option declared, checked and written once, the
constructors and JSON as they were (no TensorFlow needed)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import pytest

from harness.bench.cluster_run import ClusterPlan, task_device
from harness.bench.runner import RunConfig
from harness.bench.runspec import RunHead, RunSpec
from harness.emulate import parse_emulate

HEAD = ["model", "size", "method"]
SPEC = [f.name for f in fields(RunSpec)]
DEVICES = (task_device(0, 0), task_device(1, 0))
# A value other than the default for every option of the spec (data needs a model of the user's: left None).
OPTIONS = dict(seconds=0.5, windows=2, warmup_steps=1, emulate=parse_emulate("400,200"), input_delay_ms=1.5, seed=7,
               notes=("a note",), rebalance_every=5, throttle=((1, 100.0, 3),), overlap=False)


def test_a_run_option_is_declared_once_on_the_spec_and_carried_by_both_forms_and_their_json():
    assert SPEC[:4] == [*HEAD, "batches"] and set(OPTIONS) | {"data"} == set(SPEC[4:])
    # Positional order as before: model, size, method, where, batches; then the spec's options and each form's own.
    assert [f.name for f in fields(RunConfig)] == [*HEAD, "devices", *SPEC[3:], "label"]
    assert [f.name for f in fields(ClusterPlan)] == [*HEAD, "counts", *SPEC[3:], "kind", "timeout_s", "probe_steps"]
    for form in (RunConfig, ClusterPlan):  # declared once: no class of either form repeats a field of the spec
        for cls in form.__mro__:
            if cls not in (RunSpec, RunHead):
                assert not set(vars(cls).get("__annotations__", {})) & set(SPEC), cls

    config = RunConfig("mnist_maxing", "tiny", "mirrored", DEVICES, (60, 30), label="x", **OPTIONS)
    plan = ClusterPlan.from_spec(config, counts=(1, 1))
    assert {name: getattr(plan, name) for name in SPEC} == {name: getattr(config, name) for name in SPEC}
    assert RunConfig.from_spec(plan, devices=DEVICES, label="x") == config  # a worker's config is the parent's
    assert ClusterPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    record, sent = config.to_json(), plan.to_json()
    assert set(record) == {*SPEC, "devices", "label", "batch"}
    assert set(sent) == {*SPEC, "counts", "kind", "timeout_s", "probe_steps"}
    assert {k: v for k, v in record.items() if k in SPEC and k != "throttle"} == \
        {k: v for k, v in sent.items() if k in SPEC and k != "throttle"}


def test_a_new_option_on_the_spec_reaches_a_form_by_keyword_and_json_keeping_the_positional_order():
    # How RunConfig and ClusterPlan are made (harness/bench/runspec.py): a spec with one more option, and a form.
    @dataclass(frozen=True)
    class Spec(RunSpec):
        extra: int = 0

    @dataclass(frozen=True)
    class OnDevices(RunHead):
        devices: tuple[str, ...]

    @dataclass(frozen=True)
    class Config(Spec, OnDevices):
        label: str = ""

    config = Config("mnist_maxing", "tiny", "towers", DEVICES, (60, 30), extra=4, label="x")
    assert (config.devices, config.batches, config.extra, config.to_json()["extra"]) == (DEVICES, (60, 30), 4, 4)


def test_both_forms_write_and_read_the_json_they_wrote_before():
    # Results files hold RunConfig.to_json() (throttle as dicts, the global batch); worker plans ClusterPlan.to_json()
    # (throttle as lists), read back by from_json. Key order aside, the JSON of the forms before RunSpec, and since
    # the overlap (harness.parallel.staging) its setting.
    emulate = [{"rate": 400.0, "max_batch": None, "overhead_ms": 0.0}, {"rate": 200.0, "max_batch": None,
                                                                        "overhead_ms": 0.0}]
    common = {"model": "mnist_maxing", "size": "tiny", "method": "mirrored", "batches": [60, 30], "seconds": 0.5,
              "windows": 2, "warmup_steps": 1, "emulate": emulate, "input_delay_ms": 1.5, "seed": 7,
              "notes": ["a note"], "rebalance_every": 5, "data": None, "overlap": False}
    config = RunConfig("mnist_maxing", "tiny", "mirrored", DEVICES, (60, 30), label="x", **OPTIONS)
    assert json.loads(json.dumps(config.to_json())) == {
        **common, "devices": list(DEVICES), "label": "x", "throttle": [{"device": 1, "rate": 100.0, "at_step": 3}],
        "batch": 90}
    plan = ClusterPlan("mnist_maxing", "tiny", "mirrored", (1, 1), (60, 30), kind="CPU", timeout_s=30.0,
                       probe_steps=4, **OPTIONS)
    before = {**common, "counts": [1, 1], "throttle": [[1, 100.0, 3]], "kind": "CPU", "timeout_s": 30.0,
              "probe_steps": 4}
    assert json.loads(json.dumps(plan.to_json())) == before
    assert ClusterPlan.from_json(before) == plan
    older = {k: v for k, v in before.items() if k != "overlap"}  # a plan written before the overlap existed
    assert ClusterPlan.from_json(older).overlap is True
    assert RunConfig("mnist_maxing", "tiny", "towers", ("/device:CPU:0", "/device:CPU:1"), (60, 30)).to_json() == {
        "model": "mnist_maxing", "size": "tiny", "method": "towers", "devices": ("/device:CPU:0", "/device:CPU:1"),
        "batches": (60, 30), "seconds": 5.0, "windows": 3, "warmup_steps": 2, "emulate": None, "input_delay_ms": 0.0,
        "seed": 0, "label": "", "notes": (), "rebalance_every": None, "throttle": [], "data": None, "overlap": True,
        "batch": 90}


@pytest.mark.parametrize(("options", "needle"), [
    ({"seconds": 0}, "seconds per window must be > 0; got seconds=0"),
    ({"windows": 0}, "windows must be an int >= 1; got windows=0"),
    ({"warmup_steps": 0}, "warmup_steps must be an int >= 1; got warmup_steps=0"),
    ({"batches": (60, 0)}, "per-device batch sizes must be ints >= 1; got batches=[60, 0]"),
    ({"rebalance_every": 0}, "rebalance_every must be an int >= 1 (steps per window); got rebalance_every=0"),
    ({"method": "keras", "rebalance_every": 5}, "rebalance_every needs a parallel method (towers or mirrored); got "
                                                "method 'keras'"),
    ({"method": "keras"}, "method 'keras' splits the global batch evenly (stock MirroredStrategy); got batches "
                          "[60, 30]: use 2 equal batches such as [45, 45]"),
    ({"overlap": "no"}, "overlap must be true or false; got overlap='no'"),
    ({"throttle": ((2, 100.0, 3),)}, "throttle device index must be 0..1 (2 devices); got 2"),
    ({"throttle": ((1, 100.0, 3),), "emulate": None}, "throttle changes an emulated device's rate: it needs "
                                                      "emulate=..."),
])
def test_both_forms_check_the_spec_alike(options, needle):
    values = {"method": "mirrored", "batches": (60, 30), "emulate": parse_emulate("400,200"), **options}
    for where in ({"devices": DEVICES}, {"counts": (1, 1)}):
        form = RunConfig if "devices" in where else ClusterPlan
        with pytest.raises(ValueError) as info:
            form(model="mnist_maxing", size="tiny", **where, **values)
        assert needle in str(info.value), form
