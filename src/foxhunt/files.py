"""Files in folders others may write (a job ledger, a sweep folder, a cache): read without
following a link or blocking, written whole or not at all. Defined here only.

A pipe or a device named like a ledger file would hang its reader or never end, and a symbolic
link planted at a name would have foxhunt read, or write through to, a file it never made:
:func:`read_regular_file` opens with ``O_NOFOLLOW | O_NONBLOCK`` and reads only a regular file of
bounded size; :func:`write_whole` writes a temporary file of this process's own (created with
``O_EXCL | O_NOFOLLOW``, so never opened through a link planted at its name) and renames it over
the target (a link there is replaced, not followed; a reader sees the old file or the new one,
never half of one). What the bytes mean is checked by the reader's owner.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def read_regular_file(path: str | os.PathLike, limit: int, *, end: bool = False) -> bytes | None:
    """The bytes of the regular file at ``path``, opened without following a link or blocking:
    None when it is no regular file, or (unless ``end``) larger than ``limit``; with ``end``, its
    last ``limit`` bytes. ``OSError`` when it cannot be opened (missing, or a link: ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_size > limit and not end):
            return None
        handle.seek(max(0, info.st_size - limit) if end else 0)
        return handle.read(limit)


def write_whole(path: str | os.PathLike, text: str) -> None:
    """``text`` at ``path``, whole or not at all (see the module doc); the folder is made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as out:
            out.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
