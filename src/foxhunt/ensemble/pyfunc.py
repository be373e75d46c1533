"""A registered member as an MLflow ``pyfunc`` model, so MLflow's tools can use it directly.

:func:`save_member_model` writes the model folder a registered version is made of, as MLflow
"models from code": the ``MLmodel`` file, the code file :mod:`foxhunt.ensemble.pyfunc_entry`
(copied as ``pyfunc_entry.py``; MLflow runs it to build :class:`FoxhuntMember`, so loading a
version runs foxhunt's code and ``torch.load(weights_only=True)``, and no pickle is written or
run), the member's files under ``artifacts/`` (:mod:`foxhunt.ensemble.member_files`), the
foxhunt wheel and pinned requirements that rebuild its environment
(:mod:`foxhunt.ensemble.model_env`), a signature and an input example.

The signature: a frame of 1-minute bars in (``ts``, ``open``, ``high``, ``low``, ``close``,
``volume``), one row per bar out (``position``, -1/0/1; ``signal``, the
summed median forecast of a forecaster, null for an agent or a bar before the member is warm:
``None`` in the frame, so ``mlflow models serve`` answers JSON ``null``, never ``NaN``). The
price and volume columns are typed ``any``: MLflow's schema check casts only where numpy calls
it safe, so a ``double`` column refused what users hold (an integer volume or price column, which
is what pandas reads a CSV of whole numbers as); :func:`bar_rows` takes any numeric type and
refuses anything else naming the column and row. ``ts`` stays ``long`` (int64 nanoseconds since
the epoch): typed ``any``, ``mlflow models serve`` read a JSON body's integers as float64, which
cannot hold a nanosecond time exactly. A bad
bar (out of order, non-finite, off the tick grid, ...) is an ``MlflowException`` with
``INVALID_PARAMETER_VALUE`` naming the bar, which ``mlflow models serve`` answers with HTTP 400.

**What loading trusts.** MLflow runs the folder's code file to load it (models from code): a
version whose ``pyfunc_entry.py`` was edited in the artifact store runs the edit, before any
check of foxhunt's can run. Once foxhunt's code runs, :func:`verify_logged_folder` compares the
folder's files with the digests recorded in the tracking store when the version was registered,
so edited weights, config or statistics are refused. foxhunt's own commands (``replay``,
``serve``, ``paper``, ``export``, ...) never run a version's code and verify every file first.

``mlflow.pyfunc.load_model("models:/foxhunt-tft-es@champion").predict(bars)`` (and so
``mlflow models serve``) streams the given bars through a fresh engine holding only this
member: the first rows prime the features (``warmup_bars``, flat) and forecasters decide once
``seq_len`` bars have arrived, so a request carries the history it is decided on (the input
example does: bars of the run's validation split, enough to warm up and decide). The ensemble and
its HTTP server keep one stream per symbol instead (``foxhunt ensemble serve``).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import weakref
from importlib.resources import files
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.models.signature import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import AnyType, ColSpec, Schema
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.ensemble.engine import StreamingEngine
from foxhunt.ensemble.member_files import CODE_FILE, DATASET_FILE, DIGESTS_TAG, MEMBER_FILE, RegistryError, check_digests
from foxhunt.ensemble.rebuild import build_member
from foxhunt.runs.store import RunStore

BAR_FIELDS = ("ts", "open", "high", "low", "close", "volume")
WHEEL_ARTIFACT = "foxhunt_wheel"


def _signature():
    # ts typed: JSON's integers reach predict exact (typed any, mlflow models serve read them as float64);
    # the prices and volume any: bar_rows converts and checks them (module doc)
    inputs = Schema([ColSpec("long", "ts"), *(ColSpec(AnyType(), c) for c in BAR_FIELDS[1:])])
    outputs = Schema([ColSpec("long", "position"), ColSpec("double", "signal", required=False)])
    return ModelSignature(inputs=inputs, outputs=outputs)


class FoxhuntMember(PythonModel):
    """pyfunc wrapper of one ensemble member (see the module doc)."""

    def load_context(self, context) -> None:
        threads = _packaged("ensemble", "default").get("torch_threads")
        if threads:  # pinned as the ensemble is (ensemble.torch_threads): batch-1 steps lose to more threads
            torch.set_num_threads(int(threads))
        member_file = Path(context.artifacts["member"])
        folder = member_file.parent.parent
        name = verify_logged_folder(folder)
        info = json.loads(member_file.read_text())
        # A TFT's ONNX graphs are written to a scratch folder: the model folder may be read-only.
        scratch = Path(tempfile.mkdtemp(prefix="foxhunt-pyfunc-"))
        weakref.finalize(self, shutil.rmtree, scratch, True)
        self.member, self.inputs, self.info = build_member(
            folder, name or f"foxhunt-{info['family']}-{info['asset']}", info["asset"], "fp32", "auto", "cpu",
            probe_calls=50, workdir=scratch,
        )  # fmt: skip
        self.asset = AssetSpec(**json.loads(Path(context.artifacts["dataset"]).read_text())["asset"])
        self.engine: StreamingEngine | None = None

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if self.engine is None:
            self.engine = StreamingEngine([self.member], {self.member.name: self.inputs}, self.asset, rule="majority",
                                          origin="pyfunc input")  # fmt: skip
        engine = self.engine
        frame = pd.DataFrame(model_input)
        missing = [c for c in BAR_FIELDS if c not in frame.columns]
        if missing:
            raise MlflowException(
                f"bars lack the column(s) {', '.join(missing)} (need {', '.join(BAR_FIELDS)})", INVALID_PARAMETER_VALUE
            )
        bars = bar_rows(frame)
        stream = engine.open_stream("request")  # a fresh stream per request: its bars carry their history
        positions, signals = [], []
        try:
            for bar in bars:
                result = engine.step_many([(stream, bar)])[0]
                if isinstance(result, Exception):  # a bad bar (foxhunt.data.errors.BarDataError): one line naming it
                    raise MlflowException(str(result), INVALID_PARAMETER_VALUE) from None
                decision = result.decisions.get(self.member.name)
                positions.append(0 if decision is None else decision.position)
                signals.append(None if decision is None or decision.signal is None else float(decision.signal))
        finally:
            engine.close_stream(stream)
        return pd.DataFrame({"position": np.asarray(positions, dtype=np.int64), "signal": pd.Series(signals, dtype=object)})


def bar_rows(frame: pd.DataFrame) -> list[tuple[int, float, float, float, float, float]]:
    """The frame's bars as ``(ts_ns, open, high, low, close, volume)``: ``ts`` as the signature
    typed it (int64), the others numbers of any numeric type (module doc); anything else is an
    ``MlflowException`` naming the column and row. The values are checked by the engine, as every
    stream's are."""
    values = {name: _numbers(frame[name], name) for name in BAR_FIELDS[1:]}
    return [(ts, *(values[name][i] for name in BAR_FIELDS[1:])) for i, ts in enumerate(_nanoseconds(frame["ts"]))]  # type: ignore[misc]


