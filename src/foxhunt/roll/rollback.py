"""``foxhunt ensemble rollback``: each family's ``champion`` alias back to its ``previous``
version, and ``previous`` to the version it left (a second rollback undoes the first), all
families' moves committed as one record under the registry lock
(:func:`foxhunt.ensemble.registry.commit_moves`), with an MLflow run in ``roll.experiment``
(``rollback-<asset>``) holding the record. A family without a ``previous`` version is named and
left as it is; when no family has one, nothing moves (one line, exit 2). ``dry_run``: the moves,
nothing moved."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from foxhunt.ensemble.loading import registered_names
from foxhunt.ensemble.member_files import RegistryError
from foxhunt.ensemble.registry import REGISTRY_LOCK, commit_moves, complete_pending, download_version, rollback_moves
from foxhunt.roll.challenger import ROLE_TAG
from foxhunt.runs.store import RunStore
from foxhunt.runs.tracked_run import TrackedRun

SOURCE = "foxhunt ensemble rollback"


@dataclass
class Rollback:
    lines: list[str]
    run_id: str | None


def rollback_ensemble(cfg, dry_run: bool = False) -> Rollback:
    ens, roll = cfg.ensemble, cfg.roll
    store = RunStore(str(cfg.logger.tracking_uri))
    key = str(cfg.asset.key)
    with store.exclusive(REGISTRY_LOCK):
        lines = complete_pending(store, str(roll.experiment), dry_run=dry_run)
        moves, skipped = [], []
        for name in registered_names(cfg):
            try:
                moves += rollback_moves(store, name, str(ens.alias), str(roll.previous_alias), str(roll.experiment))
            except RegistryError as exc:
                skipped.append(str(exc))
        if not moves:
            raise RegistryError(f"nothing to roll back for {key}: " + "; ".join(skipped))
        _check_targets(str(cfg.logger.tracking_uri), [m for m in moves if m.alias == str(ens.alias)])
        lines += [f"{SOURCE}: {line}: left as it is" for line in skipped]
        if dry_run:
            return Rollback([*lines, *(f"would move {m.line()}" for m in moves), "dry run: nothing moved"], None)
        tags = {ROLE_TAG: "rollback", "asset": key}
        with TrackedRun(str(cfg.logger.tracking_uri), str(roll.experiment), cfg.logger.artifact_location, f"rollback-{key}", tags,
                        source=SOURCE) as run:  # fmt: skip
            commit_moves(store, run.run_id, moves)
    return Rollback([*lines, *(f"moved {m.line()}" for m in moves)], run.run_id)


def _check_targets(tracking_uri: str, moves: list) -> None:
    """Each version the champion alias moves back to passes the checks every ensemble loads it
    through (its files' digests, its model folder, its code file: :func:`download_version`),
    before anything moves: a version whose files were edited would otherwise become the
    champion, and every server and paper session would then refuse to start (found probing the
    rollback)."""
    with tempfile.TemporaryDirectory(prefix="foxhunt-rollback-") as folder:
        for move in moves:
            try:
                download_version(tracking_uri, move.name, None, int(move.version), Path(folder) / move.name)
            except RegistryError as exc:
                raise RegistryError(f"{move.name}@{move.alias} not moved back to v{move.version}: {exc}; nothing moved") from None
