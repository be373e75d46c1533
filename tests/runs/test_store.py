"""The store interface beyond a training run: search, and the model registry API the ensemble
uses (register a version from a run's artifacts, aliases, FINISHED runs with their metrics)."""

from __future__ import annotations

import pytest

from foxhunt.runs.environment import store_uri
from foxhunt.runs.store import RunStore


@pytest.fixture
def store(tmp_path):
    runs = RunStore(store_uri(tmp_path))
    experiment = runs.ensure_experiment("unit", str(tmp_path / "mlruns" / "artifacts"))
    ids = {}
    for name, model, status, sharpe in (
        ("a", "dqn", "FINISHED", 1.5),
        ("b", "dqn", "FAILED", 9.0),
        ("c", "tft", "FINISHED", 0.5),
    ):
        ids[name] = runs.create(experiment, f"{model}-es-fp32", {"model": model, "quoted": "it's"})
        runs.log_params(ids[name], [("model.name", model)])
        runs.log_metrics(ids[name], {"val/sharpe": sharpe})
        checkpoint = tmp_path / f"{name}.ckpt"
        checkpoint.write_bytes(b"weights")
        runs.log_artifact(ids[name], checkpoint, "checkpoints")
        runs.end(ids[name], status)
    return runs, ids


def test_search_finished_runs_returns_their_metrics_params_and_tags_newest_first(store):
    runs, ids = store
    found = runs.search_finished_runs("unit")
    assert [r.run_id for r in found] == [ids["c"], ids["a"]]
    dqn = runs.search_finished_runs("unit", "tags.model = 'dqn'")
    assert [(r.run_id, r.metric("val/sharpe"), r.params["model.name"], r.tags["model"]) for r in dqn] == [
        (ids["a"], 1.5, "dqn", "dqn")
    ]
    assert runs.search_finished_runs("no such experiment") == []
    # a quote in a tag value cannot go into MLflow's filter: it is compared here
    assert {r.run_id for r in runs.search("unit", tags={"quoted": "it's", "model": "dqn"})} == {ids["a"], ids["b"]}


def test_model_versions_from_run_artifacts_with_aliases(store):
    runs, ids = store
    first = runs.register_model_version("dqn-es", ids["a"], "checkpoints", tags={"val_sharpe": 1.5}, alias="champion")
    assert (first.name, first.version, first.run_id, first.aliases) == ("dqn-es", "1", ids["a"], ("champion",))
    assert first.source == f"runs:/{ids['a']}/checkpoints" and first.tags == {"val_sharpe": "1.5"}
    second = runs.register_model_version("dqn-es", ids["c"], f"runs:/{ids['c']}/checkpoints")
    assert second.version == "2" and second.aliases == ()
    assert runs.get_version_by_alias("dqn-es", "champion").version == "1"
    runs.set_alias("dqn-es", "champion", second.version)
    assert runs.get_version_by_alias("dqn-es", "champion").run_id == ids["c"]
    assert runs.get_version_by_alias("dqn-es", "challenger") is None
    assert runs.get_version_by_alias("no-such-model", "champion") is None


def test_a_version_of_a_logged_model_is_linked_to_it_as_register_model_links_it(store, tmp_path):
    """The logged model's page lists its versions (MLflow's ``mlflow.modelVersions`` tag, which
    ``mlflow.register_model`` writes and raw ``create_model_version`` does not; seen failing
    before: the page said "Not registered")."""
    import json

    runs, ids = store
    model_id, _ = runs.create_logged_model(ids["a"], "dqn", "foxhunt-member", {"family": "dqn"})
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "MLmodel").write_text("artifact_path: model\n")
    runs.complete_logged_model(model_id, ids["a"], folder, ("val/",))
    first = runs.register_model_version("foxhunt-dqn-es", ids["a"], f"models:/{model_id}", model_id=model_id)
    second = runs.register_model_version("foxhunt-dqn-nq", ids["a"], f"models:/{model_id}", model_id=model_id)
    linked = json.loads(runs.logged_model_tags(model_id)["mlflow.modelVersions"])
    assert linked == [{"name": "foxhunt-dqn-es", "version": first.version}, {"name": "foxhunt-dqn-nq", "version": second.version}]
    assert runs.logged_model_tags(model_id)["family"] == "dqn"  # its own tags kept


def test_registered_run_ids_name_every_run_a_version_points_at(store, tmp_path):
    """What ``foxhunt runs prune`` never touches: a version's run, the cell and weights runs foxhunt
    tags a version with, and the source run of the logged model a version was made from."""
    runs, ids = store
    assert runs.registered_run_ids() == set()
    runs.register_model_version("dqn-es", ids["a"], "checkpoints", alias="champion")
    model_id, _ = runs.create_logged_model(ids["c"], "tft", "foxhunt-member", {})
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "MLmodel").write_text("artifact_path: model\n")
    runs.complete_logged_model(model_id, ids["c"], folder, ("val/",))
    runs.register_model_version("tft-es", ids["a"], f"models:/{model_id}", tags={"weights_run_id": ids["b"]}, model_id=model_id)
    assert runs.registered_run_ids() == {ids["a"], ids["b"], ids["c"]}


@pytest.mark.parametrize("planted", ["dangling-link", "folder"])
def test_the_stores_lock_is_never_opened_through_a_link_nor_a_folder(tmp_path, planted):
    """A dangling link at mlflow.db.registry.lock made the lock create the file it pointed to, and
    a folder there was an IsADirectoryError traceback (found by a helper probing the roll)."""
    from foxhunt.runs.store import RunStore, StoreError

    (tmp_path / "mlruns").mkdir()
    lock = tmp_path / "mlruns" / "mlflow.db.registry.lock"
    target = tmp_path / "made-by-the-lock"
    lock.symlink_to(target) if planted == "dangling-link" else lock.mkdir()
    store = RunStore(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    with pytest.raises(StoreError, match=r"the store's lock .*mlflow.db.registry.lock cannot be opened"):
        with store.exclusive("registry"):
            pass
    assert not target.exists()
