"""Each registered member's batch-1 streaming step as a file another language's runtime loads.

``foxhunt ensemble export --format onnx|torchscript`` writes, per member of the ensemble, a folder
``<out>/<registered name>-v<version>/`` with

- ``step.onnx`` (``torch.onnx.export``, opset :data:`OPSET`; ONNX Runtime for C++, Rust, Java,
  C#, JS) or ``step.pt`` (``torch.jit.trace``; libtorch in C++);
- ``member.json``: what turns bars into the graph's inputs and its outputs into a position: the
  feature names in input order, the feature settings, the normalization (``x = (features -
  offset) / scale`` per column), the feature groups, the asset spec, the inputs and outputs
  (names, shapes, dtype) and the decision rule, the registered version it was exported from, the
  weights it holds (``weights``: fp32) and those foxhunt's ensemble decides with
  (``ensemble_weights``: fp32, or int8 by ``ensemble.weights``: the export then decides on fp32
  weights where the ensemble's int8 may differ, said on the command's line; found by a helper
  replaying both: 829 trades against 831).

The step of each model, by what its class offers (:func:`foxhunt.ensemble.members.stream_of`),
as foxhunt's own ensemble runs it (:mod:`foxhunt.ensemble.members`):

- **agents (DQN, PPO)**: ``obs`` (B, n_features + 1): the normalized features of the bar, then the
  position held (-1, 0, 1) -> ``scores`` (B, 3); the new position is ``argmax(scores) - 1``.
- **recurrent forecasters (Mamba-2)**: ``x`` (B, n_features) and the recurrent state ``conv`` (layers, B, conv_dim,
  d_conv) and ``ssm`` (layers, B, heads, head_dim, d_state), zeros for a new stream ->
  ``forecast`` (B, horizon, quantiles) and the next ``conv_out``, ``ssm_out``.
- **window forecasters (TFT, DLinear)**: the window forward: ``static`` (B, n_static), ``known`` (B, seq_len + horizon,
  n_known: the window's bars then the next minutes' calendar), ``observed`` (B, seq_len,
  n_observed) -> ``forecast`` (B, horizon, quantiles).

A forecaster's signal is the sum over the horizon of the median quantile; its position is
``sign(signal)`` where ``|signal| > threshold``, else 0, once ``seq_len`` bars have arrived on a
stream (flat before). Each file is checked as it is written: its runtime (ONNX Runtime,
``torch.jit.load``) against the model on random inputs, the largest difference printed; the
tests replay a split through both and find the positions identical, forecasts within 1e-4.

Export writes only inside ``--out`` (:func:`write_inside`): never through a symbolic link
planted there, and an empty or unwritable ``--out`` is one line.

Written here: ``torch.onnx`` and ``torch.jit`` export graphs; which function of each model is the
streaming step, with which inputs, and what a consumer needs beside it, is foxhunt's.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from torch.onnx import symbolic_helper

from foxhunt.data.streaming import normalizer
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, MemberFiles, RegistryError
from foxhunt.ensemble.members import NoStreamingMember, stream_of
from foxhunt.ensemble.rebuild import rebuild_model
from foxhunt.ensemble.registry import download_version, registered_name, weights_to_load
from foxhunt.errors import UserError

FORMATS = ("onnx", "torchscript")
FILES = {"onnx": "step.onnx", "torchscript": "step.pt"}
SPEC_FILE = "member.json"
EXPORTED_WEIGHTS = "fp32"  # the weights a step is exported with (member.json says which the ensemble decides with)
OPSET = 17
CHECK_BATCH = 4  # random inputs each written file is checked on
SPEC_VERSION = 1
_TMP_SUFFIX = ".tmp"


class _AgentStep(nn.Module):
    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, obs):
        return self.network(obs)


class _RecurrentStep(nn.Module):
    """A recurrent forecaster's step with its per-layer state stacked into two tensors."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.layer_state = type(model.allocate_inference_state(1)[0])  # (conv, ssm) per layer

    def forward(self, x, conv, ssm):
        state = [self.layer_state(conv[i], ssm[i]) for i in range(conv.shape[0])]
        forecast, new = self.model.step(x, state)
        return forecast, torch.stack([s.conv for s in new]), torch.stack([s.ssm for s in new])


