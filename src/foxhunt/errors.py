"""One line per error: how an exception becomes the line a user reads (stderr, an ``error`` tag,
a summary row). Defined here only.

:func:`one_line_error` joins a multi-line message into one line; for Hydra's and omegaconf's
messages it drops the config search path and joins option lists (``Available options in
'asset': 6e, es, nq, zn``), and it adds the first line of the cause when the message does not
carry it. :func:`one_line` folds any text (a log's last lines) into one line of bounded length.
"""

from __future__ import annotations

#: Characters kept of a one-line error stored as an MLflow tag (MLflow allows 8000 per tag value).
TAG_TEXT_LIMIT = 5000
_ELLIPSIS = "..."


def one_line(text: str, limit: int | None = None, *, separator: str = " ", keep_end: bool = False) -> str:
    """``text``'s lines, white space folded, joined by ``separator``; cut to ``limit``
    characters (its start, or with ``keep_end`` its end, marked ``...``)."""
    lines = [" ".join(part.split()) for part in str(text).splitlines()]
    line = separator.join(part for part in lines if part)
    if limit is None or len(line) <= limit:
        return line
    cut = limit - len(_ELLIPSIS)
    return _ELLIPSIS + line[-cut:] if keep_end else line[:cut] + _ELLIPSIS


def one_line_error(
    exc: BaseException, *, with_type: bool = True, first_line: bool = False, limit: int | None = None
) -> str:
    """``exc`` as one line: ``Type: message`` (``with_type``), the whole message or only its
    first line (``first_line``), cut to ``limit`` characters (see the module doc)."""
    lines: list[str] = []
    listing: list[str] = []
    for raw in str(exc).splitlines():
        line = " ".join(raw.split())
        if not line:
            continue
        if line.startswith("Config search path"):
            break
        if lines and " " not in line and (listing or lines[-1].endswith(":")):
            listing.append(line)  # one option of a list Hydra prints one per line
            continue
        if listing:
            lines[-1] += " " + ", ".join(listing)
            listing = []
        lines.append(line)
    if listing:
        lines[-1] += " " + ", ".join(listing)
    text = (lines[0] if first_line else " ".join(lines)) if lines else ""
    cause = exc.__cause__
    if not first_line and cause is not None and str(cause).strip():
        first = " ".join(str(cause).strip().splitlines()[0].split())
        if first not in text:
            text += f" ({first})"
    if with_type:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    text = text or type(exc).__name__
    return one_line(text, limit)
