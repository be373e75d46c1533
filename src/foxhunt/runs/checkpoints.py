"""Which checkpoint a stopped, failed or stale run continues from. One rule, for ``foxhunt
train status`` and ``resume=true`` alike.

A run can be continued from ``interrupted.ckpt`` (written by the graceful-stop callback on a
stop request) or ``last.ckpt`` (written at every epoch's end); ``best.ckpt`` and a memory
breach's checkpoint are not where training stopped. Looked up, in order:

1. the run's folders on this machine: its checkpoint folders as its config names them (params
   ``callbacks.graceful_stop.dirpath`` and ``callbacks.model_checkpoint.dirpath``) and
   ``<output_dir>/checkpoints`` (tag ``output_dir``, updated on every attempt). When both files
   are there the newer one wins (a run stopped, resumed, then killed keeps an older
   ``interrupted.ckpt`` beside a newer ``last.ckpt``);
2. the copies logged to the run (artifacts ``checkpoints/<name>``), ``interrupted.ckpt`` first:
   read on disk when the artifact store is a local folder, listed through the store otherwise.

A checkpoint belongs to the run that wrote it (its stamp names it: :mod:`foxhunt.training.checkpoint`);
:func:`check_folder_owner` refuses a checkpoint found in one run's folder but stamped for another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from foxhunt.runs.store import open_reader
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import Param, Tag

# Lazy imports: (c) training.checkpoint (it reads checkpoints with torch): train list/status import this module

CHECKPOINTS_FOLDER = "checkpoints"  # a run's checkpoints, in its output folder (conf/callbacks/default.yaml)

INTERRUPTED_CHECKPOINT = "interrupted.ckpt"
LAST_CHECKPOINT = "last.ckpt"
BEST_CHECKPOINT = "best.ckpt"  # conf/callbacks/default.yaml: model_checkpoint.filename
RESUMABLE_CHECKPOINTS = (INTERRUPTED_CHECKPOINT, LAST_CHECKPOINT)
CHECKPOINT_ARTIFACTS = "checkpoints"  # the artifact folder checkpoints are logged to
#: ``logger.log_checkpoints``: which of a run's checkpoint files go to the store.
RETENTIONS = ("best", "all", "none")


def stored_checkpoints(files: list[Path], retention: str | bool, finished: bool, best: Path | None = None) -> list[Path]:
    """Which of the checkpoint ``files`` a run wrote go to its store (``logger.log_checkpoints``):
    ``all`` every one; ``none`` none; ``best`` (the default) ``best.ckpt`` only once the run
    finished (its ``last.ckpt`` stays in its folder: a finished run is not resumed), and every
    file when it did not (an interrupted run resumes from its ``interrupted.ckpt`` or
    ``last.ckpt``, on this machine or another). ``best``: the file the run's best is in, when
    known (it is stored as ``best.ckpt``). ``true`` / ``false``, as configs stored before the
    setting say it, are ``all`` / ``none``."""
    kept = {True: "all", False: "none"}.get(retention, retention) if isinstance(retention, bool) else retention
    if kept == "none":
        return []
    if kept == "all" or not finished:
        return list(files)
    if best is not None and best in files:  # the monitoring callback's best, whatever Lightning named it
        return [best]
    return [path for path in files if path.name == BEST_CHECKPOINT]


@dataclass(frozen=True)
class Checkpoint:
    """A resumable checkpoint: a file on this machine (``path``), or a copy logged to the run
    (``artifact``, its path among the run's artifacts)."""

    name: str
    path: Path | None = None
    artifact: str | None = None

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else f"artifact {self.artifact}"


def local_folders(run: StoredRun) -> list[Path]:
    folders = {run.params.get(key) for key in Param.CHECKPOINT_DIRS}
    if run.tags.get(Tag.OUTPUT_DIR):  # a resumed run's folder may differ from its first params
        folders.add(str(Path(run.tags[Tag.OUTPUT_DIR]) / "checkpoints"))
    return sorted(Path(folder) for folder in folders if folder)


def artifact_folder(run: StoredRun) -> Path | None:
    """The run's artifact folder when the artifact store is on this machine, else None."""
    uri = run.artifact_uri
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


def checkpoint_folder(run: StoredRun, root: Path) -> tuple[Path | None, str | None]:
    """The run's stored ``checkpoints/`` folder, and None; or None and why it is not touched (its
    artifacts are not files here, not the run's own folder, or lie outside the store's folder
    ``root``, through ``..`` or a symbolic link)."""
    folder = artifact_folder(run)
    if folder is None:
        return None, f"its artifacts {run.artifact_uri or '(none)'} are not files of this machine"
    target = Path(os.path.normpath(folder / CHECKPOINT_ARTIFACTS))
    base = next((b for b in (Path(os.path.normpath(root)), root.resolve()) if target.is_relative_to(b) and target != b), None)
    if base is None:
        return None, f"its artifact folder {folder} lies outside the store's folder {root}"
    part = target
    while part != base:
        if part.is_symlink():
            return None, f"{part} is a symbolic link (it leads out of the store's folder {root})"
        part = part.parent
    if Path(os.path.normpath(folder)).parts[-2:] != (run.run_id, "artifacts"):
        # MLflow gives each run <experiment's location>/<run id>/artifacts: a record pointing elsewhere (another
        # run's folder: its checkpoints were removed with this run's) is not this run's to prune
        return None, f"its artifact folder {folder} is not its own (<experiment's location>/{run.run_id}/artifacts)"
    return target, None


def drop_superseded_checkpoints(run: StoredRun, root: Path, kept: Iterable[str]) -> list[str]:
    """Remove from a finished run's stored ``checkpoints/`` what an earlier attempt logged and
    this one did not (``kept``: the names it stored): a run stopped, resumed and finished kept the
    stopped attempt's ``last.ckpt`` and ``interrupted.ckpt``, which a never-stopped run does not
    store, and ``foxhunt runs reproduce`` compared that stale ``last.ckpt`` and said the
    training was not deterministic (found by a helper probing kill and resume). Only a folder of
    this machine that is the run's own (:func:`checkpoint_folder`); the names removed."""
    folder, problem = checkpoint_folder(run, root)
    if folder is None or problem is not None or not folder.is_dir():
        return []
    keep = set(kept)
    removed = []
    for path in sorted(folder.iterdir()):
        if path.name not in keep and path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path.name)
    return removed


