"""The best run of each model family, registered in the MLflow Model Registry, and read back.

**Choosing.** For an asset, the FINISHED runs of the experiment (the config's ``task``) tagged
with that asset and a model family; per family the best by ``ensemble.metric``, a validation
metric (``val/...``; a ``test/`` metric is refused: the test split stays unseen until the final
report), in the metric's known direction (:data:`METRIC_DIRECTIONS`); a tie goes to the newest
run. Runs without the metric are counted, not considered. A cell evaluated by walk-forward or
over seeds (:mod:`foxhunt.training.folds`) competes with its aggregate (``val/sharpe``: the pooled
validation blocks, mean across seeds), never with its folds one by one; its weights are those
of its last fold (trained on the most recent bars), the seed best on the metric there.

**A registered version** (``<prefix>-<model>-<asset>``, e.g. ``foxhunt-tft-es``) is an MLflow 3
*logged model* of its training run (the runs table's Models column, the run's "Logged models",
the experiment's Models tab), linked to the run's ``val/`` and ``test/`` metrics, and registered
from it (``models:/<model_id>``). Its folder is a ``pyfunc`` model from code
(:mod:`foxhunt.ensemble.pyfunc`: no pickle; a signature, an input example of real bars, the
foxhunt wheel and pinned requirements, :mod:`foxhunt.ensemble.model_env`), whose ``artifacts/``
hold everything needed to rebuild the member without the training folder
(:mod:`foxhunt.ensemble.member_files`):

- ``weights.pt``: the state dict of the run's best checkpoint (plain tensors; int8-trained
  weights as their int8 values and scales), loadable with ``torch.load(weights_only=True)``;
- ``config.yaml``: the run's resolved config (model, asset, data, precision, ...);
- ``dataset.json``: the feature settings and train normalization statistics
  (:meth:`foxhunt.data.dataset.MarketDataset.manifest`), and the asset spec;
- ``member.json``: the family, the asset, the training run's id and the metric it won on.

The version's tags name the run (``run_id``), the metric and its value, and record the sha256
of every file of its folder (``foxhunt.files_sha256``; also a tag of its logged model), which
:func:`download_version` checks before any file of a version is read
(:mod:`foxhunt.ensemble.member_files`); the alias
(``ensemble.alias``, default ``champion``) moves to the new version, and the version it replaces
keeps the ``previous`` alias, both moves one committed record as a roll's promotion (below), so
a rollback after a register returns to the version it replaced. When a family's best run
already is the aliased version, nothing new is registered. Every choice is prepared and checked
(checkpoint present, loadable and stamped for the run that logged it, config valid, the saved
folder loaded by ``mlflow.pyfunc.load_model`` and answering its input example) before anything
is written to the store. The whole step holds the store's registry lock
(:meth:`foxhunt.runs.store.RunStore.exclusive`): a second ``register`` started meanwhile waits,
then finds the champions registered and registers nothing again. Versions registered before
logged models (``runs:/<run>/champion``) are still read.

**Promotion and rollback** (``foxhunt ensemble roll | rollback``, :mod:`foxhunt.roll`). A
promotion moves each promoted family's ``champion`` alias to its new version and leaves the
``previous`` alias (``roll.previous_alias``) on the version it replaced; a rollback moves
``champion`` back to ``previous`` and ``previous`` to the version it left (a second rollback
undoes the first). Every move of one promotion or rollback happens under the registry lock, and
all of them or none: MLflow moves one alias per call, so the moves are first written as one
record (:data:`PROMOTION_TAG` with :data:`PROMOTION_STATE_TAG` ``committed``, in one batch of
tags on the roll's or rollback's MLflow run: the commit point), then applied, then marked
``applied``. A process killed before the commit point leaves every alias as it was (a version
it registered has no alias: no ensemble loads it); killed after it, the record is the promotion:
:func:`resolved_version`, which every ensemble loads through, reads the committed record's moves
before the aliases, and the next ``roll``, ``rollback`` or ``register`` (under the lock)
applies them first (:func:`complete_pending`) and says so.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate

from foxhunt.config.stored import load_stored_config
from foxhunt.ensemble.member_files import (
    ARTIFACTS_DIR,
    CONFIG_FILE,
    DATASET_FILE,
    DIGESTS_TAG,
    WEIGHTS_FILE,
    RegistryError,
    check_code_file,
    check_digests,
    digests_tag,
)
from foxhunt.ensemble.model_env import model_environment
from foxhunt.ensemble.pyfunc import check_model_folder, save_member_model, stamp_logged_model
from foxhunt.ensemble.rebuild import rebuild_model
from foxhunt.errors import ConfigError, one_line_error
from foxhunt.files import read_regular_file
from foxhunt.runs.leaderboard import METRIC_DIRECTIONS, finite_metric  # the one table of directions, the one finite rule
from foxhunt.runs.status import Status
from foxhunt.runs.store import RunStore, is_version_number
from foxhunt.runs.tags import ROLE_CELL, ROLE_FOLD, Tag
from foxhunt.runs.tracked_run import TrackedRun
from foxhunt.training.checkpoint import RUN_ID, STAMP_KEY, CheckpointError, check_stamped_run, load_weights_only
from foxhunt.training.parts import build_dataset
from foxhunt.training.reproduce import check_stored_hash

SELECTION_PREFIXES = ("val/",)
VAL_SHARPE, VAL_BASELINE = "val/sharpe", "val/baseline/"
GATES = ("baseline", "interval", "none")
GATE_TAG, GATE_FORCED = "gate", "forced"  # version tag: the gate it passed, or forced
WEIGHTS_CHOICE, WEIGHTS_REASON = "weights_choice", "weights_reason"  # version tags: foxhunt ensemble footprint's verdict
MODEL_ARTIFACT_PATH = "champion"  # the run artifact folder of versions registered before logged models
LINKED_METRICS = ("val/", "test/")  # the run's metrics a version's logged model is linked to
MODEL_TYPE = "foxhunt-member"  # the logged models' model_type
CHECKPOINTS = ("checkpoints/best.ckpt", "checkpoints/last.ckpt")
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a run's dataset.json read back: a few KB written (rolls and split extents)
REGISTRY_LOCK = "registry"  # the store's lock held while champions are chosen and registered
PROMOTION_TAG = "foxhunt.promotion"  # run tag of a roll or rollback: its alias moves (JSON), the commit record
PROMOTION_STATE_TAG = "foxhunt.promotion.state"  # committed (written with the moves, in one batch) | applied
COMMITTED, APPLIED, ABANDONED = "committed", "applied", "abandoned"  # abandoned: it names a version deleted since
KILL_ENV = (
    "FOXHUNT_ROLL_KILL_AT"  # <point>: the process kills itself (SIGKILL) there (the crash tests: committed, moved-<k>, applied)
)


def metric_direction(metric: str) -> str:
    """``max`` or ``min`` for a selection metric; a test metric or an unknown one is refused."""
    if metric.startswith("test/"):
        raise RegistryError(
            f"ensemble.metric={metric}: a test metric cannot select members (the test split stays unseen); use val/..."
        )
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
    of the family were considered and how many had no value of the metric, and its ``val/``
    metrics (what the gate reads)."""

    family: str
    run_id: str | None
    run_name: str | None
    value: float | None
    considered: int
    without_metric: int
    start_ms: int | None = None
    selection: dict[str, float] = field(default_factory=dict)

    @property
    def found_run_id(self) -> str:
        """``run_id`` of a family with a run (the registration refuses families without one first)."""
        assert self.run_id is not None, f"{self.family}: no run chosen"
        return self.run_id


