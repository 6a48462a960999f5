"""HAProxy's ``show stat`` answer, read as rows (pure).

The answer is CSV whose first line, the header, starts with ``# `` (HAProxy's
doc/management.txt, "show stat": "The first line is a header starting with a sharp"); each
row is a dict keyed by the header's names (``pxname``, ``svname``, ``status``, ``scur``, ...).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator


def stat_rows(stat_csv: str) -> Iterator[dict[str, str]]:
    """Each row of a ``show stat`` answer (empty text: none)."""
    yield from csv.DictReader(io.StringIO(stat_csv.lstrip("# ")))


def stat_int(text: str | None, default: int = 0) -> int:
    """A numeric column's value; ``default`` when it is empty or not a number."""
    try:
        return int(text or default)
    except ValueError:
        return default
