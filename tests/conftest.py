"""Shared test setup. The harness pytest plugin (markers, logical_devices, keras2, any_keras) is opted into here.

Tests that train models are written once for both Keras generations: the plugin's ``any_keras``
fixture runs each on Keras 3 and on Keras 2 (tf_keras, or TF 2.15's ``keras``), skipping the
generation an environment lacks with the reason. Tests that are Keras 3 only by nature (``keras.ops``,
``keras.config``, Keras 3 internals) take the ``keras3`` fixture below, which skips them where the
``keras`` package is Keras 2 (the matrix's ``tf215`` env); tests of Keras 2 behaviour alone take
``keras2``. Every module is collected in every env.

What a Keras 2 env runs follows from those declarations: the plugin marks ``keras2`` the tests that take the
``keras2`` fixture, any_keras' Keras 2 runs and the Keras 2 case of a ``generation`` parameter; a test that asks
for ``keras2`` by ``request.getfixturevalue`` otherwise marks its Keras 2 cases by hand, as does a test whose model
is the environment's own ``keras`` (a model file, a subprocess: Keras 2 in ``tf215``) where its verdict must hold
there. ``.ci/run``'s tf215 step selects ``-m keras2``. A test that reaches Keras 3 only API (``keras.ops``,
``keras.config``, ``keras.distribution``, ``keras.src``, ``keras_core``) declares Keras 3 only with the ``keras3``
fixture (an argument, one of its fixtures', or ``usefixtures``): tests/unit/test_keras_declarations.py reads every
test module and fails on one that does not.

Timing tests on emulated devices take their rates from the ``emulation``
fixture: an emulated device is only an emulation while the host computes its
slice faster than the emulated time (``harness.emulate``), so they take their
rates from a calibration of this host, made once per test run while
whatever else runs beside the suite runs: each test scales its nominal rates
down, when needed, to a quarter of what the host sustained. Their assertions
compare figures measured within one run, and each run must say it was not
host-bound, so a machine too slow even for that fails with the reason.
"""

import json
import os
from collections import defaultdict
from dataclasses import dataclass

import coverage_claims
import pytest
from tf_zygote import ENV, python

pytest_plugins = ["harness.pytest_plugin"]  # opt-in: installing harness loads it nowhere else


KERAS2_EXTENDED = ("keras2_extended: the test's Keras 2 run (any_keras' keras2) is an extended test: the quick loop "
                   "runs it on Keras 3, and the Keras 2 paths it takes are a quick test's elsewhere (its covered_by "
                   "marker names which)")


def pytest_configure(config):
    import gc

    config.addinivalue_line("markers", KERAS2_EXTENDED)
    config.addinivalue_line("markers", coverage_claims.DESCRIPTION)
    if not hasattr(gc.unfreeze, "__wrapped__"):  # noted by each test's setup (pytest_runtest_setup below)
        gc.unfreeze = _unfreezing(gc.unfreeze)


