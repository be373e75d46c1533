"""``foxhunt runs reproduce``: a smoke run of each family retrains identical; an edited value of a
CSV file is named with both digests; a package whose recorded version differs is named; an
unknown run, a missing store, a missing config artifact and a planted ``_target_`` are one line,
exit 2, before anything trains. In-process: the original through ``run_cell``, the command
through typer's CliRunner (the sizes of tests/ensemble/ensemble_helpers.py)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from typer.testing import CliRunner

from configs import compose_train_config, synthetic_source
from ensemble.ensemble_helpers import FAST, SMALL
from foxhunt.cli import app
from foxhunt.runs.provenance import DATA_FILE, ENVIRONMENT_FILE, PROVENANCE_FOLDER
from foxhunt.runs.store import RunStore
from foxhunt.runs.tags import REPRODUCTIONS_EXPERIMENT, Tag

PROG = "foxhunt runs"  # every foxhunt runs command's one-line errors start so


def _uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"


def _train(root: Path, model: str, *overrides: str) -> str:
    from foxhunt.training.cell import run_cell

    fast = [o for o in FAST if not o.startswith("data.source.")] if "data=csv" in overrides else FAST
    cfg = compose_train_config([f"model={model}", *fast, *SMALL[model], *overrides], root)
    return str(run_cell(cfg).run_id)


def _reproduce(root: Path, *args: str):
    return CliRunner().invoke(app, ["runs", "reproduce", *args, "--root", str(root)], catch_exceptions=False)


def _artifact(root: Path, run_id: str, name: str) -> Path:
    run = RunStore(_uri(root)).get(run_id)
    return Path(run.artifact_uri.removeprefix("file://")) / name


def _one_line_exit_2(result, *wanted: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: "), result.stderr
    assert "Traceback" not in result.output
    for text in wanted:
        assert text in lines[0], lines[0]
    return lines[0]


def _identical(root: Path, model: str, *overrides: str) -> str:
    original = _train(root, model, *overrides)
    result = _reproduce(root, original)
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("identical: run ") and f"reproduces run {original}" in first, result.stdout
    assert "weights: equal (checkpoints/best.ckpt" in result.stdout  # logger.log_checkpoints=best: what the run stored
    # the same data, packages and device; the code too, unless someone edits this checkout meanwhile
    moved = [line for line in result.stdout.splitlines() if line.startswith("  input differs: ")]
    assert all(line.startswith("  input differs: code: ") for line in moved), result.stdout
    assert moved or "  inputs: the same data, code, packages and device" in result.stdout, result.stdout
    store = RunStore(_uri(root))
    (again,) = store.search(REPRODUCTIONS_EXPERIMENT, tags={Tag.REPRODUCTION_OF: original})
    assert again.status == "FINISHED" and again.tags[Tag.REPRODUCTION_VERDICT] == first
    assert again.tags[Tag.CONFIG_HASH] == store.get(original).tags[Tag.CONFIG_HASH]
    return original


def test_a_dqn_smoke_run_reproduces_identical_in_its_own_run(tmp_path):
    original = _identical(tmp_path, "dqn")
    tags = RunStore(_uri(tmp_path)).get(original).tags  # what the original recorded for it
    assert all(tags.get(key) for key in (Tag.DATA_DIGEST, Tag.CODE_DIGEST, Tag.ENVIRONMENT_DIGEST, Tag.DEVICE_NAME))
    # its config.yaml edited in the artifact store to write elsewhere: the reproduction wrote its checkpoints into
    # another run's artifacts and a ../ file name out of its folder, and said "identical" (found by a helper)
    path = _artifact(tmp_path, original, "config.yaml")
    config = yaml.safe_load(path.read_text())
    victim = tmp_path / "victim"
    config["callbacks"]["model_checkpoint"].update(dirpath=str(victim), filename="../outside")
    path.write_text(yaml.safe_dump(config))
    _one_line_exit_2(_reproduce(tmp_path, original), f"run {original} (dqn-es-fp32): config.yaml is not the file its run "
                     "logged", "the file was changed after the run")  # fmt: skip
    assert not victim.exists() and not (tmp_path / "outside.ckpt").exists()
    assert len(RunStore(_uri(tmp_path)).search(REPRODUCTIONS_EXPERIMENT)) == 1  # the first, honest one only


@pytest.mark.slow  # ~40 s for the three (dqn above stays in the default suite)
@pytest.mark.parametrize("model", ["ppo", "mamba2", "tft"])
def test_every_other_family_reproduces_identical_in_a_fresh_process(tmp_path, model):
    """The reproduction in a process of its own, as a user runs it (in-process, what the first run
    cached, a device probe, would hide what a fresh process does)."""
    import os
    import subprocess

    original = _train(tmp_path, model)
    command = [sys.executable, "-m", "foxhunt.cli", "runs", "reproduce", original, "--root", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "FOXHUNT_ROOT": str(tmp_path)}, timeout=600)
    assert done.returncode == 0 and done.stdout.startswith("identical: run "), done.stdout + done.stderr[-2000:]


def _bars_csv(path: Path) -> Path:
    """Four days of synthetic ES bars as a start-labelled CSV file."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    asset = instantiate(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "asset" / "es.yaml"))
    bars = synthetic_source(days=4, seed=3).load(asset)
    frame = bars[["open", "high", "low", "close", "volume"]].copy()
    frame.insert(0, "timestamp_utc", bars.index.strftime("%Y-%m-%d %H:%M:%S"))
    frame.to_csv(path, index=False)
    return path


