"""Helpers of the precision tests (imported by name: the test folders are not packages)."""

from __future__ import annotations

from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_policy(name: str, **overrides):
    """The PrecisionPolicy of conf/precision/<name>.yaml with ``overrides`` applied."""
    node = OmegaConf.load(REPO_ROOT / "conf" / "precision" / f"{name}.yaml")
    for key, value in overrides.items():
        node[key] = value
    return instantiate(node)