@pytest.hookimpl(tryfirst=True)  # before harness' plugin skips the extended tests this run did not select
def pytest_collection_modifyitems(config, items):
    """A grid test repeats one mechanism over its axes (models, splits, optimizers). Its Keras 3 cases all run in
    the quick loop; of its Keras 2 cases (``any_keras``' keras2) the quick loop runs one: the first collected of one
    method, the method picked by the test's name (``_keras2_method``), so that across the suite each method's Keras 2
    adapter path runs in about half the grid tests. The others are extended tests (``.ci/run``'s extended step, and
    the tf215 env in slow.yml). ``keras2_extended`` makes every Keras 2 case of a test extended. Of a Keras 3 grid
    over methods and another axis, each case runs one method (``_one_method_per_case``). Then the cases of
    ``MOVED_FOR_TIME`` become extended, each naming the quick tests that run its path.
    """
    methods: dict[str, list] = defaultdict(list)  # each grid test's Keras 2 methods, in collection order
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (params.get("any_keras") == "keras2" and params.get("method") not in methods[_base(item)]
                and item.get_closest_marker("extended") is None and item.get_closest_marker("keras2_extended") is None):
            methods[_base(item)].append(params.get("method"))
    # A Keras 2 case that a claim names stays quick (the claim is that it runs there), and stands for its test.
    named = {name for item in items for marker in item.iter_markers("covered_by") for name in marker.args}
    named |= {name for covering in MOVED_FOR_TIME.values() for name in covering}
    kept = {_base(item) for item in items if item.nodeid in named
            and getattr(getattr(item, "callspec", None), "params", {}).get("any_keras") == "keras2"}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("any_keras") != "keras2" or item.get_closest_marker("extended") is not None:
            continue
        base = _base(item)
        if item.nodeid in named and item.get_closest_marker("keras2_extended") is None:
            continue
        if (item.get_closest_marker("keras2_extended") is not None or base in kept
                or params.get("method") != _keras2_method(base, methods[base])):
            item.add_marker(pytest.mark.extended)
        else:
            kept.add(base)
    _one_method_per_case(items, named)
    moved = {item.nodeid: item for item in items}
    for nodeid, covering in MOVED_FOR_TIME.items():
        if nodeid in moved:  # absent: a module this env skips or a run of some files; test_coverage_claims holds it
            moved[nodeid].add_marker(pytest.mark.extended)
            moved[nodeid].add_marker(pytest.mark.covered_by(*covering))
    # Read by tests/unit/test_coverage_claims.py: every covered_by claim against the whole collection.
    config.stash[coverage_claims.COLLECTED] = coverage_claims.snapshot(items)


def _base(item) -> str:
    return item.nodeid.split("[")[0]


GRID_METHODS = ("towers", "mirrored")


def _one_method_per_case(items, named: set) -> None:
    """A grid test over methods and another axis (models, splits, optimizers) runs each mechanism once per method
    and once per other case: of a Keras 3 case's two methods the quick loop runs one, the methods alternating over
    the other cases (the first case's method picked by the test's name, ``_keras2_method``'s crc32), so each method
    and each other case runs in the quick loop. The other method's case becomes extended, its ``covered_by`` naming
    the quick case of its other parameters and a quick case of its method in the same test. Only where the test has
    two such cases or more (a test over methods alone keeps both); a case a claim names, one already extended and
    one of ``MOVED_FOR_TIME`` stay as they are."""
    import zlib

    grids: dict[str, dict[tuple, dict[str, object]]] = defaultdict(lambda: defaultdict(dict))
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (params.get("method") not in GRID_METHODS or "keras2" in [v for v in params.values() if isinstance(v, str)]
                or any(item.get_closest_marker(m) is not None for m in coverage_claims.OUT_OF_QUICK_LOOP)
                or item.nodeid in MOVED_FOR_TIME):
            continue
        rest = tuple(sorted((name, repr(value)) for name, value in params.items() if name != "method"))
        grids[_base(item)][rest][params["method"]] = item
    for base, cases in grids.items():
        both = [methods for methods in cases.values() if len(methods) == len(GRID_METHODS)]
        if len(both) < 2:
            continue
        first = zlib.crc32(base.encode())
        kept: dict[str, list] = defaultdict(list)
        plan = []
        for i, methods in enumerate(both):
            keep = GRID_METHODS[(first + i) % len(GRID_METHODS)]
            if any(item.nodeid in named for item in methods.values()):
                kept.update({m: [*kept[m], item] for m, item in methods.items() if item.nodeid in named})
                continue
            kept[keep].append(methods[keep])
            plan.append((keep, methods))
        for keep, methods in plan:
            for method, item in methods.items():
                if method == keep:
                    continue
                item.add_marker(pytest.mark.extended)
                item.add_marker(pytest.mark.covered_by(methods[keep].nodeid, kept[method][0].nodeid))


def _keras2_method(base: str, methods: list):
    """The method whose Keras 2 case of grid test ``base`` runs in the quick loop: one of ``methods`` by a hash of
    the test's node id (stable across runs and xdist workers; crc32, not ``hash``, which Python salts)."""
    import zlib

    return methods[zlib.crc32(base.encode()) % len(methods)] if methods else None


