"""Reading a config section into a dataclass: from the dataclass itself, a mapping or an
OmegaConf ``DictConfig``, with one-line errors naming the section and the key."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf


def dataclass_values(cls: type, cfg: Any, section: str) -> dict[str, Any]:
    """Field values of dataclass ``cls`` from a dataclass, mapping or DictConfig ``cfg``."""
    values: dict[str, Any]
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):  # an instance of cls, or of another dataclass
        values = dataclasses.asdict(cfg)
    elif isinstance(cfg, DictConfig):
        values = cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=True))  # a DictConfig's container is a dict
    elif isinstance(cfg, Mapping):
        values = dict(cfg)
    else:
        raise ValueError(f"{section}: expected a mapping, got {type(cfg).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"{section}.{unknown[0]}: unknown key (known keys: {', '.join(names)})")
    required = [
        f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    absent = [n for n in required if n not in values]
    if absent:
        raise ValueError(f"{section}.{absent[0]}: missing key")
    return {n: values[n] for n in names if n in values}
