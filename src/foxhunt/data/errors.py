"""The one exception every data source raises for bad input data.

:class:`BarDataError` subclasses :class:`ValueError` so callers that already catch bad
values keep working; its message is always one line that names where the problem is
(the file or source, and the row, record or field).
"""

from __future__ import annotations


class BarDataError(ValueError):
    """Bad or unreadable market data: the message names the file (or source) and the row/field."""