def test_one_edited_value_of_the_training_data_names_the_file_and_both_digests(tmp_path):
    csv = _bars_csv(tmp_path / "es.csv")
    before = hashlib.sha256(csv.read_bytes()).hexdigest()
    original = _train(tmp_path, "dqn", "data=csv", f"data.source.path={csv}", "data.source.bar_label=start")
    recorded = json.loads(_artifact(tmp_path, original, f"{PROVENANCE_FOLDER}/{DATA_FILE}").read_text())
    assert [(f["path"], f["sha256"]) for f in recorded["files"]] == [(str(csv.resolve()), before)]

    lines = csv.read_text().splitlines(keepends=True)
    fields = lines[100].rstrip("\n").split(",")  # a training bar: its volume one contract more
    fields[-1] = str(int(float(fields[-1])) + 1)
    lines[100] = ",".join(fields) + "\n"
    csv.write_text("".join(lines))
    after = hashlib.sha256(csv.read_bytes()).hexdigest()

    result = _reproduce(tmp_path, original)
    assert result.exit_code == 1, result.output
    first = result.stdout.splitlines()[0]
    assert first == f"differs: data: file {csv.resolve()}: sha256 {before} (original) -> {after} (reproduction)"
    assert "weights: differ: checkpoints/" in result.stdout


def test_a_package_whose_recorded_version_differs_is_named_with_both_versions(tmp_path):
    import importlib.metadata

    original = _train(tmp_path, "dqn")
    path = _artifact(tmp_path, original, f"{PROVENANCE_FOLDER}/{ENVIRONMENT_FILE}")
    environment = json.loads(path.read_text())
    environment["packages"]["numpy"] = "1.0.0"  # as if the original had trained with another numpy
    path.write_text(json.dumps(environment))

    result = _reproduce(tmp_path, original)
    installed = importlib.metadata.version("numpy")
    named = f"package numpy 1.0.0 (original) -> {installed} (reproduction)"
    assert result.exit_code == 0, result.output  # the results came out equal: numpy changed nothing here
    assert result.stdout.splitlines()[0].endswith(f"though an input differs: {named}"), result.stdout
    assert f"  input differs: {named}" in result.stdout


def test_a_run_that_is_not_in_the_store_and_a_missing_store_are_one_line(tmp_path):
    _one_line_exit_2(_reproduce(tmp_path, "0123456789abcdef0123456789abcdef"), "no MLflow store at")
    RunStore(_uri(tmp_path)).ensure_experiment("foxhunt", str(tmp_path / "mlruns" / "artifacts"))
    unknown, version = "0123456789abcdef0123456789abcdef", "models:/foxhunt-dqn-es@champion"
    _one_line_exit_2(_reproduce(tmp_path, unknown), f"run {unknown}: not in the store")
    _one_line_exit_2(_reproduce(tmp_path, version), f"{version}: no such registered version")
    huge = "models:/foxhunt-dqn-es/99999999999999999999999"  # blamed the store: 'Python int too large' (found by a helper)
    _one_line_exit_2(_reproduce(tmp_path, huge), f"{huge}: no such registered version")


