"""The signals that ask a long run to stop, and their handlers installed for a block."""

from __future__ import annotations

import contextlib
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

# Ctrl-C, SIGTERM (cron, systemd) and SIGHUP (the operator's SSH session dropped)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Handler = Callable[[int], None]

_END = -1  # no signal's number: the block is over


@contextmanager
def handled(handler: Handler, wanted: Sequence[signal.Signals] = STOP_SIGNALS
            ) -> Iterator[None]:
    """``handler(signum)`` for each of ``wanted`` that arrives inside the block, the previous
    handlers after it. Outside the main thread (where Python allows no handler) the block
    runs as it is.

    The handler runs in a thread of its own, one signal after another, never in Python's
    signal handler: that one runs in the main thread between any two of its bytecodes, so a
    handler that printed would wait forever for the reporter's lock whenever the signal came
    while the main thread held it (a Ctrl-C pressed during a progress line). The signal
    handler only puts the number on a ``queue.SimpleQueue``, whose ``put`` is documented as
    safe there. Signals still queued when the block ends are handled before it returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: queue.SimpleQueue[int] = queue.SimpleQueue()

    def arrive(signum: int, frame: FrameType | None) -> None:
        arrived.put(signum)

    def deliver() -> None:
        while (signum := arrived.get()) != _END:
            try:
                handler(signum)
            except Exception as error:  # a handler's fault must not end the run
                with contextlib.suppress(Exception):  # nor this thread: later signals count
                    print(f"tfsdeploy: handling {signal.Signals(signum).name} failed: "
                          f"{error}", file=sys.stderr)

    worker = threading.Thread(target=deliver, name="signals", daemon=True)
    worker.start()
    previous = {s: signal.signal(s, arrive) for s in wanted}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
        arrived.put(_END)
        worker.join()
