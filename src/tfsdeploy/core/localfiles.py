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

import ctypes
import fcntl
import os
import tempfile
from collections.abc import Iterator, Mapping
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
    temp = _write_temporary(target, data, mode=mode, fsync=True)
    try:
        os.replace(temp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _sync_directory(target.parent)


def _write_temporary(target: Path, data: str | bytes, *, mode: int, fsync: bool) -> str:
    """``data`` (text as UTF-8) in a new temporary file beside ``target``, with ``mode``;
    fsynced when asked. Its path; nothing is left behind when the write fails."""
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return temp


def sync_filesystem(path: str | Path) -> None:
    """Commit every written file and directory entry of the file system holding ``path``
    (Linux syncfs(2); sync(2) where the C library has no syncfs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    syncfs = getattr(libc, "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), str(path))
    finally:
        os.close(fd)


def write_durable_many(files: Mapping[Path, str | bytes], root: Path, *,
                       mode: int = 0o600) -> None:
    """Replace each of many files under ``root`` durably with two commits of the file
    system instead of two fsyncs per file: every file written to a temporary name beside it,
    then one syncfs (the data is on disk), every rename, then one syncfs (the names are).
    A reader or a power loss finds each file old or whole, never half, as with
    ``write_durable``. ``fab render`` writes thousands: with an fsync of each file and its
    directory, 5,000 files took 5.3 s of a 7.3 s render on this machine's disk."""
    temps: list[tuple[str, Path]] = []
    renamed = 0
    made: set[Path] = set()  # each folder made once (a render writes five files into each)
    try:
        for path, data in files.items():
            if path.parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(path.parent)
            temps.append((_write_temporary(path, data, mode=mode, fsync=False), path))
        sync_filesystem(root)
        for temp, path in temps:
            os.replace(temp, path)
            renamed += 1
    finally:
        for temp, _ in temps[renamed:]:  # those not renamed when a write or rename failed
            with suppress(FileNotFoundError):
                os.unlink(temp)
    sync_filesystem(root)


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
