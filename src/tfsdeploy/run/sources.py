"""A model version's files in its source on the deploy machine: listed (symbolic links
followed: DVC, git-annex and Bazel stores link to their content) and hashed."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


class SourceError(Exception):
    """The model version on the deploying machine cannot be shipped as it is."""


def files_of(root: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under ``root``, symbolic links followed, in
    ``os.walk`` order (each directory's files, sorted, before its subdirectories, sorted): a
    layer's entries are in this order; a version's sums and digest are not
    (``core.artifact.canonical_sums`` sorts them by path)."""
    found: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for directory, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:  # a link back up the tree
            raise SourceError(f"{directory} links back to {real}: a loop in the model source")
        seen.add(real)
        dirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in relative):
                raise SourceError(f"file name {relative!r} holds a control character")
            if not path.is_file():
                raise SourceError(f"{relative} is not a regular file (a dangling link?)")
            found.append((relative, path))
    return found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashingReader(io.RawIOBase):
    """Reads a file (for an archive) while hashing exactly the bytes read: the digest is of
    what was packed, even if the file changes meanwhile."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._handle.read(len(buffer))
        self.digest.update(data)
        buffer[:len(data)] = data
        return len(data)
