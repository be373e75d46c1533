"""What a cell's run read and was: its folder with the resolved ``config.yaml`` and its MLflow run
(:func:`opened_run`, for a single run and for a cell of folds and seeds alike), ``dataset.json``
(the dataset's manifest: the normalization and feature settings a registered member reads bars
with), the roll schedule, the bars as MLflow dataset inputs, and what a reproduction compares:
the bars' content, the code, the installed packages and the device (``provenance/``;
:mod:`foxhunt.runs.provenance` owns every format).

When: ``code.json`` and ``environment.json`` as the run opens; ``data.json`` once the bars are
read (:func:`bars_datasets` writes it in the run's folder, the latest attempt's, and
:func:`log_dataset_manifest` logs it with the manifest: the two are called one after the other by
:func:`foxhunt.training.fit.fit_and_score`);
``device.json`` when the run's body ends, with the deterministic settings the Trainer set."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from foxhunt.config.schema import resolved_config
from foxhunt.data.bars import resolve_files
from foxhunt.data.dataset import DATASET_FILE
from foxhunt.data.errors import BarDataError
from foxhunt.data.roll import ROLL_SCHEDULE_FILE, write_schedule
from foxhunt.runs.provenance import (
    CODE_DIFF_FILE,
    CODE_FILE,
    DATA_FILE,
    DEVICE_FILE,
    DIGEST_LENGTH,
    ENVIRONMENT_FILE,
    PROVENANCE_FOLDER,
    PROVENANCE_VERSION,
    RESUMED_PREFIX,
    SPLIT_SHA256,
    DatasetProvenance,
    code_provenance,
    device_provenance,
    environment_provenance,
    file_sha256,
    json_sha256,
    provenance_tags,
    split_sha256,
    write_provenance,
)
from foxhunt.runs.tags import Tag
from foxhunt.runs.tracked_run import CONFIG_ARTIFACT, TrackedRun

SPLITS = ("train", "val", "test")


@contextlib.contextmanager
def opened_run(cfg: DictConfig, name: str, tags: Mapping[str, str], parent_run_id: str | None,
               resume_run_id: str | None, source: str, before_fit: Callable[[], None] | None) -> Iterator[tuple[Path, TrackedRun | None]]:  # fmt: skip
    """The run's folder (``paths.output_dir``, made, with the resolved ``config.yaml``) and its
    MLflow run (:class:`~foxhunt.runs.tracked_run.TrackedRun`; ``None`` with
    ``logger.enabled=false``), entered with the config logged, then ``before_fit`` run; an
    exception in the body ends the run as TrackedRun says (FAILED, KILLED)."""
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = resolved_config(cfg)
    (out_dir / CONFIG_ARTIFACT).write_text(OmegaConf.to_yaml(resolved))
    run = None
    if cfg.logger.enabled:
        run = TrackedRun(tracking_uri=cfg.logger.tracking_uri, experiment=cfg.logger.experiment,
                         artifact_location=cfg.logger.artifact_location, run_name=name, tags=dict(tags),
                         parent_run_id=parent_run_id, resume_run_id=resume_run_id, source=source)  # fmt: skip
    with run if run is not None else contextlib.nullcontext():
        if run is not None:
            run.log_config(resolved, OmegaConf.to_yaml(resolved))
            _log_code_and_environment(out_dir, run)
        if before_fit is not None:
            before_fit()
        yield out_dir, run
        if run is not None:
            trainer = cfg.get("trainer") or {}
            device = device_provenance(str(trainer.get("accelerator", "auto")), trainer.get("deterministic"))
            _log_provenance(out_dir, run, DEVICE_FILE, device)


def provenance_folder(out_dir: Path, run) -> tuple[Path, str]:
    """(the folder in the run's folder, the artifact folder) of this attempt's provenance files:
    ``provenance/``, or ``provenance/resumed-<N>/`` for a resumed attempt (``N``: the run's
    ``resume_count``, which reopening it counted up; a resumed run continues in its first folder)."""
    if run is None or not getattr(run, "resume_run_id", None):
        return out_dir / PROVENANCE_FOLDER, PROVENANCE_FOLDER
    attempt = f"{RESUMED_PREFIX}{run.store.get(run.run_id).tags.get(Tag.RESUME_COUNT) or 1}"
    return out_dir / PROVENANCE_FOLDER / attempt, f"{PROVENANCE_FOLDER}/{attempt}"


def _log_provenance(out_dir: Path, run, name: str, content: dict) -> None:
    """One provenance file written in the run's folder, logged, and its tags set."""
    folder, artifact = provenance_folder(out_dir, run)
    run.log_artifact(write_provenance(folder, name, content), artifact)
    run.set_tags(provenance_tags(name, content))


def _log_code_and_environment(out_dir: Path, run) -> None:
    code, diff = code_provenance()
    _log_provenance(out_dir, run, CODE_FILE, code)
    if diff:
        folder, artifact = provenance_folder(out_dir, run)
        (folder / CODE_DIFF_FILE).write_text(diff)
        run.log_artifact(folder / CODE_DIFF_FILE, artifact)
    _log_provenance(out_dir, run, ENVIRONMENT_FILE, environment_provenance())


def log_dataset_manifest(dataset, out_dir: Path, run) -> None:
    """``dataset.json`` (the dataset's manifest): the normalization statistics and feature
    settings the model reads bars with (what ``foxhunt ensemble register`` stores with the
    model), beside the run and in MLflow; for a source that rolls contracts,
    ``roll_schedule.csv`` (one row per roll, and why)."""
    path = out_dir / DATASET_FILE
    path.write_text(json.dumps(dataset.manifest(), indent=1))
    paths = [path]
    if any(arrays.roll_price is not None for arrays in dataset.splits.values()):  # a source that rolls
        paths.append(write_schedule(dataset.rolls, out_dir / ROLL_SCHEDULE_FILE))
    if run is not None:
        for saved in paths:
            run.log_artifact(saved)
        _log_data_provenance(out_dir, run)


def check_resumed_data(out_dir: Path, run) -> None:
    """A resumed attempt reads the bars the interrupted one read: the ``data.digest`` of the
    run (the first attempt's tag) and of ``data.json`` written now must agree, else one line
    (:class:`~foxhunt.data.errors.BarDataError`). A data file edited between a kill -9 and
    ``resume=true`` was trained on silently, the run then recording only the new file; one with
    other rows was a traceback from the environment's state (found by a helper probing resume)."""
    if run is None or not getattr(run, "resume_run_id", None):
        return
    path = out_dir / PROVENANCE_FOLDER / DATA_FILE
    before = run.store.get(run.run_id).tags.get(Tag.DATA_DIGEST)
    now = provenance_tags(DATA_FILE, json.loads(path.read_text())).get(Tag.DATA_DIGEST) if path.is_file() else None
    if before and now and before != now:
        raise BarDataError(f"resume of run {run.run_id}: its data changed since the interrupted attempt (data.digest "
                           f"{before[:12]} -> {now[:12]}): resume=true would go on training on other bars; restore the "
                           "data, or start a new run (resume=false)")  # fmt: skip


def _log_data_provenance(out_dir: Path, run) -> None:
    """``data.json``, as :func:`bars_datasets` wrote it in the run's folder moments ago, logged
    with its tag."""
    path = out_dir / PROVENANCE_FOLDER / DATA_FILE
    if path.is_file():
        _, artifact = provenance_folder(out_dir, run)
        run.log_artifact(path, artifact)
        run.set_tags(provenance_tags(DATA_FILE, json.loads(path.read_text())))


def bars_datasets(cfg: DictConfig, parts) -> list:
    """The run's bars as MLflow dataset inputs, one per split (:mod:`foxhunt.runs.provenance`):
    the source and its files, each split's extent and the SHA-256 of its bars (its first hex
    digits the digest); and ``provenance/data.json`` in the run's folder (:func:`data_provenance`),
    which :func:`log_dataset_manifest` logs."""
    source_cfg = OmegaConf.to_container(cfg.data.source, resolve=True)
    assert isinstance(source_cfg, dict)  # data.source is a mapping
    target = str(source_cfg.pop("_target_"))
    kind = target.rsplit(".", 1)[-1]
    path = source_cfg.get("path")
    source = {"class": target, "asset": parts.asset.key}
    if path:  # uri: what MLflow's LocalArtifactDatasetSource reads (mlflow.data.get_source failed without it)
        source.update(uri=Path(str(path)).resolve().as_uri(), path=str(path),
                      files=[str(p) for p in _source_files(parts.source, path)])  # fmt: skip
    else:  # generated: its settings are the data
        source["settings"] = source_cfg
    dataset = parts.dataset
    content = data_provenance(cfg, parts)
    write_provenance(Path(cfg.paths.output_dir) / PROVENANCE_FOLDER, DATA_FILE, content)
    inputs = []
    for split in SPLITS:
        arrays = dataset.splits.get(split)
        if arrays is None:
            continue
        profile = {"rows": len(arrays), "features": int(arrays.features.shape[1]) if len(arrays) else 0,
                   SPLIT_SHA256: content["splits"][split]}  # fmt: skip
        if len(arrays):
            first, last = np.datetime_as_string(arrays.timestamps[[0, -1]], unit="s")
            profile.update(first_bar=f"{first}Z", last_bar=f"{last}Z")
        digest = content["splits"][split][:DIGEST_LENGTH]  # the split's bars: each split its own (all three had one)
        inputs.append(
            DatasetProvenance(f"{parts.asset.key}-{kind}-{split}", digest, "local" if path else "code", source, split, profile)
        )
    return inputs


def data_provenance(cfg: DictConfig, parts) -> dict:
    """``data.json`` (:mod:`foxhunt.runs.provenance`): the source's class and settings, every
    file it read (``path``, and ``definitions`` for a source that has them) with its size and
    SHA-256, and the SHA-256 of each split's bars as the run read them."""
    settings = OmegaConf.to_container(cfg.data.source, resolve=True)
    assert isinstance(settings, dict)  # data.source is a mapping
    target = str(settings.pop("_target_"))
    files = []
    for key in ("path", "definitions"):
        if settings.get(key):
            listed = _source_files(parts.source, settings[key]) if key == "path" else _listed(settings[key])
            files += [{"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in listed]
    splits = {}
    for name, arrays in parts.dataset.splits.items():
        splits[name] = split_sha256({"timestamps": arrays.timestamps.view("int64"), "features": arrays.features,
                                     "close": arrays.close, "roll_price": arrays.roll_price})  # fmt: skip
    digest = json_sha256({"files": [(f["path"], f["sha256"]) for f in files], "splits": splits})
    return {"version": PROVENANCE_VERSION, "source": target, "asset": parts.asset.key, "settings": settings,
            "files": files, "splits": splits, "digest": digest}  # fmt: skip


def _listed(path) -> list[Path]:
    try:
        return resolve_files(path, ("",), "files")
    except (BarDataError, OSError):
        return []


def _source_files(source, path) -> list[Path]:
    """The files a file source reads (its own listing when it has one)."""
    try:
        listing = getattr(source, "files", None)
        return list(listing()) if callable(listing) else resolve_files(path, ("",), "bar files")
    except (BarDataError, OSError):
        return []
