"""Files the toolkit writes on the deploy machine, written durably, and the lock around a
read-modify-write of one of them.

A file that replaces another is written to a temporary name in the same directory, fsynced,
renamed over the old one, and the directory fsynced: a reader (node_exporter, Prometheus'
file_sd, a cron job's next step) sees the old file or the new one, never half of one, and
after a power loss the rename is either there with the whole file or not there. The rename
alone gives the first half only: ext4 (delayed allocation) and xfs may keep the rename and
lose the data, leaving an empty file; fsync(2) of the directory commits the entry (ext4 and
xfs document fsync of the directory for this; Linux's fsync(2) man page: "calling fsync() on
the file descriptor of the directory is also needed"). The hosts' files follow the same rule
in shell (``commands.files``).

Appends that must outlive a crash (this machine's journal of boots, ``lock``) are fsynced
before the caller goes on.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each new entry fsynced in its parent."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for new in reversed(missing):
        with suppress(FileExistsError):
            new.mkdir()
        _sync_directory(new.parent)


def write_durable(path: str | Path, data: str | bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8) in one durable rename: a temporary file
    beside it, fsynced, renamed over it, the directory fsynced. ``mode``: the new file's
    permissions (0600 unless said: a result may name hosts and releases)."""
    target = Path(path)
    _make_parents(target.parent)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _sync_directory(target.parent)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` in one rename, not fsynced: a reader sees the old file or
    the new one, never half of one, but a power loss may lose either. For files a person or
    a later step reads now and can make again (``fab render``'s output): 5,000 files with an
    fsync each took 5.3 s of a 7 s render on this machine's disk."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(temp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def append_durable(path: str | Path, line: str, *, mode: int = 0o600) -> None:
    """Append ``line`` (a newline added) to ``path``, created when missing, and fsync it (and
    its directory when it was created) before returning."""
    target = Path(path)
    _make_parents(target.parent)
    created = not target.exists()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _sync_directory(target.parent)


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` for a read-modify-write of ``path``: on a hidden lock file
    beside it (``.<name>.lock``), not on ``path`` itself, whose inode each rename replaces
    (a lock on the old inode would not keep out a writer that opened the new one). The lock
    file is opened read-only (flock needs no write access), so users sharing the file share
    the lock; node_exporter's textfile collector reads only ``*.prom`` files."""
    target = Path(path)
    _make_parents(target.parent)
    lock_file = target.parent / f".{target.name}.lock"
    fd = os.open(lock_file, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
