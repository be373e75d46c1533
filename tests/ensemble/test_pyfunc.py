"""A registered version as MLflow users take it: models from code (no pickle written or run), an
input example of real bars it answers, and MLflow's own scoring server answering valid JSON
(null, never NaN) and 400 for a bad request."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from ensemble_helpers import cli, tracking

URI = "sqlite:///{root}/mlruns/mlflow.db"


@pytest.fixture(scope="module")
def versions(store_root, tmp_path_factory):
    """The registered DQN and TFT champions, downloaded: {family: folder}."""
    from foxhunt.ensemble.registry import download_version

    result = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    assert result.exit_code == 0, result.output
    work = tmp_path_factory.mktemp("versions")
    uri = URI.format(root=store_root)
    return {f: download_version(uri, f"foxhunt-{f}-es", "champion", None, work / f)[0] for f in ("dqn", "tft")}


def _packaged_ensemble():
    from importlib.resources import files

    from omegaconf import OmegaConf

    return OmegaConf.load(files("foxhunt.conf").joinpath("ensemble", "default.yaml"))


def _example(folder: Path):
    from mlflow.models import Model

    return Model.load(str(folder / "MLmodel")).load_input_example(str(folder))


def test_a_version_is_a_model_from_code_and_loads_without_unpickling_anything(store_root, versions, tmp_path, monkeypatch):
    import cloudpickle
    import mlflow.pyfunc

    from foxhunt.ensemble.member_files import CODE_FILE

    folder = shutil.copytree(versions["dqn"], tmp_path / "dqn")
    assert (folder / CODE_FILE.name).read_bytes() == CODE_FILE.read_bytes()
    assert not list(folder.rglob("*.pkl"))

    marker = tmp_path / "pwned"

    class Planted:  # what a planted pickle would run when unpickled
        def __reduce__(self):
            return (Path.touch, (marker,))

    (folder / "python_model.pkl").write_bytes(pickle.dumps(Planted()))

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was loaded")

    for module in (pickle, cloudpickle):
        monkeypatch.setattr(module, "load", refuse)
        monkeypatch.setattr(module, "loads", refuse)
    with tracking(store_root):  # what it is verified against (foxhunt.ensemble.pyfunc.verify_logged_folder)
        model = mlflow.pyfunc.load_model(str(folder))
    out = model.predict(_example(folder))
    assert not marker.exists() and len(out) == len(_example(folder))


def test_the_input_example_is_real_bars_it_decides_on(store_root, versions):
    import mlflow.pyfunc

    for family, folder in versions.items():
        example = _example(folder)
        assert list(example.columns) == ["ts", "open", "high", "low", "close", "volume"]
        assert example["ts"].is_monotonic_increasing and (example["high"] >= example["low"]).all()
        with tracking(store_root):
            out = mlflow.pyfunc.load_model(str(folder)).predict(example)
        assert list(out.columns) == ["position", "signal"] and len(out) == len(example)
        decided = int(_packaged_ensemble().input_example_decided)  # what the CLI's register used
        if family == "tft":  # a forecaster's signal: null until it is warm, then a number on the bars it decides
            assert out["signal"].iloc[0] is None and all(isinstance(v, float) for v in out["signal"].iloc[-decided:])
        else:
            assert out["signal"].isna().all()


def test_bars_are_taken_in_the_types_users_hold_them(store_root, versions):
    """Integer volume and price columns (pandas' type for a CSV of whole numbers) answer as the
    example does: MLflow's typed schema refused them ("Can not safely convert int64 to float64").
    A column of text is one line naming column and row."""
    import mlflow.pyfunc
    import numpy as np
    from mlflow.exceptions import MlflowException

    example = _example(versions["dqn"])
    whole = example.assign(**{c: (example[c] // 1).astype(np.int64) for c in ("open", "high", "low", "close", "volume")})
    with tracking(store_root):
        model = mlflow.pyfunc.load_model(str(versions["dqn"]))
        assert (
            model.predict(example.assign(volume=whole["volume"]))["position"].tolist()
            == model.predict(example)["position"].tolist()
        )
        floats = example.assign(**{c: whole[c].astype(np.float64) for c in whole.columns if c != "ts"})
        assert model.predict(whole)["position"].tolist() == model.predict(floats)["position"].tolist()
        text = example.assign(close=example["close"].astype(object).where(example.index != 2, "n/a"))
        with pytest.raises(MlflowException, match="close, row 2: 'n/a' is not a number"):
            model.predict(text)


@pytest.fixture(scope="module")
def scoring(store_root, versions, tmp_path_factory):
    """``mlflow models serve`` (MLflow's scoring server, env-manager local) on the TFT version: a
    function POSTing a body to /invocations and answering (status, text)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from waiting import wait_until

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(versions["tft"]), "--env-manager", "local",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    with open(log, "w") as out:
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its uvicorn
            "MLFLOW_TRACKING_URI": URI.format(root=store_root),
        }  # the store the version is verified against
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def post(body: bytes) -> tuple[int, str]:
        request = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    try:
        wait_until(up, "mlflow models serve answering /ping", timeout=180)
        yield post
    finally:
        os.killpg(process.pid, signal.SIGKILL)


def _frame_body(frame) -> bytes:
    return json.dumps({"dataframe_split": {"columns": list(frame.columns), "data": frame.values.tolist()}}).encode()


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_mlflow_models_serve_answers_json_with_null_not_nan(scoring, versions):
    example = _example(versions["tft"])
    status, text = scoring(_frame_body(example))
    assert status == 200, text
    rows = _strict_json(text)["predictions"]
    assert len(rows) == len(example) and rows[0]["signal"] is None and isinstance(rows[-1]["signal"], float)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("malformed", "Invalid input"),
        ("columns", "ts"),
        ("bad-bar", "volume=-1.0 is negative"),
        ("out-of-order", "not after"),
    ],
)  # fmt: skip
def test_mlflow_models_serve_answers_400_naming_what_is_wrong(scoring, versions, case, message):
    example = _example(versions["tft"]).iloc[:3].copy()
    if case == "bad-bar":
        example.loc[example.index[1], "volume"] = -1.0
    body = {
        "malformed": b"{not json",
        "columns": json.dumps({"dataframe_split": {"columns": ["ts", "open"], "data": [[1, 2.0]]}}).encode(),
        "bad-bar": _frame_body(example),
        "out-of-order": _frame_body(example.iloc[::-1]),
    }[case]
    status, text = scoring(body)
    assert status == 400, text
    assert message in _strict_json(text)["message"]