def choose_champions(store, experiment: str, asset: str, families: list[str], metric: str,
                     incumbents: dict[str, str] | None = None) -> list[Choice]:  # fmt: skip
    """The best FINISHED run per family of ``asset`` by ``metric`` (see the module doc), among runs
    with a finite value of it; on a tie the family's ``incumbents`` run (its champion now) stays,
    else the newest run wins."""
    direction = metric_direction(metric)
    if store.experiment_id(experiment) is None:
        raise RegistryError(f"experiment {experiment!r} (task): not in the store; train first (foxhunt-train task={experiment})")
    choices = []
    for family in families:
        runs = store.search_finished_runs(experiment, f"tags.asset = '{asset}' and tags.model = '{family}'")
        runs = [r for r in runs if r.tags.get(Tag.ROLE) != ROLE_FOLD]  # a fold or seed is part of its cell
        # a finite value only: an inf val/sharpe (a store edited, a degenerate run) was chosen, passed the gate and was
        # refused only at the model check, naming member.json; NaN broke the ordering (found by a helper)
        scored = [r for r in runs if finite_metric(r.metric(metric)) is not None]
        incumbent = (incumbents or {}).get(family)
        best = max(scored, key=lambda r: ((r.metric(metric) if direction == "max" else -r.metric(metric)),
                                          r.run_id == incumbent, r.start_ms), default=None)  # fmt: skip
        choices.append(
            Choice(
                family=family, run_id=best.run_id if best else None, run_name=best.name if best else None,
                value=best.metric(metric) if best else None, considered=len(scored),
                without_metric=len(runs) - len(scored), start_ms=best.start_ms if best else None,
                selection={k: v for k, v in best.metric_values().items() if k.startswith(SELECTION_PREFIXES)} if best else {},
            )
        )  # fmt: skip
    return choices


