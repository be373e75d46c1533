"""Where the store is: the project folder, the store's URI, and the environment variables that
carry a job's and a sweep's identity into the processes they start. Defined here only.

- ``$FOXHUNT_ROOT`` (else the current folder): the folder holding ``mlruns/`` (the SQLite store
  ``mlruns/mlflow.db`` and its artifacts: MLflow 3.17 refuses the plain file store),
  ``outputs/`` and ``.cache/``; ``conf/paths/default.yaml`` resolves ``paths.root_dir`` the same way;
- ``$FOXHUNT_JOB_ID``: set by ``foxhunt train start`` for every process of a job (tag ``job_id``);
- ``$FOXHUNT_PARENT_RUN_ID``: set by the sweep callback before any job starts: the parent run
  every cell nests under (inherited by joblib's workers, submitit's processes, SLURM tasks);
- ``$FOXHUNT_SWEEP_PID``: set beside it: the sweep's process, whose death ends its workers
  (:mod:`foxhunt.sweeps.orphans`).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "FOXHUNT_ROOT"
JOB_ID_ENV = "FOXHUNT_JOB_ID"
PARENT_RUN_ENV = "FOXHUNT_PARENT_RUN_ID"
SWEEP_PID_ENV = "FOXHUNT_SWEEP_PID"
SQLITE_PREFIX = "sqlite:///"
STORE_FILE = Path("mlruns") / "mlflow.db"


def root_dir() -> Path:
    """The project folder: ``$FOXHUNT_ROOT``, else the current folder."""
    return Path(os.environ.get(ROOT_ENV) or Path.cwd()).resolve()


def store_uri(root: str | os.PathLike) -> str:
    """The project's store under ``root`` (as ``conf/logger/mlflow.yaml`` names it)."""
    return f"{SQLITE_PREFIX}{(Path(root) / STORE_FILE).resolve()}"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other store (a server)."""
    return Path(tracking_uri[len(SQLITE_PREFIX) :]) if tracking_uri.startswith(SQLITE_PREFIX) else None
