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

import io
import os
import tarfile
import tempfile
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

from tfsdeploy.core.artifact import (
    ArtifactError,
    FileEntry,
    canonical_sums,
    model_repo,
    sums_digest,
    walk_order_sums,
)
from tfsdeploy.core.rollout.gates import GateFailed
from tfsdeploy.hosts.commands import pull as pull_commands
from tfsdeploy.hosts.commands import stage as stage_commands
from tfsdeploy.hosts.commands.files import mkdir
from tfsdeploy.hosts.registry import Registry, RegistryError
from tfsdeploy.run.changes import (
    Change,
    Check,
    Command,
    Publish,
    PullModel,
    RemoveImage,
    Upload,
    WriteFile,
)
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation
from tfsdeploy.run.publish import PackedVersion, Published, pack, publish
from tfsdeploy.run.sources import HashingReader, SourceError
from tfsdeploy.run.sources import file_sha256 as _digest_file
from tfsdeploy.run.sources import files_of as _files


@dataclass
class VersionArchive:
    """One version of the model source, hashed and archived once per run (on first need)."""

    source: Path
    _entries: tuple[FileEntry, ...] | None = None
    _path: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def entries(self) -> tuple[FileEntry, ...]:
        """Every file of the version: its name relative to the version, sha256 and size."""
        with self._lock:
            if self._entries is None:
                self._entries = tuple(FileEntry(name, _digest_file(path), path.stat().st_size)
                                      for name, path in _files(self.source))
            return self._entries

    def sums(self) -> str:
        """``sha256sum`` lines of every file in the canonical order (``canonical_sums``: a
        pull's are the same text)."""
        return canonical_sums(self.entries())

    def digest(self) -> str:
        """One digest of the whole version (of its sums), the one a pull records too."""
        return sums_digest(self.sums())

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
                    reader = HashingReader(handle)
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


@dataclass(frozen=True)
class SourceSums:
    """The source's sums of the version: in the canonical order (what this toolkit records,
    push or pull) and in the ``os.walk`` order an earlier push recorded (the same files)."""

    canonical: str
    walk_order: str

    @staticmethod
    def of(entries: tuple[FileEntry, ...]) -> SourceSums:
        """Both texts of ``entries``' sums."""
        return SourceSums(canonical_sums(entries), walk_order_sums(entries))

    @property
    def digest(self) -> str:
        """The version's canonical digest."""
        return sums_digest(self.canonical)

    def recorded_as(self, recorded: str) -> str | None:
        """The text of these sums whose digest a host recorded as ``recorded`` (None: the
        host's version holds other files)."""
        return next((text for text in (self.canonical, self.walk_order)
                     if recorded and sums_digest(text) == recorded), None)


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
    pulling = job.host.vars.model_transfer == "pull"
    try:
        source = None if not Path(job.run.source_dir).is_dir() else SourceSums.of(
            packed_of(job).files.files if pulling else archive.entries())
    except (SourceError, ArtifactError, OSError) as error:
        raise GateFailed("stage_model", f"version {version} readable in the model's source",
                         str(error)) from None
    digest = source.digest if source else ""
    replace = False
    if version in job.facts.versions:
        recorded = job.facts.versions[version]
        if not _staged_under_another_boot(job) or (source and not source.recorded_as(recorded)):
            return (yield from _check_staged(job, final, source))
        if (yield from _reverified(job, final, source)):
            return f"version {version} staged before the host's last boot: every file " \
                   "re-verified against its recorded sums"
        replace = True  # damaged: staged again below, over the damaged directory
    if not digest:
        raise GateFailed("stage_model", f"version {version} on the host or in the model's "
                         f"source ({job.run.source_dir})", "neither has it" if not replace
                         else "the host's copy failed its re-verification")
    if pulling:
        detail = yield from _pull(job, final, digest, replace=replace)
        return detail
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


def _reverified(job: HostJob, final: str, source: SourceSums | None
                ) -> Generator[Change, None, bool]:
    """Verify every file of a version staged under another boot against the sums recorded
    at staging (a version staged before sums were recorded: against the source's, whose
    digest is the recorded one); on success record this boot (and those sums). Returns
    whether the files matched (a plan, which runs no check, assumes they do)."""
    version, paths = job.run.version, job.paths
    recorded = job.facts.versions[version]
    as_recorded = source.recorded_as(recorded) if source else None
    legacy = not job.facts.version_boots.get(version) and as_recorded is not None
    sums = as_recorded.encode() if as_recorded is not None and legacy else None
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