def gate_refusal(choice: Choice, gate: str) -> str | None:
    """Why ``choice`` may not be registered under ``ensemble.gate`` (None: it passes), judged on
    the bars it was selected on (the validation blocks): ``baseline``: its ``val/sharpe`` must
    beat the best baseline's on the same bars; ``interval``: the lower end of its ``val/sharpe``
    interval must be above 0; ``none``: every champion passes."""
    if gate == "none":
        return None
    sharpe = choice.selection.get(VAL_SHARPE)
    if sharpe is None:
        return f"no {VAL_SHARPE} to judge it by (ensemble.gate={gate})"
    if gate == "interval":
        low, high = choice.selection.get(f"{VAL_SHARPE}_ci_low"), choice.selection.get(f"{VAL_SHARPE}_ci_high")
        if low is None:
            return f"no interval of its {VAL_SHARPE} (ensemble.gate=interval)"
        if low <= 0:
            return f"the interval of its {VAL_SHARPE} {sharpe:.3g}, [{low:.3g}, {high:.3g}], contains 0 (ensemble.gate=interval)"
        return None
    baselines = {k.split("/")[-2]: v for k, v in choice.selection.items() if k.startswith(VAL_BASELINE) and k.endswith("/sharpe")}
    if not baselines:
        return f"no baseline scored on its validation bars (evaluation.baselines; ensemble.gate={gate})"
    name, best = max(baselines.items(), key=lambda item: item[1])
    if sharpe <= best:
        return (f"{VAL_SHARPE} {sharpe:.3g} does not beat the best baseline on its validation bars ({name} {best:.3g}; "
                f"ensemble.gate={gate})")  # fmt: skip
    return None


@dataclass
class Prepared:
    """A chosen run's version, built in a local folder before anything is registered."""

    choice: Choice
    name: str
    folder: Path
    tags: dict[str, str] = field(default_factory=dict)


def prepare(store, choice: Choice, name: str, metric: str, workdir: Path, environment, example_decided: int) -> Prepared:
    """Download the run's checkpoint, config and dataset manifest, check that the model rebuilds
    from them, save the pyfunc model folder and check that MLflow loads it and answers its
    input example (nothing is written to the store)."""
    run_id = deployed_run(store, choice, metric)
    downloads = workdir / f"{choice.family}-download"
    downloads.mkdir(parents=True)
    listed = {f"checkpoints/{name}" for name in store.logged_files(run_id, "checkpoints")}
    checkpoint = next((c for c in CHECKPOINTS if c in listed), None)
    if checkpoint is None:
        raise RegistryError(f"run {run_id} ({choice.run_name}): no checkpoints/best.ckpt or last.ckpt artifact to register")
    ckpt_path = store.download(run_id, checkpoint, downloads)
    config_path = store.download(run_id, CONFIG_FILE, downloads)
    origin = f"run {run_id} ({choice.run_name})"
    try:  # the run's artifact, read back from the store: it may name only foxhunt's own classes, and must be the file
        # its run logged (an edited one chose where a roll's challenger, trained from the version's copy, wrote)
        cfg = load_stored_config(config_path, f"{origin}: {CONFIG_FILE}")
        check_stored_hash(cfg, store.get(run_id).tags, origin, Path(config_path))
    except ConfigError as exc:
        raise RegistryError(str(exc)) from None
    bars, dataset = _read_dataset(cfg, origin)
    stored = None
    if DATASET_FILE in store.logged_files(run_id, ""):  # a run trained before dataset.json was logged has none
        stored = store.download(run_id, DATASET_FILE, downloads)
    manifest = checked_manifest(stored, dataset.manifest(), f"{origin}: {DATASET_FILE}")
    try:  # training's own loader: tensors and plain values only, its refusal one line
        loaded = load_weights_only(Path(ckpt_path), f"run {run_id}: {checkpoint}")
        state = loaded["state_dict"]
    except CheckpointError as exc:
        raise RegistryError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise RegistryError(
            f"run {run_id}: {checkpoint}: not a foxhunt checkpoint (no state_dict: {type(exc).__name__})"
        ) from None
    stamp = loaded.get(STAMP_KEY) if isinstance(loaded.get(STAMP_KEY), dict) else {}
    check_stamped_run(f"run {run_id} ({choice.run_name}): {checkpoint}", stamp.get(RUN_ID), run_id)

    rebuild_model(cfg, state, origin=f"run {run_id} ({checkpoint})")  # raises a one-line error
    weights = workdir / f"{choice.family}-weights" / WEIGHTS_FILE  # the pyfunc folder keeps file names
    weights.parent.mkdir()
    torch.save(state, weights)
    member: dict[str, Any] = {
        "family": choice.family, "asset": str(cfg.asset.key), "run_id": run_id, "run_name": choice.run_name,
        "metric": metric, "value": choice.value, "checkpoint": checkpoint, "precision": str(cfg.precision.name),
        "cell_run_id": choice.found_run_id,
    }  # fmt: skip
    folder = workdir / f"{choice.family}-model"
    example = input_example(cfg, bars, dataset, example_decided)
    save_member_model(folder, weights=weights, config=config_path, manifest=manifest, member=member,
                      environment=environment, input_example=example)  # fmt: skip
    try:
        check_model_folder(folder, example)
    except Exception as exc:  # noqa: BLE001 (whatever stops MLflow loading or answering: never registered)
        raise RegistryError(f"run {run_id} ({choice.run_name}): its saved MLflow model does not answer its input example "
                            f"({one_line_error(exc, first_line=True, limit=200)})") from None  # fmt: skip
    tags = {"run_id": choice.found_run_id, "weights_run_id": run_id, "metric": metric, "metric_value": f"{choice.value:.6g}", "family": choice.family,
            "asset": member["asset"], "precision": member["precision"], "checkpoint": checkpoint}  # fmt: skip
    return Prepared(choice=choice, name=name, folder=folder, tags=tags)


