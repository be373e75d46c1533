"""``foxhunt ensemble replay --interpret``: the TFT member's selection weights and attention over
the replayed bars, from windows recomputed after the replay that are those the member read."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ensemble_helpers import FAST, SMALL, cli, client
from hydra.utils import instantiate
from test_parity import _parts, member_of, replay_split

from foxhunt.ensemble.engine import MemberInputs
from foxhunt.ensemble.replay import replayed_windows
from foxhunt.evaluation.interpret import ATTENTION_PNG, TABLE_FILE, SelectionNames, selection_png


def test_the_recomputed_windows_are_those_the_member_read(compose_cfg):
    cfg, parts = _parts(compose_cfg, "tft")
    model, dataset = parts.model, parts.dataset
    replayed = replay_split(cfg, parts, member_of("tft", model, dataset, "torch"), "test")
    inputs = MemberInputs(dataset.feature_config, dataset.observed_mean, dataset.observed_std, dataset.groups)
    bars = instantiate(cfg.data.source).load(parts.asset)
    stamps = dataset.splits["test"].timestamps.astype("datetime64[ns]").astype(np.int64)
    start, stop = int(stamps[0]), int(stamps[-1]) + 1
    windows, total = replayed_windows(inputs, parts.asset, bars, model.seq_len, model.horizon, start, stop)
    batch = parts.datamodule.input_windows("test")  # the batch path's windows of the same bars
    assert total == len(batch["bar_index"]) == int(np.isfinite(replayed.signals["tft"]).sum())
    np.testing.assert_array_equal(windows["bar_index"], batch["bar_index"].numpy())
    for key in ("static", "known", "observed"):
        assert windows[key].dtype == np.float32
        np.testing.assert_allclose(windows[key], batch[key].numpy(), atol=1e-5, rtol=0)
    names = SelectionNames.of(dataset.feature_names, dataset.groups)
    forecasts: list = []
    model.interpret_windows(windows, 64, names, source="replay", forecasts=forecasts)
    signals = np.concatenate([f[..., model.median_index].sum(-1).numpy() for f in forecasts])
    np.testing.assert_allclose(signals, replayed.signals["tft"][windows["bar_index"]], atol=1e-5, rtol=0)
    capped, again = replayed_windows(inputs, parts.asset, bars, model.seq_len, model.horizon, start, stop, limit=7)
    assert again == total and len(capped["bar_index"]) == 7
    assert capped["bar_index"][0] == batch["bar_index"][0] and capped["bar_index"][-1] == batch["bar_index"][-1]


@pytest.fixture(scope="module")
def tft_store(tmp_path_factory):
    """A store holding one FINISHED smoke run of a small TFT on ES, registered as the champion."""
    from configs import compose_train_config
    from foxhunt.training.cell import train

    root = tmp_path_factory.mktemp("tft-ensemble")
    train(compose_train_config(["model=tft", *FAST, *SMALL["tft"], f"paths.output_dir={root / 'outputs' / 'tft'}"], root))
    registered = cli(root, "ensemble", "register", "asset=es", "ensemble.models=[tft]", "ensemble.gate=none")
    assert registered.exit_code == 0, registered.output
    return root


def test_replay_writes_the_tft_members_selection_and_attention(tft_store):
    folder = tft_store / "interpretation"
    result = cli(tft_store, "ensemble", "replay", "asset=es", "ensemble.models=[tft]", "data.source.days=4",
                 "evaluation.interpret.max_windows=50", "--interpret", str(folder))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"written to {folder}" in result.output and "interpretability: 50 of " in result.output
    files = {p.name for p in folder.iterdir()}
    assert {TABLE_FILE, ATTENTION_PNG, *(selection_png(g) for g in ("static", "encoder", "decoder"))} <= files
    table = json.loads((folder / TABLE_FILE).read_text())
    assert table["windows"] == 50 and table["windows_available"] > 50 and table["source"].startswith("replay, the test split")
    for group in ("static", "encoder", "decoder"):
        assert sum(table["selection"][group].values()) == pytest.approx(1.0, abs=1e-5)
    assert "log_return" in table["selection"]["encoder"] and "log_return" not in table["selection"]["decoder"]
    c = client(tft_store)
    (run,) = c.search_runs([c.get_experiment_by_name("ensemble").experiment_id])
    logged = {a.path for a in c.list_artifacts(run.info.run_id, "interpretability")}
    assert f"interpretability/{TABLE_FILE}" in logged and f"interpretability/{ATTENTION_PNG}" in logged


def test_interpret_without_a_tft_member_is_one_line(tft_store):
    result = cli(tft_store, "ensemble", "replay", "asset=es", "ensemble.models=[dqn]", "--interpret", str(tft_store / "x"))
    assert result.exit_code == 2
    assert "--interpret" in result.output and "no member of the ensemble can say what its inputs weighed" in result.output