def _nanoseconds(column: pd.Series) -> list[int]:
    """``ts`` as integers: called without MLflow's signature check, True was the time 1 ns, 1.7e18
    was cut to an integer and a Timestamp or text a TypeError or ValueError traceback (found by a
    helper probing the data); each is an ``MlflowException`` naming the row."""
    values = column.tolist()
    for row, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise MlflowException(f"ts, row {row}: {str(value)[:64]!r} is not integer nanoseconds since 1970 (UTC)",
                                  INVALID_PARAMETER_VALUE)  # fmt: skip
    return [int(value) for value in values]


def _numbers(column: pd.Series, name: str) -> list[float]:
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        return column.to_numpy(dtype=np.float64).tolist()
    values = column.tolist()
    for row, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise MlflowException(f"{name}, row {row}: {str(value)[:64]!r} is not a number", INVALID_PARAMETER_VALUE)
    return [float(v) for v in values]


#: Folders :func:`save_member_model` wrote in this process and nothing has logged yet (resolved
#: paths): the only folders loaded without a logged model to verify against.
_SAVED_HERE: set[Path] = set()


def verify_logged_folder(folder: Path) -> str | None:
    """Check a pyfunc model folder that names its logged model (``model_id`` in its ``MLmodel``)
    against the file digests the tracking store recorded for that model when it was registered
    (:func:`foxhunt.ensemble.member_files.check_digests`), before any of its data is read; the
    store is MLflow's current tracking URI. Only a folder this process has just saved and not
    yet logged (``register``'s own check before anything is written) may name no model: None.
    Any other folder without a ``model_id`` is refused: the id is a line of the folder's own
    ``MLmodel``, and deleting it loaded edited weights unchecked (found by a helper probing the
    registry). MLflow has already run the folder's code file when this runs (module doc): this
    guards the data; foxhunt's own commands guard both."""
    model_id = Model.load(str(folder / "MLmodel")).model_id
    if not model_id:
        if Path(folder).resolve() in _SAVED_HERE:
            return None
        raise RegistryError(f"{folder}: its MLmodel names no logged model (model_id), so its files cannot be verified "
                            "against the tracking store; load a registered version (models:/<name>/<version>)")  # fmt: skip
    origin = f"logged model {model_id}"
    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():  # never made here
        raise RegistryError(f"{origin}: the tracking store {uri} does not exist, so its files cannot be verified; set "
                            "MLFLOW_TRACKING_URI to the store it was registered in")  # fmt: skip
    tags = RunStore(uri).logged_model_tags(model_id)
    if tags is None:
        raise RegistryError(f"{origin}: not in the tracking store {uri}, so its files cannot be verified; set "
                            "MLFLOW_TRACKING_URI to the store it was registered in")  # fmt: skip
    check_digests(folder, tags.get(DIGESTS_TAG), origin, extra_files=True)  # MLflow may add files of its own
    return origin


