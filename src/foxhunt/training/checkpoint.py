"""Checkpoints: written atomically with foxhunt's stamp, and checked before a run starts from one.

Writing. The ``checkpoint_stamp`` callback (``conf/callbacks/default.yaml``,
:class:`CheckpointStamp`) adds foxhunt's stamp to every checkpoint a run writes (best, last,
interrupted, a memory breach's): ``checkpoint["foxhunt"] = {"format", "model", "module",
"precision", "run_id", "saved_at_ms"}`` (``run_id``: the MLflow run the Trainer logs to, or
none without a logger), and makes the Trainer write each file atomically (:func:`atomic_save`: a
temporary file beside the target, flushed and fsynced, then renamed over it), so a ``kill -9``
during a write leaves the previous file whole.

Resuming into another folder. Lightning's ``ModelCheckpoint`` reloads its best score only when
the resumed Trainer writes to the folder the checkpoint was written in (elsewhere it warns and
the second half's first validation becomes "the best"). As a fit is restored, the stamp callback
carries the best files into the new folder (:func:`carry_best_checkpoints`: from the old folder,
or beside the checkpoint resumed from, where ``resume=true`` downloads a run's logged
``best.ckpt``), each copied atomically and only when its stamp names this run, and points the
callback's saved state at them: the best over both halves wins, and the copy is a checkpoint this
run wrote (logged with the others).

Checking. :func:`check_checkpoint` opens a checkpoint (``ckpt=`` or the one ``resume=true``
found) before the data is loaded or the model is built, and raises :class:`CheckpointError`
with one line that says which check failed:

1. the file exists and is a torch archive (``torch.save``'s zip; a CSV or a cut download is not);
2. it loads with ``torch.load(weights_only=True)``: tensors and plain values only (a pickle of
   arbitrary objects is refused, never loaded some other way);
3. foxhunt wrote it (a Lightning checkpoint with foxhunt's stamp);
4. the model family (``model=``) and the weights' precision (int8 weights only with
   ``precision=int8``; fp32 and bf16 share fp32 weights) are the config's;
5. every weight has the shape the config's model has (built on the meta device: no memory,
   no data), and the hyperparameters that differ are named;
6. given the run it must belong to (``run_id``: resume, registration), its stamp names that run:
   a checkpoint stamped for another run is refused, naming both (:func:`check_stamped_run`).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf

from foxhunt.errors import UserError, one_line
from foxhunt.runs.steps import checkpoint_logging_step
from foxhunt.training.parts import build_model

# Lazy imports: (c) models.quantiles (numba, about 0.35 s), when a checkpoint is checked: a bad config value fails without it

log = logging.getLogger(__name__)

STAMP_KEY = "foxhunt"
STAMP_FORMAT = 1
RUN_ID = "run_id"  # the stamp's key for the MLflow run a checkpoint belongs to
INT8 = "int8"
_SHOWN_DIFFERENCES = 3  # hyperparameters or weights named in a shape error
_TMP_SUFFIX = ".tmp"


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot start this run; the message names the file and the failed check."""

    kind = "checkpoint"


