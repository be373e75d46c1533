"""Which checkpoint a stopped, failed or stale run continues from: the newest of
``interrupted.ckpt`` and ``last.ckpt`` in the run's folders, else a logged copy
(``interrupted.ckpt`` first), read on disk when the artifact store is local."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from foxhunt.runs.checkpoints import Checkpoint, artifact_folder, local_folders, resumable_checkpoint, stored_checkpoints
from foxhunt.runs.stored import StoredRun

GRACEFUL, MODEL_CHECKPOINT = "callbacks.graceful_stop.dirpath", "callbacks.model_checkpoint.dirpath"


def run(tags=None, params=None, artifact_uri=""):
    return StoredRun("r", "n", "e", "KILLED", 0, 1, dict(tags or {}), {}, params=dict(params or {}), artifact_uri=artifact_uri)


def write(folder: Path, name: str, mtime: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"0")
    os.utime(path, (mtime, mtime))
    return path


def test_checkpoint_of_a_stopped_cell_is_found_in_its_folders(tmp_path):
    folder = tmp_path / "cell" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"0")
    run = StoredRun("r", "n", "e", "KILLED", 0, 1, {"output_dir": str(tmp_path / "cell")}, {})
    assert resumable_checkpoint(run).path == folder / "last.ckpt"
    assert resumable_checkpoint(StoredRun("r", "n", "e", "KILLED", 0, 1, {}, {})) is None


def test_the_run_folders_are_its_config_folders_and_its_latest_output_dir(tmp_path):
    found = local_folders(run({"output_dir": str(tmp_path / "second")},
                              {GRACEFUL: str(tmp_path / "first" / "checkpoints"), MODEL_CHECKPOINT: str(tmp_path / "first" / "checkpoints")}))  # fmt: skip
    assert found == [tmp_path / "first" / "checkpoints", tmp_path / "second" / "checkpoints"]


def test_the_newer_of_interrupted_and_last_wins_and_a_tie_goes_to_interrupted(tmp_path):
    folder = tmp_path / "cell" / "checkpoints"
    cell = run({"output_dir": str(tmp_path / "cell")})
    write(folder, "interrupted.ckpt", 1_000)
    write(folder, "last.ckpt", 2_000)  # stopped, resumed, then killed: last.ckpt is where it stopped
    write(folder, "best.ckpt", 9_000)  # never where training stopped
    assert resumable_checkpoint(cell) == Checkpoint("last.ckpt", path=folder / "last.ckpt")
    write(folder, "interrupted.ckpt", 3_000)
    assert resumable_checkpoint(cell).path == folder / "interrupted.ckpt"
    write(folder, "last.ckpt", 3_000)
    assert resumable_checkpoint(cell).name == "interrupted.ckpt"


def test_a_checkpoint_in_another_folder_of_the_run_counts_too(tmp_path):
    config_folder = tmp_path / "configured"
    write(config_folder, "last.ckpt", 5_000)
    write(tmp_path / "out" / "checkpoints", "interrupted.ckpt", 4_000)
    found = resumable_checkpoint(run({"output_dir": str(tmp_path / "out")}, {GRACEFUL: str(config_folder)}))
    assert found.path == config_folder / "last.ckpt"


def test_without_local_files_a_logged_copy_is_used_interrupted_first(tmp_path):
    artifacts = tmp_path / "my artifacts"  # a space: the URI is percent-encoded
    write(artifacts / "checkpoints", "last.ckpt", 1_000)
    write(artifacts / "checkpoints", "interrupted.ckpt", 0)
    found = resumable_checkpoint(run({"output_dir": str(tmp_path / "gone")}, artifact_uri=artifacts.as_uri()))
    assert found == Checkpoint("interrupted.ckpt", path=artifacts / "checkpoints" / "interrupted.ckpt",
                               artifact="checkpoints/interrupted.ckpt")  # fmt: skip
    assert str(found) == str(artifacts / "checkpoints" / "interrupted.ckpt")


def test_a_remote_artifact_store_is_listed_through_the_store():
    remote = run(artifact_uri="mlflow-artifacts:/3/r/artifacts")
    assert resumable_checkpoint(remote) is None  # not looked for without the store's listing
    found = resumable_checkpoint(remote, list_logged=lambda r: ["best.ckpt", "last.ckpt"])
    assert found == Checkpoint("last.ckpt", artifact="checkpoints/last.ckpt")
    assert str(found) == "artifact checkpoints/last.ckpt"
    assert resumable_checkpoint(remote, list_logged=lambda r: ["best.ckpt", "breach.ckpt"]) is None


def test_the_artifact_folder_is_local_only_for_a_file_uri_or_a_path(tmp_path):
    assert artifact_folder(run(artifact_uri=(tmp_path / "a b%c").as_uri())) == tmp_path / "a b%c"
    assert artifact_folder(run(artifact_uri=str(tmp_path / "plain"))) == tmp_path / "plain"
    for uri in ("", "s3://bucket/3/r/artifacts", "mlflow-artifacts:/3/r/artifacts", "dbfs:/x"):
        assert artifact_folder(run(artifact_uri=uri)) is None, uri


@pytest.mark.parametrize(
    ("retention", "finished", "stored"),
    [("best", True, ["best.ckpt"]), ("best", False, ["best.ckpt", "interrupted.ckpt", "last.ckpt"]),
     ("all", True, ["best.ckpt", "interrupted.ckpt", "last.ckpt"]), ("none", False, []),
     (True, True, ["best.ckpt", "interrupted.ckpt", "last.ckpt"]), (False, True, [])],
)  # fmt: skip
def test_what_a_run_stores_of_its_checkpoints(tmp_path, retention, finished, stored):
    """logger.log_checkpoints: a finished run stores its best checkpoint once (resume never needs
    its last one); a run that did not finish stores what resumes it; a stored config's true/false."""
    files = [tmp_path / name for name in ("best.ckpt", "interrupted.ckpt", "last.ckpt")]
    assert [p.name for p in stored_checkpoints(files, retention, finished)] == stored


def test_a_finished_run_stores_the_file_its_best_is_in_whatever_lightning_named_it(tmp_path):
    """A resumed fit's new best beside its killed attempt's best.ckpt is best-v1.ckpt: that file is
    the run's best (stored as best.ckpt by the cell), not the stale best.ckpt."""
    files = [tmp_path / name for name in ("best.ckpt", "best-v1.ckpt", "last.ckpt")]
    assert stored_checkpoints(files, "best", True, best=files[1]) == [files[1]]
    assert stored_checkpoints(files, "best", True) == [files[0]]  # the best not known: by its name
    assert stored_checkpoints(files, "best", False, best=files[1]) == files  # not finished: what resumes it
