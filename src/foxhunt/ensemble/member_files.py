"""The files a registered member is made of, and reading them back: one owner for both.

A registered version's model folder holds, under ``artifacts/`` (:mod:`foxhunt.ensemble.registry`
writes them, everything else reads them through :meth:`MemberFiles.read`):

- ``weights.pt``: the state dict (plain tensors; ``torch.load(weights_only=True)``);
- ``config.yaml``: the resolved config of the run the weights are from;
- ``dataset.json``: the feature settings, train normalization statistics and asset spec
  (:meth:`foxhunt.data.dataset.MarketDataset.manifest`);
- ``member.json``: family, asset, run ids, the metric it won on.

**Verified by content.** When a version is registered, the sha256 of every file of its folder
is recorded in the registry (:data:`DIGESTS_TAG`, a version tag and a tag of its logged model:
the registry database and the artifact store are separate trust domains on a shared server).
:func:`check_digests` compares a downloaded folder with that record before any file is read: a
file changed by one byte, missing, or added is one line naming it. A version registered before
the record existed is refused (register it again).

**Checked for meaning.** What passes the digests is still read as data, never trusted to be
sane: the config names only foxhunt's own classes (:mod:`foxhunt.config.stored`); every weight
is finite; the normalization statistics are finite, one per observed feature, with a positive
std; the feature groups index the features; the asset spec is one :class:`~foxhunt.assets.AssetSpec`
accepts; ``member.json`` agrees with the config (family, asset, precision) and its metric value
is finite. A file that is missing, damaged or not sane is one line naming the version and the
file (:class:`RegistryError`), never a traceback from the JSON, YAML or torch loader. The
folder's code file (``pyfunc_entry.py``, what ``mlflow.pyfunc.load_model`` runs) must be
foxhunt's own, byte for byte (:func:`check_code_file`).
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from foxhunt.assets import AssetSpec
from foxhunt.config.schema import Features
from foxhunt.config.stored import load_stored_config
from foxhunt.data.dataset import DATASET_FILE
from foxhunt.data.features import FeatureConfig
from foxhunt.errors import ConfigError, UserError, one_line_error

MEMBER_FILE = "member.json"
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.yaml"
ARTIFACTS_DIR = "artifacts"  # the files' folder inside a version's model folder
CODE_FILE = Path(__file__).with_name("pyfunc_entry.py")  # the models-from-code file MLflow copies into the folder
MEMBER_KEYS = ("family", "asset", "run_id", "metric", "precision")
#: Version tag (and logged-model tag) holding ``{path: sha256}`` of every file of the version's folder.
DIGESTS_TAG = "foxhunt.files_sha256"
#: Files MLflow itself writes into a folder it downloads for a ``models:/`` URI (never registered).
DOWNLOAD_FILES = frozenset({"registered_model_meta"})
MANIFEST_KEYS = ("feature_names", "groups", "feature_config", "observed_mean", "observed_std", "asset")
_REREGISTER = "register it again (foxhunt ensemble register)"
_HEX = frozenset("0123456789abcdef")
_CHUNK = 1 << 20


class RegistryError(UserError, ValueError):
    """A registry or store problem the user can act on (one line)."""

    kind = "registry"


def check_code_file(folder: Path, name: str) -> None:
    """A version's copy of the models-from-code file is foxhunt's (module doc); a version saved
    before models from code has none (the ensemble never runs a version's code: only its files)."""
    copy = folder / CODE_FILE.name
    if copy.exists() and (not copy.is_file() or copy.read_bytes() != CODE_FILE.read_bytes()):
        raise RegistryError(f"{name}: {CODE_FILE.name} is not foxhunt's (changed since it was registered); "
                            f"do not load it with mlflow.pyfunc; {_REREGISTER}")  # fmt: skip


def folder_digests(folder: Path) -> dict[str, str]:
    """``{path: sha256}`` of every file under ``folder`` (POSIX paths relative to it); a link or
    anything else that is not a file or a folder is refused (:class:`RegistryError`)."""
    digests = {}
    for path in sorted(Path(folder).rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise RegistryError(f"{folder}: {relative} is a link or not a file; a version's folder holds files only")
        if path.is_file():
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
            digests[relative] = digest.hexdigest()
    return digests


def digests_tag(folder: Path) -> str:
    """The value of :data:`DIGESTS_TAG` for ``folder`` (sorted JSON)."""
    return json.dumps(folder_digests(folder), sort_keys=True, separators=(",", ":"))


def check_digests(folder: Path, recorded: str | None, name: str, *, extra_files: bool = False) -> None:
    """``folder`` holds exactly the files registered (:data:`DIGESTS_TAG` value ``recorded``),
    each byte for byte; files MLflow adds when it downloads (:data:`DOWNLOAD_FILES`) aside, and
    any other with ``extra_files`` (a folder MLflow loads for a pyfunc). One line otherwise."""
    if recorded is None:
        raise RegistryError(f"{name}: registered without the digests of its files ({DIGESTS_TAG}), so its files cannot be "
                            f"verified; {_REREGISTER}")  # fmt: skip
    try:
        expected = json.loads(recorded)
    except ValueError:
        expected = None
    if (
        not isinstance(expected, dict)
        or not expected
        or not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 and set(v) <= _HEX for k, v in expected.items())
    ):
        raise RegistryError(f"{name}: its registry record of file digests ({DIGESTS_TAG}) is damaged; {_REREGISTER}")
    found = folder_digests(folder)
    for path, digest in sorted(expected.items()):
        if path not in found:
            raise RegistryError(f"{name}: {path} is missing from its files ({folder}); {_REREGISTER}")
        if found[path] != digest:
            raise RegistryError(f"{name}: {path} is not the file registered (sha256 {found[path][:12]}..., registered "
                                f"{digest[:12]}...): changed in the artifact store since; refused, nothing read from it; {_REREGISTER}")  # fmt: skip
    added = sorted(set(found) - set(expected) - DOWNLOAD_FILES)
    if added and not extra_files:
        raise RegistryError(f"{name}: {added[0]} was not registered with it (added to its files in the artifact store); "
                            f"refused; {_REREGISTER}")  # fmt: skip


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
        files = cls(info, _config(artifacts / CONFIG_FILE, name), _weights(artifacts / WEIGHTS_FILE, name),
                    _json(artifacts / DATASET_FILE, name))  # fmt: skip
        files._check_meaning(name)
        return files

    def _check_meaning(self, name: str) -> None:
        """The values are sane (module doc); one line naming the file and the value otherwise."""

        def refuse(file: str, what: str) -> RegistryError:
            return RegistryError(f"{name}: {file}: {what}; {_REREGISTER}")

        cfg, info, manifest = self.cfg, self.info, self.manifest
        for key, expected in (("family", cfg.model.get("name")), ("asset", cfg.get("asset", {}).get("key")),
                              ("precision", cfg.get("precision", {}).get("name"))):  # fmt: skip
            if str(info[key]) != str(expected):
                raise refuse(MEMBER_FILE, f"{key}={info[key]!r} but {CONFIG_FILE} says {expected!r}")
        value = info.get("value")
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
            raise refuse(MEMBER_FILE, f"value={value!r}: must be a finite number")
        missing = [key for key in MANIFEST_KEYS if key not in manifest]
        if missing:
            raise refuse(DATASET_FILE, f"lacks {', '.join(missing)}")
        names, groups = manifest["feature_names"], manifest["groups"]
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise refuse(DATASET_FILE, "feature_names: must be a list of names")
        if not (isinstance(groups, dict) and "observed" in groups and all(
            isinstance(idx, list) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(names) for i in idx)
            for idx in groups.values()
        )):  # fmt: skip
            raise refuse(DATASET_FILE, f"groups: each must list feature indices in 0..{len(names) - 1}")
        width = len(groups["observed"])
        for key, positive in (("observed_mean", False), ("observed_std", True)):
            values = manifest[key]
            if not (isinstance(values, list) and len(values) == width and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or not positive)
                for v in values
            )):  # fmt: skip
                rule = "finite and > 0" if positive else "finite"
                raise refuse(DATASET_FILE, f"{key}: must be {width} numbers (one per observed feature), each {rule}")
        try:
            if manifest["feature_config"] is not None:  # the config's ranges first: a window of 10**12 bars is no setting
                Features.model_validate(manifest["feature_config"])
                FeatureConfig(**manifest["feature_config"])
            AssetSpec(**manifest["asset"])
        except (TypeError, ValueError) as exc:
            raise refuse(
                DATASET_FILE, f"not a feature or asset setting foxhunt accepts ({one_line_error(exc, limit=160)})"
            ) from None
        if str(manifest["asset"].get("key")) != str(info["asset"]):
            raise refuse(DATASET_FILE, f"asset.key={manifest['asset'].get('key')!r} but {MEMBER_FILE} says {info['asset']!r}")
        for key, tensor in self.state.items():
            if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
                raise refuse(WEIGHTS_FILE, f"{key} holds a value that is not finite")


