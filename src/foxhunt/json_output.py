"""JSON that foxhunt prints or writes for other programs: strict JSON, every NaN or infinite
number as ``null``. Defined here only.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which strict parsers (``jq``,
JavaScript's ``JSON.parse``, Python's own with ``parse_constant`` refusing them) reject: a run
whose loss diverged made ``foxhunt train status --json`` unreadable. A metric that is not a
number is shown as missing, as the tables show it.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float, in any dict, list or tuple, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of :func:`finite` of ``value``, refusing any number JSON has not."""
    return json.dumps(finite(value), allow_nan=False, **options)