def deployed_run(store, choice: Choice, metric: str) -> str:
    """The run whose weights a choice registers: itself, or for a cell made of folds and seeds
    its last fold's child best on ``metric`` (module doc)."""
    run = store.get(choice.found_run_id)
    if run.tags.get(Tag.ROLE) != ROLE_CELL:
        return choice.found_run_id
    found = store.search(run.experiment, tags={Tag.PARENT: choice.found_run_id, Tag.ROLE: ROLE_FOLD}, status=Status.FINISHED)
    kids = list(found)
    if not kids:
        raise RegistryError(
            f"run {choice.found_run_id} ({choice.run_name}): a cell run without FINISHED folds to take weights from"
        )
    last = max(int(r.tags.get(Tag.FOLD) or 0) for r in kids)
    direction = metric_direction(metric)
    candidates = [r for r in kids if int(r.tags.get(Tag.FOLD) or 0) == last and r.metric(metric) is not None] or kids
    sign = 1.0 if direction == "max" else -1.0
    return max(candidates, key=lambda r: (sign * (r.metric(metric) or 0.0), r.start_ms)).run_id


def _read_dataset(cfg, origin: str):
    """(bars, dataset) of a run's config, read now from its data files."""
    try:
        asset, source = instantiate(cfg.asset), instantiate(cfg.data.source)
        return source.load(asset), build_dataset(cfg, asset, source)
    except Exception as exc:  # noqa: BLE001 (a data file moved or unreadable since training: one line)
        raise RegistryError(f"{origin}: cannot read its bars ({cfg.data.source._target_.rsplit('.', 1)[-1]}): "
                            f"{one_line_error(exc, first_line=True, limit=200)}") from None  # fmt: skip


def checked_manifest(stored: Path | None, rebuilt: dict[str, Any], origin: str) -> dict[str, Any]:
    """The manifest a version keeps: the one rebuilt now from the run's config and data, after
    the run's own ``dataset.json`` (an artifact of the store, trusted for nothing) is found to say
    the same, field by field (floats to 1e-9 relative: another machine's summation order). An
    edited statistic would otherwise be registered as the member's, and a data file changed
    since training would pair the weights with statistics they were never trained on."""
    if stored is None:
        return rebuilt
    text = read_regular_file(stored, MAX_MANIFEST_BYTES)
    try:
        found = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        raise RegistryError(f"{origin}: not a dataset manifest (a JSON object of at most {MAX_MANIFEST_BYTES} bytes)")
    expected = json.loads(json.dumps(rebuilt))
    for key in sorted(set(found) & set(expected) - {"version"}):
        if not _same(found[key], expected[key]):
            raise RegistryError(f"{origin}: {key} differs from the dataset its config yields now (an edited file, or "
                                "data changed since training: retrain on this data)")  # fmt: skip
    return rebuilt


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def input_example(cfg, bars, dataset, decided: int):
    """The bars ending the run's validation split, as the pyfunc takes them (``ts`` in UTC ns):
    enough to warm the features (``warmup_bars``) and fill a forecaster's window (``seq_len``),
    then ``decided`` bars it decides on. Never test or lockbox bars."""
    window = cfg.model.get("window") or {}
    need = dataset.feature_config.warmup_bars + int(window.get("seq_len") or 0) + decided
    last = int(dataset.splits["val"].timestamps[-1].astype("datetime64[ns]").astype(np.int64))
    stamps = bars.index.as_unit("ns").asi8
    stop = int(np.searchsorted(stamps, last, side="right"))
    chosen = bars.iloc[max(0, stop - need) : stop]
    frame = pd.DataFrame({"ts": chosen.index.as_unit("ns").asi8.astype(np.int64)})
    for column in ("open", "high", "low", "close", "volume"):
        frame[column] = chosen[column].to_numpy(dtype=np.float64)
    return frame


