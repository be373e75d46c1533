"""Which checkpoint a stopped, failed or stale run continues from."""

from __future__ import annotations

from foxhunt.runs.checkpoints import resumable_checkpoint
from foxhunt.runs.stored import StoredRun


def test_checkpoint_of_a_stopped_cell_is_found_in_its_folders(tmp_path):
    folder = tmp_path / "cell" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"0")
    run = StoredRun("r", "n", "e", "KILLED", 0, 1, {"output_dir": str(tmp_path / "cell")}, {})
    assert resumable_checkpoint(run).path == folder / "last.ckpt"
    assert resumable_checkpoint(StoredRun("r", "n", "e", "KILLED", 0, 1, {}, {})) is None
