"""stdout and stderr as every command writes them.

Everything written is made visible first (``core.visible``: escape sequences, CR, NUL and the
other characters a terminal acts on are shown as ``\\x1b``, ``\\x0d``, ...), so text from a
host can never drive the operator's terminal. A stream that can no longer be written (the
operator's SSH session closed: EIO; a reader that stopped early, `fab deploy ... | head -1`:
EPIPE; a closed file) is dropped for the rest of the command and never fails it: the run's
exit code, JSON result and textfile describe what happened on the fleet, not what happened to
the terminal. Its file descriptor is pointed at /dev/null, because the interpreter flushes
the stream once more when it exits, and a failure there prints "Exception ignored ..." and
turns the exit code into 120 (CPython, Modules/main.c: 120 when Py_FinalizeEx cannot flush;
the Python documentation's "Note on SIGPIPE" in the signal module gives the same remedy).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

from tfsdeploy.core.visible import visible


class GuardedStream:
    """A text stream whose writes are made visible and never raise (see the module)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.lost = ""  # why writing stopped ("" while it works)

    def write(self, text: str) -> int:
        """Write ``text`` made visible; a stream that fails is dropped from then on."""
        if not self.lost:
            try:
                self.inner.write(visible(text))
            except (OSError, ValueError) as error:  # EIO, EPIPE, closed, unencodable
                self._lose(error)
        return len(text)

    def flush(self) -> None:
        """Flush, unless the stream was dropped (then nothing is pending)."""
        if not self.lost:
            try:
                self.inner.flush()
            except (OSError, ValueError) as error:
                self._lose(error)

    def isatty(self) -> bool:
        """Never a terminal: what is written through it may hold no escape sequence of its
        own, so libraries that colour a terminal's output (rich) write plain text."""
        return False

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ... as the inner stream's
        return getattr(self.inner, name)

    def _lose(self, error: BaseException) -> None:
        self.lost = f"{type(error).__name__}: {error}"
        try:
            fd = self.inner.fileno()
        except (OSError, ValueError, AttributeError):  # not a file (a test's stream)
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


@contextmanager
def guarded_output() -> Iterator[tuple[GuardedStream, GuardedStream]]:
    """sys.stdout and sys.stderr guarded (``GuardedStream``) while a command runs; flushed
    at its end, where a reader that went away is found last."""
    out, err = sys.stdout, sys.stderr
    streams = GuardedStream(out), GuardedStream(err)
    sys.stdout, sys.stderr = streams
    try:
        yield streams
    finally:
        for stream in streams:
            stream.flush()
        sys.stdout, sys.stderr = out, err


def guard_process_streams() -> None:
    """Guard the process's own stdout and stderr for good (`fab` loads tasks.py before it
    prints a task's help or runs one): `fab deploy --help | head -1` ends quietly. Streams a
    caller replaced (a test's capture) and streams already guarded are left as they are."""
    if sys.stdout is sys.__stdout__ and sys.stdout is not None:
        sys.stdout = GuardedStream(sys.stdout)
    if sys.stderr is sys.__stderr__ and sys.stderr is not None:
        sys.stderr = GuardedStream(sys.stderr)


@contextmanager
def hangup_survived() -> Iterator[None]:
    """SIGHUP (the operator's SSH session closed) does not end the process while a finished
    run writes its results, runs its post-hooks and reports its notifications: the default
    action would kill it with the results half written. A handler, not SIG_IGN: a handler is
    reset to the default in the hooks' processes (execve), an ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def noted(signum: int, frame: FrameType | None) -> None:
        return  # the terminal is gone: there is nobody to tell

    previous = signal.signal(signal.SIGHUP, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
