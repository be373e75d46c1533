"""A registered version whose files are missing or damaged: every command that loads it says
so in one line naming the version and the file (exit 2), serve before it prints its URL."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
from ensemble_helpers import FAST, SMALL, cli, client, tracking


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A store with one registered DQN version, and a copy of its model folder to restore."""
    from configs import compose_train_config
    from foxhunt.training.cell import train

    root = tmp_path_factory.mktemp("damaged")
    train(compose_train_config(["model=dqn", *FAST, *SMALL["dqn"], f"paths.output_dir={root / 'outputs' / 'dqn'}"], root))
    assert cli(root, "ensemble", "register", "ensemble.models=[dqn]", "ensemble.gate=none").exit_code == 0
    c = client(root)
    version = c.get_model_version("foxhunt-dqn-es", "1")
    location = c.get_logged_model(version.source.removeprefix("models:/")).artifact_location  # a logged model's files
    folder = Path(urlparse(location).path)
    assert (folder / "MLmodel").is_file()
    backup = root / "backup"
    shutil.copytree(folder, backup)
    return root, folder, backup


def _damage(folder, how: str) -> None:
    artifacts = folder / "artifacts"
    if how == "weights-cut":
        data = (artifacts / "weights.pt").read_bytes()
        (artifacts / "weights.pt").write_bytes(data[: len(data) // 3])
    elif how == "member-json":
        (artifacts / "member.json").write_text("{not json")
    elif how == "config-yaml":
        (artifacts / "config.yaml").write_text("model: [unclosed\n")
    elif how == "dataset-missing":
        (artifacts / "dataset.json").unlink()
    elif how == "code-file":
        (folder / "pyfunc_entry.py").write_text("import os\nos.system('echo planted')\n")
    elif how == "folder-gone":
        shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("weights-cut", "registry error: models:/foxhunt-dqn-es@champion: artifacts/weights.pt is not the file registered"),
        ("member-json", "registry error: models:/foxhunt-dqn-es@champion: artifacts/member.json is not the file registered"),
        ("config-yaml", "registry error: models:/foxhunt-dqn-es@champion: artifacts/config.yaml is not the file registered"),
        ("dataset-missing", "registry error: models:/foxhunt-dqn-es@champion: artifacts/dataset.json is missing from its files"),
        ("code-file", "registry error: models:/foxhunt-dqn-es@champion: pyfunc_entry.py is not the file registered"),
        ("folder-gone", "registry error: models:/foxhunt-dqn-es@champion: MLmodel is missing from its files"),
    ],
)
@pytest.mark.parametrize("command", ["replay", "serve"])
def test_a_damaged_version_is_one_line_for_every_command(registered, how, expected, command):
    root, folder, backup = registered
    _damage(folder, how)
    try:
        result = cli(root, "ensemble", command, "ensemble.models=[dqn]", "data.source.days=4")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(backup, folder)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert lines[-1].startswith(f"foxhunt ensemble {command}: {expected}"), lines[-1]
    assert "register it again" in lines[-1] and "Traceback" not in result.output
    assert not any("http://" in line for line in lines)  # serve: refused before it says where it listens


# ----------------------------------------------------------------------------- trust: content, not structure
def _version_tags(root):
    return client(root).get_model_version("foxhunt-dqn-es", "1").tags


@pytest.fixture
def restored(registered):
    """The registered folder and its version's digest record, put back after the test."""
    from foxhunt.ensemble.member_files import DIGESTS_TAG

    root, folder, backup = registered
    recorded = _version_tags(root)[DIGESTS_TAG]
    yield root, folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(backup, folder)
    client(root).set_model_version_tag("foxhunt-dqn-es", "1", DIGESTS_TAG, recorded)


def _rerecord(root, folder) -> None:
    """An attacker who can write the registry database too: the digests recorded anew."""
    from foxhunt.ensemble.member_files import DIGESTS_TAG, digests_tag

    client(root).set_model_version_tag("foxhunt-dqn-es", "1", DIGESTS_TAG, digests_tag(folder))


def _replay(root):
    result = cli(root, "ensemble", "replay", "ensemble.models=[dqn]", "data.source.days=4")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return lines[-1]


def _edit_one_weight(path: Path, value: float) -> None:
    import torch

    state = torch.load(path, weights_only=True)
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[key].view(-1)[0] = value
    torch.save(state, path)


def test_a_weight_file_changed_by_one_value_is_refused_by_name(restored):
    root, folder = restored
    _edit_one_weight(folder / "artifacts" / "weights.pt", 0.123)
    line = _replay(root)
    assert "artifacts/weights.pt is not the file registered" in line and "refused, nothing read from it" in line, line


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("digests-gone", "registered without the digests of its files"),
        ("file-added", "artifacts/extra.pt was not registered with it"),
        ("digests-garbage", "its registry record of file digests (foxhunt.files_sha256) is damaged"),
    ],
)  # fmt: skip
def test_a_version_whose_files_cannot_be_verified_is_refused(restored, how, expected):
    root, folder = restored
    c = client(root)
    if how == "digests-gone":
        c.delete_model_version_tag("foxhunt-dqn-es", "1", "foxhunt.files_sha256")
    elif how == "file-added":
        (folder / "artifacts" / "extra.pt").write_bytes(b"\0")
    else:
        c.set_model_version_tag("foxhunt-dqn-es", "1", "foxhunt.files_sha256", '{"MLmodel": "nothex"}')
    assert expected in _replay(root)


