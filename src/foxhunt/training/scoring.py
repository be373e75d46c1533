"""The shared backtest of a trained cell: each scored split's positions through
:mod:`foxhunt.evaluation.scoring` (the same metrics for every model family), its scores saved
as artifacts (``scores/<split>.npz``), the TFT's interpretability on the test split, and the
console summary."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig

from foxhunt.evaluation.backtest import evaluation_annualization
from foxhunt.evaluation.interpret import INTERPRET_DIR, write_interpretation
from foxhunt.evaluation.plots import plot_equity
from foxhunt.evaluation.scoring import ScoringSettings, score_positions, summary_lines
from foxhunt.runs.cell import CellKey
from foxhunt.runs.provenance import file_sha256
from foxhunt.runs.tags import Tag
from foxhunt.training.parts import build_datamodule

SCORED = ("val", "test")  # the splits the shared backtest scores


SCORES_DIR = "scores"  # artifacts: each scored split's backtests (foxhunt.evaluation.scoring.SplitScore)


def scores_file(split: str) -> str:
    return f"{split}.npz"


def scores_digest_tag(split: str) -> str:
    """The run's tag holding the SHA-256 of its ``scores/<split>.npz`` (the tracking store's record
    of the artifact: a cell of folds reads a skipped child's scores back only if they match)."""
    return f"{Tag.SCORES_DIGEST}.{split}"


def scoring_datamodule(cfg: DictConfig, datamodule):
    """The datamodule the shared backtest scores: ``datamodule`` itself, or with
    ``evaluation.max_bars`` set, one over the first ``max_bars`` bars of the val and test splits
    (same features, normalization and costs; the train split, which is not scored, whole, as the
    datamodule checks its episodes against it; a new datamodule, so training's is left as it was)."""
    max_bars = cfg.evaluation.get("max_bars")
    if max_bars is None:
        return datamodule

    dataset = datamodule.dataset
    splits = {name: arrays.head(max_bars) if name in SCORED else arrays for name, arrays in dataset.splits.items()}
    return build_datamodule(cfg, dataclasses.replace(dataset, splits=splits))


def score_split(model, datamodule, split: str, cfg: DictConfig, asset, out_dir: Path, run):
    """The shared backtest of one split, the model's and the baselines' (the same metrics for
    every model family, :mod:`foxhunt.evaluation.scoring`): returns the ``<split>/...``
    metrics and the :class:`~foxhunt.evaluation.scoring.SplitScore`, saved as an artifact."""
    arrays = datamodule.dataset.splits[split]
    settings = ScoringSettings.from_config(cfg, asset)
    score = score_positions(model.trading_positions(datamodule, split), arrays.close, arrays.timestamps, asset,
                            settings, roll_price=arrays.roll_price)  # fmt: skip
    metrics = {f"{split}/{name}": float(value) for name, value in score.metrics(settings).items()}
    folder = out_dir / SCORES_DIR
    folder.mkdir(exist_ok=True)
    saved = score.save(folder / scores_file(split))
    if run is not None:
        run.log_artifact(saved, SCORES_DIR)
        run.set_tags({scores_digest_tag(split): file_sha256(saved)})  # what a cell of folds checks it by (folds)
    if cfg.evaluation.plot_equity and split == "test":
        png = out_dir / f"equity_{split}.png"
        plot_equity(score.model, arrays.timestamps, png, title=f"{CellKey.from_config(cfg).name} {split} split")
        if run is not None:
            run.log_artifact(png)
    return metrics, score


def interpret_test_split(cfg: DictConfig, model, datamodule, out_dir: Path, run):
    """A TFT run's interpretability on the test split (:mod:`foxhunt.evaluation.interpret`):
    after the backtest, from the same windows (at most ``evaluation.interpret.max_windows``,
    spread over the split), without gradients; the table and PNGs under ``interpretability/``
    beside the run and in MLflow. Returns the result and its ``test/vsn_*``, ``test/attention/*``
    metrics; a model family that has nothing to say (``interpret_split`` absent or ``None``),
    or ``evaluation.interpret.enabled=false``: ``(None, {})``."""
    settings = cfg.evaluation.get("interpret")
    method = getattr(model, "interpret_split", None)
    if settings is None or not settings.enabled or method is None:
        return None, {}

    result = method(datamodule, "test", settings.max_windows)
    if result is None:
        return None, {}
    for path in write_interpretation(result, out_dir / INTERPRET_DIR, title=f"{CellKey.from_config(cfg).name} test split"):
        if run is not None:
            run.log_artifact(path, INTERPRET_DIR)
    return result, result.metrics("test/")


def print_summary(cfg: DictConfig, metrics: dict[str, float], asset) -> None:
    name = CellKey.from_config(cfg).name
    print("\n".join([f"{name}: test split, shared backtest (net of costs)", *summary_lines(metrics, "test/"),
                     f"  {evaluation_annualization(asset, cfg.evaluation).announced()}"]))  # fmt: skip