# Quick-loop cases moved to the extended tests for the quick loop's time (746 s on a 2-core host against
# its 480 s budget x the host's probe), each with the quick tests that run its path; tests/unit/test_coverage_claims.py
# holds every claim, and that every case named here exists (test_the_cases_moved_for_time_exist).
_EQ = "tests/parallel/test_equivalence.py::"
MOVED_FOR_TIME: dict[str, tuple[str, ...]] = {
    # 22 s: an asv repository built and run in pairs; the extended busy-loop tests run the gate end to end (5%, a
    # README change, a crash), the quick replay judges recorded pairs and rounds against planted gates.
    "tests/ci/test_gate.py::test_gate_fails_a_planted_30_percent_slowdown": (
        "tests/ci/test_gate_plants.py::test_each_plant_is_wrong_where_the_real_gate_is_right",
        "tests/ci/test_interleave.py::test_the_two_sides_are_sampled_in_turn_the_order_alternating_pair_by_pair"),
    # 10-11 s each: the GRU on an even split; its uneven split runs on each method.
    f"{_EQ}test_parallel_step_equals_single_device[keras3-towers-even-gru]": (
        f"{_EQ}test_parallel_step_equals_single_device[keras3-towers-5:3:2-gru]",),
    f"{_EQ}test_parallel_step_equals_single_device[keras3-mirrored-even-gru]": (
        f"{_EQ}test_parallel_step_equals_single_device[keras3-mirrored-5:3:2-gru]",),
    # 16 s: the reuse of a traced model is equivalence's (_Traced), alike for each method; set_ratios on mirrored is
    # the Rebalance tests'.
    f"{_EQ}test_cases_of_one_model_share_its_traced_parallel_model[keras3-mirrored]": (
        f"{_EQ}test_cases_of_one_model_share_its_traced_parallel_model[keras3-towers]",
        f"{_EQ}test_a_users_rebalance_on_timed_devices_stays_exact[keras3-mirrored-fixed]"),
    # 13 s: mixed_float16's loss scaling under a MirroredStrategy, also a zoo pin's path on mirrored.
    "tests/parallel/test_conformance.py::test_mixed_float16_keeps_loss_scaling[keras3-mirrored]": (
        "tests/parallel/test_conformance.py::test_mixed_float16_keeps_loss_scaling[keras3-towers]",
        "tests/zoo/test_zoo_conformance.py::test_a_sampled_pin_holds[mlp|3|mirrored|3:2|adagrad/mixed_float16]"),
    # 7-8 s each: a mirrored case beside its towers and Keras 2 cases.
    "tests/upstream/test_saving.py::test_save_then_load_gives_the_single_device_model_with_equal_predictions"
    "[keras3-mirrored]": (
        "tests/upstream/test_saving.py::test_save_then_load_gives_the_single_device_model_with_equal_predictions"
        "[keras3-towers]",),
    # 7 s: an LSTM stack trained to one device's accuracy on towers; mirrored's recurrent step is the equivalence
    # grid's GRU.
    "tests/upstream/test_recurrent.py::test_recurrent_stack_reaches_the_single_device_accuracy[keras3-lstm-mirrored]": (
        "tests/upstream/test_recurrent.py::test_recurrent_stack_reaches_the_single_device_accuracy[keras3-lstm-towers]",
        f"{_EQ}test_parallel_step_equals_single_device[keras3-mirrored-5:3:2-gru]"),
    # 23 s: 300 steps of BatchNorm over 4 uneven replicas, often empty, under MirroredStrategy (a NaN after tens of
    # steps, tensorflow/tensorflow#87432); one step's path, empty replicas' statistics kept out, is the partial last
    # batch's, on each method.
    "tests/upstream/test_batches.py::test_batchnorm_moving_statistics_stay_finite_over_hundreds_of_uneven_steps"
    "[keras3]": (
        "tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact[keras3-mirrored]",
        "tests/upstream/test_batches.py::test_partial_last_batch_with_batchnorm_stays_finite_and_exact[keras3-towers]"),
    # 17 s: four MirroredStrategies (1 to 4 replicas) traced anew; the same 1-4 replica counts on towers, the model
    # (two inputs, L2 weight regularisers) on 3 uneven mirrored replicas, and mirrored's 4 replicas on a last batch
    # smaller than the device count.
    "tests/upstream/test_batches.py::test_replica_count_does_not_change_the_step[keras3-mirrored]": (
        "tests/upstream/test_batches.py::test_replica_count_does_not_change_the_step[keras3-towers]",
        f"{_EQ}test_parallel_step_equals_single_device[keras3-mirrored-5:3:2-two_input]",
        "tests/upstream/test_batches.py::test_last_batch_smaller_than_the_device_count[keras3-dense-mirrored]"),
    "tests/parallel/test_user_model.py::test_lookups_fed_by_a_dataset_get_the_single_devices_rows[mirrored-False]": (
        "tests/parallel/test_user_model.py::test_lookups_fed_by_a_dataset_get_the_single_devices_rows[mirrored-True]",
        "tests/parallel/test_user_model.py::test_lookups_fed_by_a_dataset_get_the_single_devices_rows[towers-False]"),
}


