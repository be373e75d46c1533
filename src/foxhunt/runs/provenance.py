"""Where a run came from: the process that runs it, and what the MLflow UI's Source and
Dataset columns show.

- ``host``, ``pid`` and ``job_id`` (``$FOXHUNT_JOB_ID``): the process, which
  :mod:`foxhunt.runs.liveness` checks; ``mlflow.user``, its user (the run's ``user_id``);
- ``mlflow.source.name``: the entry point and its command (``foxhunt-train``, ``foxhunt-train
  -m`` for a sweep's parent run, ``foxhunt memory validate``, ...), ``mlflow.source.type``
  ``LOCAL``; ``mlflow.source.git.commit`` when foxhunt runs from a git checkout (read from its
  ``.git``: ``HEAD``, the ref it names, or ``packed-refs``; a worktree's ``.git`` file points at
  its own folder; no ``git`` process);
- a dataset input per split (:class:`DatasetProvenance`): name ``<asset>-<source>-<split>``, digest
  (the first :data:`DIGEST_LENGTH` hex digits of ``sha256``, the SHA-256 of the split's bars as
  the run read them, :func:`split_sha256`: equal digests, equal bars), source (the source class,
  its path, its ``uri`` as MLflow's local source reads it, and its files; a generated source's
  settings), a profile (rows, first and last bar, ``sha256``) and the split as the input's
  context tag.

What a reproduction (``foxhunt runs reproduce``, :mod:`foxhunt.runs.reproduce`) compares, as JSON
files in the run's artifact folder ``provenance/`` (:data:`PROVENANCE_FOLDER`) and as tags:

- ``data.json`` (:data:`DATA_FILE`, tag ``data.digest``): the source and its settings, every file
  it read with its size and SHA-256 (of the bytes: not the path, size and mtime the feature cache
  key covers), and the SHA-256 of each split's bars (timestamps, features, close, roll prices),
  which covers generated bars too; written by :func:`foxhunt.training.provenance.bars_datasets`;
- ``code.json`` (:data:`CODE_FILE`, tags ``code.digest``, ``code.dirty``, ``foxhunt.version``):
  foxhunt's version and the SHA-256 of every file of the package folder it ran from (read, no
  process), and from a git checkout its commit (read from ``.git``) and whether the package
  folder differs from it; the difference itself is ``code.diff`` (:data:`CODE_DIFF_FILE`: ``git
  diff HEAD`` of the package folder, run with a :data:`GIT_TIMEOUT_S` timeout and no optional
  locks, plus the files git does not track there). foxhunt installed from a wheel or an index
  has no work tree: no commit and no diff, its version and file digests only;
- ``environment.json`` (:data:`ENVIRONMENT_FILE`, tag ``environment.digest``): Python and every
  installed distribution's version (``importlib.metadata.distributions()``);
- ``device.json`` (:data:`DEVICE_FILE`, tag ``device.name``): the device the run trained on
  (CPU model, CUDA devices), torch's threads and its deterministic settings (``deterministic
  algorithms``, cuDNN, ``CUBLAS_WORKSPACE_CONFIG``, ``trainer.deterministic``), taken when the
  run's training ended (the Trainer sets them).

A resumed attempt logs its own files under ``provenance/resumed-<N>/`` (``N``: its ``resume_count``).
"""

from __future__ import annotations

import difflib
import getpass
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.runs.environment import JOB_ID_ENV
from foxhunt.runs.tags import SOURCE_TYPE_LOCAL, Tag

# Lazy imports: (c) numpy and torch, where a digest or the device needs them: train list imports this through the store

DIGEST_LENGTH = 16  # MLflow keeps 36 characters of a dataset digest
#: The key of a dataset input's profile holding the SHA-256 of its split's bars (what replay compares).
SPLIT_SHA256 = "sha256"
SOURCE_JSON_LIMIT = 60_000  # characters of a dataset's source description (files listed up to it)
_HEX_SHA = re.compile(r"^[0-9a-f]{40}$")

PROVENANCE_FOLDER = "provenance"  # the run's artifact folder of the files below
DATA_FILE = "data.json"
CODE_FILE = "code.json"
CODE_DIFF_FILE = "code.diff"
ENVIRONMENT_FILE = "environment.json"
DEVICE_FILE = "device.json"
PROVENANCE_FILES = (DATA_FILE, CODE_FILE, ENVIRONMENT_FILE, DEVICE_FILE)
RESUMED_PREFIX = "resumed-"  # provenance/resumed-<attempt folder>/: a resumed attempt's files
PROVENANCE_VERSION = 1  # layout of the JSON files above
DISTRIBUTION = "foxhunt"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the foxhunt package this process runs
GIT_TIMEOUT_S = 10  # git diff of the package folder; past it the difference is said unknown
HASH_CHUNK = 1 << 20  # bytes read at a time when hashing a file
_INSTALLED = ("site-packages", "dist-packages")  # folders of installed packages: no work tree of theirs
_SKIPPED_PARTS = ("__pycache__",)
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def process_tags() -> dict[str, str]:
    """The process that runs a run: host, pid, the job it belongs to (if any), and its user as
    ``mlflow.start_run`` records one (the run's ``user_id`` was "unknown")."""
    return {Tag.HOST: socket.gethostname(), Tag.PID: str(os.getpid()), Tag.JOB_ID: os.environ.get(JOB_ID_ENV, ""),
            Tag.USER: process_user()}  # fmt: skip