def _packaged(group: str, name: str) -> dict:
    """A config shipped with foxhunt (``conf/<group>/<name>.yaml``)."""
    plain = OmegaConf.to_container(OmegaConf.create(files("foxhunt.conf").joinpath(group, f"{name}.yaml").read_text()))
    assert isinstance(plain, dict)  # a config group's file is a mapping
    return plain


def save_member_model(folder: Path, weights: Path, config: Path, manifest: dict, member: dict, environment,
                      input_example) -> Path:  # fmt: skip
    """Write the pyfunc model folder of one member (nothing is logged anywhere): the code file,
    the member's files, ``environment`` (:class:`foxhunt.ensemble.model_env.ModelEnvironment`)
    and ``input_example`` (a frame of bars)."""
    _SAVED_HERE.add(Path(folder).resolve())  # MLflow loads it to check the example before save_model returns
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        (scratch / DATASET_FILE).write_text(json.dumps(manifest, indent=1))
        (scratch / MEMBER_FILE).write_text(json.dumps(member, indent=1))
        artifacts = {"weights": str(weights), "config": str(config), "dataset": str(scratch / DATASET_FILE),
                     "member": str(scratch / MEMBER_FILE)}  # fmt: skip
        if environment.wheel is not None:
            artifacts[WHEEL_ARTIFACT] = str(environment.wheel)
        quiet = logging.getLogger("mlflow.pyfunc")
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # its "Validating input example" line, one per version
        try:
            mlflow.pyfunc.save_model(
                path=str(folder), python_model=str(CODE_FILE), artifacts=artifacts, signature=_signature(),
                input_example=input_example, pip_requirements=environment.requirements,
            )  # fmt: skip
        finally:
            quiet.setLevel(level)
    return folder


def check_model_folder(folder: Path, example) -> None:
    """Load the saved folder as MLflow would (``mlflow.pyfunc.load_model``) and predict its input
    example: a folder that cannot answer is never registered."""
    model = mlflow.pyfunc.load_model(str(folder))
    answer = model.predict(example)
    if len(answer) != len(example):
        raise AssertionError(f"pyfunc answered {len(answer)} rows for {len(example)} bars")


def stamp_logged_model(folder: Path, model_id: str, run_id: str, artifact_location: str) -> None:
    """Write the logged model's id, run and location into the folder's ``MLmodel``, as
    ``Model.log`` does before it uploads a folder."""
    _SAVED_HERE.discard(Path(folder).resolve())  # logged now: verified against the store whenever loaded
    mlmodel = folder / "MLmodel"
    model = Model.load(str(mlmodel))
    model.model_id = model.model_uuid = model_id
    model.run_id, model.artifact_path = run_id, artifact_location
    model.save(str(mlmodel))
