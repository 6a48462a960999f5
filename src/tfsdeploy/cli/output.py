"""Printing for people: progress lines, tables, errors, JSON (rich is imported only when a
table prints)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tfsdeploy.core.errors import ConfigError, TfsDeployError

if TYPE_CHECKING:
    from tfsdeploy.hosts.dockerssh import PullProgress


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


def print_error(error: BaseException, stream: TextIO | None = None) -> None:
    """The error, with every problem and its fix, on stderr."""
    out = stream or sys.stderr
    label = "invalid input" if isinstance(error, ConfigError) else "error"
    if not isinstance(error, TfsDeployError):
        label = f"unexpected {type(error).__name__} (a defect of tfsdeploy; --debug shows " \
                "the traceback)"
    print(f"tfsdeploy: {label}: {error}", file=out)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    json.dump(data, sys.stdout, indent=2, default=str)
    print()


class LineReporter:
    """Progress lines as steps finish: elapsed, host, phase, step, status, duration, detail.

    A stream that can no longer be written (the operator's terminal closed: SIGHUP) is
    dropped, never allowed to fail the run; the log file keeps every line.
    """

    def __init__(self, stream: TextIO, log_file: str | None = None) -> None:
        self._streams: list[TextIO] = [stream]
        if log_file:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            self._streams.append(open(log_file, "a", buffering=1))  # noqa: SIM115
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._pulls: dict[tuple[str, str], float] = {}
        self.events: list[dict[str, Any]] = []  # for --json: pull progress, as printed

    def _print(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        for index, stream in enumerate(list(self._streams)):
            try:
                print(f"{stamp} {text}" if index else text, file=stream, flush=True)
            except (OSError, ValueError):
                self._streams.remove(stream)

    def step(self, host: str, phase: str, task: str, status: str, seconds: float,
             detail: str) -> None:
        """Print one finished step."""
        first, *rest = (detail or "").splitlines() or [""]
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] {host:<10} {phase:<9} "
                        f"{task:<15} {status:<7} {seconds:6.2f}s  {first}")
            for line in rest:
                self._print(f"{'':>60}{line}")

    def note(self, text: str) -> None:
        """Print a fleet-level message."""
        with self._lock:
            self._print(f"[{time.monotonic() - self._start:7.1f}s] == {text}")

    def progress(self, host: str, update: PullProgress) -> None:
        """An image pull's progress, at most once a second per host and image."""
        key = (host, update.image)
        now = time.monotonic()
        done = update.layers_total and update.layers_done == update.layers_total
        if now - self._pulls.get(key, 0.0) < 1.0 and not done:
            return
        self._pulls[key] = now
        self.events.append({**update.as_event(), "host": host,
                            "at_s": round(now - self._start, 3)})
        mib = update.bytes_done / (1 << 20)
        total = f"/{update.bytes_total / (1 << 20):.0f}" if update.bytes_total else ""
        self.note(f"{host}: pull {update.image}: {update.layers_done}/{update.layers_total} "
                  f"layers, {mib:.0f}{total} MiB")
