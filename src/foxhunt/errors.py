"""One line per error: how an exception becomes the line a user reads (stderr, an ``error`` tag,
a summary row). Defined here only.

:func:`one_line_error` joins a multi-line message into one line; for Hydra's and omegaconf's
messages it drops the config search path and joins option lists (``Available options in
'asset': 6e, es, nq, zn``), and it adds the first line of the cause when the message does not
carry it. :func:`one_line` folds any text (a log's last lines) into one line of bounded length.

Input errors and bugs: an error the user's input caused (a :class:`UserError`: ``ConfigError``,
``BarDataError``, ``CheckpointError``, ``StoreError``; or Hydra's error for a bad override) is
reported by :func:`reported` as one line, ``<command>: <kind> error: <message>``, exit status
2, no traceback; the run's ``error`` tag is the same line without the command
(:func:`error_line`). Any other exception is a bug and keeps its traceback. ``--debug`` or
``FOXHUNT_DEBUG=1`` (or ``HYDRA_FULL_ERROR=1``) shows the traceback of an input error too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from foxhunt.printable import visible

#: Characters kept of a one-line error stored as an MLflow tag (MLflow allows 8000 per tag value).
TAG_TEXT_LIMIT = 5000
_ELLIPSIS = "..."


def one_line(text: str, limit: int | None = None, *, separator: str = " ", keep_end: bool = False) -> str:
    """``text``'s lines, white space folded, joined by ``separator``, every other control
    character made visible (:func:`foxhunt.printable.visible`: a run name read from a store
    carried an escape that retitled the terminal and a carriage return that forged a line into
    an error); cut to ``limit`` characters (its start, or with ``keep_end`` its end, marked ``...``)."""
    lines = [" ".join(part.split()) for part in str(text).splitlines()]
    line = visible(separator.join(part for part in lines if part))
    if limit is None or len(line) <= limit:
        return line
    cut = limit - len(_ELLIPSIS)
    return _ELLIPSIS + line[-cut:] if keep_end else line[:cut] + _ELLIPSIS


def one_line_error(exc: BaseException, *, with_type: bool = True, first_line: bool = False, limit: int | None = None) -> str:
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


# ----------------------------------------------------------------------------- user errors
#: Exit status of a command stopped by an error in its input (config, data, checkpoint, store).
EXIT_USER_ERROR = 2
EXIT_ON_SIGTERM = 128 + 15  # the shell's status for a process ended by SIGTERM
EXIT_ON_INTERRUPT = 128 + 2  # ... and by Ctrl-C (SIGINT)
#: Asking for the traceback of an input error: ``FOXHUNT_DEBUG=1`` (or Hydra's own
#: ``HYDRA_FULL_ERROR=1``) in the environment, or ``--debug`` on the command line.
DEBUG_ENV = "FOXHUNT_DEBUG"
DEBUG_FLAG = "--debug"
_HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"
#: Hydra's errors that mean the command line or the config is wrong (not a bug of foxhunt).
_HYDRA_INPUT_ERRORS = ("ConfigCompositionException", "MissingConfigException", "OverrideParseException", "SearchPathException")


class UserError(Exception):
    """An error in what the user gave foxhunt (config, data file, checkpoint, store URI,
    registry name, job id): reported as one line, :func:`error_line`, without a traceback.
    ``kind`` names the input in that line (``data error: ...``). A bug is any other exception."""

    kind = "input"


class ConfigError(UserError, ValueError):
    """A composed config that cannot run; the message is one line naming the key
    (:mod:`foxhunt.config.schema` and :mod:`foxhunt.config.model_schemas` raise it)."""

    kind = "config"


class FolderError(UserError):
    """A run's or a sweep's output folder that cannot be made where the config puts it."""

    kind = "config"

    @classmethod
    def of(cls, exc: OSError, keys: str) -> FolderError:
        where = exc.filename if exc.filename else "the output folder"
        return cls(f"cannot make the folder {where}: {exc.strerror or exc} (set {keys} to a folder that can be written)")


def raised_in(exc: BaseException) -> str:
    """The module whose code raised ``exc`` (its traceback's innermost frame; "" without one): a
    library's own check of what it was given (Hydra's, Lightning's, Optuna's reading a record) is
    the input's error, a foxhunt frame's is a bug."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return str(frame.tb_frame.f_globals.get("__name__", "")) if frame is not None else ""


def is_user_error(exc: BaseException) -> bool:
    """True for an error the user's input caused: a :class:`UserError`, or Hydra's error for
    a bad override or a config group option that does not exist."""
    if isinstance(exc, UserError):
        return True
    hydra_errors = sys.modules.get("hydra.errors")  # imported only where Hydra is in use
    if hydra_errors is None:
        return False
    return isinstance(exc, tuple(getattr(hydra_errors, name) for name in _HYDRA_INPUT_ERRORS))


def error_line(exc: BaseException, limit: int | None = TAG_TEXT_LIMIT) -> str:
    """The one line that stands for ``exc`` on stderr (after the command's name) and in the run's
    ``error`` tag: ``<kind> error: <message>`` for an input error, ``Type: message`` for a bug."""
    if not is_user_error(exc):
        return one_line_error(exc, limit=limit)
    kind = exc.kind if isinstance(exc, UserError) else "config"
    message = one_line_error(exc, with_type=False)
    override = getattr(exc, "override", None)  # Hydra's parse error does not repeat the override
    if isinstance(override, str) and override not in message:
        message = f"override {override!r}: {message}"
    return one_line(f"{kind} error: {message}", limit)


def debug_requested(argv: list[str] | None = None) -> bool:
    """True when the user asked for tracebacks (see :data:`DEBUG_ENV`)."""
    env = any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes") for name in (DEBUG_ENV, _HYDRA_FULL_ERROR))
    return env or DEBUG_FLAG in (argv or [])


def strip_debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether it was there."""
    kept = [arg for arg in argv if arg != DEBUG_FLAG]
    return kept, len(kept) != len(argv)


@contextmanager
def reported(prog: str, *, debug: bool = False, exit_code: int = EXIT_USER_ERROR) -> Iterator[None]:
    """Around a command: an input error becomes ``<prog>: <error_line>`` on stderr and exit
    status ``exit_code``; a bug (and any error with ``debug``) propagates with its traceback."""
    try:
        yield
    except Exception as exc:
        if debug or not is_user_error(exc):
            raise
        print(f"{prog}: {error_line(exc, limit=None)}", file=sys.stderr, flush=True)
        raise SystemExit(exit_code) from None