def _check_staged(job: HostJob, final: str, source: SourceSums | None) -> Ops:
    recorded = job.facts.versions[job.run.version]
    if recorded and (source is None or source.recorded_as(recorded) is not None):
        return f"version {job.run.version} already staged (digest {recorded[:12]})"
    if source is None:
        raise GateFailed("stage_model", f"version {job.run.version} on the host with its "
                         "digest, or in the model's source", "the host's copy has no "
                         f"recorded digest and the source ({job.run.source_dir}) no version")
    if recorded:
        raise GateFailed("stage_model", f"version {job.run.version} on the host to hold the "
                         f"source's files (digest {source.digest[:12]})",
                         f"it holds other files (digest {recorded[:12]}): a version number "
                         "is never reused for new weights (TFServing may have loaded it); "
                         "publish them as a new version")
    sums = f"{job.paths.model_dir}/.sums-{job.run.version}-{job.run.release_id}"
    yield WriteFile(sums, source.canonical.encode())
    yield Command.of(stage_commands.verify_existing(
        sums, final, digest_file=job.paths.digest_file(job.run.version), digest=source.digest),
        f"verify the files already in {final} against the source")
    return f"version {job.run.version} already staged, verified against the source"


# -- model_transfer pull -----------------------------------------------------------------------

# room kept free beside a pulled version (the staging copy's directories, the sums, the
# records): a version that exactly fills a disk would leave the host unable to write its logs
PULL_MARGIN_BYTES = 64 << 20


def packed_of(job: HostJob) -> PackedVersion:
    """The run's image of the version (packed on first need, once for every host)."""
    run = job.run
    with run.publish_lock:
        if run.packed is None:
            run.packed = pack(run.model.name, run.version, Path(run.source_dir))
        packed: PackedVersion = run.packed
    return packed


def publish_once(job: HostJob) -> str:
    """Publish the version to the host's ``model_registry`` unless this run already did (or
    failed to: every host then fails with the same reason, without asking again)."""
    run, host_vars = job.run, job.host.vars
    prefix = str(host_vars.model_registry)
    with run.publish_lock:
        done = run.published.get(prefix)
        if done is None:
            registry = Registry(prefix.split("/", 1)[0],
                                insecure=host_vars.model_registry_insecure)
            try:
                done = publish(run.packed, registry, prefix)
            except (RegistryError, SourceError, ArtifactError) as error:
                done = error
            finally:
                registry.close()
            run.published[prefix] = done
    if isinstance(done, Exception):
        raise GateFailed("stage_model", f"version {run.version} published to {prefix}",
                         str(done))
    published: Published = done
    return published.describe()


def _pull(job: HostJob, final: str, digest: str, *, replace: bool) -> Ops:
    """Publish if needed, pull by digest, copy out, verify against the source's sums,
    publish into place with one rename; the image is removed once the files are in place."""
    run, paths, host_vars = job.run, job.paths, job.host.vars
    packed = packed_of(job)
    prefix = str(host_vars.model_registry)
    reference = model_repo(prefix, run.model.name).reference(packed.digest)
    staging = f"{paths.model_dir}/.pull-{run.version}"
    size_mib = packed.files.total_bytes / (1 << 20)
    yield Publish(f"publish version {run.version} to {prefix} unless it is there",
                  lambda: publish_once(job))
    yield Command.of(pull_commands.free_space(
        paths.model_dir, need_bytes=packed.files.total_bytes + PULL_MARGIN_BYTES,
        image_bytes=packed.layer.size), f"room for version {run.version} "
        f"({size_mib:.1f} MiB) and its image on the host")
    yield PullModel(reference, what=f"version {run.version} ({size_mib:.1f} MiB)")
    yield Command.of(pull_commands.extract(reference, staging, model=run.model.name),
                     f"copy version {run.version} out of its image into {staging}",
                     timeout=600)
    yield WriteFile(f"{staging}/SHA256SUMS", packed.files.sums().encode())
    yield Command.of(pull_commands.verify_pulled(staging),
                     "verify every pulled file against the source's sha256 and file list",
                     timeout=600)
    yield Command.of(stage_commands.verify_and_publish(
        staging, final, digest_file=paths.digest_file(run.version), digest=digest,
        replace=replace, checked=True),
        f"publish {final}" + (" over its damaged copy" if replace else ""), timeout=600)
    yield RemoveImage(reference)
    return f"pulled {reference}, published {final} (sha256 verified)"