def _finished_run(root: Path, config: dict | None, status: str = "FINISHED") -> str:
    """A run holding only ``config`` as its config.yaml artifact (None: no artifact)."""
    store = RunStore(_uri(root))
    experiment = store.ensure_experiment("foxhunt", str(root / "mlruns" / "artifacts"))
    run_id = store.create(experiment, "dqn-es-fp32", {Tag.MODEL: "dqn"})
    if config is not None:
        store.log_text(run_id, yaml.safe_dump(config), "config.yaml")
    store.end(run_id, status)
    return run_id


def test_a_planted_target_or_no_config_artifact_is_refused_before_anything_is_imported_or_trained(tmp_path):
    from foxhunt.config.schema import resolved_config

    config = resolved_config(compose_train_config(["model=dqn", "trainer=smoke"], tmp_path))
    config["model"]["module"]["_target_"] = "planted_module_of_test_reproduce.Evil"
    planted = _finished_run(tmp_path, config)
    line = _one_line_exit_2(_reproduce(tmp_path, planted), f"run {planted}", "model.module._target_", "refused, nothing imported")
    assert "planted_module_of_test_reproduce.Evil" in line and "planted_module_of_test_reproduce" not in sys.modules
    bare = _finished_run(tmp_path, None)
    _one_line_exit_2(_reproduce(tmp_path, bare), f"run {bare}", "no config.yaml artifact")
    config = resolved_config(compose_train_config(["model=dqn", "trainer=smoke"], tmp_path))
    del config["task"]  # an invalid stored config: the line names its file (it said only 'config error: task: missing')
    damaged = _finished_run(tmp_path, config)
    _one_line_exit_2(_reproduce(tmp_path, damaged), f"run {damaged} (dqn-es-fp32): config.yaml: task")
    failed = _finished_run(tmp_path, None, status="FAILED")
    _one_line_exit_2(_reproduce(tmp_path, failed), f"run {failed}", "is FAILED: only a FINISHED run has results to reproduce")
    assert RunStore(_uri(tmp_path)).experiment_id(REPRODUCTIONS_EXPERIMENT) is None  # nothing trained


def test_a_run_killed_by_kill_9_is_named_stale_not_running(tmp_path):
    """A run whose process died stays RUNNING in the store; reproduce said 'is RUNNING', as if it
    were training (found probing the runs commands). It says STALE and how to finish it."""
    import socket
    import subprocess

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = RunStore(_uri(tmp_path))
    experiment = store.ensure_experiment("foxhunt", str(tmp_path / "mlruns" / "artifacts"))
    run_id = store.create(experiment, "dqn-es-fp32", {Tag.MODEL: "dqn", Tag.HOST: socket.gethostname(), Tag.PID: str(dead.pid)})
    _one_line_exit_2(_reproduce(tmp_path, run_id), f"run {run_id}", "is STALE (RUNNING in the store, its process gone: "
                     "finish it with resume=true, then reproduce it): only a FINISHED run")  # fmt: skip


# -- the comparison, in-process ---------------------------------------------------------------
def _inputs(**changes):
    from foxhunt.runs.provenance import CODE_FILE, DEVICE_FILE

    h = "ab" * 32
    files = {
        DATA_FILE: {"version": 1, "source": "CsvBarSource", "settings": {"path": "/d"}, "digest": h,
                    "files": [{"path": "/d/a.csv", "sha256": h}, {"path": "/d/b.csv", "sha256": h}], "splits": {"train": h}},
        CODE_FILE: {"version": 1, "digest": h, "files": {"foxhunt/a.py": h}, "commit": "c1", "diff_sha256": None,
                    "package_version": "0.1.0"},
        ENVIRONMENT_FILE: {"version": 1, "digest": h, "python": {"version": "3.11.4"},
                           "packages": {"numpy": "2.0.0", "torch": "2.5.0"}},
        DEVICE_FILE: {"version": 1, "device": "cpu", "name": "AMD EPYC", "torch_threads": 2},
    }  # fmt: skip
    for dotted, value in changes.items():
        name, *keys = dotted.split("__")
        node = files[{"data": DATA_FILE, "code": CODE_FILE, "environment": ENVIRONMENT_FILE, "device": DEVICE_FILE}[name]]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return files