def record_weights_choice(tracking_uri: str, versions: dict, choices: dict[str, tuple[str, str]]) -> None:
    """Tag each measured version with the weights that pay for it and why (``ensemble.weights=auto``
    loads them)."""
    store = RunStore(tracking_uri)
    for name, (choice, reason) in choices.items():
        store.set_version_tags(name, versions[name].version, {WEIGHTS_CHOICE: choice, WEIGHTS_REASON: reason})


def weights_to_load(configured: str, version) -> tuple[str, str]:
    """(weights, why) of a member: the configured ``fp32``/``int8``, or with ``auto`` the version's
    recorded verdict (fp32 when none was measured)."""
    if configured != "auto":
        return configured, f"ensemble.weights={configured}"
    choice = version.tags.get(WEIGHTS_CHOICE)
    if choice in ("fp32", "int8"):
        return choice, f"measured by foxhunt ensemble footprint: {version.tags.get(WEIGHTS_REASON, '')}"
    return "fp32", "no int8 verdict recorded for this version (foxhunt ensemble footprint measures one)"


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    run_id: str
    unchanged: bool
    gate: str = ""  # the gate it passed, or "forced"


def register_prepared(store, prepared: Prepared, alias: str | None, gate: str) -> Registered:
    """Log the model folder as a logged model of its training run, register it as a new version
    from there, move ``alias`` (module doc; None: no alias, as a roll registers a challenger
    before its promotion is committed)."""
    run_id = prepared.choice.found_run_id
    tags = {**prepared.tags, GATE_TAG: gate}
    model_id, location = store.create_logged_model(run_id, prepared.name, MODEL_TYPE, tags)
    try:
        stamp_logged_model(prepared.folder, model_id, run_id, location)
        digests = {DIGESTS_TAG: digests_tag(prepared.folder)}  # the folder as uploaded, MLmodel stamped
        store.set_logged_model_tags(model_id, digests)  # what foxhunt's pyfunc loader verifies against
        store.complete_logged_model(model_id, run_id, prepared.folder, LINKED_METRICS)
    except BaseException:
        store.fail_logged_model(model_id)
        raise
    version = store.register_model_version(prepared.name, run_id, f"models:/{model_id}", tags={**tags, **digests},
                                           alias=alias, model_id=model_id)  # fmt: skip
    return Registered(prepared.name, version.version, run_id, unchanged=False, gate=gate)


def download_version(tracking_uri: str, name: str, alias: str | None, version: int | None, dst: Path,
                     via_alias: bool = False) -> tuple[Path, Any]:  # fmt: skip
    """The local folder of a registered version (``models:/name@alias`` or ``models:/name/N``)
    and its ModelVersion; a missing model, alias or version is one line. ``via_alias``: the
    version is the one ``alias`` resolved to, and the errors name it as the user does,
    ``models:/name@alias``."""
    store = RunStore(tracking_uri)
    uri = f"models:/{name}/{version}" if version is not None and not via_alias else f"models:/{name}@{alias}"
    if version is not None:
        found = store.get_version(name, version)
    else:
        assert alias is not None, name  # a version or an alias names what to download
        found = store.get_version_by_alias(name, alias)
    if found is None:
        raise RegistryError(f"{uri}: not in the registry of {tracking_uri}; run foxhunt ensemble register first")
    dst.mkdir(parents=True, exist_ok=True)
    try:
        if found.source.startswith("models:/") or not found.run_id:
            local = store.download_uri(found.source, dst)
        else:  # registered before logged models: the run's champion/ folder
            local = store.download(found.run_id, MODEL_ARTIFACT_PATH, dst)
    except Exception as exc:  # MLflow's error for artifacts that are gone, an OSError for a folder that is not one
        if not (type(exc).__module__.startswith("mlflow") or isinstance(exc, OSError)):
            raise
        raise RegistryError(f"{uri}: its files ({found.source}) cannot be read from the artifact store "
                            f"({one_line_error(exc, with_type=False, first_line=True, limit=160)}); register it again "
                            "(foxhunt ensemble register)") from None  # fmt: skip
    check_digests(local, found.tags.get(DIGESTS_TAG), uri)  # before any of its files is read
    if not (local / "MLmodel").is_file() or not (local / ARTIFACTS_DIR).is_dir():
        raise RegistryError(
            f"{uri}: its files ({found.source}) hold no foxhunt MLflow model; register it again (foxhunt ensemble register)"
        )
    check_code_file(local, uri)
    return local, found