def _plant_module(tmp_path, monkeypatch) -> Path:
    """A module whose import (or call) leaves a marker file: what a planted target would run."""
    marker = tmp_path / "ran"
    (tmp_path / "planted_payload.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('import')\n"
        f"def Payload(*args, **kwargs):\n    Path({str(marker)!r}).write_text('call')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("model.module", "model.module._target_='planted_payload.Payload': not one of foxhunt's own classes"),
        ("data.source", "data.source._target_='planted_payload.Payload': not one of foxhunt's own classes"),
        ("model.module.nested", "model.module.nested._target_='planted_payload.Payload': not one of foxhunt's own"),
        ("precision", "precision._target_='planted_payload.Payload'"),
        ("env", "model.module.hidden_sizes='${oc.env:HOME}': a stored config is resolved"),
    ],
)  # fmt: skip
def test_a_planted_target_runs_nothing_and_is_refused(restored, tmp_path, monkeypatch, where, expected):
    """Even with the digests recorded anew (registry and artifact store both written), a stored
    config naming code is refused before anything in it is imported."""
    import sys

    import yaml

    root, folder = restored
    marker = _plant_module(tmp_path, monkeypatch)
    path = folder / "artifacts" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    if where == "model.module.nested":
        cfg["model"]["module"]["nested"] = {"_target_": "planted_payload.Payload"}
    elif where == "env":
        cfg["model"]["module"]["hidden_sizes"] = "${oc.env:HOME}"
    else:
        node = cfg
        for part in where.split("."):
            node = node[part]
        node["_target_"] = "planted_payload.Payload"
    path.write_text(yaml.safe_dump(cfg))
    _rerecord(root, folder)
    line = _replay(root)
    assert "registry error: foxhunt-dqn-es: config.yaml: " in line and expected in line, line
    assert not marker.exists() and "planted_payload" not in sys.modules


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("std-zero", "dataset.json: observed_std: must be"),
        ("mean-nan", "dataset.json: observed_mean: must be"),
        ("group-out-of-range", "dataset.json: groups: each must list feature indices"),
        ("asset-other", "dataset.json: asset.key='nq' but member.json says 'es'"),
        ("weight-nan", "weights.pt: "),
        ("family-other", "member.json: family='tft' but config.yaml says 'dqn'"),
        ("value-inf", "member.json: value=inf: must be a finite number"),
        # a 7.28 TiB allocation's MemoryError traceback before (found by probing the registry)
        ("window-huge", "dataset.json: not a feature or asset setting foxhunt accepts"),
        ("nested-deep", "member.json is damaged (nested too deep)"),  # a RecursionError traceback before
    ],
)  # fmt: skip
def test_stored_values_are_checked_for_meaning(restored, how, expected):
    import json

    root, folder = restored
    artifacts = folder / "artifacts"
    manifest = json.loads((artifacts / "dataset.json").read_text())
    member = json.loads((artifacts / "member.json").read_text())
    if how == "std-zero":
        manifest["observed_std"][0] = 0.0
    elif how == "mean-nan":
        manifest["observed_mean"][0] = float("nan")
    elif how == "group-out-of-range":
        manifest["groups"]["observed"][0] = 99
    elif how == "asset-other":
        manifest["asset"]["key"] = "nq"
    elif how == "family-other":
        member["family"] = "tft"
    elif how == "value-inf":
        member["value"] = float("inf")
    elif how == "window-huge":
        manifest["feature_config"]["volume_bars"] = 10**12
    elif how == "nested-deep":
        member = None
    else:
        _edit_one_weight(artifacts / "weights.pt", float("nan"))
    (artifacts / "dataset.json").write_text(json.dumps(manifest))
    (artifacts / "member.json").write_text(json.dumps(member) if member is not None else "[" * 200_000 + "]" * 200_000)
    _rerecord(root, folder)
    line = _replay(root)
    assert f"registry error: foxhunt-dqn-es: {expected}" in line and "register it again" in line, line


def test_the_pyfunc_loader_refuses_an_edited_weight(restored):
    """MLflow's loader runs foxhunt's code file, which verifies the data files against the
    digests the tracking store recorded for the logged model."""
    import mlflow.pyfunc

    from foxhunt.ensemble.member_files import RegistryError

    root, folder = restored
    _edit_one_weight(folder / "artifacts" / "weights.pt", 0.5)
    with tracking(root), pytest.raises(RegistryError, match=r"artifacts/weights.pt is not the file registered"):
        mlflow.pyfunc.load_model("models:/foxhunt-dqn-es@champion")


def test_the_pyfunc_loader_of_a_folder_refuses_a_store_that_does_not_hold_it(registered, tmp_path, monkeypatch):
    """A version's folder loaded by path is verified against the store MLFLOW_TRACKING_URI names;
    a store that does not exist is said so, and never made."""
    import mlflow.pyfunc
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from foxhunt.ensemble.member_files import RegistryError

    root, folder, _ = registered
    missing = tmp_path / "nowhere" / "mlflow.db"
    with (
        _use_tracking_uri(f"sqlite:///{missing}"),
        pytest.raises(RegistryError, match=r"does not exist, so its files cannot be verified"),
    ):
        mlflow.pyfunc.load_model(str(folder))
    assert not missing.exists()
    with tracking(root):
        assert mlflow.pyfunc.load_model(str(folder)) is not None