def test_inputs_are_compared_data_first_then_code_packages_and_device():
    from foxhunt.runs.reproduce import input_differences

    h2 = "cd" * 32
    assert input_differences(_inputs(), _inputs()) == []
    moved = _inputs(data__files=[{"path": "/d/a.csv", "sha256": "ab" * 32}, {"path": "/d/b.csv", "sha256": h2}],
                    code__digest=h2, code__files={"foxhunt/a.py": h2}, code__commit="c2",
                    environment__packages={"numpy": "2.1.0", "torch": "2.6.0"}, device__torch_threads=8)  # fmt: skip
    assert input_differences(_inputs(), moved) == [
        f"data: file /d/b.csv: sha256 {'ab' * 32} (original) -> {h2} (reproduction)",
        "code: foxhunt/a.py sha256 abababababab... -> cdcdcdcdcdcd...; commit c1 (original) -> c2 (reproduction)",
        "package numpy 2.0.0 (original) -> 2.1.0 (reproduction) (and 1 more packages)",
        "device: torch threads 2 (original) -> 8 (reproduction)",
    ]
    bars = input_differences(_inputs(), _inputs(data__splits={"train": h2}))
    assert bars == [f"data: the train split's bars: sha256 {'ab' * 32} (original) -> {h2} (reproduction), with every file the same "
                    "(the features' code or a package differs)"]  # fmt: skip
    gone = input_differences(_inputs(), _inputs(data__files=[{"path": "/d/a.csv", "sha256": "ab" * 32}]))
    assert gone == ["data: file /d/b.csv was read by the original, not by the reproduction"]
    only_commit = input_differences(_inputs(), _inputs(code__commit="c2"))  # the package files are the same: no difference
    assert only_commit == []


def test_the_verdict_is_identical_only_when_weights_and_every_compared_metric_are_equal():
    from foxhunt.runs.reproduce import EXIT_DIFFERS, EXIT_IDENTICAL, Verdict, excluded_summary, metric_excluded

    same = Verdict("o", "dqn-es-fp32", "r", weights_compared=["last.ckpt"], tensors=4, metrics_compared=["val/loss"])
    assert (same.identical, same.exit_code) == (True, EXIT_IDENTICAL)
    assert same.headline() == "identical: run r reproduces run o (dqn-es-fp32)"
    drift = Verdict(
        "o", "dqn-es-fp32", "r", weights_compared=["last.ckpt"], metric_difference="metric train/loss differs first at step 3"
    )
    assert (drift.identical, drift.exit_code) == (False, EXIT_DIFFERS)
    assert drift.headline() == "differs: no recorded input differs, yet metric train/loss differs first at step 3"
    drift.inputs_differ = ["package numpy 1 (original) -> 2 (reproduction)"]
    assert drift.headline() == "differs: package numpy 1 (original) -> 2 (reproduction)"
    assert not Verdict("o", "x", "r").identical  # no weights compared: never identical
    keys = ["memory/rss_mb", "memory/peak_mb", "system/cpu_utilization_percentage", "progress", "train/env_steps_per_s",
            "sweep/wall_s", "latency/p50_ms", "train/loss", "val/sharpe_per_step", "test/steps", "epoch"]  # fmt: skip
    assert [k for k in keys if metric_excluded(k)] == keys[:7]  # the machine's samples (system/*) are not the training's
    assert (
        excluded_summary(keys[:7]) == "memory/* (2), system/* (1), progress, train/env_steps_per_s, sweep/wall_s, latency/p50_ms"
    )