@dataclass
class Registration:
    """What ``register`` did: the choice per family, the versions registered (or kept), and the
    families the gate refused (family, why); with a refusal nothing is registered."""

    choices: list[Choice]
    registered: list[Registered] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)  # promotions interrupted after their commit, applied first


def register_champions(tracking_uri: str, experiment: str, asset: str, families: list[str], metric: str,
                       prefix: str, alias: str, dry_run: bool, gate: str = "baseline",
                       force: bool = False, *, example_decided: int, journal: str | None = None,
                       previous: str | None = None, artifact_location: str | None = None) -> Registration:  # fmt: skip
    """Choose, gate, prepare every version, then register them (see the module doc). ``journal``:
    the experiment of the promotion records (``roll.experiment``): one committed and not applied
    is applied first. With ``journal`` and ``previous`` (``roll.previous_alias``), a version that
    replaces a champion leaves ``previous`` on it, both moves committed as one record in a run
    ``register-<asset>`` of ``journal`` (artifacts at ``artifact_location``), as a roll's
    promotion does: ``rollback`` then goes back to the version a register replaced."""
    if gate not in GATES:
        raise RegistryError(f"ensemble.gate={gate!r}: must be one of {', '.join(GATES)}")
    store = RunStore(tracking_uri)
    if dry_run:
        return Registration(
            choose_champions(store, experiment, asset, families, metric, _incumbents(store, families, prefix, asset, alias))
        )
    with store.exclusive(REGISTRY_LOCK):  # a concurrent register waits, then finds the champions registered
        completed = complete_pending(store, journal) if journal else []
        registration = _register_locked(store, experiment, asset, families, metric, prefix, alias, gate, force, example_decided)
        _keep_previous(store, registration, asset, alias, journal, previous, artifact_location)
        registration.completed = completed
        return registration


def _incumbents(store, families: list[str], prefix: str, asset: str, alias: str) -> dict[str, str]:
    current = {family: store.get_version_by_alias(registered_name(prefix, family, asset), alias) for family in families}
    return {family: version.run_id for family, version in current.items() if version is not None and version.run_id}


def _replaces_promotion(store, choice: Choice, incumbents: dict[str, str], experiment: str, name: str,
                        alias: str) -> str | None:  # fmt: skip
    """Why ``choice`` may not take the alias from its family's champion: a champion a roll
    promoted (its run is not of the training ``experiment``, where ``register`` chooses) was
    trained on bars the training runs never saw, so their scores do not rank it, and replacing it
    would undo the promotion with no ``previous`` alias to roll back to (found probing a roll,
    then ``register``: the old model served again). None: nothing promoted stands in the way."""
    incumbent = incumbents.get(choice.family)
    if incumbent is None or incumbent == choice.run_id:
        return None
    try:
        found = store.get(incumbent)
    except Exception as exc:  # a champion whose run is gone from the store: register may replace it
        if not type(exc).__module__.startswith("mlflow"):
            raise
        return None
    if found.experiment == experiment:
        return None
    return (f"{name}@{alias} is run {incumbent} of experiment {found.experiment!r} (promoted by a roll), which the runs "
            f"of {experiment!r} do not rank: registering run {choice.run_id} would undo that promotion")  # fmt: skip