# ----------------------------------------------------------------------------- writing
def atomic_save(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """``torch.save(checkpoint)`` to ``path`` through a temporary file in the same folder that is
    fsynced and renamed over ``path``: ``path`` is always either the old file or the new one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}{_TMP_SUFFIX}")
    tmp.unlink(missing_ok=True)  # a file or a link left at this name: created afresh, never written through
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself reaches the disk with the folder's entry
        folder = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def _remove_stale_temporaries(target: Path) -> None:
    """The temporaries of ``target`` left by processes killed while writing it (``.<name>.<pid>.tmp``
    of a pid that no longer runs): each would stay in the run's folder for good."""
    prefix = f".{target.name}."
    for stale in target.parent.glob(f"{prefix}*{_TMP_SUFFIX}"):
        pid = stale.name[len(prefix) : -len(_TMP_SUFFIX)]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            stale.unlink(missing_ok=True)


def _atomic_checkpoint_io():
    class AtomicCheckpointIO(TorchCheckpointIO):
        """Lightning's torch checkpoint IO, each file written by :func:`atomic_save`; it keeps
        the files it wrote and has not removed since (:attr:`written`)."""

        def __init__(self) -> None:
            super().__init__()
            self.written: dict[Path, None] = {}  # in the order written

        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:  # noqa: D102
            if storage_options is not None:
                super().save_checkpoint(checkpoint, path, storage_options)
            else:
                atomic_save(checkpoint, path)
            self.written[Path(path).resolve()] = None

        def remove_checkpoint(self, path) -> None:  # noqa: D102
            super().remove_checkpoint(path)
            self.written.pop(Path(path).resolve(), None)

    return AtomicCheckpointIO()


def _checkpoint_stamp_class() -> type:
    class CheckpointStamp(pl.Callback):
        """Stamps every checkpoint of the run (model family, module, precision, run) and has the
        Trainer write each one atomically; :meth:`written` names the files this run wrote."""

        def __init__(self, model: str, module: str, precision: str) -> None:
            self.stamp = {"format": STAMP_FORMAT, "model": str(model), "module": str(module), "precision": str(precision)}
            self.io = None

        def written(self) -> list[Path] | None:
            """The checkpoint files the Trainer wrote through this callback's IO and did not
            remove since, that are still on disk (None: another checkpoint IO was in use)."""
            if self.io is None:
                return None
            return [path for path in self.io.written if path.is_file()]

        def setup(self, trainer, pl_module, stage: str) -> None:  # noqa: D102
            if self.io is None and type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # another IO is the user's choice
                self.io = _atomic_checkpoint_io()
            if self.io is not None:
                trainer.strategy.checkpoint_io = self.io
            # a run id is text: Lightning's DummyLogger (trainer.fast_dev_run) answers any attribute with a method,
            # which was stamped on the checkpoint and refused by every later ckpt= (found by a helper)
            run_id = next((logger.run_id for logger in trainer.loggers if isinstance(getattr(logger, "run_id", None), str)), None)
            if run_id:  # the MLflow run this Trainer logs to: its checkpoints are that run's
                self.stamp[RUN_ID] = str(run_id)

        def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:  # noqa: D102
            # Lightning calls every callback's on_load_checkpoint before any callback's load_state_dict
            run_id = self.stamp.get(RUN_ID)
            carried = carry_best_checkpoints(trainer, checkpoint, str(run_id) if run_id else None)
            if self.io is not None:
                self.io.written.update(dict.fromkeys(path.resolve() for path in carried))

        def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:  # noqa: D102

            # saved_at_ms: what the run logged after this moment is not in the checkpoint (resume.rewind_run)
            checkpoint[STAMP_KEY] = {**self.stamp, "saved_at_ms": int(time.time() * 1000)}

    CheckpointStamp.__module__, CheckpointStamp.__qualname__ = __name__, "CheckpointStamp"
    return CheckpointStamp


def carry_best_checkpoints(trainer, checkpoint: dict[str, Any], run_id: str | None) -> list[Path]:
    """A fit restored from ``checkpoint`` into another folder than the one it was written in (the
    module doc): each ``ModelCheckpoint``'s best files copied into its new folder and its saved
    state pointed at them, so that Lightning reloads the best score. A best file is looked for in
    its old folder, then beside the checkpoint resumed from (``trainer.ckpt_path``); it is carried
    only when its stamp names ``run_id`` (None: a run without a logger). When the best file is not
    found, or is not this run's, the state is left as Lightning handles it (the score starts
    anew, said in the log). Returns the files copied."""
    states = checkpoint.get("callbacks")
    resumed_from = Path(str(trainer.ckpt_path)) if trainer.ckpt_path else None
    carried: list[Path] = []
    for callback in trainer.checkpoint_callbacks:
        state = states.get(callback.state_key) if isinstance(states, dict) else None
        if not isinstance(callback, ModelCheckpoint) or callback.dirpath is None or not isinstance(state, dict):
            continue
        old_dir = state.get("dirpath")
        best = str(state.get("best_model_path") or "")
        if old_dir is None or _same_folder(old_dir, callback.dirpath) or not best:
            continue
        moved: dict[str, str] = {}
        for old in dict.fromkeys([best, *(state.get("best_k_models") or {})]):
            found = _this_runs_file(Path(old), resumed_from, run_id)
            if found is None:
                continue
            target = Path(callback.dirpath) / Path(old).name
            if found.resolve() != target.resolve():
                _atomic_copy(found, target)
                carried.append(target)
            moved[old] = str(target)
        if best not in moved:
            log.warning("resumed into %s: the best checkpoint %s (of %s) is not here or not this run's: the best "
                        "score starts anew", callback.dirpath, best, old_dir)  # fmt: skip
            continue
        state["best_k_models"] = {moved[p]: score for p, score in (state.get("best_k_models") or {}).items() if p in moved}
        state["best_model_path"] = moved[best]
        state["kth_best_model_path"] = moved.get(str(state.get("kth_best_model_path") or ""), moved[best])
        if state.get("last_model_path"):
            state["last_model_path"] = str(Path(callback.dirpath) / Path(str(state["last_model_path"])).name)
        state["dirpath"] = callback.dirpath
    return carried


def _same_folder(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _this_runs_file(path: Path, resumed_from: Path | None, run_id: str | None) -> Path | None:
    """``path``, else the file of its name beside ``resumed_from``, when it is a foxhunt
    checkpoint stamped for ``run_id``."""
    candidates = [path] + ([resumed_from.parent / path.name] if resumed_from is not None else [])
    for candidate in candidates:
        if candidate.is_file():
            stamp = read_stamp(candidate)
            if stamp is not None and (stamp.get(RUN_ID) or None) == run_id:
                return candidate
    return None


def _atomic_copy(source: Path, target: Path) -> None:
    """``source``'s bytes at ``target``, through a fsynced temporary file renamed over it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}{_TMP_SUFFIX}")
    try:
        with open(source, "rb") as reader, open(tmp, "wb") as writer:
            shutil.copyfileobj(reader, writer)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_LAZY: dict[str, type] = {}


def __getattr__(name: str):
    """``CheckpointStamp`` is made on first use: importing this module (``foxhunt-train`` does,
    to check a checkpoint) loads neither torch nor lightning."""
    if name == "CheckpointStamp":
        if name not in _LAZY:
            _LAZY[name] = _checkpoint_stamp_class()
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- checking
@dataclass(frozen=True)
class CheckedCheckpoint:
    stamp: dict[str, Any]
    logging_step: int  # the step the run's metrics were logged at when it was written (foxhunt.runs.steps)
    saved_at_ms: int  # when its state was taken (the stamp's time, else the file's)

    @property
    def run_id(self) -> str | None:
        """The MLflow run the checkpoint was written by (None: written without a logger)."""
        return self.stamp.get(RUN_ID) or None


def check_stamped_run(where: str, stamped: str | None, run_id: str) -> None:
    """Refuse a checkpoint stamped for a run other than ``run_id``, naming both runs."""
    if stamped and stamped != run_id:
        raise CheckpointError(f"{where}: stamped for run {stamped}, not for run {run_id} (a checkpoint "
                              f"belongs to the run that wrote it)")  # fmt: skip


def check_checkpoint(cfg, path: str | os.PathLike, key: str = "ckpt", run_id: str | None = None) -> CheckedCheckpoint:
    """Check the checkpoint at ``path`` against the composed config ``cfg`` (see the module doc);
    ``key`` names where the path came from in the error (``ckpt``, or the resumed run); with
    ``run_id``, a checkpoint stamped for another run is refused. Returns its stamp and step."""
    where = f"{key}={path}"
    file = Path(str(path)).expanduser()
    if not file.exists():
        raise CheckpointError(f"{where}: file not found (a .ckpt file written by foxhunt-train)")
    if not file.is_file():
        raise CheckpointError(f"{where}: not a file (a .ckpt file written by foxhunt-train)")
    if not zipfile.is_zipfile(file):
        raise CheckpointError(f"{where}: not a torch checkpoint archive ({_what_it_is(file)}; a .ckpt file is a torch.save zip)")
    state = load_weights_only(file, where)
    if not isinstance(state, dict) or "state_dict" not in state:
        found = ", ".join(sorted(map(str, state)))[:200] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{where}: not a Lightning checkpoint (no state_dict; found {found or 'nothing'})")
    stamp = state.get(STAMP_KEY)
    if not isinstance(stamp, dict) or "model" not in stamp:
        raise CheckpointError(
            f"{where}: not written by foxhunt (no '{STAMP_KEY}' stamp naming its model family and precision; "
            "start from a checkpoint of foxhunt-train)"
        )
    model, precision = str(cfg.model.name), str(cfg.precision.name)
    if stamp["model"] != model:
        raise CheckpointError(f"{where}: a {stamp['model']} checkpoint, but the config trains model={model}")
    if (stamp.get("precision") == INT8) != (precision == INT8):
        raise CheckpointError(
            f"{where}: weights of precision={stamp.get('precision')} do not load into precision={precision} "
            "(int8 weights need precision=int8; fp32 and bf16 runs share fp32 weights)"
        )
    if run_id is not None:
        check_stamped_run(where, stamp.get(RUN_ID), run_id)
    if precision != INT8:
        _check_shapes(cfg, state, where)

    saved_at_ms = int(stamp.get("saved_at_ms") or file.stat().st_mtime * 1000)
    step = checkpoint_logging_step(state)
    return CheckedCheckpoint(dict(stamp), int(state.get("global_step") or 0) if step is None else step, saved_at_ms)


def read_stamp(path: str | os.PathLike) -> dict[str, Any] | None:
    """foxhunt's stamp of the checkpoint at ``path`` (None: unreadable, or not stamped)."""
    try:
        state = load_weights_only(Path(path), str(path))
    except CheckpointError:
        return None
    stamp = state.get(STAMP_KEY) if isinstance(state, dict) else None
    return dict(stamp) if isinstance(stamp, dict) else None


def _what_it_is(file: Path) -> str:
    size = file.stat().st_size
    if size == 0:
        return "an empty file"
    with open(file, "rb") as handle:
        head = handle.read(64)
    if head.startswith(b"PK"):
        return f"a zip archive cut short or damaged ({size} bytes, no end of archive)"
    if head.startswith(b"\x1f\x8b"):
        return "gzip data"
    if head.startswith(b"\x80"):
        return "a pickle, not an archive"
    text = head.decode("utf-8", "replace").splitlines()[0] if head.strip() else ""
    if text and all(ch.isprintable() for ch in text):
        return f"text starting {text[:40]!r}"
    return f"{size} bytes of something else"


def load_weights_only(file: Path, where: str) -> Any:
    """``torch.load(weights_only=True)`` of a checkpoint file, its refusal or damage one line naming ``where``
    (:class:`CheckpointError`), without torch's advice to load it another way."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{where}: refused: it holds objects that torch.load(weights_only=True) does not load "
            f"({_unsafe_global(exc)}); foxhunt loads only checkpoints of tensors and plain values"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{where}: damaged torch archive ({_first_line(exc)})") from None


def _unsafe_global(exc: BaseException) -> str:
    match = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    if match:
        return f"unsupported global {match.group(1)}"
    match = re.search(r"WeightsUnpickler error: ([^\n]*)", str(exc))
    return match.group(1).strip()[:120] if match else "not tensors and plain values"


def _first_line(exc: BaseException) -> str:
    """The error's first line without torch's advice on loading the file another way."""
    text = one_line(str(exc).split("\n", 1)[0], 200) or type(exc).__name__
    return re.sub(r"\s*\(?[^.]*weights_only[^.]*\.?\)?", "", text) or type(exc).__name__


def _check_shapes(cfg, state: dict[str, Any], where: str) -> None:
    from foxhunt.models.quantiles import upgrade_state_dict

    with torch.device("meta"):
        model = build_model(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # a checkpoint written before the forecasters shared one quantile head names it as it was then
    found = {k: tuple(v.shape) for k, v in upgrade_state_dict(model, state["state_dict"]).items() if hasattr(v, "shape")}
    missing = sorted(expected.keys() - found.keys())
    extra = sorted(found.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    if not (missing or extra or wrong):
        return
    problems = [f"{k} is {list(found[k])} in the checkpoint, {list(expected[k])} for the config" for k in wrong]
    problems += [f"{k} missing from the checkpoint" for k in missing] + [f"{k} not in the config's model" for k in extra]
    shown = "; ".join(problems[:_SHOWN_DIFFERENCES]) + (
        f"; {len(problems) - _SHOWN_DIFFERENCES} more" if len(problems) > _SHOWN_DIFFERENCES else ""
    )
    differing = _differing_hyperparameters(cfg, state.get("hyper_parameters") or {})
    hint = f" (the checkpoint has {differing})" if differing else ""
    raise CheckpointError(f"{where}: weights do not fit the config's {cfg.model.name} model: {shown}{hint}")


def _differing_hyperparameters(cfg, saved: dict[str, Any]) -> str:
    module = OmegaConf.to_container(cfg.model.module, resolve=True)
    assert isinstance(module, dict)  # model.module is a mapping
    differ = [
        f"{name}={saved[name]!r}, the config model.module.{name}={value!r}"
        for name, value in module.items()
        if name != "_target_" and name in saved and saved[name] != value
    ]
    return "; ".join(differ[:_SHOWN_DIFFERENCES])
