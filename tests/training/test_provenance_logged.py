"""What a run logs for a reproduction (foxhunt.training.provenance): the bars' content, file by
file (the feature cache key, the dataset inputs' digest, covers a file's path, size and mtime,
not its bytes), and the code, packages and device of each attempt."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mlflow.tracking import MlflowClient

from configs import synthetic_source
from foxhunt.runs.provenance import (
    CODE_DIFF_FILE,
    CODE_FILE,
    DATA_FILE,
    DEVICE_FILE,
    ENVIRONMENT_FILE,
    PROVENANCE_FOLDER,
)
from foxhunt.runs.tags import Tag

REPO = Path(__file__).resolve().parents[2]


def _csv(path: Path) -> Path:
    """Four days of synthetic ES bars as a start-labelled CSV file."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    bars = synthetic_source(days=4, seed=3).load(instantiate(OmegaConf.load(REPO / "conf" / "asset" / "es.yaml")))
    frame = bars[["open", "high", "low", "close", "volume"]].copy()
    frame.insert(0, "timestamp_utc", bars.index.strftime("%Y-%m-%d %H:%M:%S"))
    frame.to_csv(path, index=False)
    return path


def test_the_bars_digest_is_each_files_bytes_where_the_cache_key_misses_an_edit(compose_cfg, tmp_path):
    from foxhunt.training.parts import build_parts
    from foxhunt.training.provenance import bars_datasets, data_provenance

    csv = _csv(tmp_path / "es.csv")
    cfg = compose_cfg(["model=dqn", "trainer=smoke", "data=csv", f"data.source.path={csv}", "data.source.bar_label=start"])
    parts = build_parts(cfg)
    before = data_provenance(cfg, parts)
    digest = hashlib.sha256(csv.read_bytes()).hexdigest()
    assert before["files"] == [{"path": str(csv.resolve()), "bytes": csv.stat().st_size, "sha256": digest}]
    inputs = bars_datasets(cfg, parts)  # the dataset inputs carry each split's bars digest; data.json is written
    assert {d.context: d.profile["sha256"] for d in inputs} == before["splits"]
    assert {d.context: d.digest for d in inputs} == {split: sha[:16] for split, sha in before["splits"].items()}
    import mlflow.data
    from mlflow.entities import Dataset

    source = mlflow.data.get_source(Dataset(inputs[0].name, inputs[0].digest, inputs[0].source_type, inputs[0].source_json()))
    assert source.uri == csv.resolve().as_uri()  # MLflow's own reader of a local source (it failed: no "uri")
    assert json.loads((Path(cfg.paths.output_dir) / PROVENANCE_FOLDER / DATA_FILE).read_text()) == before

    stat = csv.stat()
    text = csv.read_text()
    at = text.index("\n", 1000) + 1  # a training bar's volume: one digit replaced, the size kept
    line_end = text.index("\n", at)
    digit = text[line_end - 1]
    csv.write_text(text[:at] + text[at : line_end - 1] + ("1" if digit != "1" else "2") + text[line_end:])
    os.utime(csv, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as a copy that keeps times would
    again = build_parts(cfg)
    assert again.dataset.cache_key == parts.dataset.cache_key  # what the inputs' digest has said so far: no change
    after = data_provenance(cfg, again)
    assert after["files"][0]["sha256"] == hashlib.sha256(csv.read_bytes()).hexdigest() != before["files"][0]["sha256"]
    assert after["digest"] != before["digest"]


def test_each_attempt_logs_its_code_packages_and_device_and_a_resume_its_own(compose_cfg):
    from foxhunt.training.provenance import opened_run

    cfg = compose_cfg(["model=dqn", "trainer=smoke"])
    with opened_run(cfg, "dqn-es-fp32", {}, None, None, "test", None) as (out_dir, run):
        run_id = run.run_id
    client = MlflowClient(cfg.logger.tracking_uri)
    listed = sorted(a.path for a in client.list_artifacts(run_id, PROVENANCE_FOLDER))
    assert {f"{PROVENANCE_FOLDER}/{name}" for name in (CODE_FILE, ENVIRONMENT_FILE, DEVICE_FILE)} <= set(listed)
    tags = client.get_run(run_id).data.tags
    code = json.loads((out_dir / PROVENANCE_FOLDER / CODE_FILE).read_text())
    device = json.loads((out_dir / PROVENANCE_FOLDER / DEVICE_FILE).read_text())
    assert tags[Tag.CODE_DIGEST] == code["digest"] and tags[Tag.DEVICE_NAME] == f"cpu: {device['name']}"
    assert tags[Tag.CODE_DIRTY] in ("true", "false", "unknown") and device["trainer_deterministic"] is False

    for _ in range(2):  # two resumed attempts, in the run's own folder (as resume=true continues it)
        with opened_run(cfg, "dqn-es-fp32", {}, None, run_id, "test", None):
            pass
    assert json.loads((out_dir / PROVENANCE_FOLDER / CODE_FILE).read_text()) == code  # the first attempt's, kept
    resumed = [f"{PROVENANCE_FOLDER}/resumed-1", f"{PROVENANCE_FOLDER}/resumed-2"]
    assert sorted(a.path for a in client.list_artifacts(run_id, PROVENANCE_FOLDER)) == sorted([*listed, *resumed])
    attempt = resumed[-1]
    logged = {a.path for a in client.list_artifacts(run_id, attempt)}
    assert {f"{attempt}/{name}" for name in (CODE_FILE, DEVICE_FILE, ENVIRONMENT_FILE)} <= logged
    assert (f"{attempt}/{CODE_DIFF_FILE}" in logged) == (tags[Tag.CODE_DIRTY] == "true")  # this checkout's state
