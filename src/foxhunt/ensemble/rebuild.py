"""A registered member from its version's files: the model rebuilt from the stored config and
weights (:func:`rebuild_model`), and the streaming member around it (:func:`build_member`).

The ensemble's loading (:mod:`foxhunt.ensemble.loading`), the pyfunc model (:mod:`foxhunt.ensemble.pyfunc`), the
registry's checks, the lockbox report, export and the footprint all build members here; this
module reads the file format through :mod:`foxhunt.ensemble.member_files` and knows no registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from foxhunt.config.schema import ConfigError, resolved_config, validate
from foxhunt.config.stored import check_stored_config
from foxhunt.data.features import FeatureConfig
from foxhunt.ensemble.engine import MemberInputs
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, MemberFiles, RegistryError
from foxhunt.ensemble.members import Member, NoStreamingMember, make_member
from foxhunt.precision.quantize import dequantize_model, quantize_model
from foxhunt.training.parts import build_model


def rebuild_model(cfg, state: dict, origin: str):
    """The LightningModule of a stored resolved config with ``state`` loaded, in plain fp32
    (int8-trained weights loaded through their quantized layers, then dequantized). The config
    names only foxhunt's own classes (:mod:`foxhunt.config.stored`), checked before anything in
    it is imported."""
    try:  # before the schema, which imports the model's and the source's classes to check them
        check_stored_config(resolved_config(cfg) if OmegaConf.is_config(cfg) else cfg, origin)
    except ConfigError as exc:
        raise RegistryError(str(exc)) from None
    try:
        validate(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg))
    except ConfigError as exc:
        raise RegistryError(f"{origin}: the stored config no longer validates: {exc}") from None
    model = build_model(cfg)
    policy = instantiate(cfg.precision)
    if policy.quantizes_weights:
        quantize_model(model, policy)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise RegistryError(f"{origin}: the weights do not fit the stored config's model ({first})") from None
    return dequantize_model(model).eval()


def build_member(folder: Path, name: str, asset_key: str, weights: str, runtime: str, device: str,
                 probe_calls: int, threads: int = 1, workdir: Path | None = None) -> tuple[Member, MemberInputs, dict[str, Any]]:  # fmt: skip
    """A member from a version's model folder (``<folder>/artifacts/...``): its fp32 model, and
    its runtime's ``weights`` (fp32 or int8; :mod:`foxhunt.ensemble.members`); a TFT's ONNX
    graphs go to ``workdir`` (default: beside the folder)."""
    files = MemberFiles.read(folder / ARTIFACTS_DIR, name)
    info, cfg, manifest = files.info, files.cfg, files.manifest
    if info["asset"] != asset_key:
        raise RegistryError(f"{name}: trained on {info['asset']}, the bars are {asset_key} (asset={asset_key})")
    model = rebuild_model(cfg, files.state, origin=name).to(device).eval()
    inputs = MemberInputs(
        feature_config=FeatureConfig(**manifest["feature_config"]),
        observed_mean=np.asarray(manifest["observed_mean"], dtype=np.float64),
        observed_std=np.asarray(manifest["observed_std"], dtype=np.float64),
        groups={g: list(v) for g, v in manifest["groups"].items()},
    )
    family = str(cfg.model.name)
    try:
        member = make_member(family, name, model, weights, info.get("value"), runtime, probe_calls, inputs.groups,
                             workdir=workdir or folder.parent, threads=threads)  # fmt: skip
    except NoStreamingMember as exc:
        raise RegistryError(f"{name}: model family {family!r} has no streaming member ({exc})") from None
    return member, inputs, {**info, "holdout": cfg.evaluation.get("holdout")}
