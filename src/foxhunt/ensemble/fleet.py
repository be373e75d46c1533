"""The fleet: registered members loaded onto one device, ready for the streaming engine.

:func:`load_fleet` reads each family's version (``models:/<prefix>-<model>-<asset>@<alias>``,
or the version ``ensemble.versions`` names), rebuilds its model from the version's own files
(:func:`rebuild_model`: the stored config, validated by today's schema; the weights, loaded with
``torch.load(weights_only=True)``; int8-trained weights through their quantized layers, then
back to plain fp32), moves it to ``ensemble.device`` in eval mode and wraps it in a
:class:`~foxhunt.ensemble.members.Member`, whose runtime holds its weights (fp32, or with
``ensemble.weights=int8`` int8: :mod:`foxhunt.ensemble.members` says how per family); with ``auto`` (the
default) each member loads the weights ``foxhunt ensemble validate`` measured to pay for it
(its version's ``weights_choice`` tag: int8 only when its step is at most
``ensemble.validate.int8_max_slowdown`` x fp32's and its footprint at least
``int8_min_cut_pct`` % smaller), fp32 when none was measured; the log says which and why, one
line per member. A member trained on
another asset than the one asked for, a missing version and a stored config that no longer
validates are each one line (:class:`~foxhunt.ensemble.member_files.RegistryError`), as is a
missing or damaged file of a version (:mod:`foxhunt.ensemble.member_files`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, MemberFiles, RegistryError
from foxhunt.ensemble.members import Member, make_member
from foxhunt.ensemble.registry import download_version, registered_name, weights_to_load

log = logging.getLogger(__name__)


def rebuild_model(cfg, state: dict, origin: str):
    """The LightningModule of a stored resolved config with ``state`` loaded, in plain fp32
    (int8-trained weights loaded through their quantized layers, then dequantized)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from foxhunt.build import build_model
    from foxhunt.config.schema import ConfigError, validate
    from foxhunt.precision.quantize import dequantize_model, quantize_model

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


@dataclass
class FleetMember:
    member: Member
    inputs: MemberInputs
    name: str  # registered model name
    version: str
    run_id: str
    metric: str
    value: float | None
    precision: str  # what it was trained in
    holdout: float | None = None  # the lockbox its training run kept (evaluation.holdout)


def int8_policy():
    """The int8 policy of ``conf/precision/int8.yaml``: its layer rule picks the layers an int8
    inference copy quantizes."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    text = resources.files("foxhunt.conf").joinpath("precision", "int8.yaml").read_text()
    return instantiate(OmegaConf.create(text))


def build_member(folder: Path, name: str, asset_key: str, weights: str, runtime: str, device: str,
                 probe_calls: int, threads: int = 1, workdir: Path | None = None) -> tuple[Member, MemberInputs, dict[str, Any]]:  # fmt: skip
    """A member from a version's model folder (``<folder>/artifacts/...``): its fp32 model, and
    its runtime's ``weights`` (fp32 or int8; :mod:`foxhunt.ensemble.members`); a TFT's ONNX
    graphs go to ``workdir`` (default: beside the folder)."""
    from foxhunt.data.features import FeatureConfig

    files = MemberFiles.read(folder / ARTIFACTS_DIR, name)
    info, cfg, record = files.info, files.cfg, files.record
    if info["asset"] != asset_key:
        raise RegistryError(f"{name}: trained on {info['asset']}, the bars are {asset_key} (asset={asset_key})")
    model = rebuild_model(cfg, files.state, origin=name).to(device).eval()
    inputs = MemberInputs(
        feature_config=FeatureConfig(**record["feature_config"]),
        observed_mean=np.asarray(record["observed_mean"], dtype=np.float64),
        observed_std=np.asarray(record["observed_std"], dtype=np.float64),
        groups={g: list(v) for g, v in record["groups"].items()},
    )
    family = str(cfg.model.name)
    member = make_member(family, name, model, weights, info.get("value"), runtime, probe_calls, inputs.groups,
                         workdir=workdir or folder.parent, threads=threads)  # fmt: skip
    if member is None:
        raise RegistryError(f"{name}: model family {family!r} has no streaming member")
    return member, inputs, {**info, "holdout": cfg.evaluation.get("holdout")}


def load_fleet(cfg, workdir: Path) -> list[FleetMember]:
    """Every family of ``cfg.ensemble.models`` for ``cfg.asset``, loaded (see the module doc)."""
    import torch

    ens = cfg.ensemble
    if ens.torch_threads is not None:
        torch.set_num_threads(int(ens.torch_threads))
    asset_key = str(cfg.asset.key)
    fleet = []
    for family in ens.models:
        name = registered_name(str(ens.registry_prefix), str(family), asset_key)
        version = ens.versions.get(str(family)) if ens.versions else None
        folder, found = download_version(str(cfg.logger.tracking_uri), name, str(ens.alias), version, workdir / name)
        weights, why = weights_to_load(str(ens.weights), found)
        log.info("%s v%s: %s weights (%s)", name, found.version, weights, why)
        member, inputs, info = build_member(folder, name, asset_key, weights, str(ens.runtime), str(ens.device),
                                            int(ens.runtime_probe_calls), int(ens.torch_threads or 1))  # fmt: skip
        fleet.append(
            FleetMember(member, inputs, name, str(found.version), info["run_id"], info["metric"], info.get("value"),
                        info["precision"], info["holdout"])  # fmt: skip
        )
    return fleet


def fleet_engine(fleet: list[FleetMember], asset, cfg, origin: str) -> StreamingEngine:
    """The streaming engine of a loaded fleet with the configured rule."""
    from foxhunt.config.schema import ConfigError
    from foxhunt.ensemble.registry import metric_direction
    from foxhunt.ensemble.rules import check_rule

    ens = cfg.ensemble
    weights = {f.member.name: f.value for f in fleet}
    metrics = sorted({f.metric for f in fleet})
    if str(ens.rule) == "weighted" and len(metrics) > 1:
        raise ConfigError(f"ensemble.rule=weighted: the members were registered on different metrics ({', '.join(metrics)})")
    check_rule(str(ens.rule), [f.member.family for f in fleet], weights, metrics[0], metric_direction(metrics[0]) == "max")
    return StreamingEngine(
        [f.member for f in fleet], {f.member.name: f.inputs for f in fleet}, asset, rule=str(ens.rule),
        weights={k: (v or 0.0) for k, v in weights.items()}, forecast_threshold=float(ens.forecast_threshold),
        origin=origin,
    )  # fmt: skip
