"""A registered version whose files are missing or damaged: every command that loads it says
so in one line naming the version and the file (exit 2), serve before it prints its URL."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
from fleet_helpers import FAST, SMALL, cli, client


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
        ("weights-cut", "registry error: foxhunt-dqn-es: weights.pt is damaged"),
        ("member-json", "registry error: foxhunt-dqn-es: member.json is damaged (JSONDecodeError"),
        ("config-yaml", "registry error: foxhunt-dqn-es: config.yaml is damaged"),
        ("dataset-missing", "registry error: foxhunt-dqn-es: dataset.json is missing from its files"),
        ("code-file", "registry error: models:/foxhunt-dqn-es@champion: pyfunc_entry.py is not foxhunt's"),
        ("folder-gone", "registry error: models:/foxhunt-dqn-es@champion: its files (models:/m-"),
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