# The garbage collector's full collections walk every object a test process holds, the modules first: after
# TensorFlow, Keras and JAX are imported, some 300,000 objects that live as long as the process. With the objects alive
# at a test's start frozen out of the collector (gc.freeze) once the imports are done, the collector's time in the two
# xdist workers of tests/parallel/test_equivalence.py, test_conformance.py, test_api.py and
# tests/upstream/test_batches.py (pytest -n 2, idle, gc.callbacks timing each collection) went from 49 + 44 s to
# 27 + 37 s (full collections: 28 + 29 s to 5 + 15 s), of some 215 s each; the wall times of such runs move by more
# than that from run to run here (185-211 s without, 199-217 s with). A test's own objects are collected as before;
# what is frozen is what was alive between tests after a full collection: modules, session fixtures, caches.
# (Larger collection thresholds made it slower: 10000,10,10 took 26 + 42 s, 50000,10,10 109 + 57 s.)
_FREEZE_AFTER_MODULES = 100  # modules imported since the last freeze that make the next test's setup freeze again
_frozen = {"modules": 0, "unfrozen": False}


def _unfreezing(unfreeze):
    """``gc.unfreeze`` that notes it ran, so that the next test's setup freezes again. The note replaces reading
    ``gc.get_freeze_count()`` before each test: CPython counts the frozen objects by walking their list, 35 ms
    for the 383,000 that TensorFlow's and Keras' imports leave (measured: ``python -c "import gc, time, tensorflow,
    keras; gc.freeze(); ..."``, 20 calls), some 45 ms in a test process later on: 10% of
    tests/parallel/test_equivalence.py, test_conformance.py and test_api.py in one process (py-spy, 20 Hz). Those
    last two files, ``pytest -n 0``, twice each way, alternating: 47.9 and 49.0 s reading the count, 42.2 and 41.2 s
    with the note."""
    def wrapped():
        _frozen["unfrozen"] = True
        unfreeze()
    wrapped.__wrapped__ = unfreeze
    return wrapped


@pytest.hookimpl(tryfirst=True)  # before the runner sets up this test's fixtures, so that none of them is frozen
def pytest_runtest_setup(item):
    """Freezes what is alive (after a full collection) when imports since the last freeze added
    ``_FREEZE_AFTER_MODULES`` modules or more, or when something unfroze it (``gc.unfreeze``: harness' chart drawing
    does)."""
    import gc
    import sys

    if len(sys.modules) - _frozen["modules"] >= _FREEZE_AFTER_MODULES or _frozen["unfrozen"]:
        gc.collect()
        gc.freeze()
        _frozen.update(modules=len(sys.modules), unfrozen=False)


@pytest.fixture(autouse=True)
def _distributed_iterators_end_with_their_test():
    """A stock ``fit`` under a ``MirroredStrategy`` leaves its distributed input (a ``MultiDeviceIterator``) in a
    reference cycle. Collected later, by whichever test's allocation set off the collector, its destruction held
    that test 20 to 40 s at 1-5% CPU (measured with py-spy in the quick loop: test_floor's and test_fidelity's
    tests, in C++ ``~MultiDeviceIterator`` under ``EagerTensor_dealloc`` while tracing). Collected at the end of
    the test that made it, it takes 0.2 s. Nothing is collected after a test that left none alive."""
    import sys

    name = "tensorflow.python.data.ops.multi_device_iterator_ops"
    ops = sys.modules.get(name)
    if ops is None:  # no TensorFlow in this process yet: tracked from the next test on, this one's collected now
        yield
        if name in sys.modules:
            import gc

            gc.collect()
        return
    made = _track_iterators(ops)
    if made is None:  # a TensorFlow without the class: nothing to track
        yield
        return
    made.clear()
    yield
    if any(ref() is not None for ref in made):
        import gc

        gc.collect()
    made.clear()


