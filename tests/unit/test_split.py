"""split_batch: the seed's numbers, properties, and errors that name the bad value."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import split_batch
from harness.split import validate_ratios


def test_seed_000_ratio_gives_the_promised_58_42():
    # Seed 000's code (docs/background.md) floors each share and gets 57/43 where its README promises 58/42.
    assert split_batch(100, [768, 560]) == (58, 42)


@pytest.mark.parametrize(
    ("batch", "ratios", "expected"),
    [
        (1000, [3, 2], (600, 400)),
        (1024, [1, 1], (512, 512)),
        (10, [1, 1, 1], (4, 3, 3)),  # tie: the lower index gets the extra sample
        (3, [1000, 1, 1], (1, 1, 1)),  # no device starved when there are enough samples
        (1, [1, 1], (1, 0)),  # fewer samples than devices: a share may be 0
        (0, [3, 2], (0, 0)),
    ],
)
def test_examples(batch, ratios, expected):
    assert split_batch(batch, ratios) == expected


ratio_lists = st.lists(st.floats(min_value=0.01, max_value=1000), min_size=1, max_size=8)


@given(st.integers(min_value=0, max_value=5000), ratio_lists)
def test_sums_and_bounds(batch, ratios):
    sizes = split_batch(batch, ratios)
    assert sum(sizes) == batch
    assert all(s >= 0 for s in sizes)
    if batch >= len(ratios):
        assert all(s >= 1 for s in sizes)
    total = math.fsum(ratios)
    for size, r in zip(sizes, ratios):
        # Largest remainder stays within one sample of the exact share, except where
        # a starved device was filled (then the donor moves by at most len(ratios)).
        assert abs(size - batch * r / total) <= len(ratios)


@given(st.integers(min_value=0, max_value=5000), ratio_lists, st.integers(0, 7), st.floats(1.0, 10.0))
def test_monotonic_in_ratio(batch, ratios, index, factor):
    index %= len(ratios)
    more = list(ratios)
    more[index] *= factor
    assert split_batch(batch, more)[index] >= split_batch(batch, ratios)[index] - 1


@pytest.mark.parametrize(
    ("ratios", "error", "fragment"),
    [
        ([3, 0], ValueError, "ratios=[3, 0]"),
        ([3, -1], ValueError, "ratios=[3, -1]"),
        ([1, float("nan")], ValueError, "positive finite"),
        ([1, float("inf")], ValueError, "positive finite"),
        ([], ValueError, "at least one"),
        ("32", TypeError, "ratios='32'"),
        ([1, "a"], TypeError, "must be numbers"),
    ],
)
def test_bad_ratios_name_the_value(ratios, error, fragment):
    with pytest.raises(error, match=None) as info:
        split_batch(10, ratios)
    assert fragment in str(info.value)


def test_bad_batch_sizes():
    with pytest.raises(ValueError, match="batch_size=-1"):
        split_batch(-1, [1, 1])
    with pytest.raises(TypeError, match="batch_size=2.5"):
        split_batch(2.5, [1, 1])


def test_wrong_length_names_both_counts():
    with pytest.raises(ValueError, match=r"3 devices\); got 2 ratios"):
        validate_ratios([1, 2], 3)
