"""kill -9 of a process group the moment a file changes (Linux inotify, standard library
only): the cue of a kill between two steps of a run that print nothing in between, seen on
a host (a configuration written, not yet loaded).

Run as its own process, away from the test's threads (a test process busy with its clients
may not poll for a while): ``python file_cue.py PATH``. It reads PATH, arms an inotify watch
on its directory, prints ``armed``, reads the process group id on stdin, and as soon as PATH
holds other bytes than when it was armed sends SIGKILL to that group and prints ``killed``;
it prints ``gone`` and exits when the group ends first.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from contextlib import suppress
from pathlib import Path

# <sys/inotify.h>: a file closed after writing, moved in (a rename over it), created
IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100


def content(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def main(path: Path) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, str(path.parent).encode(),
                                        IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0:
        raise OSError(ctypes.get_errno(), f"inotify on {path.parent}")
    first = content(path)
    print("armed", flush=True)
    group = int(sys.stdin.readline())
    while content(path) == first:
        if not alive(group):
            print("gone", flush=True)
            return
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            with suppress(BlockingIOError):
                os.read(fd, 65536)
    os.killpg(group, signal.SIGKILL)
    print("killed", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
