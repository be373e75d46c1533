"""``foxhunt runs prune`` end to end on a small real store (typer's runner, in process).

The store: one cell (dqn/es) of five FINISHED runs ranked by val/sharpe, one registered, one
RUNNING that scores best, a cell run made of a fold child, a run without the metric, another cell
(tft/es) of one run, and two runs whose artifact folder leads out of the store (``..`` in its URI,
a symbolic link), each with checkpoints of its own size. Checked: the dry run removes nothing and
measures what it would; ``--yes`` removes the checkpoints of the runs that lost only (registered,
the best K, RUNNING, unranked and other cells kept), tags them, keeps their metrics; a second prune
is a no-op; nothing outside the store is followed or removed; a run registered or reopened after
the plan keeps its files; one-line errors.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt.cli import app
from foxhunt.runs import prune as pr
from foxhunt.runs.environment import store_uri
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import Tag

runner = CliRunner()
PRUNE = ["runs", "prune"]  # the command as a user types it: foxhunt runs prune ...
TASK = "unit"


@dataclass
class Store:
    root: Path
    store: RunStore
    ids: dict[str, str]
    outside: Path

    def folder(self, label: str) -> Path:
        return Path(self.store.get(self.ids[label]).artifact_uri.removeprefix("file://")) / "checkpoints"

    def invoke(self, *args: str):
        return runner.invoke(app, [*PRUNE, f"task={TASK}", "--root", str(self.root), *args])


@pytest.fixture
def built(tmp_path) -> Store:
    store = RunStore(store_uri(tmp_path))
    experiment = store.ensure_experiment(TASK, str(tmp_path / "mlruns" / "artifacts"))
    ids: dict[str, str] = {}
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def run(label, sharpe, size, model="dqn", status="FINISHED", tags=None):
        run_id = store.create(experiment, f"{model}-es-fp32", {"model": model, "asset": "es", "precision": "fp32",
                                                              "seed": "42", **(tags or {})})  # fmt: skip
        if sharpe is not None:
            store.log_metrics(run_id, {"val/sharpe": sharpe, "val/loss": 1.0})
        checkpoint = scratch / "best.ckpt"
        checkpoint.write_bytes(b"w" * size)
        store.log_artifact(run_id, checkpoint, "checkpoints")
        if status != "RUNNING":
            store.end(run_id, status)
        ids[label] = run_id
        return run_id

    for rank, size in enumerate((101, 102, 103, 104, 105), start=1):
        run(f"s{rank}", 6.0 - rank, size)
    run("live", 99.0, 110, status="RUNNING")  # scores best, trains: untouched
    run("failed", 0.1, 111, status="FAILED")  # resumable: untouched
    cell = run("cell", 0.5, 120, tags={Tag.ROLE: "cell"})  # rank 6: lost, and its child with it
    run("fold", 7.0, 121, tags={Tag.ROLE: "fold", Tag.PARENT: cell})
    run("nometric", None, 130)  # not ranked: kept
    run("tft", 0.0, 140, model="tft")  # the only run of its cell
    store.register_model_version("foxhunt-dqn-es", ids["s4"], "checkpoints", alias="champion")
    # two runs that lost, whose artifact folders lead out of the store
    outside = tmp_path / "outside"
    (outside / "artifacts" / "checkpoints").mkdir(parents=True)
    (outside / "artifacts" / "checkpoints" / "precious.ckpt").write_bytes(b"p" * 50)
    dotted = run("dotted", -1.0, 150)
    run("linked", -2.0, 160)
    with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as db:
        db.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?",
                   (f"file://{tmp_path}/mlruns/artifacts/../../outside/artifacts", dotted))  # fmt: skip
    built = Store(tmp_path, store, ids, outside)
    folder = built.folder("linked")
    for item in folder.iterdir():
        item.unlink()
    folder.rmdir()
    folder.symlink_to(outside / "artifacts" / "checkpoints", target_is_directory=True)
    # a link inside a run that lost: removed as a link, never followed
    (outside / "keep.ckpt").write_bytes(b"k" * 60)
    (built.folder("s5") / "link.ckpt").symlink_to(outside / "keep.ckpt")
    return built


LOST = ("s3", "s5", "cell", "fold")  # keep 2: s1, s2 kept, s4 registered
KEPT = ("s1", "s2", "s4", "live", "failed", "nometric", "tft")


def _present(built: Store) -> dict[str, bool]:
    return {label: (built.folder(label) / "best.ckpt").is_file() for label in (*LOST, *KEPT)}


def test_a_dry_run_measures_what_it_would_remove_and_removes_nothing(built):
    result = built.invoke("--keep", "2")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("would remove ")]
    for label, size in (("s3", 103), ("s5", 105), ("cell", 120), ("fold", 121)):
        assert any(built.ids[label] in line and f" {size} bytes" in line for line in lines), (label, result.output)
    assert f"{103 + 105 + 120 + 121:,} bytes" in lines[-1] and "pass --yes" in lines[-1]
    for label in KEPT:
        assert built.ids[label] not in result.output
    assert all(_present(built).values())
    assert "lies outside the store's folder" in result.output and "is a symbolic link" in result.output


def test_yes_removes_the_losers_checkpoints_only_and_a_second_prune_is_a_no_op(built):
    result = built.invoke("--keep", "2", "--yes")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].startswith(f"removed 4 runs' checkpoints, {103 + 105 + 120 + 121:,} bytes")
    assert _present(built) == {**dict.fromkeys(LOST, False), **dict.fromkeys(KEPT, True)}
    for label in LOST:
        run = built.store.get(built.ids[label])
        assert "checkpoints/ removed" in run.tags[Tag.ARTIFACTS_PRUNED]
        assert run.metric("val/sharpe") is not None  # the record stays: the leaderboard still ranks it
    for label in KEPT:
        assert Tag.ARTIFACTS_PRUNED not in built.store.get(built.ids[label]).tags
    # nothing outside the store removed: the dotted run's and the linked run's target, the link's target
    assert (built.outside / "artifacts" / "checkpoints" / "precious.ckpt").read_bytes() == b"p" * 50
    assert (built.outside / "keep.ckpt").read_bytes() == b"k" * 60
    assert built.folder("linked").is_symlink()
    again = built.invoke("--keep", "2", "--yes")
    assert again.exit_code == 0 and again.output.splitlines()[-1].startswith("removed 0 runs' checkpoints, 0 bytes")
    last = built.invoke("--keep", "2").output.splitlines()[-1]
    assert last.startswith("would remove experiment unit: 0 runs'") and last.endswith("; 4 that lost store no checkpoints")


def test_reproducing_a_pruned_run_says_its_checkpoints_were_pruned(built, tmp_path):
    """One line that names the pruning (it guessed logger.log_checkpoints before)."""
    from omegaconf import OmegaConf

    from configs import compose_train_config
    from foxhunt.config.schema import resolved_config
    from foxhunt.runs.reproduce import ReproduceError, open_original
    from foxhunt.runs.tracked_run import CONFIG_ARTIFACT

    config = tmp_path / "scratch" / CONFIG_ARTIFACT
    config.write_text(OmegaConf.to_yaml(resolved_config(compose_train_config(["model=dqn"], tmp_path / "composed"))))
    built.store.log_artifact(built.ids["s3"], config, "")
    assert built.invoke("--keep", "2", "--yes").exit_code == 0
    with pytest.raises(
        ReproduceError, match=r"no weights to compare a reproduction with \(its checkpoints were pruned \(.*checkpoints/ removed"
    ):
        open_original(built.store, built.ids["s3"], tmp_path / "work")


def test_a_cells_name_says_its_data_set(built):
    """Two data sets of one model and asset are two cells: their names differ by the data's digest."""
    from foxhunt.runs.leaderboard import DATA_TAG

    experiment = built.store.ensure_experiment("bars", str(built.root / "mlruns" / "artifacts"))
    for digest in ("a" * 64, "b" * 64):
        run_id = built.store.create(experiment, "dqn-es-fp32", {"model": "dqn", "asset": "es", DATA_TAG: digest})
        built.store.log_metrics(run_id, {"val/sharpe": 1.0})
        built.store.end(run_id, "FINISHED")
    finished = built.store.search_finished_runs("bars")
    names = sorted(name for _, name in pr.cell_ranks("bars", finished, "val/sharpe").values())
    assert names == ["model=dqn asset=es data=aaaaaaaaaaaa", "model=dqn asset=es data=bbbbbbbbbbbb"]


