"""The best run of each model family, registered in the MLflow Model Registry, and read back.

**Choosing.** For an asset, the FINISHED runs of the experiment (the config's ``task``) tagged
with that asset and a model family; per family the best by ``ensemble.metric``, a validation
metric (``val/...``; a ``test/`` metric is refused: the test split stays unseen until the final
report), in the metric's known direction (:data:`METRIC_DIRECTIONS`); a tie goes to the newest
run. Runs without the metric are counted, not considered.

**A registered version** (``<prefix>-<model>-<asset>``, e.g. ``foxhunt-tft-es``) is an MLflow
``pyfunc`` model (:class:`foxhunt.ensemble.pyfunc.FoxhuntMember`, with a signature: bars in,
positions and forecast signals out), logged into its training run's artifacts (``champion/``)
and registered from there, so the MLflow UI's Models page lists it and links its run. Its
artifacts hold everything needed to rebuild the model without the training folder:

- ``weights.pt``: the state dict of the run's best checkpoint (plain tensors; int8-trained
  weights as their int8 values and scales), loadable with ``torch.load(weights_only=True)``;
- ``config.yaml``: the run's resolved config (model, asset, data, precision, ...);
- ``dataset.json``: the feature settings and train normalization statistics
  (:meth:`foxhunt.data.dataset.MarketDataset.record`), and the asset spec;
- ``member.json``: the family, the asset, the training run's id and the metric it won on.

The version's tags name the run (``run_id``), the metric and its value; the alias
(``ensemble.alias``, default ``champion``) moves to the new version. When a family's best run
already is the aliased version, nothing new is registered. Every choice is prepared and checked
(checkpoint present and loadable, config valid) before anything is written to the registry.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Direction of each known metric name (the part after the split, ``val/<name>``).
METRIC_DIRECTIONS = {
    "sharpe": "max", "pnl": "max", "pnl_usd": "max", "mean_reward": "max", "hit_rate": "max",
    "direction_accuracy": "max", "loss": "min", "max_drawdown": "min",
}  # fmt: skip
SELECTION_PREFIXES = ("val/",)
MEMBER_FILE = "member.json"
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.yaml"
MODEL_ARTIFACT_PATH = "champion"
CHECKPOINTS = ("checkpoints/best.ckpt", "checkpoints/last.ckpt")


class RegistryError(ValueError):
    """A registry or store problem the user can act on (one line)."""


def metric_direction(metric: str) -> str:
    """``max`` or ``min`` for a selection metric; a test metric or an unknown one is refused."""
    if metric.startswith("test/"):
        raise RegistryError(f"ensemble.metric={metric}: a test metric cannot select members (the test split stays unseen); use val/...")
    if not metric.startswith(SELECTION_PREFIXES):
        raise RegistryError(f"ensemble.metric={metric}: must be a validation metric ({', '.join(SELECTION_PREFIXES)}...)")
    name = metric.rsplit("/", 1)[-1]
    if name not in METRIC_DIRECTIONS:
        raise RegistryError(f"ensemble.metric={metric}: unknown direction (known: {', '.join(sorted(METRIC_DIRECTIONS))})")
    return METRIC_DIRECTIONS[name]


def registered_name(prefix: str, model: str, asset: str) -> str:
    return f"{prefix}-{model}-{asset}"


@dataclass(frozen=True)
class Choice:
    """The best run of one family: its id, name, metric value and start time, how many runs
    of the family were considered and how many had no value of the metric."""

    family: str
    run_id: str | None
    run_name: str | None
    value: float | None
    considered: int
    without_metric: int
    start_ms: int | None = None


def choose_champions(client, experiment: str, asset: str, families: list[str], metric: str) -> list[Choice]:
    """The best FINISHED run per family of ``asset`` by ``metric`` (see the module doc)."""
    direction = metric_direction(metric)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise RegistryError(f"experiment {experiment!r} (task): not in the store; train first (foxhunt-train task={experiment})")
    choices = []
    for family in families:
        runs = _search(client, found.experiment_id, f"attributes.status = 'FINISHED' and tags.asset = '{asset}' and tags.model = '{family}'")
        scored = [r for r in runs if metric in r.data.metrics]
        best = None
        for run in scored:
            key = (run.data.metrics[metric] if direction == "max" else -run.data.metrics[metric], run.info.start_time)
            if best is None or key > best[0]:
                best = (key, run)
        run = best[1] if best else None
        choices.append(
            Choice(
                family=family, run_id=run.info.run_id if run else None, run_name=run.info.run_name if run else None,
                value=run.data.metrics[metric] if run else None, considered=len(scored),
                without_metric=len(runs) - len(scored), start_ms=run.info.start_time if run else None,
            )
        )  # fmt: skip
    return choices


def _search(client, experiment_id: str, filter_string: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


@dataclass
class Prepared:
    """A chosen run's version, built in a local folder before anything is registered."""

    choice: Choice
    name: str
    folder: Path
    tags: dict[str, str] = field(default_factory=dict)


