"""The one exception every data source raises for bad input data.

:class:`BarDataError` subclasses :class:`ValueError` so callers that already catch bad
values keep working; its message is always one line that names where the problem is
(the file or source, and the row, record or field). It is a
:class:`foxhunt.errors.UserError`: the entry points print it as ``data error: <message>``.
"""

from __future__ import annotations

from foxhunt.errors import UserError


class BarDataError(UserError, ValueError):
    """Bad or unreadable market data: the message names the file (or source) and the row/field."""

    kind = "data"
