"""TF-style logging to stderr: ``2024-01-02 03:04:05.678901: I file.cc:123] message``.

Deploy tools show the tail of the server log on failure, so the lines look like the real
server's (same prefixes, same message texts where it matters).
"""

from __future__ import annotations

import datetime
import sys
import threading

_LOCK = threading.Lock()


def _emit(level: str, where: str, message: str) -> None:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    line = f"{now}: {level} {where}] {message}\n"
    with _LOCK:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def info(where: str, message: str) -> None:
    """Log an INFO line; ``where`` names the TFServing source file it mirrors."""
    _emit("I", where, message)


def warning(where: str, message: str) -> None:
    """Log a WARNING line."""
    _emit("W", where, message)


def error(where: str, message: str) -> None:
    """Log an ERROR line."""
    _emit("E", where, message)
