"""``foxhunt runs top``: the best FINISHED cell per group, on a small real MLflow store.

The store is made with ``MlflowClient`` as training makes it (tags model/asset/precision/seed,
``foxhunt.role`` cell and fold, a sweep's parent run, metrics with intervals, baselines and the
DSR inputs): best per group in the metric's direction, fold children and unfinished runs left
out, ties, JSON, filters, ``--by``, one-line errors, the SQLite reader against the client, and
no heavy import.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.runs import leaderboard as lb
from foxhunt.runs.environment import store_uri
from foxhunt.runs.sqlite_reader import SqliteReader
from foxhunt.runs.store import RunStore
from foxhunt.runs.stored import Metric, StoredRun

runner = CliRunner()
T0 = 1_760_000_000_000
MINUTE_MS = 60_000


@dataclass
class Store:
    root: Path
    uri: str
    ids: dict[str, str]


def dsr_inputs(sharpe: float, skew: float = 0.1, kurtosis: float = 3.5) -> dict[str, float]:
    return {"val/sharpe_per_step": sharpe / 100, "val/steps": 500.0, "val/pnl_skew": skew, "val/pnl_kurtosis": kurtosis}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("top_store")
    (root / "mlruns").mkdir()
    uri = store_uri(root)
    client = MlflowClient(uri)
    artifacts = (root / "mlruns" / "artifacts").as_uri()
    experiments = {name: client.create_experiment(name, artifact_location=artifacts) for name in ("foxhunt", "system")}
    ids: dict[str, str] = {}
    clock = [T0]

    def run(label, model, asset, metrics, status="FINISHED", precision="fp32", experiment="foxhunt", tags=None,
            start=None):  # fmt: skip
        clock[0] += MINUTE_MS
        start = clock[0] if start is None else start
        run_tags = {"model": model, "asset": asset, "precision": precision, "seed": "42", **(tags or {})}
        run_tags = {k: v for k, v in run_tags.items() if v is not None}
        created = client.create_run(experiments[experiment], run_name=label, tags=run_tags, start_time=start)
        run_id = created.info.run_id
        client.log_batch(run_id, metrics=[MlflowMetric(k, float(v), start, 0) for k, v in metrics.items()])
        if status != "RUNNING":
            client.set_terminated(run_id, status, end_time=start + MINUTE_MS)
        ids[label] = run_id
        return run_id

    # dqn/es: b wins; the failed, killed and running ones score higher but are not FINISHED.
    run("a", "dqn", "es", {"val/sharpe": 1.0, "val/loss": 0.5, **dsr_inputs(1.0)})
    run("b", "dqn", "es", {
        "val/sharpe": 2.0, "val/sharpe_ci_low": 0.5, "val/sharpe_ci_high": 3.5, "val/loss": 0.4,
        "val/baseline/flat/sharpe": 0.0, "val/baseline/momentum/sharpe": 0.7, "val/baseline/momentum/pnl": -5.0,
        "val/baseline/flat/pnl": 0.0, "test/baseline/random/sharpe": 9.0, "test/sharpe": 0.3, **dsr_inputs(2.0),
    })  # fmt: skip
    run("failed", "dqn", "es", {"val/sharpe": 9.0}, status="FAILED")
    run("killed", "dqn", "es", {"val/sharpe": 8.0}, status="KILLED")
    run("running", "dqn", "es", {"val/sharpe": 7.0}, status="RUNNING")
    # a walk-forward cell of dqn/es: its folds score highest one by one; the cell's aggregate does not win
    cell = run("cell", "dqn", "es", {"val/sharpe": 1.5, "test/sharpe": 4.0, **dsr_inputs(1.5)}, tags={"foxhunt.role": "cell"})
    for fold in range(2):
        run(f"fold{fold}", "dqn", "es", {"val/sharpe": 5.0 + fold, "test/sharpe": 6.0, "val/loss": 0.01},
            tags={"foxhunt.role": "fold", "fold": str(fold), "mlflow.parentRunId": cell})  # fmt: skip
    # dqn/nq: a tie on val/sharpe: the newer run wins; its interval's low end is NaN (JSON null)
    run("nq-old", "dqn", "nq", {"val/sharpe": 1.0, "test/sharpe": 2.0})
    run("nq-new", "dqn", "nq", {"val/sharpe": 1.0, "val/sharpe_ci_low": math.nan, "val/sharpe_ci_high": 2.0}, precision="int8")
    # tft/es: val/loss is lower-is-better; tft/es's best sharpe is another run
    run("tft-1", "tft", "es", {"val/loss": 0.3, "val/sharpe": 0.9}, precision="int8")
    run("tft-2", "tft", "es", {"val/loss": 0.1, "val/sharpe": 0.2})
    run("tft-3", "tft", "es", {"val/loss": 0.2, "val/sharpe": 0.5})
    # ppo/es: its only run has a NaN val/sharpe: counted, not ranked
    run("ppo-nan", "ppo", "es", {"val/sharpe": math.nan})
    # a sweep's parent run: no model/asset tags, not a cell
    run("sweep", None, None, {"val/sharpe": 50.0}, tags={"foxhunt.run_kind": "sweep", "precision": None, "seed": None})
    # another experiment (task=system)
    run("system-1", "dqn", "es", {"val/sharpe": 99.0}, experiment="system")
    return Store(root, uri, ids)


def top(store, *args):
    return runner.invoke(app, ["runs", "top", *args, "--root", str(store.root)])


def rows(store, *args):
    result = top(store, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # a note on a test metric goes to stderr


def winners(found) -> dict[tuple, str]:
    return {tuple(r["group"].values()): r["run_name"] for r in found}


def test_best_per_group_in_the_metric_direction(store):
    found = rows(store)
    assert [(tuple(r["group"].values()), r["run_name"], r["value"]) for r in found] == [
        (("dqn", "es"), "b", 2.0),
        (("dqn", "nq"), "nq-new", 1.0),
        (("tft", "es"), "tft-1", 0.9),
    ]  # best first; ppo/es (only NaN) and the sweep's parent run have no row
    by_loss = rows(store, "--metric", "val/loss")
    assert winners(by_loss) == {("dqn", "es"): "b", ("tft", "es"): "tft-2"}  # min; the folds' 0.01 does not count
    assert [r["value"] for r in by_loss] == [0.1, 0.4]  # lowest first
    assert rows(store, "--limit", "1")[0]["run_name"] == "b"


def test_fold_children_and_unfinished_runs_are_left_out(store):
    (dqn_es,) = [r for r in rows(store, "model=dqn", "asset=es")]
    assert (dqn_es["runs"], dqn_es["scored"], dqn_es["run_id"]) == (3, 3, store.ids["b"])  # a, b and the cell
    by_test = rows(store, "--metric", "test/sharpe", "model=dqn", "asset=es")
    assert by_test[0]["run_id"] == store.ids["cell"]  # the cell with its aggregate, never fold0/fold1's 6.0
    listed = {r["run_id"] for r in rows(store, "--by", "model")}
    assert not listed & {store.ids[k] for k in ("failed", "killed", "running", "fold0", "fold1", "sweep")}
    groups = {tuple(r["group"].values()): r for r in rows(store, "--by", "model")}
    assert groups[("dqn",)]["runs"] == 5  # a, b, cell, nq-old, nq-new


def test_ties_go_to_the_newest_run_then_the_smallest_run_id():
    def stored_run(run_id, start, value):
        return StoredRun(run_id=run_id, name=run_id, experiment="x", status="FINISHED", start_ms=start, end_ms=None,
                         tags={"model": "m", "asset": "a"}, metrics={"val/sharpe": Metric(value, 0, start)})  # fmt: skip

    class Fake:
        def __init__(self, runs):
            self.runs = runs

        def experiment_exists(self, name):
            return True

        def finished_runs(self, experiment, tag_keys, metric_keys):
            return self.runs

        def run_metrics(self, run_ids, keys, prefix):
            return {}

    same_time = [stored_run("c", T0, 1.0), stored_run("b", T0, 1.0), stored_run("d", T0 - 1, 1.0), stored_run("e", T0, 0.5)]
    for order in (same_time, same_time[::-1]):
        assert lb.top(Fake(order), lb.Query("x")).rows[0].run_id == "b"
    newer = [stored_run("a", T0, 1.0), stored_run("z", T0 + 1, 1.0)]
    assert lb.top(Fake(newer), lb.Query("x")).rows[0].run_id == "z"


def test_json_carries_interval_baseline_dsr_and_no_nan(store):
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio

    result = top(store, "--json")
    assert "NaN" not in result.output and "Infinity" not in result.output
    best, nq, tft = json.loads(result.stdout)
    assert (best["ci_low"], best["ci_high"]) == (0.5, 3.5)
    assert best["baseline"] == {"name": "momentum", "metric": "val/baseline/momentum/sharpe", "value": 0.7}
    trials = [0.01, 0.02, 0.015]  # a, b, cell: the group's runs with val/sharpe_per_step
    assert best["dsr_trials"] == 3
    assert best["dsr"] == pytest.approx(deflated_sharpe_ratio(0.02, trials, 500, 0.1, 3.5), rel=1e-9)
    assert (nq["ci_low"], nq["ci_high"], nq["baseline"], nq["dsr"]) == (None, 2.0, None, None)
    assert set(tft) == {"group", "data", "metric", "value", "ci_low", "ci_high", "baseline", "dsr", "dsr_trials", "runs",
                        "scored", "run_id", "run_name", "start_ms"}  # fmt: skip
    by_pnl = rows(store, "--metric", "val/pnl", "model=dqn", "asset=es")
    assert by_pnl == []  # no run logged val/pnl
    (by_loss,) = rows(store, "--metric", "val/loss", "model=dqn", "asset=es")
    assert by_loss["baseline"]["metric"] == "val/baseline/momentum/sharpe"  # baselines log no loss: their Sharpe


def test_the_stdlib_dsr_is_the_evaluation_one():
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio

    cases = [(0.05, [0.05], 1000, 0.0, 3.0), (0.05, [0.01, 0.05, -0.02, 0.03], 250, -0.3, 5.0),
             (0.1, [0.1] * 5, 100, 0.2, 2.0), (0.02, [0.0, 0.02, 0.01] * 30, 5000, 1.0, 9.0)]  # fmt: skip
    for case in cases:
        assert lb.deflated_sharpe(*case) == pytest.approx(deflated_sharpe_ratio(*case), rel=1e-9, abs=1e-12)
    for bad in [(0.05, [0.05], 1, 0.0, 3.0), (0.05, [0.05], 100, 0.0, 0.5), (2.0, [2.0], 100, 5.0, 1.0)]:
        with pytest.raises(ValueError):
            deflated_sharpe_ratio(*bad)
        assert lb.deflated_sharpe(*bad) is None


def test_filters_and_grouping(store):
    assert winners(rows(store, "model=dqn,tft", "asset=es")) == {("dqn", "es"): "b", ("tft", "es"): "tft-1"}
    assert winners(rows(store, "precision=int8")) == {("dqn", "nq"): "nq-new", ("tft", "es"): "tft-1"}
    assert winners(rows(store, "task=system")) == {("dqn", "es"): "system-1"}
    assert rows(store, "asset=zn") == []
    by = rows(store, "--by", "model,asset,precision")
    assert winners(by) == {("dqn", "es", "fp32"): "b", ("dqn", "nq", "int8"): "nq-new", ("dqn", "nq", "fp32"): "nq-old",
                           ("tft", "es", "int8"): "tft-1", ("tft", "es", "fp32"): "tft-3"}  # fmt: skip
    assert list(by[0]["group"]) == ["model", "asset", "precision"]
    assert winners(rows(store, "--by", "asset")) == {("es",): "b", ("nq",): "nq-new"}


def test_the_table_and_the_note_on_a_test_metric(store):
    result = runner.invoke(app, ["runs", "top", "--root", str(store.root)], env={"COLUMNS": "200"})  # one line a row
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if store.ids["b"] in line)
    assert "[0.5, 3.5]" in row and "momentum 0.7" in row and " b " in row
    assert "experiment foxhunt: 3 groups, 9 FINISHED cell runs" in result.output
    assert "1 group without val/sharpe" in result.output and "note:" not in result.stderr
    result = top(store, "--metric", "test/sharpe")
    assert result.exit_code == 0 and "selection (sweeps, searches, foxhunt ensemble register) uses val/" in result.stderr
    empty = top(store, "asset=zn")
    assert empty.exit_code == 0 and "no FINISHED run with val/sharpe" in empty.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--metric", "val/sortinoo"], "--metric val/sortinoo: unknown direction for 'sortinoo'"),
        (["--metric", "sharpe"], "--metric sharpe: expected <split>/<name>"),
        (["--metric", "train/loss"], "--metric train/loss: expected <split>/<name>"),
        (["colour=red"], "override 'colour=red': unknown key 'colour'"),
        (["asset"], "override 'asset': expected key=value"),
        (["asset="], "override 'asset=': expected key=value"),
        (["asset=es", "asset=nq"], "asset given twice"),
        (["task=a,b"], "task takes one experiment"),
        (["--by", "model,colour"], "--by colour: unknown tag"),
        (["task=nope"], "experiment 'nope' (task): not in the store (experiments: Default, foxhunt, system)"),
    ],
)
def test_user_errors_are_one_line_exit_2(store, args, message):
    result = top(store, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("foxhunt runs: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_no_store_and_a_file_that_is_no_store(tmp_path):
    result = subprocess.run([sys.executable, "-m", "foxhunt.cli", "runs", "top", "--root", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    database = tmp_path / "mlruns" / "mlflow.db"
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"foxhunt runs: no MLflow store at {database}: run foxhunt-train first (or pass --root)"
    database.parent.mkdir()
    database.write_text("not a database")
    result = runner.invoke(app, ["runs", "top", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "not an SQLite store with MLflow's tables" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@contextmanager
def locked(database: Path, release_after_s: float | None = None):
    """Another writer holding the store's SQLite file locked (BEGIN EXCLUSIVE): for the block,
    or for ``release_after_s`` seconds."""
    holder = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    timer = threading.Timer(release_after_s, holder.rollback) if release_after_s is not None else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.join()
        else:
            holder.rollback()
        holder.close()


def test_a_locked_store_is_waited_for_then_said_locked(store, monkeypatch):
    from foxhunt.runs import sqlite_reader

    database = store.root / "mlruns" / "mlflow.db"
    monkeypatch.setattr(sqlite_reader, "SQLITE_TIMEOUT_S", 0.3)
    with locked(database):
        result = top(store)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.strip() == (f"foxhunt runs: the MLflow store {database} is locked by another writer: "
                                     "waited 0.3 s; try again when it is done")  # fmt: skip
    monkeypatch.setattr(sqlite_reader, "SQLITE_TIMEOUT_S", 30)
    with locked(database, release_after_s=0.5):  # a writer that is done in time: waited for, answered
        assert top(store).exit_code == 0


def test_the_sqlite_reader_answers_as_the_client(store):
    from mlflow.tracking import MlflowClient

    sqlite = lb.SqliteSource(SqliteReader(store.root / "mlruns" / "mlflow.db"))
    client = lb.ClientSource(RunStore(store.uri))
    queries = [
        lb.Query("foxhunt"), lb.Query("foxhunt", metric="val/loss"), lb.Query("foxhunt", metric="test/sharpe"),
        lb.Query("foxhunt", by=("model", "asset", "precision"), filters={"asset": ("es", "nq")}),
        lb.Query("foxhunt", by=("model",), limit=1), lb.Query("system"),
    ]  # fmt: skip
    for query in queries:
        assert lb.top(sqlite, query) == lb.top(client, query), query
    # and by hand from MlflowClient.search_runs: the best FINISHED non-fold run per model/asset
    experiment = MlflowClient(store.uri).get_experiment_by_name("foxhunt").experiment_id
    found = MlflowClient(store.uri).search_runs([experiment], "attributes.status = 'FINISHED'")
    best: dict[tuple, tuple] = {}
    for r in found:
        tags, value = r.data.tags, r.data.metrics.get("val/sharpe", math.nan)
        if tags.get("foxhunt.role") == "fold" or "model" not in tags or math.isnan(value):
            continue
        key = (tags["model"], tags["asset"])
        best[key] = max(best.get(key, (-math.inf, 0, "")), (value, r.info.start_time, r.info.run_id))
    assert {k: v[2] for k, v in best.items()} == {tuple(r.group.values()): r.run_id for r in lb.top(sqlite, queries[0]).rows}


def test_runs_top_imports_neither_torch_lightning_nor_mlflow(store):
    code = (
        "import sys\nfrom foxhunt.cli import app\n"
        f"for args in (['--root', {str(store.root)!r}], ['--json', '--root', {str(store.root)!r}]):\n"
        "    sys.argv = ['foxhunt', 'runs', 'top', *args]\n"
        "    try:\n        app()\n    except SystemExit as exit:\n        assert not exit.code, exit.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'mlflow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"
    assert f'"run_id": "{store.ids["b"]}"' in out.stdout and "best FINISHED run per model,asset" in out.stdout


def test_the_registry_selects_with_the_same_direction_table():
    from foxhunt.ensemble import registry

    assert registry.METRIC_DIRECTIONS is lb.METRIC_DIRECTIONS
    assert registry.metric_direction("val/loss") == lb.direction_of("val/loss") == "min"


@pytest.fixture(scope="module")
def data_store(tmp_path_factory) -> Store:
    """dqn/es runs on four data sets: two runs on bars A (a seed-1 synthetic set), one on bars B (a
    cell keeping a lockbox: other splits, another ``data.digest``), one older run without a digest,
    and a walk-forward cell whose fold children record their bars' digests (C and D)."""
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("data_store")
    (root / "mlruns").mkdir()
    uri = store_uri(root)
    client = MlflowClient(uri)
    experiment = client.create_experiment("foxhunt", artifact_location=(root / "mlruns" / "artifacts").as_uri())
    ids = {}
    for i, (label, digest, sharpe) in enumerate([("a1", "a" * 64, 1.0), ("a2", "a" * 64, 1.2), ("b1", "b" * 64, 3.0),
                                                 ("old", None, 2.0)]):  # fmt: skip
        start = T0 + i * MINUTE_MS
        tags = {"model": "dqn", "asset": "es", "precision": "fp32", "seed": "42", **({"data.digest": digest} if digest else {})}
        run_id = client.create_run(experiment, run_name=label, tags=tags, start_time=start).info.run_id
        metrics = {"val/sharpe": sharpe, **dsr_inputs(sharpe)}
        client.log_batch(run_id, metrics=[MlflowMetric(k, float(v), start, 0) for k, v in metrics.items()])
        client.set_terminated(run_id, "FINISHED", end_time=start + MINUTE_MS)
        ids[label] = run_id
    # a walk-forward cell: its run records no digest, each fold child its own bars'
    tags = {"model": "dqn", "asset": "es", "precision": "fp32", "seed": "42", "foxhunt.role": "cell"}
    cell = client.create_run(experiment, run_name="cell", tags=tags, start_time=T0 + 9 * MINUTE_MS).info.run_id
    client.log_batch(cell, metrics=[MlflowMetric("val/sharpe", 0.5, T0, 0)])
    for fold, digest in enumerate(("d" * 64, "c" * 64)):
        child = client.create_run(experiment, run_name=f"fold{fold}", start_time=T0 + 9 * MINUTE_MS, tags={
            **tags, "foxhunt.role": "fold", "mlflow.parentRunId": cell, "data.digest": digest}).info.run_id  # fmt: skip
        client.log_batch(child, metrics=[MlflowMetric("val/sharpe", 9.0, T0, 0)])
        client.set_terminated(child, "FINISHED", end_time=T0 + 10 * MINUTE_MS)
    client.set_terminated(cell, "FINISHED", end_time=T0 + 10 * MINUTE_MS)
    ids["cell"] = cell
    return Store(root, uri, ids)


