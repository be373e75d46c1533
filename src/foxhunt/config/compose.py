"""Composing ``conf/`` outside ``@hydra.main``: :func:`compose_config`, for every command that reads
a config (``foxhunt train start``'s grid, ``foxhunt data show``, the ensemble and memory commands,
the roll, the benchmark) and for :mod:`foxhunt.training.parts`, which builds a run from it.

It imports Hydra and the store's location only: what a config names (data, models, precision) is
built elsewhere, so a command that only composes and validates does not load torch or Lightning.
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig

from foxhunt.errors import raised_in
from foxhunt.runs.environment import root_dir as default_root


def compose_config(
    overrides: list[str],
    root_dir: str | os.PathLike | None = None,
    output_dir: str | None = None,
    config_name: str = "train",
) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (``train``; ``ensemble`` for the ensemble commands) with
    Hydra overrides outside ``@hydra.main``.

    ``paths.root_dir`` defaults to ``$FOXHUNT_ROOT`` or the current folder, as for
    ``foxhunt-train``; ``output_dir`` defaults to ``<root>/outputs/commands``. Raises Hydra's own
    error for an unknown group option or a malformed override.
    """
    root = Path(root_dir).resolve() if root_dir else default_root()
    out = output_dir or str(root / "outputs" / "commands")
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="foxhunt.conf", version_base="1.3"):
        try:
            cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
        except (AttributeError, AssertionError, TypeError) as exc:
            if raised_in(exc).split(".")[0] not in ("hydra", "omegaconf"):  # foxhunt's own frame: a bug
                raise
            # Hydra applying an override to a node its schema leaves null (hydra.sweeper.params={seed:1} on the
            # basic sweeper) fails inside OmegaConf, unwrapped: Hydra's own error, so every caller says it in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigCompositionException(f"cannot apply the overrides {overrides}: {first}") from None
    # the folders are set, not passed as overrides: a folder whose name holds '=' (a partition folder,
    # date=2024-01) broke Hydra's override grammar in every command and every roll (found by a helper); an
    # override of the user's own keeps its say
    given = {override.split("=", 1)[0].lstrip("+~") for override in overrides}
    for key, value in (("root_dir", str(root)), ("output_dir", out)):
        if f"paths.{key}" not in given:
            cfg.paths[key] = value
    HydraConfig.instance().set_config(cfg)
    return cfg