def prepare(client, choice: Choice, name: str, metric: str, workdir: Path) -> Prepared:
    """Download the run's checkpoint, config and dataset record, check that the model rebuilds
    from them, and save the pyfunc model folder (nothing is written to the store)."""
    import torch
    from omegaconf import OmegaConf

    from foxhunt.ensemble.pyfunc import save_member_model

    run_id = choice.run_id
    downloads = workdir / f"{choice.family}-download"
    downloads.mkdir(parents=True)
    listed = {a.path for a in client.list_artifacts(run_id, "checkpoints")}
    checkpoint = next((c for c in CHECKPOINTS if c in listed), None)
    if checkpoint is None:
        raise RegistryError(f"run {run_id} ({choice.run_name}): no checkpoints/best.ckpt or last.ckpt artifact to register")
    ckpt_path = Path(client.download_artifacts(run_id, checkpoint, str(downloads)))
    config_path = Path(client.download_artifacts(run_id, CONFIG_FILE, str(downloads)))
    try:
        record_path = Path(client.download_artifacts(run_id, "dataset.json", str(downloads)))
        record = json.loads(record_path.read_text())
    except Exception:  # a run trained before dataset.json was logged: rebuild the statistics
        record = _rebuild_record(OmegaConf.load(config_path))
    try:
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    except Exception as exc:
        raise RegistryError(f"run {run_id}: {checkpoint}: not a loadable foxhunt checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    cfg = OmegaConf.load(config_path)
    from foxhunt.ensemble.fleet import rebuild_model

    rebuild_model(cfg, state, origin=f"run {run_id} ({checkpoint})")  # raises a one-line error
    weights = workdir / f"{choice.family}-weights" / WEIGHTS_FILE  # the pyfunc folder keeps file names
    weights.parent.mkdir()
    torch.save(state, weights)
    member = {
        "family": choice.family, "asset": str(cfg.asset.key), "run_id": run_id, "run_name": choice.run_name,
        "metric": metric, "value": choice.value, "checkpoint": checkpoint, "precision": str(cfg.precision.name),
    }  # fmt: skip
    folder = workdir / f"{choice.family}-model"
    save_member_model(folder, weights=weights, config=config_path, record=record, member=member)
    tags = {"run_id": run_id, "metric": metric, "metric_value": f"{choice.value:.6g}", "family": choice.family,
            "asset": member["asset"], "precision": member["precision"], "checkpoint": checkpoint}  # fmt: skip
    return Prepared(choice=choice, name=name, folder=folder, tags=tags)


def _rebuild_record(cfg) -> dict[str, Any]:
    from hydra.utils import instantiate

    from foxhunt.data.dataset import load_market_dataset

    asset = instantiate(cfg.asset)
    dataset = load_market_dataset(instantiate(cfg.data.source), asset, cfg.data.features, cfg.data.split, cfg.data.cache_dir)
    return dataset.record()


@dataclass(frozen=True)
class Registered:
    name: str
    version: str | None
    run_id: str
    unchanged: bool


def current_version(client, name: str, alias: str):
    """The version ``alias`` points at, or ``None`` (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def register_prepared(client, prepared: Prepared, alias: str) -> Registered:
    """Log the model folder into the training run, register it as a new version, move ``alias``."""
    from mlflow.exceptions import MlflowException

    run_id = prepared.choice.run_id
    client.log_artifacts(run_id, str(prepared.folder), MODEL_ARTIFACT_PATH)
    try:
        client.get_registered_model(prepared.name)
    except MlflowException:
        client.create_registered_model(prepared.name, description=f"foxhunt {prepared.choice.family} champion, by run")
    version = client.create_model_version(
        prepared.name, source=f"runs:/{run_id}/{MODEL_ARTIFACT_PATH}", run_id=run_id, tags=prepared.tags,
    )  # fmt: skip
    client.set_registered_model_alias(prepared.name, alias, version.version)
    return Registered(prepared.name, str(version.version), run_id, unchanged=False)


def download_version(tracking_uri: str, name: str, alias: str | None, version: int | None, dst: Path) -> tuple[Path, Any]:
    """The local folder of a registered version (``models:/name@alias`` or ``models:/name/N``)
    and its ModelVersion; a missing model, alias or version is one line."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    uri = f"models:/{name}/{version}" if version is not None else f"models:/{name}@{alias}"
    try:
        found = client.get_model_version(name, str(version)) if version is not None else client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        raise RegistryError(f"{uri}: not in the registry of {tracking_uri} ({_mlflow_reason(exc)}); run foxhunt ensemble register first") from None
    dst.mkdir(parents=True, exist_ok=True)
    local = Path(client.download_artifacts(found.run_id, MODEL_ARTIFACT_PATH, str(dst))) if found.run_id else None
    if local is None or not (local / "MLmodel").is_file():
        local = _download_source(found.source, dst, tracking_uri)
    return local, found


def _download_source(source: str, dst: Path, tracking_uri: str) -> Path:
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=tracking_uri))


def _mlflow_reason(exc: BaseException) -> str:
    text = str(getattr(exc, "message", exc)).strip().splitlines()
    return text[0] if text else type(exc).__name__


def register_champions(tracking_uri: str, experiment: str, asset: str, families: list[str], metric: str,
                       prefix: str, alias: str, dry_run: bool) -> tuple[list[Choice], list[Registered]]:  # fmt: skip
    """Choose, prepare every version, then register them (see the module doc)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    choices = choose_champions(client, experiment, asset, families, metric)
    missing = [c.family for c in choices if c.run_id is None]
    if dry_run:
        return choices, []
    if missing:
        raise RegistryError(
            f"no FINISHED {asset} run with {metric} for {', '.join(missing)} in experiment {experiment!r}: "
            f"train them first, or narrow ensemble.models"
        )
    results, work = [], Path(tempfile.mkdtemp(prefix="foxhunt-register-"))
    try:
        todo = []
        for choice in choices:
            name = registered_name(prefix, choice.family, asset)
            current = current_version(client, name, alias)
            if current is not None and current.run_id == choice.run_id:
                results.append(Registered(name, str(current.version), choice.run_id, unchanged=True))
                continue
            todo.append(prepare(client, choice, name, metric, work))  # every check before any write
        results += [register_prepared(client, prepared, alias) for prepared in todo]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return choices, results
