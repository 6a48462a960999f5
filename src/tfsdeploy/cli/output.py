"""Printing for people: tables and errors (rich is imported only when something prints)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from tfsdeploy.errors import ConfigError, TfsDeployError


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                stream: TextIO | None = None) -> None:
    """A table on stdout (or ``stream``)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    Console(file=stream or sys.stdout, width=140).print(table)


def print_error(error: TfsDeployError, stream: TextIO | None = None) -> None:
    """The error, with every problem and its fix, on stderr."""
    out = stream or sys.stderr
    label = "invalid input" if isinstance(error, ConfigError) else "error"
    print(f"tfsdeploy: {label}: {error}", file=out)
