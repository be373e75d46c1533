"""Where a run came from: the process that runs it, and what the MLflow UI's Source and
Dataset columns show.

- ``host``, ``pid`` and ``job_id`` (``$FOXHUNT_JOB_ID``): the process, which
  :mod:`foxhunt.runs.liveness` checks;
- ``mlflow.source.name``: the entry point and its command (``foxhunt-train``, ``foxhunt-train
  -m`` for a sweep's parent run, ``foxhunt memory validate``, ...), ``mlflow.source.type``
  ``LOCAL``; ``mlflow.source.git.commit`` when foxhunt runs from a git checkout (read from its
  ``.git``: ``HEAD``, the ref it names, or ``packed-refs``; a worktree's ``.git`` file points at
  its own folder; no ``git`` process);
- a dataset input per split (:class:`DatasetProvenance`): name ``<asset>-<source>-<split>``, digest
  (the first :data:`DIGEST_LENGTH` hex digits of the feature cache key, itself a SHA-256 of the
  source's fingerprint, the asset, the features and the split: equal digests, equal bars),
  source (the source class, its path and files), a profile (rows, first and last bar) and the
  split as the input's context tag.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.runs.environment import JOB_ID_ENV
from foxhunt.runs.tags import SOURCE_TYPE_LOCAL, Tag

DIGEST_LENGTH = 16  # MLflow keeps 36 characters of a dataset digest
SOURCE_JSON_LIMIT = 60_000  # characters of a dataset's source description (files listed up to it)
_HEX_SHA = re.compile(r"^[0-9a-f]{40}$")


def process_tags() -> dict[str, str]:
    """The process that runs a run: host, pid, and the job it belongs to (if any)."""
    return {Tag.HOST: socket.gethostname(), Tag.PID: str(os.getpid()), Tag.JOB_ID: os.environ.get(JOB_ID_ENV, "")}


def source_tags(source_name: str) -> dict[str, str]:
    """The Source column's tags of a run started by ``source_name`` (see the module doc)."""
    tags = {Tag.SOURCE_NAME: source_name, Tag.SOURCE_TYPE: SOURCE_TYPE_LOCAL}
    commit = git_commit(Path(__file__).resolve())
    if commit:
        tags[Tag.GIT_COMMIT] = commit
    return tags


def git_commit(start: Path) -> str | None:
    """The commit checked out in the git work tree holding ``start``, or None."""
    for folder in [start, *start.parents]:
        dot_git = folder / ".git"
        if dot_git.exists():
            return _head_commit(dot_git)
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