def test_keep_defaults_to_conf(built):
    keep = pr.default_keep()
    result = built.invoke()
    assert result.exit_code == 0 and f"best {keep} of each cell" in result.output


def test_a_run_registered_or_reopened_after_the_plan_keeps_its_files(built):
    plan = pr.plan_prune(built.store, TASK, "val/sharpe", 2)
    assert {r.run.run_id for r in plan.removals} == {built.ids[label] for label in LOST}
    built.store.register_model_version("foxhunt-dqn-es", built.ids["s3"], "checkpoints")
    built.store.client.update_run(built.ids["s5"], status="RUNNING")  # resumed meanwhile
    outcome = pr.apply_prune(built.store, plan, lock="test")
    assert {r.run.run_id for r in outcome.removed} == {built.ids["cell"], built.ids["fold"]}
    assert {r.run.run_id: why for r, why in outcome.left} == {built.ids["s3"]: "registered since the plan",
                                                              built.ids["s5"]: "now RUNNING"}  # fmt: skip
    assert (built.folder("s3") / "best.ckpt").is_file() and (built.folder("s5") / "best.ckpt").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--keep", "0"], "--keep 0: must be an integer >= 1"),
        (["task=nope"], "experiment 'nope' (task): not in the store"),
        (["asset=es"], "prune takes task= only"),
        (["--metric", "val/nothing"], "unknown direction for 'nothing'"),
        (["--tracking-uri", "http://localhost:5000"], "prune removes the files of a local SQLite store"),
    ],
)
def test_a_bad_request_is_one_line(built, args, message):
    result = runner.invoke(app, [*PRUNE, "--root", str(built.root), *args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output, result.output
    assert all(_present(built).values())


def test_a_bad_keep_is_refused_before_the_store_is_opened(tmp_path, monkeypatch):
    """--keep 0 was refused only once the store was read (8 s here; found by a helper probing the CLI)."""
    from foxhunt.runs import prune as pr

    monkeypatch.setattr(pr, "store_folder", lambda uri: pytest.fail("the store was opened"))
    result = runner.invoke(app, [*PRUNE, "--root", str(tmp_path), "--keep", "0"])
    assert result.exit_code == 2 and "--keep 0: must be an integer >= 1" in result.output, result.output


def test_a_run_whose_record_points_at_another_runs_folder_is_not_pruned_through_it(built):
    """A losing run's artifact_uri edited to name the best run's folder: --yes removed the best
    run's checkpoints with the loser's (found by a helper probing prune). A folder that is not
    <location>/<run id>/artifacts is not the run's own and is left alone."""
    with sqlite3.connect(built.root / "mlruns" / "mlflow.db") as db:
        db.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?",
                   (built.store.get(built.ids["s1"]).artifact_uri, built.ids["s3"]))  # fmt: skip
    result = built.invoke("--keep", "2", "--yes")
    assert result.exit_code == 0, result.output
    assert (built.folder("s1") / "best.ckpt").is_file()  # the best run keeps its checkpoints
    assert (
        "its artifact folder" in result.output
        and f"is not its own (<experiment's location>/{built.ids['s3']}/artifacts)" in result.output
    )


@pytest.mark.parametrize("args", [["prune"], ["prune", "--yes"], ["reproduce", "abc"], ["top"]])
def test_a_file_that_is_no_store_is_one_line_and_left_as_it_was(tmp_path, args):
    """An empty mlflow.db: runs prune and runs reproduce opened it with MLflow's client, which
    wrote its tables into it (0 bytes grew to 950 KB), then said 'experiment not in the store'
    (found by a helper probing the runs commands). runs top refused it; all three do now."""
    database = tmp_path / "mlruns" / "mlflow.db"
    database.parent.mkdir()
    database.write_bytes(b"")
    result = runner.invoke(app, ["runs", *args, "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().endswith(f"cannot read the MLflow store {database}: not an SQLite store with MLflow's tables")
    assert len(result.output.strip().splitlines()) == 1 and database.stat().st_size == 0