def test_a_registered_version_names_the_run_its_weights_came_from():
    from foxhunt.runs.reproduce import ReproduceError, resolve_target
    from foxhunt.runs.store import ModelVersion

    class Store:
        tracking_uri = "sqlite:///x"

        def get_version_by_alias(self, name, alias):
            return (
                ModelVersion(name, "3", "cell", "src", {"weights_run_id": "fold"}) if (name, alias) == ("m", "champion") else None
            )

        def get_version(self, name, version):
            return ModelVersion(name, version, "plain", "src", {}) if name == "m" else None

    store = Store()
    assert [resolve_target(store, t) for t in ("abc", "models:/m@champion", "models:/m/2")] == ["abc", "fold", "plain"]
    for bad in ("models:/m@other", "models:/m", "models:/m/x/y"):
        with pytest.raises(ReproduceError, match=bad):
            resolve_target(store, bad)


@pytest.mark.parametrize("content", ['{"version": 1, "packages": "numpy", "python": {}, "digest": "x"}', "[1, 2]", "not json {"])
def test_a_provenance_file_read_back_that_is_not_foxhunts_is_one_line(tmp_path, content):
    from foxhunt.runs.reproduce import ReproduceError, checked_provenance

    path = tmp_path / ENVIRONMENT_FILE
    path.write_text(content)
    with pytest.raises(ReproduceError, match=r"^run r: provenance/environment.json: ") as refused:
        checked_provenance(path, f"run r: {PROVENANCE_FOLDER}/{ENVIRONMENT_FILE}", ENVIRONMENT_FILE)
    assert "\n" not in str(refused.value)


def test_a_resumed_runs_threads_are_its_last_recorded_attempts():
    """A killed first attempt logs no device.json (written as its training ends): the reproduction
    of a resumed run took the machine's default threads, said "not recorded by the original" and
    differed (found by a helper probing kill and resume)."""
    from foxhunt.runs.provenance import DATA_FILE, DEVICE_FILE
    from foxhunt.runs.reproduce import Original

    def original(provenance):
        return Original(run=None, config=None, config_path=Path("config.yaml"), checkpoints={}, provenance=provenance)

    killed_first = original({"original": {DATA_FILE: {}}, "resumed-1": {DEVICE_FILE: {"torch_threads": 1}}})
    assert killed_first.threads == 1 and DEVICE_FILE in killed_first.recorded()
    many = {
        "original": {DEVICE_FILE: {"torch_threads": 4}},
        **{f"resumed-{n}": {DEVICE_FILE: {"torch_threads": n}} for n in (2, 10, 3)},
    }
    assert original(many).threads == 10  # the last attempt (10th), not the last by name (resumed-3)
    assert original({"original": {}}).threads is None


def test_a_stored_config_is_checked_by_its_logged_digest_else_by_its_config_hash(tmp_path):
    """The run's config.sha256 tag decides (a roll's challenger, whose data.cache_dir is a literal
    path, hashed otherwise and was refused, so no roll promoted: found by a helper); a run logged
    before the tag falls back to its config_hash; a run with neither is refused."""
    from foxhunt.config.schema import resolved_config
    from foxhunt.errors import ConfigError
    from foxhunt.runs.provenance import file_sha256
    from foxhunt.training.reproduce import check_stored_hash, stored_hash

    stored = OmegaConf.create(resolved_config(compose_train_config(["model=dqn", "trainer=smoke"], tmp_path)))
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(stored))
    check_stored_hash(stored, {Tag.CONFIG_DIGEST: file_sha256(path), Tag.CONFIG_HASH: "not-checked"}, "run r", path)
    check_stored_hash(stored, {Tag.CONFIG_HASH: stored_hash(stored)}, "run r", path)
    for tags, line in (({Tag.CONFIG_DIGEST: "0" * 64}, "config.yaml is not the file its run logged"),
                       ({Tag.CONFIG_HASH: "0" * 16}, "config.yaml hashes to "),
                       ({}, "its run has no config.sha256 or config_hash tag")):  # fmt: skip
        with pytest.raises(ConfigError, match=line):
            check_stored_hash(stored, tags, "run r", path)