def _track_iterators(ops) -> list | None:
    """The weak references to every ``OwnedMultiDeviceIterator`` made since the list was cleared (None: no such
    class in this TensorFlow)."""
    cls = getattr(ops, "OwnedMultiDeviceIterator", None)
    if cls is None:
        return None
    made = cls.__dict__.get("_harness_tests_made")
    if made is None:
        import weakref

        made = []
        init = cls.__init__

        def tracked(self, *args, **kwargs):
            init(self, *args, **kwargs)
            made.append(weakref.ref(self))

        cls.__init__ = tracked
        cls._harness_tests_made = made
    return made


@pytest.fixture(scope="session")
def keras3():
    """The ``keras`` package where it is Keras 3; skips the test, saying why, where it is Keras 2 or absent."""
    from importlib import metadata

    try:
        version = metadata.version("keras")
    except metadata.PackageNotFoundError:
        pytest.skip("Keras 3 only, and the keras package is not installed")
    if int(version.split(".")[0]) < 3:
        pytest.skip(f"Keras 3 only: the keras package here is Keras {version}")
    import keras

    return keras


@pytest.fixture(scope="module")
def shared_runs():
    """``shared_runs(*key)``: a ``single_runs`` dict of ``harness.compare_training``, one per key, for one test module.

    The cases of one model that differ only in method, split or devices (a grid) pass the same dict: the
    single-device run is trained once, and each method's parallel model is traced once per device list and
    restored to the initial weights and optimizer state for the next split (``set_ratios``, no retrace). Tracing
    is most of what a small model's comparison costs. Key it by everything else the runs depend on (the Keras
    module, the model, the data and the training options).
    """
    kept: dict = defaultdict(dict)
    yield lambda *key: kept[key]
    kept.clear()


# A quarter of the calibrated rate: the load beside a test may grow after the calibration (another
# xdist worker starting a TensorFlow process, two CPU hogs) and slow the host two- or threefold.
SHARE = 0.25
CALIBRATE = ["calibrate", "--model", "mnist_maxing", "--devices", "2", "--batch", "100", "--seconds", "0.3",
             "--windows", "3", "--json", "--no-save"]


@dataclass(frozen=True)
class Emulation:
    """This host's calibration: the rate it computes two busy devices' slices of ``mnist_maxing`` tiny at."""

    sustained: float  # samples/s per device, 100 samples per device per step, both devices at once
    outside_ms: float  # the host's work per step outside the devices

    @property
    def max_rate(self) -> float:
        """The fastest rate a test may emulate here: ``SHARE`` of the sustained rate."""
        return SHARE * self.sustained

    def factor(self, *rates: float) -> float:
        """The scale (at most 1) that brings the fastest of ``rates`` to ``max_rate``."""
        return min(1.0, self.max_rate / max(rates))

    def scale(self, *rates: float) -> list[int]:
        """``rates`` times ``factor(*rates)``, whole samples/s: their ratios kept, all well within the host."""
        f = self.factor(*rates)
        return [max(1, round(r * f)) for r in rates]


@pytest.fixture(scope="session")
def emulation(tmp_path_factory) -> Emulation:
    """``harness calibrate`` of this host, once per test run: the first xdist worker that needs it calibrates
    while the suite runs beside it, the others read its figures (the recipe pytest-xdist gives for session data)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return _calibrate()
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent / f"emulation-{run}.json"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            return Emulation(**json.loads(shared.read_text()))
        emulation = _calibrate()
        shared.write_text(json.dumps({"sustained": emulation.sustained, "outside_ms": emulation.outside_ms}))
        return emulation


def _calibrate() -> Emulation:
    done = python(["-m", "harness", *CALIBRATE], timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = json.loads(done.stdout)["result"]["workloads"]
    print(f"calibration: {entry['sustained_rate']:.0f} samples/s per device sustained, "
          f"{entry['outside_ms']:.1f} ms per step outside the devices")
    return Emulation(entry["sustained_rate"], entry["outside_ms"])
