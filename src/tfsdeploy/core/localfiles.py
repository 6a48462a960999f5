"""Files the toolkit writes on the deploy machine (the JSON result, the textfile, the local
targets, fab observe's and fab render's output): each replaced whole in one rename, and made
durable before the call returns: the file's data and the directory entry that names it are
flushed (fsync), so a power loss after a run never leaves a half-written or a vanished result.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str, mode: int | None = None) -> None:
    """Replace ``path`` with ``text`` in one rename (``mode``: its permissions, else 0600),
    the file and its directory fsynced."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    sync_directory(target.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory: the entries created or renamed in it survive a power loss."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
