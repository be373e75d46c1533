"""``foxhunt-train``: the Hydra entry of one cell (:func:`foxhunt.training.cell.run_cell`).

``main`` turns an input error (a bad override, a config group option that does not exist, a bad
value, data file, checkpoint or store) into one line and exit status 2; in a sweep each Hydra
cell goes through :func:`foxhunt.sweeps.sweep_cell.run_sweep_cell`. What it returns to a sweeper is
:data:`foxhunt.training.cell.OBJECTIVE`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from foxhunt.errors import ConfigError, FolderError, debug_requested, is_user_error, reported, strip_debug_flag

if TYPE_CHECKING:
    from foxhunt.runs.cell import CellResult

# Lazy imports: (a) training, torch, Lightning once a job runs, sweeps in a -m job: --help and a bad override answer without them

PROG = "foxhunt-train"
MULTIRUN_FLAGS = ("-m", "--multirun")


_DEBUG = False  # --debug / FOXHUNT_DEBUG=1 / HYDRA_FULL_ERROR=1: input errors keep their traceback


_ENTERED = False  # the Hydra job started (its folder exists)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _hydra_entry(cfg: DictConfig) -> float | None:
    global _ENTERED
    _ENTERED = True  # from here on an OSError is this job's, not Hydra's making of its folder
    import lightning.pytorch  # noqa: F401  (imported now so that its handlers exist to remove)

    from foxhunt.training.cell import OBJECTIVE
    from foxhunt.training.graceful_stop import stop_exit_status

    # Lightning adds console handlers of its own (to `lightning` and `lightning.pytorch`); under
    # Hydra the root logger prints already, so each message would appear twice.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()

    if HydraConfig.get().mode == RunMode.MULTIRUN:  # a job of foxhunt-train -m: the sweep's cell
        from foxhunt.sweeps.sweep_cell import run_sweep_cell

        metrics = run_sweep_cell(cfg, run_cell)  # a failing cell returns None
        return None if metrics is None else metrics.get(OBJECTIVE)
    try:  # an input error: one line and exit 2 from here (Hydra would print its job line first)
        with reported(PROG, debug=_DEBUG):
            try:
                _refuse_a_sweep_without_multirun()
                outcome = run_cell(cfg, before_fit=lambda: _use_configured_threads(cfg))
            except Exception as exc:
                if is_user_error(exc) and getattr(exc, "kind", "config") != "data":  # refused before any run was made
                    _drop_unused_run_folder()
                raise
    except SystemExit as exc:
        if not exc.code:  # Lightning's SIGTERMException carries no code, which would exit 0
            raise SystemExit(stop_exit_status(exc)) from exc
        raise
    return outcome.metrics.get(OBJECTIVE)


def run_cell(cfg: DictConfig, **kwargs: Any) -> CellResult:
    """:func:`foxhunt.training.cell.run_cell`, imported when Hydra has composed the job (see the
    ``Lazy imports`` line above), not when ``foxhunt-train`` starts."""
    from foxhunt.training.cell import run_cell as run_training_cell

    return run_training_cell(cfg, **kwargs)


def _refuse_a_sweep_without_multirun() -> None:
    """A preset that sweeps (``preset=grid``, ``hparams_search=...``: it sets
    ``hydra.sweeper.params``) run without ``-m`` would silently train one default cell: one line."""
    hydra_cfg = HydraConfig.get()
    params = hydra_cfg.sweeper.get("params")
    if not params:
        return
    choices = hydra_cfg.runtime.choices
    preset = next((f"{group}={choices[group]}" for group in ("preset", "hparams_search") if choices.get(group)), "this config")
    swept = ", ".join(str(key) for key in params)
    raise ConfigError(f"{preset} sweeps {swept}: run it with -m (foxhunt-train -m {preset}); "
                      "without it one default cell would train")  # fmt: skip


def _drop_unused_run_folder() -> None:
    """An input error other than the data's stops a run before it writes anything: the folder
    Hydra made for it holds only ``.hydra/`` and its job log, and it was left behind (44 of them
    after a helper's probe of the CLI). It is removed when it is this process's own (its name
    ends with the process's token, :mod:`foxhunt.config.resolvers`) and holds nothing else."""

    from foxhunt.config.resolvers import run_suffix
    from foxhunt.runs.tracked_run import CONFIG_ARTIFACT

    hydra_cfg = HydraConfig.get()
    folder = Path(hydra_cfg.runtime.output_dir)
    if not folder.name.endswith(run_suffix()) or not folder.is_dir():
        return
    made = {folder / ".hydra" / name for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    made |= {folder / f"{hydra_cfg.job.name}.log", folder / CONFIG_ARTIFACT}  # the run's config, written before its store opened
    found = set(folder.rglob("*"))
    if not found <= made | {folder / ".hydra"}:
        return
    for path in found & made:
        path.unlink()
    for empty in (folder / ".hydra", folder):
        if empty.is_dir():
            empty.rmdir()


def _refuse_the_old_preset_group(argv: list[str]) -> None:
    """``experiment=grid`` (the presets' group before it was named ``preset``, issue 39) is one line
    that says so, not Hydra's advice to add ``+experiment=grid``, which the schema then refuses."""
    for arg in argv:
        name, _, value = arg.lstrip("+~").partition("=")
        if name == "experiment":
            raise ConfigError(f"{arg}: the presets are the preset group (preset={value or 'grid'}); "
                              "the MLflow experiment is named by task=<name>")  # fmt: skip


def _multirun_first(argv: list[str]) -> list[str]:
    """``-m`` (``--multirun``) anywhere among the overrides, as users write it: after an override
    argparse printed a 9-line usage block ("unrecognized arguments"; found by a helper probing the
    CLI). It takes no value, so it moves to the front, where Hydra reads it."""
    flags = [arg for arg in argv[1:] if arg in MULTIRUN_FLAGS]
    return [argv[0], *flags, *(arg for arg in argv[1:] if arg not in MULTIRUN_FLAGS)] if flags else argv


def _use_configured_threads(cfg: DictConfig) -> None:
    import torch

    from foxhunt.sweeps.resources import configured_threads

    torch.set_num_threads(configured_threads(cfg))


def main() -> None:
    """``foxhunt-train``: an error in the input (a bad override, a config group option that does not
    exist, a bad value, data file, checkpoint or store) is one line on stderr and exit status 2,
    without a traceback unless asked for (``--debug``, ``FOXHUNT_DEBUG=1`` or ``HYDRA_FULL_ERROR=1``:
    :mod:`foxhunt.errors`); a bug keeps its traceback."""
    global _DEBUG, _ENTERED
    _ENTERED = False
    sys.argv, flag = strip_debug_flag(sys.argv)
    sys.argv = _multirun_first(sys.argv)
    _DEBUG = flag or debug_requested()
    # Hydra prints its own report of an error raised while composing the config (and exits 1);
    # with HYDRA_FULL_ERROR set it raises instead, and the error reaches `reported` here.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its table-creation notes on stderr
    with reported(PROG, debug=_DEBUG):
        _refuse_the_old_preset_group(sys.argv[1:])
        try:
            _hydra_entry()
        except OSError as exc:  # raised before the job ran: Hydra could not make the run folder
            if _ENTERED or is_user_error(exc) or not exc.filename:  # (Hydra's missing-config error is an OSError too)
                raise
            raise FolderError.of(exc, "paths.root_dir or hydra.run.dir") from None


if __name__ == "__main__":
    main()
