"""What a cell's run read and was: its folder with the resolved ``config.yaml`` and its MLflow run
(:func:`opened_run`, for a single run and for a cell of folds and seeds alike), ``dataset.json``
(the dataset's manifest: the normalization and feature settings a registered member reads bars
with), the roll schedule, and the bars as MLflow dataset inputs
(:mod:`foxhunt.runs.provenance` owns their format)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

SPLITS = ("train", "val", "test")


@contextlib.contextmanager
def opened_run(cfg: DictConfig, name: str, tags: Mapping[str, str], parent_run_id: str | None,
               resume_run_id: str | None, source: str, before_fit: Callable[[], None] | None) -> Iterator[tuple[Path, object]]:  # fmt: skip
    """The run's folder (``paths.output_dir``, made, with the resolved ``config.yaml``) and its
    MLflow run (:class:`~foxhunt.runs.tracked_run.TrackedRun`; ``None`` with
    ``logger.enabled=false``), entered with the config logged, then ``before_fit`` run; an
    exception in the body ends the run as TrackedRun says (FAILED, KILLED)."""
    from foxhunt.config.schema import resolved_config
    from foxhunt.runs.tracked_run import TrackedRun

    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = resolved_config(cfg)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
    run = None
    if cfg.logger.enabled:
        run = TrackedRun(tracking_uri=cfg.logger.tracking_uri, experiment=cfg.logger.experiment,
                         artifact_location=cfg.logger.artifact_location, run_name=name, tags=dict(tags),
                         parent_run_id=parent_run_id, resume_run_id=resume_run_id, source=source)  # fmt: skip
    with run if run is not None else contextlib.nullcontext():
        if run is not None:
            run.log_config(resolved, OmegaConf.to_yaml(resolved))
        if before_fit is not None:
            before_fit()
        yield out_dir, run


def log_dataset_manifest(dataset, out_dir: Path, run) -> None:
    """``dataset.json`` (the dataset's manifest): the normalization statistics and feature
    settings the model reads bars with (what ``foxhunt ensemble register`` stores with the
    model), beside the run and in MLflow; for a source that rolls contracts,
    ``roll_schedule.csv`` (one row per roll, and why)."""
    import json

    from foxhunt.data.dataset import DATASET_FILE

    path = out_dir / DATASET_FILE
    path.write_text(json.dumps(dataset.manifest(), indent=1))
    paths = [path]
    if any(arrays.roll_price is not None for arrays in dataset.splits.values()):  # a source that rolls
        from foxhunt.data.roll import ROLL_SCHEDULE_FILE, write_schedule

        paths.append(write_schedule(dataset.rolls, out_dir / ROLL_SCHEDULE_FILE))
    if run is not None:
        for saved in paths:
            run.log_artifact(saved)


def bars_datasets(cfg: DictConfig, parts) -> list:
    """The run's bars as MLflow dataset inputs, one per split (:mod:`foxhunt.runs.provenance`):
    the source and its files, the feature cache key as the digest, each split's extent."""
    import hashlib

    import numpy as np

    from foxhunt.runs.provenance import DIGEST_LENGTH, DatasetProvenance

    source_cfg = OmegaConf.to_container(cfg.data.source, resolve=True)
    target = str(source_cfg.pop("_target_"))
    kind = target.rsplit(".", 1)[-1]
    path = source_cfg.get("path")
    source = {"class": target, "asset": parts.asset.key}
    if path:
        source.update(path=str(path), files=[str(p) for p in _source_files(parts.source, path)])
    else:  # generated: its settings are the data
        source["settings"] = source_cfg
    dataset = parts.dataset
    digest = (dataset.cache_key or hashlib.sha256(repr(sorted(source.items())).encode()).hexdigest())[:DIGEST_LENGTH]
    inputs = []
    for split in SPLITS:
        arrays = dataset.splits.get(split)
        if arrays is None:
            continue
        profile = {"rows": len(arrays), "features": int(arrays.features.shape[1]) if len(arrays) else 0}
        if len(arrays):
            first, last = np.datetime_as_string(arrays.timestamps[[0, -1]], unit="s")
            profile.update(first_bar=f"{first}Z", last_bar=f"{last}Z")
        inputs.append(
            DatasetProvenance(f"{parts.asset.key}-{kind}-{split}", digest, "local" if path else "code", source, split, profile)
        )
    return inputs


def _source_files(source, path) -> list[Path]:
    """The files a file source reads (its own listing when it has one)."""
    from foxhunt.data.bars import resolve_files
    from foxhunt.data.errors import BarDataError

    try:
        listing = getattr(source, "files", None)
        return list(listing()) if callable(listing) else resolve_files(path, ("",), "bar files")
    except (BarDataError, OSError):
        return []