def _register_locked(store, experiment: str, asset: str, families: list[str], metric: str, prefix: str,
                     alias: str, gate: str, force: bool, example_decided: int) -> Registration:  # fmt: skip
    incumbents = _incumbents(store, families, prefix, asset, alias)
    choices = choose_champions(store, experiment, asset, families, metric, incumbents)
    missing = [c.family for c in choices if c.run_id is None]
    if missing:
        raise RegistryError(
            f"no FINISHED {asset} run with {metric} for {', '.join(missing)} in experiment {experiment!r}: "
            f"train them first, or narrow ensemble.models"
        )
    refused = [(c.family, why) for c in choices if (why := gate_refusal(c, gate) or _replaces_promotion(store, c, incumbents,
               experiment, registered_name(prefix, c.family, asset), alias)) is not None]  # fmt: skip
    if refused and not force:
        return Registration(choices, refused=refused)
    passed = {c.family: GATE_FORCED if any(f == c.family for f, _ in refused) else gate for c in choices}
    results, work = [], Path(tempfile.mkdtemp(prefix="foxhunt-register-"))
    try:
        todo, environment = [], None
        for choice in choices:
            name = registered_name(prefix, choice.family, asset)
            current = store.get_version_by_alias(name, alias) if incumbents.get(choice.family) == choice.run_id else None
            if current is not None and DIGESTS_TAG in current.tags:  # registered before digests: registered again
                results.append(
                    Registered(name, current.version, choice.found_run_id, unchanged=True, gate=current.tags.get(GATE_TAG, ""))
                )
                continue
            if environment is None:  # one wheel for every version of this register
                environment = model_environment(work, ARTIFACTS_DIR)
            todo.append(prepare(store, choice, name, metric, work, environment, example_decided))  # every check before any write
        # a version that replaces a champion is registered without the alias: its move, and previous's, are
        # committed together afterwards (_keep_previous); a family's first version takes the alias at once
        results += [register_prepared(store, prepared, None if store.get_version_by_alias(prepared.name, alias) else alias,
                                      passed[prepared.choice.family]) for prepared in todo]  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Registration(choices, results, refused)


def _keep_previous(store, registration: Registration, asset: str, alias: str, journal: str | None, previous: str | None,
                   artifact_location: str | None) -> None:  # fmt: skip
    """Move ``alias`` to each new version registered without it, keeping ``previous`` on the
    version it replaces, all moves committed as one record (:func:`commit_moves`; register_champions'
    doc). Without a journal the alias simply moves (nothing can keep ``previous`` atomically)."""
    fresh = [r for r in registration.registered if not r.unchanged and alias not in store.get_version(r.name, r.version).aliases]
    if not fresh:
        return
    if not journal or not previous:
        for r in fresh:
            store.set_alias(r.name, alias, r.version)
        return
    moves = [m for r in fresh for m in promotion_moves(store, r.name, alias, previous, r.version)]
    with TrackedRun(store.tracking_uri, journal, artifact_location, f"register-{asset}", {"asset": asset},
                    source="foxhunt ensemble register") as run:  # fmt: skip
        commit_moves(store, run.run_id, moves)


# -- promotion and rollback ------------------------------------------------------------------
@dataclass(frozen=True)
class AliasMove:
    """One alias of one registered model moved to ``version``; ``was``: the version it named
    before (None: it named none)."""

    name: str
    alias: str
    version: str
    was: str | None = None

    def line(self) -> str:
        return (
            f"{self.name}@{self.alias}: v{self.was} -> v{self.version}"
            if self.was
            else f"{self.name}@{self.alias}: v{self.version}"
        )


def promotion_moves(store, name: str, alias: str, previous: str, version: str) -> list[AliasMove]:
    """The moves that make ``version`` of ``name`` the ``alias`` (champion), the version it
    replaces kept as ``previous`` (none when the model had no champion)."""
    current = resolved_version(store, name, alias, None)
    moves = []
    if current is not None:
        kept = store.get_version_by_alias(name, previous)
        moves.append(AliasMove(name, previous, current.version, kept.version if kept else None))
    moves.append(AliasMove(name, alias, str(version), current.version if current else None))
    return moves


def rollback_moves(store, name: str, alias: str, previous: str, journal: str | None = None) -> list[AliasMove]:
    """``alias`` back to the ``previous`` version and ``previous`` to the version it left (a
    second rollback undoes the first), read as the aliases stand once every committed record of
    ``journal`` is applied (:func:`resolved_version`: a dry run applies none, and read the raw
    aliases, so it said "no previous version" of a promotion every ensemble already loaded;
    found by a helper probing the roll); a model without both aliases is a one-line
    :class:`RegistryError`."""
    current, before = resolved_version(store, name, alias, journal), resolved_version(store, name, previous, journal)
    if current is None:
        raise RegistryError(f"models:/{name}@{alias}: not in the registry; nothing to roll back")
    if before is None:
        raise RegistryError(f"models:/{name}@{previous}: no previous version to roll back to (a promotion by foxhunt ensemble "
                            f"roll leaves one); {name}@{alias} stays v{current.version}")  # fmt: skip
    return [AliasMove(name, alias, before.version, current.version), AliasMove(name, previous, current.version, before.version)]


