"""A registered member as an MLflow ``pyfunc`` model, so MLflow's tools can use it directly.

:func:`save_member_model` writes the model folder a registered version is made of (the
``MLmodel`` file, this wrapper and the member's artifacts, see :mod:`foxhunt.ensemble.registry`),
with a signature: a frame of 1-minute bars in (``ts`` as UTC nanoseconds, ``open``, ``high``,
``low``, ``close``, ``volume``), one row per bar out (``position``; ``signal``, the summed
median forecast of a forecaster, NaN for an agent or a bar before the member is warm).

``mlflow.pyfunc.load_model("models:/foxhunt-tft-es@champion").predict(bars)`` (and so
``mlflow models serve``) streams the given bars through a fresh engine holding only this
member: the first rows prime the features (``warmup_bars``, flat) and forecasters decide once
``seq_len`` bars have arrived, so a request carries the history it is decided on. The fleet and
its HTTP server keep one stream per symbol instead (``foxhunt ensemble serve``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from foxhunt.ensemble.member_files import DATASET_FILE, MEMBER_FILE

BAR_FIELDS = ("ts", "open", "high", "low", "close", "volume")


def _signature():
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    inputs = Schema([ColSpec("long", "ts"), *(ColSpec("double", c) for c in BAR_FIELDS[1:])])
    outputs = Schema([ColSpec("long", "position"), ColSpec("double", "signal")])
    return ModelSignature(inputs=inputs, outputs=outputs)


class FoxhuntMember(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of one fleet member (see the module doc)."""

    def load_context(self, context) -> None:
        import torch

        from foxhunt.ensemble.fleet import build_member

        threads = _packaged("ensemble", "default").get("torch_threads")
        if threads:  # pinned as the fleet is (ensemble.torch_threads): batch-1 steps lose to more threads
            torch.set_num_threads(int(threads))

        folder = Path(context.artifacts["member"]).parent.parent
        info = json.loads(Path(context.artifacts["member"]).read_text())
        self.member, self.inputs, self.info = build_member(
            folder, f"foxhunt-{info['family']}-{info['asset']}", info["asset"], "fp32", "auto", "cpu", probe_calls=50,
        )  # fmt: skip
        record = json.loads(Path(context.artifacts["dataset"]).read_text())
        from foxhunt.assets import AssetSpec

        fields = dict(record["asset"])
        if "calendar" not in fields:  # registered before assets named their exchange calendar
            fields["calendar"] = _packaged_asset(fields["key"])["calendar"]
        self.asset = AssetSpec(**fields)

    def predict(self, context, model_input, params: dict[str, Any] | None = None):
        import numpy as np
        import pandas as pd

        from foxhunt.ensemble.engine import StreamingEngine

        if getattr(self, "engine", None) is None:
            self.engine = StreamingEngine([self.member], {self.member.name: self.inputs}, self.asset, rule="majority",
                                          origin="pyfunc input")  # fmt: skip
        stream = self.engine.open_stream("request")  # a fresh stream per request: its bars carry their history
        frame = pd.DataFrame(model_input)
        positions, signals = [], []
        try:
            for row in frame[list(BAR_FIELDS)].itertuples(index=False):
                bar = (int(row.ts), float(row.open), float(row.high), float(row.low), float(row.close), float(row.volume))
                result = self.engine.step_many([(stream, bar)])[0]
                if isinstance(result, Exception):
                    raise result
                decision = result.decisions.get(self.member.name)
                positions.append(0 if decision is None else decision.position)
                signals.append(np.nan if decision is None or decision.signal is None else decision.signal)
        finally:
            self.engine.close_stream(stream)
        return pd.DataFrame({"position": np.asarray(positions, dtype=np.int64), "signal": np.asarray(signals, dtype=np.float64)})


def _packaged(group: str, name: str) -> dict:
    """A config shipped with foxhunt (``conf/<group>/<name>.yaml``)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(files("foxhunt.conf").joinpath(group, f"{name}.yaml")))


def _packaged_asset(key: str) -> dict:
    """The asset config shipped with foxhunt (``conf/asset/<key>.yaml``)."""
    return _packaged("asset", key)


def save_member_model(folder: Path, weights: Path, config: Path, record: dict, member: dict) -> Path:
    """Write the pyfunc model folder of one member (nothing is logged anywhere)."""
    import torch

    import foxhunt

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / DATASET_FILE).write_text(json.dumps(record, indent=1))
        (scratch / MEMBER_FILE).write_text(json.dumps(member, indent=1))
        mlflow.pyfunc.save_model(
            path=str(folder),
            python_model=FoxhuntMember(),
            artifacts={
                "weights": str(weights), "config": str(config),
                "dataset": str(scratch / DATASET_FILE), "member": str(scratch / MEMBER_FILE),
            },
            signature=_signature(),
            pip_requirements=[f"foxhunt=={getattr(foxhunt, '__version__', '0.1.0')}", f"torch>={torch.__version__.split('+')[0]}"],
        )  # fmt: skip
    return folder
