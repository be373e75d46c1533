"""The fleet: registered members loaded onto one device, ready for the streaming engine.

:func:`load_fleet` reads each family's version (``models:/<prefix>-<model>-<asset>@<alias>``,
or the version ``ensemble.versions`` names), rebuilds its model from the version's own files
(:func:`foxhunt.ensemble.rebuild.rebuild_model`: the stored config, validated by today's schema; the weights, loaded with
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
from pathlib import Path

from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.ensemble.members import Member
from foxhunt.ensemble.rebuild import build_member
from foxhunt.ensemble.registry import download_version, registered_name, weights_to_load

log = logging.getLogger(__name__)


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