class _Window(nn.Module):
    """A window forecaster's forward with the window's three inputs as arguments."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, static, known, observed):
        return self.model({"static": static, "known": known, "observed": observed})


@dataclass
class Step:
    """One family's streaming step: the module, example inputs, their names, the output names,
    which axes are the batch, and the decision rule for the spec."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    outputs: list[str]
    batch_axes: dict[str, int]
    decision: dict[str, Any]


def streaming_step(model, manifest: dict) -> Step:
    """The batch-1 streaming step of ``model`` (module doc), chosen by what its class offers
    (:func:`foxhunt.ensemble.members.stream_of`), with inputs of batch CHECK_BATCH."""
    width, b = len(manifest["feature_names"]), CHECK_BATCH
    stream = stream_of(model)
    if stream == "greedy":
        return Step(_AgentStep(model.acting_network).eval(), {"obs": torch.randn(b, width + 1)}, ["scores"], {"obs": 0, "scores": 0},
                    {"rule": "argmax", "position": "argmax(scores) - 1", "actions": [-1, 0, 1],
                     "obs": "the normalized features, then the position held before this bar"})  # fmt: skip
    forecaster = {"rule": "median_sum", "threshold": float(model.position_threshold), "seq_len": int(model.seq_len),
                  "horizon": int(model.horizon), "median_index": int(model.median_index),
                  "position": "sign(sum(forecast[:, :, median_index], axis=1)) where its absolute value > threshold, "
                              "else 0; flat until seq_len bars have arrived"}  # fmt: skip
    if stream == "recurrent":
        state = model.allocate_inference_state(b)
        conv, ssm = torch.stack([s.conv for s in state]), torch.stack([s.ssm for s in state])
        return Step(_RecurrentStep(model).eval(), {"x": torch.randn(b, width), "conv": torch.randn_like(conv), "ssm": torch.randn_like(ssm)},
                    ["forecast", "conv_out", "ssm_out"], {"x": 0, "conv": 1, "ssm": 1, "forecast": 0, "conv_out": 1, "ssm_out": 1},
                    {**forecaster, "state": "conv and ssm start at zeros for a new stream; each step returns the next"})  # fmt: skip
    groups = manifest["groups"]  # the TFT and every window forecaster: the window's forward
    length = int(model.seq_len) + int(model.horizon)
    inputs = {"static": torch.randn(b, len(groups["static"])), "known": torch.randn(b, length, len(groups["known"])),
              "observed": torch.randn(b, int(model.seq_len), len(groups["observed"]))}  # fmt: skip
    return Step(_Window(model).eval(), inputs, ["forecast"], {"static": 0, "known": 0, "observed": 0, "forecast": 0},
                {**forecaster, "window": "known: the window's bars then the next horizon minutes' calendar rows"})  # fmt: skip