def resumable_checkpoint(run: StoredRun, list_logged: Callable[[StoredRun], Iterable[str]] | None = None) -> Checkpoint | None:
    """The checkpoint ``run`` continues from (see the module doc), or None.

    ``list_logged`` names the run's logged checkpoints when its artifact store is not on this
    machine (the store's client); without it such copies are not looked for."""
    local = [folder / name for folder in local_folders(run) for name in RESUMABLE_CHECKPOINTS]
    local = [path for path in local if path.is_file()]
    if local:
        newest = max(local, key=lambda p: (p.stat().st_mtime, p.name == INTERRUPTED_CHECKPOINT))
        return Checkpoint(newest.name, path=newest)
    folder = artifact_folder(run)
    if folder is not None:
        logged = {p.name for p in (folder / CHECKPOINT_ARTIFACTS).glob("*.ckpt")}
    elif list_logged is not None:
        logged = set(list_logged(run))
    else:
        logged = set()
    for name in RESUMABLE_CHECKPOINTS:
        if name in logged:
            artifact = f"{CHECKPOINT_ARTIFACTS}/{name}"
            path = folder / artifact if folder is not None else None
            return Checkpoint(name, path=path, artifact=artifact)
    return None


def check_folder_owner(tracking_uri: str, path: str | Path, stamped_run: str | None) -> None:
    """Refuse (:class:`~foxhunt.training.checkpoint.CheckpointError`, naming both runs) a checkpoint that
    lies in a run's ``<output_dir>/checkpoints`` folder but is stamped for another run: it was
    copied there, or written by a run that shared the folder. A checkpoint outside any run's
    folder, or without a run in its stamp, is left to the other checks."""
    from foxhunt.training.checkpoint import check_stamped_run

    file = Path(str(path)).expanduser().resolve()
    if not stamped_run or file.parent.name != CHECKPOINTS_FOLDER:
        return
    owners = open_reader(tracking_uri).run_ids_with_tag(Tag.OUTPUT_DIR, str(file.parent.parent))
    if owners and stamped_run not in owners:
        check_stamped_run(f"ckpt={path} (in the folder of run {owners[0]})", stamped_run, owners[0])
