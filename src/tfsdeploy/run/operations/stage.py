"""Stage: the model version on every host, atomically, and never a changed version under an
existing number.

The version's files are read from the model's source on the deploying machine, following
symbolic links (DVC, git-annex and Bazel stores link to their content), hashed, and packed
with their sums into one archive; on the host they are unpacked into a hidden directory,
checked and published with one rename (``commands.stage``). A version directory already on a
host is reused only when its recorded digest is the source's (TFServing may have loaded it:
new weights need a new version number). A version staged before the host's kernel last
booted is trusted only after every file was verified again against the sums recorded at
staging (a power loss can leave a file short whatever was synced after it): a mismatch
stages it again.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tfsdeploy.core.gates import GateFailed
from tfsdeploy.hosts.commands import stage as stage_commands
from tfsdeploy.hosts.commands.files import mkdir
from tfsdeploy.run.changes import Change, Check, Command, Upload, WriteFile
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation

CHUNK = 1 << 20


class SourceError(Exception):
    """The model version on the deploying machine cannot be shipped as it is."""


def _files(root: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under ``root``, symbolic links followed, sorted."""
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


def _digest_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _HashingReader(io.RawIOBase):
    """Reads a file for the archive while hashing exactly the bytes archived."""

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


@dataclass
class VersionArchive:
    """One version of the model source, hashed and archived once per run (on first need)."""

    source: Path
    _sums: str | None = None
    _path: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sums(self) -> str:
        """``sha256sum`` lines of every file (GNU format, names relative to the version)."""
        with self._lock:
            if self._sums is None:
                lines = [f"{_digest_file(path)}  {name}" for name, path in _files(self.source)]
                self._sums = "\n".join(lines) + "\n"
            return self._sums

    def digest(self) -> str:
        """One digest of the whole version (of its sums)."""
        return hashlib.sha256(self.sums().encode()).hexdigest()

    def path(self) -> str:
        """The archive: ``version/<files>`` and ``SHA256SUMS``; files that changed since they
        were hashed are refused."""
        sums = self.sums()
        with self._lock:
            if self._path is None:
                self._path = self._build(sums)
            return self._path

    def _build(self, sums: str) -> str:
        expected = {name: digest for digest, name in
                    (line.split("  ", 1) for line in sums.splitlines())}
        fd, path = tempfile.mkstemp(prefix="tfsdeploy-", suffix=".tar")
        os.close(fd)
        with tarfile.open(path, "w") as tar:
            for name, file in _files(self.source):
                info = tarfile.TarInfo(f"version/{name}")
                info.size, info.mode = file.stat().st_size, 0o644
                with file.open("rb") as handle:
                    reader = _HashingReader(handle)
                    tar.addfile(info, io.BufferedReader(reader))
                if reader.digest.hexdigest() != expected.get(name):
                    os.unlink(path)
                    raise SourceError(f"{name} changed while it was being archived")
            data = sums.encode()
            info = tarfile.TarInfo("SHA256SUMS")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        return path

    def size_mib(self) -> float:
        """The version's size."""
        return sum(p.stat().st_size for _, p in _files(self.source)) / (1024 * 1024)

    def discard(self) -> None:
        """Delete the archive (end of the run)."""
        if self._path:
            Path(self._path).unlink(missing_ok=True)
            self._path = None


def archive_of(job: HostJob) -> VersionArchive:
    """The run's archive of the version (one for every host)."""
    run = job.run
    with run.lock:
        if run.archive is None:
            run.archive = VersionArchive(Path(run.source_dir))
        archive: VersionArchive = run.archive
    return archive