def _present(path: Path, name: str) -> None:
    if not path.is_file():
        raise RegistryError(f"{name}: {path.name} is missing from its files ({path.parent}); {_REREGISTER}")


def _json(path: Path, name: str) -> dict[str, Any]:
    _present(path, name)
    try:
        value = json.loads(path.read_text())
    except RecursionError:
        raise RegistryError(f"{name}: {path.name} is damaged (nested too deep); {_REREGISTER}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RegistryError(f"{name}: {path.name} is damaged ({one_line_error(exc, limit=160)}); {_REREGISTER}") from None
    if not isinstance(value, dict):
        raise RegistryError(f"{name}: {path.name} is damaged (not a JSON object); {_REREGISTER}")
    return value


def _config(path: Path, name: str):
    _present(path, name)
    try:
        cfg = load_stored_config(path, f"{name}: {path.name}")
    except ConfigError as exc:  # not YAML, or it names code, or it interpolates (foxhunt.config.stored)
        raise RegistryError(f"{exc}; {_REREGISTER}") from None
    if "model" not in cfg:
        raise RegistryError(f"{name}: {path.name} is damaged (not a foxhunt run's config); {_REREGISTER}")
    return cfg


def _weights(path: Path, name: str) -> dict[str, Any]:
    _present(path, name)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise RegistryError(f"{name}: {path.name} refused: it holds objects torch.load(weights_only=True) does not load "
                            f"({one_line_error(exc, with_type=False, first_line=True, limit=120)}); {_REREGISTER}") from None  # fmt: skip
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise RegistryError(
            f"{name}: {path.name} is damaged ({one_line_error(exc, first_line=True, limit=160)}); {_REREGISTER}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RegistryError(f"{name}: {path.name} is damaged (not a state dict of tensors); {_REREGISTER}")
    return state