def process_user() -> str:
    """The login name of this process, as MLflow's default run context finds it."""
    try:
        return getpass.getuser()
    except (ImportError, KeyError, OSError):  # no such variable and no password entry for the uid (a bare container)
        return "unknown"


def source_tags(source_name: str) -> dict[str, str]:
    """The Source column's tags of a run started by ``source_name`` (see the module doc)."""
    tags = {Tag.SOURCE_NAME: source_name, Tag.SOURCE_TYPE: SOURCE_TYPE_LOCAL}
    commit = git_commit(Path(__file__).resolve())
    if commit:
        tags[Tag.GIT_COMMIT] = commit
    return tags


def git_commit(start: Path) -> str | None:
    """The commit checked out in the git work tree holding ``start``, or None (none for a file of
    an installed package: a virtual environment inside some checkout is not that checkout's code)."""
    tree = work_tree(start)
    return None if tree is None else _head_commit(tree / ".git")


def work_tree(start: Path) -> Path | None:
    """The git work tree holding ``start`` (the folder with its ``.git``), or None: outside a
    checkout, or inside an installed package (``site-packages``)."""
    if any(part in _INSTALLED for part in start.parts):
        return None
    for folder in [start, *start.parents]:
        if (folder / ".git").exists():
            return folder
    return None


