"""Where the store is: ``$FOXHUNT_ROOT`` or the current folder, the project's store URI under
it, and the database file of a ``sqlite:///`` URI (none for a server)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.runs.environment import ROOT_ENV, root_dir, sqlite_path, store_uri

folder_names = st.text(st.sampled_from("aZ0 _-.é'%"), min_size=1, max_size=8).filter(lambda name: name not in (".", ".."))


def test_the_root_is_foxhunt_root_else_the_current_folder(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(ROOT_ENV, str(project / "sub" / ".."))
    assert root_dir() == project.resolve()
    monkeypatch.setenv(ROOT_ENV, "")  # set but empty: as if unset
    assert root_dir() == elsewhere.resolve()
    monkeypatch.delenv(ROOT_ENV)
    assert root_dir() == elsewhere.resolve()


@settings(max_examples=50)
@given(names=st.lists(folder_names, min_size=1, max_size=3))
def test_the_store_uri_names_the_database_file_under_the_root(names):
    root = Path("/tmp/foxhunt-env-test").joinpath(*names)
    uri = store_uri(root)
    assert uri.startswith("sqlite:///")
    assert sqlite_path(uri) == root.resolve() / "mlruns" / "mlflow.db"


def test_a_store_that_is_no_sqlite_file_has_no_database_path():
    for uri in ("http://127.0.0.1:5000", "databricks", "postgresql://u@h/db", "file:///tmp/mlruns", "sqlite://"):
        assert sqlite_path(uri) is None, uri
    assert sqlite_path("sqlite:///relative/mlflow.db") == Path("relative/mlflow.db")