def commit_moves(store, run_id: str, moves: list[AliasMove]) -> None:
    """Record ``moves`` on run ``run_id`` in one write (the commit point), apply them, mark them
    applied (module doc). Call under the registry lock."""
    record = json.dumps([{"name": m.name, "alias": m.alias, "version": m.version, "was": m.was} for m in moves])
    store.tag(run_id, {PROMOTION_TAG: record, PROMOTION_STATE_TAG: COMMITTED})  # one batch: one transaction
    kill_point("committed")
    apply_moves(store, run_id, moves)


def apply_moves(store, run_id: str, moves: list[AliasMove]) -> None:
    """Set each alias (again: applying twice is applying once), then mark the record applied."""
    for done, move in enumerate(moves, 1):
        store.set_alias(move.name, move.alias, move.version)
        kill_point(f"moved-{done}")
    store.tag(run_id, {PROMOTION_STATE_TAG: APPLIED})
    kill_point("applied")


def pending_moves(store, journal: str | None) -> list[tuple[str, list[AliasMove]]]:
    """The records of experiment ``journal`` committed and not applied (a process killed between
    its commit and its last alias move), oldest first, each (run id, moves)."""
    if not journal or store.experiment_id(journal) is None:
        return []
    found = store.search(journal, tags={PROMOTION_STATE_TAG: COMMITTED})
    pending = []
    for run in sorted(found, key=lambda r: r.start_ms):
        try:
            record = json.loads(run.tags.get(PROMOTION_TAG, ""))
            if not isinstance(record, list) or not record:  # {} was an empty list of moves, marked applied
                raise ValueError("not a non-empty list of moves")
            moves = [_recorded_move(m) for m in record]
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise RegistryError(f"run {run.run_id} of experiment {journal!r}: its tag {PROMOTION_TAG} is not a promotion record "
                                f"({type(exc).__name__}); the registry tags of that run were edited") from None  # fmt: skip
        pending.append((run.run_id, moves))
    return pending


def _recorded_move(item: Any) -> AliasMove:
    """One move of a promotion record, checked: names and aliases text, versions numbers that pass
    :func:`~foxhunt.runs.store.is_version_number` (a 23-digit version overflowed SQLite's integer in
    every command that read the record: a traceback, found by a helper probing the roll)."""
    name, alias, version, was = item["name"], item["alias"], item["version"], item.get("was")
    if not (
        isinstance(name, str)
        and isinstance(alias, str)
        and is_version_number(version)
        and (was is None or is_version_number(was))
    ):
        raise ValueError("a move names a model, an alias and versions (positive numbers)")
    return AliasMove(name, alias, str(version), None if was is None else str(was))


def complete_pending(store, journal: str | None, dry_run: bool = False) -> list[str]:
    """Apply every committed record not yet applied (under the registry lock); one line each.
    ``dry_run``: say what would be applied, and write nothing (a rollback's dry run applied them)."""
    lines = []
    for run_id, moves in pending_moves(store, journal):
        gone = next((m for m in moves if store.get_version(m.name, m.version) is None), None)
        if dry_run:
            lines.append(f"would {'abandon' if gone is not None else 'complete'} the promotion of run {run_id}, interrupted "
                         f"after its commit: {'; '.join(m.line() for m in moves)}")  # fmt: skip
            continue
        if gone is not None:  # none of it can be applied whole: abandoned, the aliases as they were (it was refused
            # for good before: every roll, rollback and register refused, while ensembles loaded the aliases)
            store.tag(run_id, {PROMOTION_STATE_TAG: ABANDONED})
            lines.append(f"abandoned the promotion of run {run_id}: it names {gone.name} v{gone.version}, which is not in the "
                         "registry (deleted since); nothing of it moved")  # fmt: skip
            continue
        apply_moves(store, run_id, moves)
        lines.append(
            f"completed the promotion of run {run_id}, interrupted after its commit: {'; '.join(m.line() for m in moves)}"
        )
    return lines


def resolved_version(store, name: str, alias: str, journal: str | None):
    """The version ``models:/name@alias`` names once every committed promotion is applied: a
    committed record's move of this alias, else the alias (None: none). What an ensemble loads."""
    for _, moves in reversed(pending_moves(store, journal)):
        for move in moves:
            if move.name == name and move.alias == alias:
                return store.get_version(name, move.version)
    return store.get_version_by_alias(name, alias)


def kill_point(point: str) -> None:
    """Kill this process (SIGKILL) at ``point`` when ``FOXHUNT_ROLL_KILL_AT`` names it (the crash tests)."""
    if os.environ.get(KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
