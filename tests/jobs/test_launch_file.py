"""What ``foxhunt train start`` writes before the store knows a job: its launch file
(``<root>/outputs/jobs/<job_id>.json``) with the plan, read back as written, and the tags that
make a parent run a job."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.jobs.launch_file import JOB_ID_PATTERN, MAX_PID, MAX_TIME_MS, LaunchFile, PlannedCell, job_tags, jobs_dir
from foxhunt.runs.cell import CellKey

words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
cells = st.builds(
    PlannedCell,
    key=st.builds(CellKey, model=words, asset=words, precision=words, seed=words, config_hash=words),
    steps=st.integers(0, 10**9),
    weight=st.floats(0, 1e6, allow_nan=False),
    overrides=st.lists(words, max_size=3),
)
launch_files = st.builds(
    LaunchFile,
    job_id=st.from_regex(JOB_ID_PATTERN, fullmatch=True), pid=st.integers(0, MAX_PID), host=words, command=st.lists(words, max_size=4),
    overrides=st.lists(words, max_size=4), log=words, tracking_uri=words, root=words, sweep_dir=words,
    started_ms=st.integers(0, MAX_TIME_MS), plan=st.lists(cells, max_size=3), experiment=words, artifact_location=words,
)  # fmt: skip


def test_job_tags():
    tags = job_tags("ab12cd34", 4242, ["foxhunt-train", "-m", "model=dqn,tft", "x=a b"], ["model=dqn,tft", "x=a b"])
    assert tags == {
        "job_id": "ab12cd34", "pid": "4242", "host": socket.gethostname(),
        "command": "foxhunt-train -m model=dqn,tft 'x=a b'", "job.overrides": json.dumps(["model=dqn,tft", "x=a b"]),
    }  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(launch=launch_files)
def test_a_launch_file_reads_back_as_written(launch, tmp_path_factory):
    path = jobs_dir(tmp_path_factory.mktemp("root")) / f"{launch.job_id}.json"
    launch.write(path)
    assert LaunchFile.read(path) == launch
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # written whole, no temporary left


def test_rewriting_a_launch_file_replaces_it_and_the_jobs_folder_is_under_outputs(tmp_path):
    assert jobs_dir(tmp_path) == tmp_path / "outputs" / "jobs"
    plan = [PlannedCell(CellKey("dqn", "es", "fp32", "42"), 8, 0.5, ["model=dqn"])]
    launch = LaunchFile("ab12cd34", 0, "h", ["foxhunt-train", "-m"], [], "log", "sqlite:///x", str(tmp_path), "s", 1, plan)
    path = jobs_dir(tmp_path) / "ab12cd34.json"
    launch.write(path)
    launch.pid = 4242  # the launcher writes the supervisor's pid once it started
    launch.write(path)
    data = json.loads(Path(path).read_text())
    assert data["pid"] == 4242 and data["plan"] == [{"model": "dqn", "asset": "es", "precision": "fp32", "seed": "42",
                                                     "config_hash": "", "steps": 8, "weight": 0.5, "overrides": ["model=dqn"]}]  # fmt: skip


def test_a_plan_cell_from_an_older_launcher_gets_defaults():
    cell = PlannedCell.from_dict({"model": "tft", "asset": "nq", "precision": "bf16"})
    assert cell == PlannedCell(CellKey("tft", "nq", "bf16"), steps=0, weight=1.0, overrides=[]) and cell.name == "tft-nq-bf16"
