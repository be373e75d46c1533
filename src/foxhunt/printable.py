"""Text read from a store or a ledger, shown on a terminal: :func:`shown`.

A tag value, a run name or a job's log line is written by whoever can write the store; printed as
it is, an escape sequence in it retitles the terminal, clears the screen or forges a line, and a
``[red]`` in it is rich markup. :func:`shown` makes every control character visible as its escape
(``\\x1b``, ``\\n``) and returns rich :class:`~rich.text.Text`, which rich never parses as
markup. Written here because rich strips only a few control codes (bell, backspace, carriage
return), never ESC.
"""

from __future__ import annotations

import re

from rich.text import Text

#: C0 and C1 control characters and DEL (tab included: it moves the cursor in a table cell).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(value: object) -> str:
    """``str(value)`` with every control character written as its escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


def shown(value: object, style: str = "") -> Text:
    """``value`` as rich Text for a terminal: control characters visible, no markup."""
    return Text(visible(value), style=style)