def _head_commit(dot_git: Path) -> str | None:
    try:
        git_dir = dot_git
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text().strip()
            if not text.startswith("gitdir:"):
                return None
            git_dir = (dot_git.parent / text.split(":", 1)[1].strip()).resolve()
        head = (git_dir / "HEAD").read_text().strip()
        if _HEX_SHA.match(head):
            return head  # a detached HEAD
        if not head.startswith("ref:"):
            return None
        ref = head.split(":", 1)[1].strip()
        common = git_dir
        if (git_dir / "commondir").is_file():
            common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
        for folder in dict.fromkeys([git_dir, common]):
            if (folder / ref).is_file():
                value = (folder / ref).read_text().strip()
                return value if _HEX_SHA.match(value) else None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref and _HEX_SHA.match(parts[0]):
                    return parts[0]
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class DatasetProvenance:
    """One dataset input of a run (what MLflow's ``Dataset`` and its context tag hold)."""

    name: str
    digest: str
    source_type: str  # "local" (files), "code" (generated)
    source: dict[str, Any]
    context: str  # the split: train, validation or test
    profile: dict[str, Any] = field(default_factory=dict)

    def source_json(self) -> str:
        text = json.dumps(self.source, sort_keys=True, default=str)
        if len(text) <= SOURCE_JSON_LIMIT:
            return text
        files = list(self.source.get("files", []))
        while files and len(text) > SOURCE_JSON_LIMIT:
            files = files[: len(files) // 2]
            kept = {**self.source, "files": files, "files_listed": f"{len(files)} of {len(self.source['files'])}"}
            text = json.dumps(kept, sort_keys=True, default=str)
        return text

    def profile_json(self) -> str:
        return json.dumps(self.profile, sort_keys=True, default=str)


# -- what a reproduction compares (module doc) ------------------------------------------------
def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def json_sha256(value: Any) -> str:
    """The SHA-256 (hex) of ``value`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def split_sha256(arrays: Mapping[str, Any]) -> str:
    """The SHA-256 of a split's bars as arrays (name -> numpy array or None): each array's name,
    dtype, shape and bytes, in name order."""
    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = arrays[name]
        if value is None:
            digest.update(f"{name}:none;".encode())
            continue
        array = np.ascontiguousarray(value)
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def package_files(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """SHA-256 of every file of the package folder (its path relative to the folder's parent,
    e.g. ``foxhunt/models/ppo.py``), caches of compiled modules left out."""
    found = {}
    for path in sorted(package_dir.rglob("*")):
        if path.is_file() and not any(p in _SKIPPED_PARTS for p in path.parts) and not path.name.endswith(_SKIPPED_SUFFIXES):
            found[path.relative_to(package_dir.parent).as_posix()] = file_sha256(path)
    return found


def code_provenance(package_dir: Path = PACKAGE_DIR) -> tuple[dict[str, Any], str | None]:
    """``code.json`` of this process (module doc) and the uncommitted diff of the package folder
    (None when there is none, or no work tree, or git could not say)."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    files = package_files(package_dir)
    code: dict[str, Any] = {"version": PROVENANCE_VERSION, "package": DISTRIBUTION, "package_version": version,
                            "package_dir": str(package_dir), "digest": json_sha256(files), "files": files}  # fmt: skip
    tree = work_tree(package_dir)
    if tree is None:
        code.update(source="installed", commit=None, dirty=None, diff_sha256=None,
                    note="installed package: no work tree, so no commit and no diff; its version and file digests")  # fmt: skip
        return code, None
    diff, note = uncommitted_diff(tree, package_dir)
    code.update(source="git", work_tree=str(tree), commit=_head_commit(tree / ".git"), dirty=None if diff is None else bool(diff),
                diff_sha256=hashlib.sha256(diff.encode()).hexdigest() if diff else None, note=note)  # fmt: skip
    return code, diff or None


def uncommitted_diff(tree: Path, package_dir: Path) -> tuple[str | None, str]:
    """(the package folder's difference from the commit checked out, a note saying how it was
    taken): ``git diff HEAD`` (staged and unstaged changes) and the files git does not track
    there, as new-file diffs. None with the note when git cannot say (no git, no commit yet,
    past :data:`GIT_TIMEOUT_S`). git runs with ``GIT_OPTIONAL_LOCKS=0``: it never takes the
    index lock of a tree others work in."""
    folder = package_dir.relative_to(tree).as_posix()
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}
    base = ["git", "-C", str(tree), "-c", "core.quotepath=off"]
    try:
        diff = subprocess.run([*base, "diff", "HEAD", "--no-color", "--no-ext-diff", "--binary", "--", folder],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False)  # fmt: skip
        if diff.returncode != 0:
            return None, f"git diff HEAD failed: {' '.join(diff.stderr.split())[:200]}"
        others = subprocess.run([*base, "ls-files", "--others", "--exclude-standard", "-z", "--", folder],
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False)  # fmt: skip
        if others.returncode != 0:
            return None, f"git ls-files failed: {' '.join(others.stderr.split())[:200]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"git could not say ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    parts = [diff.stdout]
    for name in sorted(filter(None, others.stdout.split("\0"))):
        path = tree / name
        try:
            lines = path.read_text().splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            parts.append(
                f"diff --git a/{name} b/{name}\nnew file (not text): sha256 {file_sha256(path) if path.is_file() else '-'}\n"
            )
            continue
        parts.append(f"diff --git a/{name} b/{name}\nnew file (untracked)\n")
        parts.append("".join(difflib.unified_diff([], lines, "/dev/null", f"b/{name}")))
    return "".join(parts), f"git diff HEAD -- {folder} and its untracked files (git, {GIT_TIMEOUT_S} s timeout)"


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_packages() -> dict[str, str]:
    """Every installed distribution's version, by canonical name (the first one found of a name,
    as ``importlib.metadata.version`` picks it)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name and canonical_name(name) not in found:
            found[canonical_name(name)] = str(dist.version)
    return dict(sorted(found.items()))


def environment_provenance() -> dict[str, Any]:
    """``environment.json``: Python and every installed distribution's version."""
    python = {"version": platform.python_version(), "implementation": platform.python_implementation()}
    packages = installed_packages()
    return {"version": PROVENANCE_VERSION, "python": python, "platform": platform.platform(),
            "digest": json_sha256({"python": python, "packages": packages}), "packages": packages}  # fmt: skip


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_provenance(accelerator: str, trainer_deterministic: Any) -> dict[str, Any]:
    """``device.json``: the device a run trains on (``accelerator`` as configured: ``auto`` takes
    CUDA when there is one), torch's threads and deterministic settings as they are now."""
    import torch

    cuda = torch.cuda.is_available()
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    used = (
        "cuda" if cuda and accelerator in ("auto", "gpu", "cuda") else ("cpu" if accelerator in ("auto", "cpu") else accelerator)
    )
    return {
        "version": PROVENANCE_VERSION,
        "device": used,
        "name": names[0] if used == "cuda" and names else (cpu_model() if used == "cpu" else used),
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "accelerator": accelerator,
        "cuda_devices": names,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if cuda else None,
        "trainer_deterministic": trainer_deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


def provenance_tags(name: str, content: Mapping[str, Any]) -> dict[str, str]:
    """The tags that show a provenance file's gist in the runs table (module doc)."""
    if name == DATA_FILE:
        return {Tag.DATA_DIGEST: str(content["digest"])}
    if name == CODE_FILE:
        dirty = content.get("dirty")
        return {Tag.CODE_DIGEST: str(content["digest"]), Tag.FOXHUNT_VERSION: str(content.get("package_version") or ""),
                Tag.CODE_DIRTY: "unknown" if dirty is None else str(bool(dirty)).lower()}  # fmt: skip
    if name == ENVIRONMENT_FILE:
        return {Tag.ENVIRONMENT_DIGEST: str(content["digest"])}
    if name == DEVICE_FILE:
        return {Tag.DEVICE_NAME: f"{content['device']}: {content['name']}"}
    return {}


def write_provenance(folder: Path, name: str, content: Mapping[str, Any]) -> Path:
    """``content`` as the JSON file ``folder/name`` (made)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(content, indent=1, sort_keys=True, default=str))
    return path
