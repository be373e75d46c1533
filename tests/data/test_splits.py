"""Chronological split: exact sizes, gaps, coverage and config validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.data.splits import SPLIT_NAMES, SplitConfig, split_slices

CFG = {"train": 0.7, "val": 0.15, "test": 0.15, "gap_bars": 10}


def test_exact_slices():
    # usable = 1000 - 2 * 10 = 980: train floor(686.0), val floor(147.0), test the rest
    slices = split_slices(1000, CFG)
    assert list(slices) == ["train", "val", "test"]
    assert slices == {
        "train": slice(0, 686),
        "val": slice(696, 843),
        "test": slice(853, 1000),
    }


def test_zero_gap_and_remainder_to_test():
    slices = split_slices(11, {**CFG, "gap_bars": 0})
    # floor(7.7) = 7, floor(1.65) = 1, test gets 3
    assert slices == {"train": slice(0, 7), "val": slice(7, 8), "test": slice(8, 11)}


@given(
    n=st.integers(min_value=3, max_value=100_000),
    a=st.floats(min_value=0.01, max_value=1.0),
    b=st.floats(min_value=0.01, max_value=1.0),
    c=st.floats(min_value=0.01, max_value=1.0),
    gap=st.integers(min_value=0, max_value=500),
)
def test_split_properties(n, a, b, c, gap):
    total = a + b + c
    fractions = {"train": a / total, "val": b / total}
    fractions["test"] = 1.0 - fractions["train"] - fractions["val"]
    assume(fractions["test"] > 0)
    cfg = {**fractions, "gap_bars": gap}
    usable = n - 2 * gap
    try:
        slices = split_slices(n, cfg)
    except ValueError as err:
        assert "need more bars" in str(err)
        assert (
            min(
                math.floor(usable * fractions["train"]),
                math.floor(usable * fractions["val"]),
                usable - math.floor(usable * fractions["train"]) - math.floor(usable * fractions["val"]),
            )
            < 1
        )
        return
    train, val, test = (slices[s] for s in SPLIT_NAMES)
    assert train.start == 0 and test.stop == n
    assert val.start - train.stop == gap and test.start - val.stop == gap
    for s in (train, val, test):
        assert s.stop > s.start
    assert train.stop - train.start == math.floor(usable * fractions["train"])
    assert val.stop - val.start == math.floor(usable * fractions["val"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"val": -0.15, "train": 1.0}, r"split\.train=1\.0: must be a number in \(0, 1\)"),
        ({"val": -0.1, "train": 0.95}, r"split\.val=-0\.1: must be a number in \(0, 1\)"),
        ({"test": 0.2}, r"split\.train \+ .* = 1\.05: must sum to 1"),
        ({"gap_bars": -1}, r"split\.gap_bars=-1: must be an integer >= 0"),
        ({"gap_bars": 1.5}, r"split\.gap_bars=1\.5"),
        ({"train_fraction": 0.7}, r"split\.train_fraction: unknown key"),
    ],
)
def test_config_errors_name_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        SplitConfig.from_config({**CFG, **change})


def test_missing_key():
    cfg = dict(CFG)
    del cfg["gap_bars"]
    with pytest.raises(ValueError, match=r"^split\.gap_bars: missing key$"):
        split_slices(100, cfg)


def test_too_few_bars_names_the_split():
    with pytest.raises(ValueError, match=r"split\.val=0\.15: gives 0 bars .*need more"):
        split_slices(25, CFG)  # usable 5: train 3, val 0


def test_dictconfig_and_dataclass_accepted():
    expected = split_slices(1000, CFG)
    assert split_slices(1000, OmegaConf.create(CFG)) == expected
    assert split_slices(1000, SplitConfig(**CFG)) == expected
