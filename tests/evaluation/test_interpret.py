"""The TFT's interpretability as numbers and files (foxhunt.evaluation.interpret): means of
sums, names from the dataset's feature list, metrics, the table and the PNGs."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from foxhunt.data.dataset import feature_groups
from foxhunt.data.features import FEATURE_GROUPS, FEATURE_NAMES
from foxhunt.evaluation.interpret import (
    ATTENTION_FILE,
    ATTENTION_PNG,
    SELECTION_FILE,
    TABLE_FILE,
    InterpretationSums,
    SelectionNames,
    selection_png,
    spaced_indices,
    write_interpretation,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _causal_rows(rng, windows: int, seq_len: int, horizon: int) -> np.ndarray:
    """(windows, horizon, L) attention rows of the decoder positions: softmax over positions <= t."""
    length = seq_len + horizon
    scores = rng.normal(size=(windows, horizon, length))
    future = np.arange(length)[None, :] > (seq_len + np.arange(horizon))[:, None]
    scores[:, future] = -np.inf
    return _softmax(scores)


def _sums(rng, names: SelectionNames, windows: int, seq_len: int, horizon: int) -> tuple[InterpretationSums, dict]:
    raw = {
        "static": _softmax(rng.normal(size=(windows, len(names.static)))),
        "encoder": _softmax(rng.normal(size=(windows, seq_len, len(names.encoder)))),
        "decoder": _softmax(rng.normal(size=(windows, horizon, len(names.decoder)))),
        "attention": _causal_rows(rng, windows, seq_len, horizon),
    }
    sums = InterpretationSums(names, seq_len, horizon)
    for part in np.array_split(np.arange(windows), 3):  # in batches, as the model feeds it
        sums.add(len(part), raw["static"][part].sum(0), raw["encoder"][part].sum((0, 1)),
                 raw["decoder"][part].sum((0, 1)), raw["attention"][part].sum(0))  # fmt: skip
    return sums, raw


def test_names_come_from_the_dataset_feature_list_in_the_tfts_order():
    names = SelectionNames.of(FEATURE_NAMES, feature_groups())
    assert names.static == FEATURE_GROUPS["static"]
    assert names.encoder == FEATURE_GROUPS["known"] + FEATURE_GROUPS["observed"]  # known first, as the encoder
    assert names.decoder == FEATURE_GROUPS["known"]
    shuffled = {"static": [3, 2, 1, 0], "known": [4, 5], "observed": [6]}
    custom = SelectionNames.of([f"f{i}" for i in range(7)], shuffled)
    assert custom == SelectionNames(("f3", "f2", "f1", "f0"), ("f4", "f5", "f6"), ("f4", "f5"))


def test_means_are_the_means_of_the_windows_and_each_group_sums_to_one():
    rng = np.random.default_rng(0)
    names = SelectionNames.of(FEATURE_NAMES, feature_groups())
    sums, raw = _sums(rng, names, windows=50, seq_len=7, horizon=3)
    result = sums.result("synthetic", total_windows=80)
    np.testing.assert_allclose(result.static, raw["static"].mean(0))
    np.testing.assert_allclose(result.encoder, raw["encoder"].mean((0, 1)))
    np.testing.assert_allclose(result.decoder, raw["decoder"].mean((0, 1)))
    np.testing.assert_allclose(result.attention, raw["attention"].mean(0))
    for group in ("static", "encoder", "decoder"):
        assert result.selection(group).sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(result.attention.sum(1), 1.0)  # every forecast position's row
    assert (result.attention[np.arange(3)[:, None] + 7 < np.arange(10)[None, :]] == 0).all()  # causal
    assert result.windows == 50 and result.total_windows == 80
    by_lag = result.attention_by_lag()
    assert by_lag.shape == (3, 7)
    np.testing.assert_allclose(by_lag[:, 0], result.attention[:, 6])  # lag 0: the window's last bar
    assert result.past_share() == pytest.approx(result.attention[:, :7].sum(1).mean())
    assert 0 <= result.mean_lag() <= 6


def test_metrics_are_named_by_feature_and_the_logged_means_sum_to_one():
    rng = np.random.default_rng(1)
    names = SelectionNames.of(FEATURE_NAMES, feature_groups())
    metrics = _sums(rng, names, windows=10, seq_len=5, horizon=2)[0].result("synthetic").metrics("test/")
    assert len(metrics) == 4 + 12 + 8 + 2  # one per variable of each selection, two of the attention
    for group, expected in (("static", names.static), ("encoder", names.encoder), ("decoder", names.decoder)):
        logged = {k.split("/")[-1]: v for k, v in metrics.items() if k.startswith(f"test/vsn_{group}/")}
        assert list(logged) == list(expected)
        assert sum(logged.values()) == pytest.approx(1.0, abs=1e-12)
    assert {"test/attention/past_share", "test/attention/mean_lag"} <= set(metrics)


def test_spaced_indices_cover_the_split_evenly():
    np.testing.assert_array_equal(spaced_indices(5, None), np.arange(5))
    np.testing.assert_array_equal(spaced_indices(5, 10), np.arange(5))
    picked = spaced_indices(1000, 11)
    assert len(picked) == 11 and picked[0] == 0 and picked[-1] == 999
    assert np.all(np.diff(picked) > 0) and np.ptp(np.diff(picked)) <= 1
    assert len(spaced_indices(0, 3)) == 0


def test_wrong_shapes_are_refused():
    sums = InterpretationSums(SelectionNames(("a",), ("b", "c"), ("b",)), seq_len=4, horizon=2)
    with pytest.raises(ValueError, match="encoder has shape"):
        sums.add(1, np.ones(1), np.ones(3), np.ones(1), np.ones((2, 6)))


def test_the_table_and_pngs_are_written(tmp_path):
    rng = np.random.default_rng(2)
    names = SelectionNames.of(FEATURE_NAMES, feature_groups())
    result = _sums(rng, names, windows=20, seq_len=6, horizon=3)[0].result("test split", total_windows=40)
    paths = write_interpretation(result, tmp_path / "interpretability", title="tft-es-fp32")
    expected = {
        TABLE_FILE,
        SELECTION_FILE,
        ATTENTION_FILE,
        ATTENTION_PNG,
        *(selection_png(g) for g in ("static", "encoder", "decoder")),
    }
    assert {p.name for p in paths} == expected and all(p.parent == tmp_path / "interpretability" for p in paths)
    for path in paths:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000
    table = json.loads((tmp_path / "interpretability" / TABLE_FILE).read_text())
    assert table["windows"] == 20 and table["windows_available"] == 40 and table["source"] == "test split"
    assert list(table["selection"]["encoder"]) == list(names.encoder)
    assert sum(table["selection"]["decoder"].values()) == pytest.approx(1.0)
    assert len(table["attention"]["by_lag_mean"]) == 6 and len(table["attention"]["matrix"]) == 3
    with (tmp_path / "interpretability" / SELECTION_FILE).open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["feature"] for r in rows if r["group"] == "encoder"] == list(names.encoder)
    assert len(rows) == 4 + 12 + 8
    with (tmp_path / "interpretability" / ATTENTION_FILE).open() as handle:
        lags = list(csv.DictReader(handle))
    assert [int(r["lag"]) for r in lags] == list(range(6)) and set(lags[0]) == {"lag", "mean", "step_1", "step_2", "step_3"}