def test_a_changed_code_file_is_refused_by_foxhunt_in_one_line(store_root, versions, tmp_path):
    from foxhunt.ensemble.member_files import CODE_FILE, RegistryError, check_code_file

    folder = shutil.copytree(versions["dqn"], tmp_path / "dqn")
    (folder / CODE_FILE.name).write_text("import os\nos.system('echo pwned')\n")
    with pytest.raises(RegistryError, match=r"^models:/foxhunt-dqn-es@champion: pyfunc_entry.py is not foxhunt's"):
        check_code_file(folder, "models:/foxhunt-dqn-es@champion")


def test_a_folder_whose_mlmodel_lost_its_model_id_is_refused_not_loaded_unverified(store_root, versions, tmp_path):
    """Edited weights are refused by their digest; deleting model_id from MLmodel (a line of the
    folder's own) skipped the check and scored with the edited weights (found by a helper probing
    the registry). Only a folder this process has just saved may name no logged model."""
    import mlflow.pyfunc
    import torch

    from foxhunt.ensemble.member_files import RegistryError

    folder = shutil.copytree(versions["dqn"], tmp_path / "dqn")
    weights = folder / "artifacts" / "weights.pt"
    state = torch.load(weights, weights_only=True)
    torch.save({k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in state.items()}, weights)
    mlmodel = folder / "MLmodel"
    mlmodel.write_text("".join(line for line in mlmodel.read_text().splitlines(keepends=True)
                               if not line.startswith(("model_id:", "model_uuid:"))))  # fmt: skip
    with tracking(store_root), pytest.raises(RegistryError, match=r"its MLmodel names no logged model \(model_id\)"):
        mlflow.pyfunc.load_model(str(folder))


@pytest.mark.parametrize(
    "ts", [True, 1.7e18, "2024-06-03", None], ids=["bool", "float", "text", "none"]
)  # fmt: skip
def test_a_ts_that_is_not_integer_nanoseconds_names_its_row(ts):
    """Without MLflow's signature check, True was read as the time 1 ns, 1.7e18 was cut to an
    integer, and text a ValueError traceback (found by a helper probing the data)."""
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from foxhunt.ensemble.pyfunc import bar_rows

    good = {"ts": 1_717_200_000_000_000_000, "open": 1.0, "high": 1.0, "low": 1.0, "close": 1.0, "volume": 1}
    assert bar_rows(pd.DataFrame([good]))[0][0] == 1_717_200_000_000_000_000
    frame = pd.DataFrame([good, {**good, "ts": ts}], dtype=object)
    with pytest.raises(MlflowException, match=r"ts, row 1: .* is not integer nanoseconds since 1970"):
        bar_rows(frame)
