"""The model families: one per file of ``conf/model/``, registered by that file alone.

A family is its config group option ``conf/model/<name>.yaml``: its ``name`` (the file's stem),
its ``kind`` (``agent`` or ``forecaster``) and its LightningModule (``module._target_``). Every
list of families foxhunt shows or accepts (``ensemble.models``, ``foxhunt memory validate``'s
default models, the benchmark's ensemble) is read here, so adding a family is adding its file; what
a family can do beyond that (stream one bar at a time, export its step) is read from its model's
class (:mod:`foxhunt.ensemble.members`), never from its name.

The files are read as YAML without Hydra's composition (their ``name`` and ``kind`` are plain
values), once per process.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

import yaml

#: Where the families' config files are (the package's config group ``model``).
MODEL_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
KINDS = ("agent", "forecaster")


@dataclass(frozen=True)
class Family:
    """One model family as its config file declares it."""

    name: str
    kind: str
    module: str  # the LightningModule's class path (``module._target_``)


@functools.cache
def families() -> dict[str, Family]:
    """Every family of ``conf/model/``, by name, in file-name order. A file whose ``name`` is not
    its stem or whose ``kind`` is not one of :data:`KINDS` is a broken install: ValueError."""
    found: dict[str, Family] = {}
    for path in sorted(MODEL_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        name, kind = data.get("name"), data.get("kind")
        target = (data.get("module") or {}).get("_target_")
        if name != path.stem or kind not in KINDS or not isinstance(target, str):
            raise ValueError(f"{path}: a model family's file needs name: {path.stem}, kind: one of {', '.join(KINDS)} "
                             "and module._target_")  # fmt: skip
        found[name] = Family(name, kind, target)
    return found


def model_class(name: str) -> type:
    """The LightningModule class of family ``name`` (a class of foxhunt's own, named by the
    family's file in the package's ``conf/model/``)."""
    module, _, attribute = families()[name].module.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def family_names(kind: str | None = None) -> tuple[str, ...]:
    """The families' names (of one ``kind`` when given), in file-name order."""
    return tuple(name for name, family in families().items() if kind is None or family.kind == kind)