def write_step(step: Step, path: Path, fmt: str) -> float:
    """Write the step's file and check it against the model: the largest |difference| of its
    outputs on the example inputs."""
    names = list(step.inputs)
    args = tuple(step.inputs.values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks traced as constants: the shapes are fixed
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.onnx's TorchScript exporter, still the one without onnxscript
        expected = step.module(*args)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        if fmt == "onnx":
            axes = {name: {axis: "batch"} for name, axis in step.batch_axes.items()}
            _register_rms_norm()
            torch.onnx.export(step.module, args, str(path), input_names=names, output_names=step.outputs,
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)  # fmt: skip
            got = run_onnx(path, {n: t.numpy() for n, t in step.inputs.items()})
        else:
            with _jit_scripting(step.module):
                traced = torch.jit.trace(step.module, args, check_trace=False)
            traced.save(str(path))
            loaded = torch.jit.load(str(path))
            out = loaded(*args)
            got = [t.numpy() for t in ([out] if isinstance(out, torch.Tensor) else out)]
    return max(float(np.max(np.abs(g - e.numpy()))) for g, e in zip(got, expected))


def _rms_norm(g, x, normalized_shape, weight, eps):
    """ONNX of ``aten::rms_norm`` (Mamba-2's gated norm), which torch.onnx's TorchScript exporter
    lacks: ``x / sqrt(mean(x^2 over the normalized dims) + eps)``, times ``weight`` if given."""
    dims = list(range(-len(symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")), 0))
    epsilon = symbolic_helper._get_const(eps, "f", "eps")
    mean = g.op("ReduceMean", g.op("Mul", x, x), axes_i=dims, keepdims_i=1)
    out = g.op("Div", x, g.op("Sqrt", g.op("Add", mean, g.op("Constant", value_t=torch.tensor(epsilon, dtype=torch.float32)))))
    return out if symbolic_helper._is_none(weight) else g.op("Mul", out, weight)


def _register_rms_norm() -> None:
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm, OPSET)


@contextmanager
def _jit_scripting(module: nn.Module):
    """Lightning's flag for a module being traced (``LightningModule.to_torchscript`` sets it):
    without it, tracing reads ``.trainer`` of a module no trainer holds, which raises."""
    flagged = [m for m in module.modules() if hasattr(m, "_jit_is_scripting")]
    for m in flagged:
        m._jit_is_scripting = True  # type: ignore[assignment]  # torch types Module.__setattr__'s value Tensor | Module; any is kept
    try:
        yield
    finally:
        for m in flagged:
            m._jit_is_scripting = False  # type: ignore[assignment]  # as above


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of the ONNX file at ``path`` on ``feeds`` (ONNX Runtime, one thread)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()})


def spec(step: Step, fmt: str, family: str, manifest: dict, source: dict[str, Any]) -> dict[str, Any]:
    """``member.json`` of an exported step (module doc)."""
    width = len(manifest["feature_names"])
    offset, scale = normalizer(
        width, manifest["groups"]["observed"], np.asarray(manifest["observed_mean"]), np.asarray(manifest["observed_std"])
    )
    return {
        "version": SPEC_VERSION, "family": family, "format": fmt, "file": FILES[fmt], **source,
        "inputs": [{"name": n, "shape": ["batch" if step.batch_axes.get(n) == i else d for i, d in enumerate(t.shape)],
                    "dtype": "float32"} for n, t in step.inputs.items()],
        "outputs": step.outputs,
        "features": {"names": list(manifest["feature_names"]), "settings": manifest["feature_config"],
                     "groups": manifest["groups"], "offset": offset.tolist(), "scale": scale.tolist(),
                     "normalize": "x = (features - offset) / scale, per column, as float32"},
        "decision": step.decision,
        "asset": manifest["asset"],
    }  # fmt: skip


@dataclass(frozen=True)
class Exported:
    name: str
    version: str
    folder: Path
    max_diff: float
    fmt: str
    ensemble_weights: str = EXPORTED_WEIGHTS  # the weights foxhunt's ensemble decides with (int8: the export's may differ)
    why: str = ""


class ExportError(UserError, ValueError):
    """An ``--out`` folder export cannot write into, or a link planted inside it (one line)."""

    kind = "export"


def export_ensemble(cfg, out: Path, fmt: str, workdir: Path) -> list[Exported]:
    """Every family of ``cfg.ensemble.models`` for ``cfg.asset`` (the alias, or
    ``ensemble.versions``), exported under ``out`` (module doc): every member is built and
    checked in ``workdir`` first, then all are written (:func:`write_inside`)."""
    if fmt not in FORMATS:
        raise RegistryError(f"--format {fmt}: must be one of {', '.join(FORMATS)}")
    ens, asset = cfg.ensemble, str(cfg.asset.key)
    built = []
    for family in ens.models:
        name = registered_name(str(ens.registry_prefix), str(family), asset)
        version = ens.versions.get(str(family)) if ens.versions else None
        folder, found = download_version(str(cfg.logger.tracking_uri), name, str(ens.alias), version, workdir / name)
        files = MemberFiles.read(folder / ARTIFACTS_DIR, name)
        model = rebuild_model(files.cfg, files.state, origin=name).cpu().eval()
        try:
            step = streaming_step(model, files.manifest)
        except NoStreamingMember as exc:
            raise RegistryError(f"{name}: no streaming step to export ({exc})") from None
        scratch = workdir / f"{name}-step"
        scratch.mkdir()
        diff = write_step(step, scratch / FILES[fmt], fmt)
        decides, why = weights_to_load(str(ens.weights), found)  # what foxhunt's ensemble loads this version with
        source = {"registered_name": name, "registered_version": str(found.version), "run_id": files.info["run_id"],
                  "metric": files.info["metric"], "metric_value": files.info.get("value"), "weights": EXPORTED_WEIGHTS,
                  "ensemble_weights": decides}  # fmt: skip
        written = {FILES[fmt]: (scratch / FILES[fmt]).read_bytes(),
                   SPEC_FILE: json.dumps(spec(step, fmt, str(family), files.manifest, source), indent=1).encode()}  # fmt: skip
        built.append(
            (
                f"{name}-v{found.version}",
                written,
                Exported(name, str(found.version), out / f"{name}-v{found.version}", diff, fmt, decides, why),
            )  # fmt: skip
        )
    for member_folder, _, _ in built:  # a link or a file where a member's folder goes: refused before anything is written
        _check_folder(out, member_folder)
    for member_folder, written, _ in built:
        write_inside(out, member_folder, written)
    return [exported for _, _, exported in built]


def _check_folder(out: Path, folder: str) -> None:
    target = out / folder
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ExportError(f"--out {out}: {folder} is {'a symbolic link' if target.is_symlink() else 'not a folder'}; "
                          "refused (export writes only inside --out, never through a link)")  # fmt: skip


def _open_folder(out: Path, out_fd: int, folder: str) -> int:
    """``out/folder`` opened without following a link (ExportError for a link or a file)."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=out_fd)
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
        raise ExportError(f"--out {out}: {folder} is a symbolic link or not a folder ({exc.strerror}); refused "
                          "(export writes only inside --out, never through a link)") from None  # fmt: skip


def write_inside(out: Path, folder: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` (name: bytes) into ``out/folder`` and nowhere else. The folder is opened
    without following a link (``O_NOFOLLOW``: a link there is refused); each file is written to a
    new temporary file in it (``O_EXCL | O_NOFOLLOW``) and renamed over its name, and a rename
    replaces a link at that name instead of writing through it: a link planted in ``--out``,
    even while export runs, never leads a write outside it. ``out`` itself is the user's."""
    directory = os.O_RDONLY | os.O_DIRECTORY
    try:
        out_fd = os.open(out, directory)
    except OSError as exc:
        raise ExportError(f"--out {out}: cannot open the folder ({exc.strerror})") from None
    try:
        try:
            os.mkdir(folder, 0o755, dir_fd=out_fd)
        except FileExistsError:
            pass
        folder_fd = _open_folder(out, out_fd, folder)
        try:
            for name, data in files.items():
                temporary = f".{name}.{os.getpid()}{_TMP_SUFFIX}"
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder_fd)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        finally:
            os.close(folder_fd)
    except OSError as exc:
        raise ExportError(f"--out {out}: cannot write {folder}/{exc.filename or ''} ({exc.strerror})") from None
    finally:
        os.close(out_fd)
    return out / folder
