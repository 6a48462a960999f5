"""Publishing a model version to the fleet's registry: packed once into a deterministic,
content-addressed image (``core.artifact``), pushed blob by blob only where the registry lacks
it, so that a second publish of the same files sends nothing and names the same digest.

The layer is an uncompressed tar of ``version/<files>``: entries sorted, every directory
0755 and file 0644, owner 0:0 without names, mtime 0, PAX format. Its digest is computed
while the files are read once for their sums; the tar is written again only when the
registry lacks it, and refused when its bytes no longer give that digest (a file changed
meanwhile).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tfsdeploy.core.artifact import (
    CONFIG_TYPE,
    LAYER_ROOT,
    LAYER_TYPE,
    MANIFEST_TYPE,
    Descriptor,
    FileEntry,
    FileManifest,
    RegistryRepo,
    config_document,
    image_manifest,
    model_repo,
    sha256_digest,
    version_tag,
)
from tfsdeploy.hosts.registry import CHUNK, Registry
from tfsdeploy.run.sources import HashingReader, SourceError, files_of


class _Sink(io.RawIOBase):
    """A write-only stream that hashes and counts what it is given (and may keep it)."""

    def __init__(self, keep: IO[bytes] | None = None) -> None:
        self.digest = hashlib.sha256()
        self.size = 0
        self._keep = keep

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.size += len(data)
        if self._keep is not None:
            self._keep.write(data)
        return len(data)


def _entry(name: str, *, directory: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    return info


def write_layer(source: Path, sink: IO[bytes]) -> FileManifest:
    """Write the layer of the version in ``source`` to ``sink``; returns the files' manifest
    (hashed from the very bytes written)."""
    files = files_of(source)
    directories = {LAYER_ROOT}
    for name, _ in files:
        parent = Path(LAYER_ROOT, name).parent
        while str(parent) != ".":
            directories.add(str(parent))
            parent = parent.parent
    entries: list[FileEntry] = []
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            tar.addfile(_entry(directory, directory=True))
        for name, path in files:
            size = path.stat().st_size
            with path.open("rb") as handle:
                reader = HashingReader(handle)
                try:
                    tar.addfile(_entry(f"{LAYER_ROOT}/{name}", directory=False, size=size),
                                io.BufferedReader(reader))
                except OSError as error:  # shorter than its size: it changed while read
                    raise SourceError(f"{name} changed while it was being packed: "
                                      f"{error}") from None
                if handle.read(1):
                    raise SourceError(f"{name} grew while it was being packed")
            entries.append(FileEntry(name, reader.digest.hexdigest(), size))
    return FileManifest.of(entries)


@dataclass(frozen=True)
class PackedVersion:
    """One version as an image: its files' manifest and the image's documents and digests."""

    model: str
    version: int
    source: Path
    files: FileManifest
    layer: Descriptor
    config: bytes
    manifest: bytes

    @property
    def digest(self) -> str:
        """The image manifest's digest: what hosts pull."""
        return sha256_digest(self.manifest)

    @property
    def config_descriptor(self) -> Descriptor:
        """The config blob's descriptor."""
        return Descriptor(CONFIG_TYPE, sha256_digest(self.config), len(self.config))


def pack(model: str, version: int, source: Path) -> PackedVersion:
    """Read the version once: its files' sums and sizes and the image's digests (nothing is
    written: the layer is only hashed)."""
    sink = _Sink()
    files = write_layer(source, sink)  # type: ignore[arg-type]
    layer = Descriptor(LAYER_TYPE, "sha256:" + sink.digest.hexdigest(), sink.size)
    config = config_document(model=model, version=version, files=files,
                             layer_digest=layer.digest)
    config_desc = Descriptor(CONFIG_TYPE, sha256_digest(config), len(config))
    return PackedVersion(model=model, version=version, source=source, files=files,
                         layer=layer, config=config,
                         manifest=image_manifest(config_desc, layer, model=model,
                                                 version=version))


@dataclass(frozen=True)
class Published:
    """What a publish did: the image's reference by digest and what it uploaded."""

    repo: RegistryRepo
    digest: str
    tag: str
    uploaded: tuple[str, ...]  # "layer", "config", "manifest": the parts the registry lacked
    uploaded_bytes: int

    @property
    def reference(self) -> str:
        """``registry/repository@sha256:...``."""
        return self.repo.reference(self.digest)

    def describe(self) -> str:
        """One line for people."""
        if not self.uploaded:
            return f"{self.reference} already in the registry: nothing pushed"
        return (f"{self.reference} published ({', '.join(self.uploaded)}: "
                f"{self.uploaded_bytes / (1 << 20):.1f} MiB pushed)")


def _layer_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def _upload_layer(packed: PackedVersion, registry: Registry, repo: RegistryRepo) -> None:
    with tempfile.NamedTemporaryFile(prefix="tfsdeploy-layer-", suffix=".tar") as spool:
        sink = _Sink(keep=spool)
        files = write_layer(packed.source, sink)  # type: ignore[arg-type]
        spool.flush()
        if files != packed.files or "sha256:" + sink.digest.hexdigest() != packed.layer.digest:
            raise SourceError(f"version {packed.version}'s files changed since they were "
                              "hashed: run again")
        registry.upload_blob(repo.repository, packed.layer.digest, packed.layer.size,
                             lambda: _layer_chunks(spool.name))


def publish(packed: PackedVersion, registry: Registry, prefix: str) -> Published:
    """Push what the registry lacks of the version's image (layer, config, then the manifest
    last: a manifest is only ever there with its blobs) under ``prefix``'s repository."""
    repo = model_repo(prefix, packed.model)
    tag = version_tag(packed.version, packed.files)
    before = registry.sent_bytes
    if registry.has_manifest(repo.repository, packed.digest, MANIFEST_TYPE):
        return Published(repo, packed.digest, tag, (), 0)
    uploaded: list[str] = []
    if not registry.has_blob(repo.repository, packed.layer.digest):
        _upload_layer(packed, registry, repo)
        uploaded.append("layer")
    config = packed.config_descriptor
    if not registry.has_blob(repo.repository, config.digest):
        registry.upload_blob(repo.repository, config.digest, config.size,
                             lambda: packed.config)
        uploaded.append("config")
    given = registry.put_manifest(repo.repository, tag, packed.manifest, MANIFEST_TYPE)
    if given and given != packed.digest:
        raise SourceError(f"the registry named the manifest {given}, not {packed.digest}: "
                          "it rewrote the manifest; hosts could not pull it by digest")
    uploaded.append("manifest")
    return Published(repo, packed.digest, tag, tuple(uploaded), registry.sent_bytes - before)
