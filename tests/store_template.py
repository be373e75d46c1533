"""A fresh SQLite MLflow store made in the test's process from a copy of one migrated store.

MLflow makes a store's tables by running its alembic migrations, one Python file each: about a
second of CPU per new store in a warm process (more in a cold one), and most tests train into a
store of their own under ``tmp_path``. :func:`install` has MLflow's table initialisation, for an
empty SQLite database, replay the schema and rows (``alembic_version``) of one store the real
migrations made in this process: the same tables, indexes and schema revision, which MLflow still
verifies (``_verify_schema``) as it opens the store. Any other database, one that is not empty, or
a replay that fails (another process made the tables meanwhile) goes through MLflow's own path.
Processes a test starts (``foxhunt-train``, ``foxhunt``) are not touched: they make their stores as
a user's do.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import mlflow.store.db.utils as db_utils
import mlflow.store.model_registry.sqlalchemy_store as registry_store
import pytest
import sqlalchemy

Initializer = Callable[[sqlalchemy.engine.Engine], None]


def _schema_script(folder: Path, migrate: Initializer) -> str:
    """The SQL that rebuilds a store the real migrations made in ``folder``."""
    engine = sqlalchemy.create_engine(f"sqlite:///{folder / 'template.db'}")
    try:
        migrate(engine)
    finally:
        engine.dispose()
    with closing(sqlite3.connect(folder / "template.db")) as template:
        return "\n".join(template.iterdump())


def _replaying(migrate: Initializer, folder: Path) -> Initializer:
    script: list[str] = []  # filled by the first empty SQLite store

    def initialize(engine: sqlalchemy.engine.Engine) -> None:
        if engine.url.get_backend_name() != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return migrate(engine)
        if sqlalchemy.inspect(engine).get_table_names():  # not empty: MLflow's own path decides
            return migrate(engine)
        if not script:
            script.append(_schema_script(folder, migrate))
        try:
            with closing(sqlite3.connect(engine.url.database, timeout=30)) as db:
                db.executescript(script[0])  # one transaction: BEGIN ... COMMIT
        except sqlite3.Error:
            return migrate(engine)  # made meanwhile by another process: MLflow checks before it creates
        engine.dispose()  # pooled connections opened before the tables existed re-read the schema

    return initialize


def install(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """MLflow's table initialisation replays a template store for every empty SQLite store, in both
    of its callers (the tracking store reads it from ``mlflow.store.db.utils``, the registry store
    imported the name)."""
    initialize = _replaying(db_utils._initialize_tables, folder)
    monkeypatch.setattr(db_utils, "_initialize_tables", initialize)
    monkeypatch.setattr(registry_store, "_initialize_tables", initialize)
