"""Text read from a store or a ledger, shown on a terminal: :func:`shown`.

A tag value, a run name or a job's log line is written by whoever can write the store; printed as
it is, an escape sequence in it retitles the terminal, clears the screen or forges a line, and a
``[red]`` in it is rich markup. :func:`shown` makes every control character visible as its escape
(``\\x1b``, ``\\n``) and returns rich :class:`~rich.text.Text`, which rich never parses as
markup. Unicode's bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C)
are made visible as well (``\\u202e``): printed, they reorder the rest of a line, so an asset
or a run name could show as another ("Trojan Source"). Written here because rich strips only a
few control codes (bell, backspace, carriage return), never ESC nor these.
"""

from __future__ import annotations

import re

from rich.text import Text

#: C0 and C1 control characters and DEL (tab included: it moves the cursor in a table cell), and
#: Unicode's bidirectional controls (module doc).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(value: object) -> str:
    """``str(value)`` with every control character written as its escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


def shown(value: object, style: str = "") -> Text:
    """``value`` as rich Text for a terminal: control characters visible, no markup."""
    return Text(visible(value), style=style)
