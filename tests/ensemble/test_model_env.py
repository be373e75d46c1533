"""The environment a registered version rebuilds in: foxhunt's wheel built from the source
folder it was installed from (its current code and dependencies), pinned requirements, the
other ways foxhunt may be installed; and (slow) ``mlflow models serve --env-manager virtualenv``
rebuilding it from the model folder alone, in a clean folder with a fresh mlflow."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
import tomllib

from foxhunt.ensemble import model_env
from foxhunt.ensemble.member_files import RegistryError

REPO = Path(__file__).resolve().parents[2]


def _declared() -> list[str]:
    from packaging.requirements import Requirement

    return [Requirement(r).name for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]


def test_the_wheel_holds_the_code_and_configs_and_every_dependency_is_pinned(tmp_path):
    env = model_env.model_environment(tmp_path, "artifacts")
    assert env.wheel is not None and env.requirements[0] == f"artifacts/{env.wheel.name}"
    with zipfile.ZipFile(env.wheel) as archive:
        names = set(archive.namelist())
    assert {"foxhunt/ensemble/pyfunc_entry.py", "foxhunt/ensemble/pyfunc.py", "foxhunt/conf/ensemble/default.yaml",
            "foxhunt/conf/ensemble.yaml"} <= names  # fmt: skip
    pins = dict(r.split("==") for r in env.requirements[1:])
    assert sorted(pins) == sorted(_declared())  # what pyproject declares now, not the venv's stale metadata
    assert all("+" not in v for v in pins.values())  # torch==2.13.0, never 2.13.0+cpu


class _Dist:
    version = "9.9.9"
    requires = ["numpy>=1.26", "pytest>=8; extra == 'test'"]

    def __init__(self, direct_url):
        self.direct_url = direct_url

    def read_text(self, name):
        return None if self.direct_url is None else json.dumps(self.direct_url)


@pytest.mark.parametrize(
    ("direct_url", "first"),
    [
        (None, "foxhunt==9.9.9"),  # from an index: that index rebuilds it
        ({"url": "https://example.org/foxhunt-9.9.9-py3-none-any.whl", "archive_info": {}}, "foxhunt @ https://example.org/foxhunt-9.9.9-py3-none-any.whl"),
    ],
)  # fmt: skip
def test_foxhunt_from_an_index_or_a_url_is_named_not_bundled(monkeypatch, tmp_path, direct_url, first):
    monkeypatch.setattr(model_env.importlib.metadata, "distribution", lambda name: _Dist(direct_url))
    env = model_env.model_environment(tmp_path, "artifacts")
    assert env.wheel is None and env.requirements[0] == first
    assert env.requirements[1].startswith("numpy==") and len(env.requirements) == 2  # the test extra is not pinned


def test_foxhunt_from_a_wheel_file_bundles_that_file_and_a_gone_one_is_one_line(monkeypatch, tmp_path):
    wheel = tmp_path / "foxhunt-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    monkeypatch.setattr(model_env.importlib.metadata, "distribution",
                        lambda name: _Dist({"url": wheel.as_uri(), "archive_info": {}}))  # fmt: skip
    monkeypatch.setattr(model_env, "_wheel_requires", lambda path: ["numpy>=1.26"])
    (tmp_path / "work").mkdir()
    env = model_env.model_environment(tmp_path / "work", "artifacts")
    assert env.wheel == tmp_path / "work" / wheel.name and env.requirements[0] == f"artifacts/{wheel.name}"
    wheel.unlink()
    with pytest.raises(RegistryError, match=r"^foxhunt was installed from file://.*, which is gone"):
        model_env.model_environment(tmp_path / "work", "artifacts")


def test_a_source_folder_that_is_gone_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(model_env.importlib.metadata, "distribution",
                        lambda name: _Dist({"url": (tmp_path / "gone").as_uri(), "dir_info": {"editable": True}}))  # fmt: skip
    with pytest.raises(RegistryError, match=r"holds no pyproject.toml any more"):
        model_env.model_environment(tmp_path, "artifacts")


@pytest.mark.slow
def test_mlflow_models_serve_rebuilds_the_environment_with_virtualenv(store_root, tmp_path):
    """A clean folder, a fresh venv with only mlflow, the model folder copied in: `mlflow models
    serve --env-manager virtualenv` builds the model's own environment (measured: 121 s, 2.1 GB,
    with pip's cache warm) and answers its input example."""
    import shutil

    from ensemble_helpers import cli
    from mlflow.models import Model

    from foxhunt.ensemble.registry import download_version

    assert cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none").exit_code == 0
    folder, _ = download_version(
        f"sqlite:///{store_root}/mlruns/mlflow.db", "foxhunt-tft-es", "champion", None, tmp_path / "download"
    )
    model = shutil.copytree(folder, tmp_path / "clean" / "model")
    outer = tmp_path / "clean" / "outer"
    import mlflow

    subprocess.run([sys.executable, "-m", "venv", str(outer)], check=True)
    subprocess.run([str(outer / "bin" / "pip"), "install", "-q", f"mlflow=={mlflow.__version__}"], check=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(MLFLOW_ENV_ROOT=str(tmp_path / "envs"), PATH=f"{outer / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(outer / "bin" / "mlflow"), "models", "serve", "-m", str(model), "--env-manager", "virtualenv",
                                    "--host", "127.0.0.1", "--port", str(port)], cwd=tmp_path / "clean", env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        from waiting import wait_until

        def up() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(up, "mlflow models serve --env-manager virtualenv answering /ping", timeout=1800, poll=5)
        example = Model.load(str(model / "MLmodel")).load_input_example(str(model))
        body = json.dumps({"dataframe_split": {"columns": list(example.columns), "data": example.values.tolist()}}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            rows = json.loads(response.read())["predictions"]
        assert len(rows) == len(example) and rows[0]["signal"] is None and isinstance(rows[-1]["signal"], float)
        (python,) = (tmp_path / "envs").glob("*/bin/python")
        where = subprocess.run([str(python), "-c", "import foxhunt; print(foxhunt.__file__)"], capture_output=True, text=True)
        assert str(tmp_path / "envs") in where.stdout  # foxhunt from the model's wheel, not from this checkout
    finally:
        os.killpg(process.pid, signal.SIGKILL)