@operation("stage_model")
def stage_model(job: HostJob) -> Ops:
    """Upload the version atomically (temp dir, checksums verified, one rename), or check that
    the version already on the host is the source's."""
    version, paths = job.run.version, job.paths
    final = paths.version_dir(version)
    if job.target_running:
        return f"version {version} is in use by the running release"
    archive = archive_of(job)
    try:
        digest = archive.digest() if Path(job.run.source_dir).is_dir() else ""
    except (SourceError, OSError) as error:
        raise GateFailed("stage_model", f"version {version} readable in the model's source",
                         str(error)) from None
    replace = False
    if version in job.facts.versions:
        recorded = job.facts.versions[version]
        if not _staged_under_another_boot(job) or (digest and recorded != digest):
            return (yield from _check_staged(job, final, digest))
        if (yield from _reverified(job, final, digest)):
            return f"version {version} staged before the host's last boot: every file " \
                   "re-verified against its recorded sums"
        replace = True  # damaged: staged again below, over the damaged directory
    if not digest:
        raise GateFailed("stage_model", f"version {version} on the host or in the model's "
                         f"source ({job.run.source_dir})", "neither has it" if not replace
                         else "the host's copy failed its re-verification")
    staging = f"{paths.model_dir}/.staging-{version}-{job.run.release_id}"
    yield Command.of(mkdir(paths.model_dir), f"create {paths.model_dir}")
    yield Upload(source=archive.path, path=f"{staging}.tar",
                 what=f"version {version} ({archive.size_mib():.1f} MiB)")
    yield Command.of(stage_commands.extract(f"{staging}.tar", staging),
                     f"unpack into {staging}", timeout=600)
    yield Command.of(stage_commands.verify_and_publish(
        staging, final, digest_file=paths.digest_file(version), digest=digest,
        replace=replace), f"verify sha256 of every file and publish {final}"
        + (" over its damaged copy" if replace else ""), timeout=600)
    return f"published {final} (sha256 verified)" + (
        "; the copy staged before the host's last boot failed its re-verification and was "
        "replaced" if replace else "")


def _staged_under_another_boot(job: HostJob) -> bool:
    """A staged version with a recorded digest whose files the host has not verified since
    its kernel last booted (or whose boot is not known): a power loss may have cut them short
    after the digest was recorded (pure)."""
    facts, version = job.facts, job.run.version
    if not facts.versions.get(version):
        return False  # no digest: _check_staged verifies against the source anyway
    recorded = facts.version_boots.get(version, "")
    return not recorded or not facts.boot_id or recorded != facts.boot_id


def _reverified(job: HostJob, final: str, digest: str) -> Generator[Change, None, bool]:
    """Verify every file of a version staged under another boot against the sums recorded
    at staging (a version staged before sums were recorded: against the source's, whose
    digest is the recorded one); on success record this boot (and those sums). Returns
    whether the files matched (a plan, which runs no check, assumes they do)."""
    version, paths = job.run.version, job.paths
    recorded = job.facts.versions[version]
    legacy = not job.facts.version_boots.get(version) and digest == recorded
    sums = archive_of(job).sums().encode() if legacy else None
    verdict: dict[str, bool] = {}

    def verify() -> str:
        result = job.conn.run(stage_commands.verify_recorded(
            final, sums_file="" if legacy else paths.sums_file(version), digest=recorded),
            timeout=600, stdin=sums)
        verdict["ok"] = result.ok
        return "every file matches" if result.ok else (
            f"version {version}'s files differ from the sums recorded at staging: staged again")

    yield Check(f"re-verify version {version}'s files against the sums recorded at staging "
                "(staged before the host's last boot)", verify)
    if not verdict.get("ok", True):
        return False
    if sums is not None:
        yield WriteFile(paths.sums_file(version), sums)
    yield Command.of(stage_commands.record_boot(paths.digest_file(version), recorded),
                     f"record version {version} as verified since the host's last boot")
    return True


def _check_staged(job: HostJob, final: str, digest: str) -> Ops:
    recorded = job.facts.versions[job.run.version]
    if recorded and (recorded == digest or not digest):
        return f"version {job.run.version} already staged (digest {recorded[:12]})"
    if recorded:
        raise GateFailed("stage_model", f"version {job.run.version} on the host to hold the "
                         f"source's files (digest {digest[:12]})",
                         f"it holds other files (digest {recorded[:12]}): a version number "
                         "is never reused for new weights (TFServing may have loaded it); "
                         "publish them as a new version")
    sums = f"{job.paths.model_dir}/.sums-{job.run.version}-{job.run.release_id}"
    yield WriteFile(sums, archive_of(job).sums().encode())
    yield Command.of(stage_commands.verify_existing(
        sums, final, digest_file=job.paths.digest_file(job.run.version), digest=digest),
        f"verify the files already in {final} against the source")
    return f"version {job.run.version} already staged, verified against the source"
