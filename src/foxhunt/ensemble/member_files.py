"""The files a registered member is made of, and reading them back: one owner for both.

A registered version's model folder holds, under ``artifacts/`` (:mod:`foxhunt.ensemble.registry`
writes them, everything else reads them through :meth:`MemberFiles.read`):

- ``weights.pt``: the state dict (plain tensors; ``torch.load(weights_only=True)``);
- ``config.yaml``: the resolved config of the run the weights are from;
- ``dataset.json``: the feature settings, train normalization statistics and asset spec
  (:meth:`foxhunt.data.dataset.MarketDataset.manifest`);
- ``member.json``: family, asset, run ids, the metric it won on.

A file that is missing or damaged (cut, edited, replaced) is one line naming the version and
the file (:class:`RegistryError`), never a traceback from the JSON, YAML or torch loader. The
folder's code file (``pyfunc_entry.py``, what ``mlflow.pyfunc.load_model`` runs) must be
foxhunt's own, byte for byte (:func:`check_code_file`).
"""

from __future__ import annotations

import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foxhunt.data.dataset import DATASET_FILE
from foxhunt.errors import UserError, one_line_error

MEMBER_FILE = "member.json"
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.yaml"
ARTIFACTS_DIR = "artifacts"  # the files' folder inside a version's model folder
CODE_FILE = Path(__file__).with_name("pyfunc_entry.py")  # the models-from-code file MLflow copies into the folder
MEMBER_KEYS = ("family", "asset", "run_id", "metric", "precision")
_REREGISTER = "register it again (foxhunt ensemble register)"


class RegistryError(UserError, ValueError):
    """A registry or store problem the user can act on (one line)."""

    kind = "registry"


def check_code_file(folder: Path, name: str) -> None:
    """A version's copy of the models-from-code file is foxhunt's (module doc); a version saved
    before models from code has none (the fleet never runs a version's code: only its files)."""
    copy = folder / CODE_FILE.name
    if copy.exists() and (not copy.is_file() or copy.read_bytes() != CODE_FILE.read_bytes()):
        raise RegistryError(f"{name}: {CODE_FILE.name} is not foxhunt's (changed since it was registered); "
                            f"do not load it with mlflow.pyfunc; {_REREGISTER}")  # fmt: skip


@dataclass
class MemberFiles:
    """A member's files, read: ``info`` (member.json), ``cfg`` (config.yaml, a DictConfig),
    ``state`` (weights.pt) and ``manifest`` (dataset.json)."""

    info: dict[str, Any]
    cfg: Any
    state: dict[str, Any]
    manifest: dict[str, Any]

    @classmethod
    def read(cls, artifacts: Path, name: str) -> MemberFiles:
        """The files under ``artifacts`` of version ``name`` (module doc)."""
        info = _json(artifacts / MEMBER_FILE, name)
        missing = [key for key in MEMBER_KEYS if key not in info]
        if missing:
            raise RegistryError(f"{name}: {MEMBER_FILE} lacks {', '.join(missing)}; {_REREGISTER}")
        return cls(info, _config(artifacts / CONFIG_FILE, name), _weights(artifacts / WEIGHTS_FILE, name),
                   _json(artifacts / DATASET_FILE, name))  # fmt: skip


def _present(path: Path, name: str) -> None:
    if not path.is_file():
        raise RegistryError(f"{name}: {path.name} is missing from its files ({path.parent}); {_REREGISTER}")


def _json(path: Path, name: str) -> dict[str, Any]:
    _present(path, name)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RegistryError(f"{name}: {path.name} is damaged ({one_line_error(exc, limit=160)}); {_REREGISTER}") from None
    if not isinstance(value, dict):
        raise RegistryError(f"{name}: {path.name} is damaged (not a JSON object); {_REREGISTER}")
    return value


def _config(path: Path, name: str):
    from omegaconf import DictConfig, OmegaConf

    _present(path, name)
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml's and omegaconf's errors for a damaged file
        raise RegistryError(f"{name}: {path.name} is damaged ({one_line_error(exc, limit=160)}); {_REREGISTER}") from None
    if not isinstance(cfg, DictConfig) or "model" not in cfg:
        raise RegistryError(f"{name}: {path.name} is damaged (not a foxhunt run's config); {_REREGISTER}")
    return cfg


def _weights(path: Path, name: str) -> dict[str, Any]:
    import torch

    _present(path, name)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise RegistryError(f"{name}: {path.name} refused: it holds objects torch.load(weights_only=True) does not load "
                            f"({one_line_error(exc, with_type=False, first_line=True, limit=120)}); {_REREGISTER}") from None  # fmt: skip
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise RegistryError(f"{name}: {path.name} is damaged ({one_line_error(exc, first_line=True, limit=160)}); {_REREGISTER}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RegistryError(f"{name}: {path.name} is damaged (not a state dict of tensors); {_REREGISTER}")
    return state
