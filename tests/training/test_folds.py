"""A cell evaluated by walk-forward over two seeds: one cell run, its folds nested under it, the
aggregate equal to the children's pooled scores, resume and registration on the cell."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import compose_train_config
from foxhunt.evaluation.scoring import ScoringSettings, SplitScore, pool_scores
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import ROLE_CELL, ROLE_FOLD, Tag
from foxhunt.training.cell import run_cell
from foxhunt.training.scoring import SCORES_DIR, scores_file

OVERRIDES = [
    "model=dqn", "asset=es", "trainer=smoke", "data.source.days=14", "evaluation.protocol=walk_forward",
    "evaluation.walk_forward.folds=2", "evaluation.seeds=[1,2]", "evaluation.bootstrap.samples=200",
]  # fmt: skip


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    root = tmp_path_factory.mktemp("walk_forward")
    cfg = compose_train_config(OVERRIDES, root)
    outcome = run_cell(cfg)
    store = RunStore(cfg.logger.tracking_uri)
    return root, cfg, outcome, store, store.search("foxhunt")


def test_one_cell_run_with_a_child_per_seed_and_fold(cell):
    _, _, outcome, _, runs = cell
    (parent,) = [r for r in runs if r.tags.get(Tag.ROLE) == ROLE_CELL]
    assert parent.run_id == outcome.run_id and parent.name == "dqn-es-fp32"
    assert "walk-forward 2 folds expanding" in parent.tags[Tag.PROTOCOL] and "seeds [1, 2]" in parent.tags[Tag.PROTOCOL]
    kids = [r for r in runs if r.tags.get(Tag.ROLE) == ROLE_FOLD]
    assert sorted(r.name for r in kids) == [f"dqn-es-fp32 seed{s}_fold{k}" for s in (1, 2) for k in (0, 1)]
    assert all(r.parent_id == parent.run_id and r.status == "FINISHED" for r in kids)
    assert sorted((r.tags[Tag.SEED], r.tags[Tag.FOLD]) for r in kids) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]


def test_seeds_change_the_model_not_the_bars(cell):
    root, _, _, _, _ = cell
    manifests = {p.parent.name: json.loads(p.read_text()) for p in (root / "outputs" / "run").glob("seed*/dataset.json")}
    assert manifests["seed1_fold0"]["cache_key"] == manifests["seed2_fold0"]["cache_key"]
    assert manifests["seed1_fold0"]["splits"] == manifests["seed2_fold0"]["splits"]
    assert manifests["seed1_fold0"]["splits"]["test"] != manifests["seed1_fold1"]["splits"]["test"]
    # each fold normalizes with its own training window: fold 1's window is longer
    assert manifests["seed1_fold1"]["splits"]["train"]["rows"] > manifests["seed1_fold0"]["splits"]["train"]["rows"]
    assert manifests["seed1_fold0"]["observed_mean"] != manifests["seed1_fold1"]["observed_mean"]


def test_aggregate_is_the_pooled_children_mean_across_seeds(cell, tmp_path):
    _, cfg, outcome, store, runs = cell
    from hydra.utils import instantiate

    settings = ScoringSettings.from_config(cfg, instantiate(cfg.asset))
    kids = sorted((r for r in runs if r.tags.get(Tag.ROLE) == ROLE_FOLD), key=lambda r: (r.tags[Tag.SEED], r.tags[Tag.FOLD]))
    per_seed = {}
    for seed in ("1", "2"):
        scores = [SplitScore.load(store.download(r.run_id, f"{SCORES_DIR}/{scores_file('val')}", tmp_path / r.run_id))
                  for r in kids if r.tags[Tag.SEED] == seed]  # fmt: skip
        per_seed[seed] = pool_scores(scores).metrics(settings)["sharpe"]
    values = list(per_seed.values())
    assert outcome.metrics["val/sharpe"] == pytest.approx(np.mean(values), rel=1e-12)
    assert outcome.metrics["val/sharpe_std"] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
    parent = store.get(outcome.run_id)
    for key in ("test/sharpe", "test/sharpe_ci_low", "test/sharpe_ci_high", "test/baseline/momentum/sharpe",
                "test/sharpe_fold_std", "val/mean_reward", "memory/peak_mb"):  # fmt: skip
        assert parent.metric(key) is not None, key
    assert parent.metric("test/sharpe_ci_low") < parent.metric("test/sharpe") < parent.metric("test/sharpe_ci_high")
    files = store.logged_files(outcome.run_id, "")
    assert "folds.md" in files and "equity_walk_forward.png" in files


def test_resume_skips_the_finished_cell(cell):
    root, _, outcome, _, _ = cell
    again = run_cell(compose_train_config([*OVERRIDES, "resume=true"], root))
    assert again.status == "SKIPPED" and again.run_id == outcome.run_id
    assert again.metrics["val/sharpe"] == pytest.approx(outcome.metrics["val/sharpe"])


def test_register_selects_the_cell_and_takes_its_last_fold(cell):
    _, _, outcome, store, _runs = cell
    from foxhunt.ensemble.registry import choose_champions, deployed_run

    (choice,) = choose_champions(store, "foxhunt", "es", ["dqn"], "val/sharpe")
    assert choice.run_id == outcome.run_id and choice.considered == 1  # the folds do not compete
    weights = store.get(deployed_run(store, choice, "val/sharpe"))
    assert weights.tags[Tag.ROLE] == ROLE_FOLD and weights.tags[Tag.FOLD] == "1"
    assert weights.parent_id == outcome.run_id


def test_a_skipped_childs_scores_are_pooled_only_as_its_run_logged_them(cell):
    """A cell killed after its folds finished resumes by reading the folds' scores back from the
    store. An edited scores/val.npz entered the cell's pooled metrics (a forged val/sharpe, what
    registration selects by), a malformed one was a traceback (found by a helper probing stored
    files): each is checked against the SHA-256 its run recorded. Runs last: it edits the store."""
    from foxhunt.errors import UserError

    root, _, outcome, store, runs = cell
    kid = next(r for r in runs if r.tags.get(Tag.ROLE) == ROLE_FOLD and r.tags[Tag.FOLD] == "0")
    store.end(outcome.run_id, "KILLED")  # as a kill left it: every fold FINISHED, the cell not
    honest = run_cell(compose_train_config([*OVERRIDES, "resume=true"], root))  # the folds skipped, read back
    assert honest.status == "FINISHED" and honest.metrics["val/sharpe"] == pytest.approx(outcome.metrics["val/sharpe"])
    store.end(outcome.run_id, "KILLED")
    path = store.download(kid.run_id, f"{SCORES_DIR}/{scores_file('val')}", root / "peek")
    stored = next((root / "mlruns").rglob(f"{kid.run_id}/artifacts/{SCORES_DIR}/{scores_file('val')}"))
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["model.gross"] = np.abs(arrays["model.gross"]) * 1000 + 5  # a forged edge
    original = stored.read_bytes()
    try:
        np.savez_compressed(stored, **arrays)
        with pytest.raises(UserError, match=rf"run {kid.run_id}: scores/val.npz: it is not the file its run logged"):
            run_cell(compose_train_config([*OVERRIDES, "resume=true"], root))
    finally:
        stored.write_bytes(original)
        store.end(outcome.run_id, "FINISHED")
