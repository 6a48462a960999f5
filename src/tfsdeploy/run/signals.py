"""The signals that ask a long run to stop, and their handlers installed for a block."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

# Ctrl-C, SIGTERM (cron, systemd) and SIGHUP (the operator's SSH session dropped)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], None]


@contextmanager
def handled(handler: Handler, wanted: Sequence[signal.Signals] = STOP_SIGNALS
            ) -> Iterator[None]:
    """``handler`` for each of ``wanted`` inside the block, the previous handlers after it.
    Outside the main thread (where Python allows no handler) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
