"""zstd files checked whole before they are read: a cut download is an error, never a shorter series.

zstd decoders (databento-dbn's, and pandas' through ``zstandard``) stop quietly where a cut
stream ends: a ``.dbn.zst`` or ``.csv.zst`` cut short read as fewer records, a CSV cut inside a
row as a row with empty fields (found by a helper probing the data). :func:`zstd_problem` walks
the frame layout of RFC 8878 block by block (nothing decompressed) and says why the data is not
whole. Written by hand: neither ``zstandard`` nor databento-dbn checks that a stream ends where
its last frame does.
"""

from __future__ import annotations

from pathlib import Path

from foxhunt.data.errors import BarDataError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SUFFIX = ".zst"


def is_zstd_start(head: bytes) -> bool:
    """``head`` (a file's first 4 bytes) begins zstd data: a frame, or a skippable frame (``pzstd``
    writes one first; such a file was refused as "not zstd data": found reviewing the change)."""
    return len(head) == 4 and (head == ZSTD_MAGIC or int.from_bytes(head, "little") in _ZSTD_SKIPPABLE)


def check_zstd_file(file: Path) -> None:
    """A file named ``.zst``: refused (:class:`BarDataError`, one line naming it) unless it holds
    whole zstd data."""
    try:
        with open(file, "rb") as handle:
            if not is_zstd_start(handle.read(4)):
                raise BarDataError(f"{file}: not zstd data, though named {ZSTD_SUFFIX} (no zstd frame at its start)")
            problem = zstd_problem(handle)
    except OSError as exc:
        raise BarDataError(f"{file}: cannot read ({' '.join(str(exc).split())})") from None
    if problem is not None:
        raise BarDataError(f"{file}: {problem}")


_ZSTD_FRAME_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_ZSTD_RESERVED_BLOCK = 3


def zstd_problem(handle) -> str | None:
    """Why the zstd data of ``handle`` is not whole ("truncated: ...", "corrupt ...": the frame
    layout of RFC 8878 walked block by block, nothing decompressed), or None.

    The DBN decoder stops quietly where a cut zstd stream ends, so a download cut short would
    read as fewer records (or none): each frame must end with its last block (and checksum)."""
    size = handle.seek(0, 2)
    pos = 0

    def read(at: int, count: int) -> bytes | None:
        if at + count > size:
            return None
        handle.seek(at)
        return handle.read(count)

    cut = "truncated: the zstd data ends inside a frame at byte {} of {} (the file was cut short)"
    while pos < size:
        magic = read(pos, 4)
        if magic is None:
            return cut.format(pos, size)
        number = int.from_bytes(magic, "little")
        if number in _ZSTD_SKIPPABLE:
            skipped = read(pos + 4, 4)
            if skipped is None or pos + 8 + int.from_bytes(skipped, "little") > size:
                return cut.format(pos, size)
            pos += 8 + int.from_bytes(skipped, "little")
            continue
        if number != _ZSTD_FRAME_MAGIC:
            return f"corrupt zstd data: no zstd frame at byte {pos} of {size}"
        descriptor = read(pos + 4, 1)
        if descriptor is None:
            return cut.format(pos, size)
        flags = descriptor[0]
        if flags & 0x08:
            return f"corrupt zstd data: reserved bit set in the frame header at byte {pos}"
        single = bool(flags & 0x20)
        header = (0 if single else 1) + (0, 1, 2, 4)[flags & 0x03] + ((1 if single else 0), 2, 4, 8)[flags >> 6]
        pos += 5 + header
        while True:
            block = read(pos, 3)
            if block is None:
                return cut.format(pos, size)
            value = int.from_bytes(block, "little")
            kind, length = (value >> 1) & 0x03, value >> 3
            if kind == _ZSTD_RESERVED_BLOCK:
                return f"corrupt zstd data: a reserved block type at byte {pos}"
            pos += 3 + (1 if kind == 1 else length)
            if pos > size:
                return cut.format(size, size)
            if value & 0x01:
                break
        if flags & 0x04:
            pos += 4
            if pos > size:
                return cut.format(size, size)
    return None
