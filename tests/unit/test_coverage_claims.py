"""Coverage claims a machine checks (tests/coverage_claims.py): a test kept out of the quick loop names, in a
``covered_by`` marker, the quick tests that run its path; here every such claim of the suite is held to the suite's
collection, and the checker is shown failing on planted bad claims.

In the quick loop every test process collects the whole suite: the check reads this session's collection
(tests/conftest.py records it before ``-k``/``-m`` deselect any) and costs milliseconds. Run on a part of the suite, it
collects the modules concerned (those holding a claim and those a claim names) in a ``pytest --collect-only`` of
their own: 11-14 s on this busy 2-core host, most of it the TensorFlow and Keras imports of the parallel tests'
modules.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from coverage_claims import COLLECTED, Collected, claim_problems, claimant_files, collect

ROOT = Path(__file__).resolve().parents[2]

# The paths that had gone out of the quick loop behind comments, each restored as a quick test with its planted
# defect: the extended test and the quick one its claim must keep naming.
RESTORED = {
    "tests/parallel/test_equivalence.py::test_per_device_batchnorm_is_not_exact[keras2-mirrored]":
        "tests/parallel/test_equivalence.py::test_per_device_batchnorm_is_not_exact[keras2-towers]",
    "tests/parallel/test_conformance.py::test_mixed_float16_keeps_loss_scaling[keras2-towers]":
        "tests/parallel/test_conformance.py::test_keras2_loss_scaling_is_handed_over_and_fails_planted",
    "tests/onjax/test_bench_jax.py::test_compare_writes_rows_json_and_chart":
        "tests/onjax/test_bench_jax.py::test_run_on_three_cpu_devices_by_ratios_and_a_planted_share_fails",
    "tests/parallel/test_randomness.py::test_check_passes_a_random_classifier_and_fails_a_planted_one[mirrored]":
        "tests/parallel/test_randomness.py::test_check_passes_a_random_classifier_and_fails_a_planted_one[towers]",
    "tests/parallel/test_equivalence.py::test_cases_of_one_model_share_its_traced_parallel_model[keras2-mirrored]":
        "tests/parallel/test_equivalence.py::test_cases_of_one_model_share_its_traced_parallel_model[keras2-towers]",
}


def _the_suite(config) -> dict[str, Collected]:
    """The tests that hold a claim and those the claims name: this session's, where it was given folders or files
    that hold all their modules (the quick loop: tests/), else a collection of those modules."""
    files = claimant_files(ROOT)
    given = [(config.invocation_params.dir / arg).resolve() for arg in config.args]
    whole = not any("::" in arg for arg in config.args) and all(
        any(path == folder or folder in path.parents for folder in given) for path in (ROOT / f for f in files))
    session = config.stash.get(COLLECTED, None)
    return session if whole and session is not None else collect(files, ROOT)


def test_every_coverage_claim_names_a_quick_test(request):
    tests = _the_suite(request.config)
    problems = claim_problems(tests, ROOT)
    assert not problems, "\n".join(problems)
    modules = {nodeid.split("::", 1)[0] for nodeid in tests}
    for extended, quick in RESTORED.items():
        if extended.split("::", 1)[0] not in modules:
            continue  # skipped as a whole in this environment (tests/onjax without JAX)
        assert not tests[extended].quick and quick in (tests[extended].claims or ()), extended
        assert tests[quick].quick, quick


def test_the_cases_moved_for_time_exist_and_are_out_of_the_quick_loop(request):
    """A case tests/conftest.py moves to the extended tests that no longer exists (renamed, a parameter changed) would
    leave its claim unread: each must be collected, extended, and carry the claim."""
    import conftest

    tests = _the_suite(request.config)
    modules = {nodeid.split("::", 1)[0] for nodeid in tests}
    for nodeid, covering in conftest.MOVED_FOR_TIME.items():
        if nodeid.split("::", 1)[0] not in modules:
            continue  # skipped as a whole in this environment
        assert nodeid in tests, f"MOVED_FOR_TIME names {nodeid!r}, which does not exist"
        assert "extended" in tests[nodeid].out and set(covering) <= set(tests[nodeid].claims or ()), (
            nodeid, tests[nodeid])


def test_bad_claims_are_named():
    out, quick = ("extended",), ()
    tests = {
        "t.py::test_quick[a]": Collected(quick),
        "t.py::test_quick[b]": Collected(quick),
        "t.py::test_deep": Collected(out),
        "t.py::test_missing": Collected(out, ("t.py::test_gone",)),
        "t.py::test_case_missing": Collected(out, ("t.py::test_quick[c]",)),
        "t.py::test_names_extended": Collected(out, ("t.py::test_deep",)),
        "t.py::test_right": Collected(("slow",), ("t.py::test_quick[a]", "t.py::test_quick[b]")),
        "t.py::test_stale[x]": Collected(quick, ("t.py::test_quick[a]",)),
        "t.py::test_empty": Collected(out, ()),
        "t.py::test_not_a_name": Collected(out, (3,)),
        "t.py::test_k[keras3]": Collected(quick, ("t.py::test_gone",)),  # a quick case: its claim is its Keras 2's
        "t.py::test_k[keras2]": Collected(out, ("t.py::test_quick[a]",), keras2_extended=True),
        "t.py::test_unclaimed[keras2]": Collected(out, None, keras2_extended=True),
    }
    assert claim_problems(tests) == [
        "t.py::test_missing: covered_by names 't.py::test_gone', which does not exist",
        "t.py::test_case_missing: covered_by names 't.py::test_quick[c]', which does not exist (its cases: "
        "t.py::test_quick[a], t.py::test_quick[b])",
        "t.py::test_names_extended: covered_by names 't.py::test_deep', which is not in the quick loop (marked "
        "extended)",
        "t.py::test_empty: covered_by takes one or more node ids (strings); got []",
        "t.py::test_not_a_name: covered_by takes one or more node ids (strings); got [3]",
        "t.py::test_unclaimed[keras2]: keras2_extended, and no covered_by names the quick test of its Keras 2 path",
        "t.py::test_stale: covered_by on a test whose every case runs in the quick loop: no claim to make",
    ]


def test_a_claim_into_a_module_skipped_here_is_left_to_where_it_is_collected(tmp_path):
    # tests/onjax without JAX: its modules exist and skip as a whole; a name whose module does not exist is wrong.
    (tmp_path / "skipped.py").write_text("")
    tests = {"t.py::test_deep": Collected(("extended",), ("skipped.py::test_x", "absent.py::test_y"))}
    assert claim_problems(tests, tmp_path) == [
        "t.py::test_deep: covered_by names 'absent.py::test_y', which does not exist"]


PLANTED = '''
import pytest


@pytest.mark.parametrize("case", ["a", pytest.param("b", marks=[
    pytest.mark.extended, pytest.mark.covered_by("test_planted.py::test_quick[a]")])])
def test_quick(case):
    pass


@pytest.mark.extended
@pytest.mark.covered_by("test_planted.py::test_quick[c]")
def test_names_a_case_that_does_not_exist():
    pass


@pytest.mark.slow
@pytest.mark.covered_by("test_planted.py::test_quick[b]", "test_planted.py::test_quick[a]")
def test_names_an_extended_case():
    pass
'''


def test_planted_bad_claims_fail_through_a_real_collection(tmp_path):
    # The markers as pytest collects them: a claim on a parameter's marks, and on a test's own.
    (tmp_path / "test_planted.py").write_text(textwrap.dedent(PLANTED))
    tests = collect(["test_planted.py"], tmp_path, timeout=120)
    assert tests["test_planted.py::test_quick[b]"] == Collected(("extended",), ("test_planted.py::test_quick[a]",))
    assert claim_problems(tests) == [
        "test_planted.py::test_names_a_case_that_does_not_exist: covered_by names 'test_planted.py::test_quick[c]', "
        "which does not exist (its cases: test_planted.py::test_quick[a], test_planted.py::test_quick[b])",
        "test_planted.py::test_names_an_extended_case: covered_by names 'test_planted.py::test_quick[b]', which is "
        "not in the quick loop (marked extended)",
    ]