def test_runs_on_other_bars_are_other_groups_with_their_own_trials(data_store):
    """Runs of one model and asset on other bars (another synthetic seed, a lockbox kept or not:
    another ``data.digest``) are not ranked or counted as trials together: one row per data set,
    naming it; a walk-forward cell is on its folds' bars; runs without a recorded digest are their
    own group, said so (they were one group of five runs and four trials, b1 winning over runs on
    other bars)."""
    from foxhunt.evaluation.deflated import deflated_sharpe_ratio

    found = rows(data_store)
    assert [(r["run_name"], r["data"], r["runs"], r["dsr_trials"]) for r in found] == [
        ("b1", "b" * 64, 1, 1), ("old", None, 1, 1), ("a2", "a" * 64, 2, 2),
        ("cell", lb.data_identity(["c" * 64, "d" * 64]), 1, 0)]  # fmt: skip
    assert found[2]["dsr"] == pytest.approx(deflated_sharpe_ratio(0.012, [0.01, 0.012], 500, 0.1, 3.5), rel=1e-9)
    sqlite = lb.SqliteSource(SqliteReader(data_store.root / "mlruns" / "mlflow.db"))
    assert lb.top(sqlite, lb.Query("foxhunt")) == lb.top(lb.ClientSource(RunStore(data_store.uri)), lb.Query("foxhunt"))
    result = runner.invoke(app, ["runs", "top", "--root", str(data_store.root)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    lines = {name: next(line for line in result.output.splitlines() if f" {name} " in line) for name in ("a2", "b1", "old")}
    assert "aaaaaaaaaaaa" in lines["a2"] and "bbbbbbbbbbbb" in lines["b1"] and "no digest (old run)" in lines["old"]
    assert "experiment foxhunt: 4 groups, 5 FINISHED cell runs" in result.output
