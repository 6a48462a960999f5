"""A model version as a content-addressed OCI image (pure): its file manifest, the image's
config and manifest documents, and where it lives in the fleet's registry.

The image holds one layer: an uncompressed tar of ``version/<files>`` (nothing else), written
deterministically (``run.publish``), so the same files always give the same layer, config and
manifest digest: publishing again finds every blob and the manifest already there. The
version's file manifest (every file's path, sha256 and size) rides in the image config's
labels for people (``docker inspect``); a host never trusts it: it verifies the files it
extracted against the sums the deploy machine computed from the model's source.

Facts this relies on (OCI image-spec and distribution-spec, github.com/opencontainers):
- an image manifest is ``schemaVersion: 2`` with ``mediaType``
  ``application/vnd.oci.image.manifest.v1+json``, a ``config`` descriptor
  (``application/vnd.oci.image.config.v1+json``) and ``layers`` descriptors (mediaType,
  digest, size); its digest is the sha256 of the exact bytes PUT to the registry;
- ``application/vnd.oci.image.layer.v1.tar`` is an uncompressed tar layer, so the config's
  ``rootfs.diff_ids`` entry equals the layer's digest (a SavedModel's variables barely
  compress, and compression would cost every publish CPU for nothing);
- a layer entry named ``.wh.<name>`` is a whiteout (it deletes ``<name>``) and ``.wh..wh..opq``
  an opaque directory: a model file with such a name cannot travel in a layer;
- repository name components are ``[a-z0-9]+((\\.|_|__|-+)[a-z0-9]+)*`` and tags
  ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`` (distribution-spec, "Pulling manifests");
- a reference's registry is ``host[:port]``, host a DNS name (components
  ``[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`` joined by '.') or ``[IPv6]``
  (github.com/distribution/reference regexp.go, ``domainAndPort``), and Docker takes the first
  component of a name for a registry only when it holds a '.' or a ':', is ``localhost`` or
  has an upper-case letter; anything else is a Docker Hub namespace (normalize.go,
  ``splitDockerDomain``): ``registry/models/m`` is pulled from docker.io.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
LABEL_MANIFEST = "dev.tfsdeploy.files"
LABEL_MODEL = "dev.tfsdeploy.model"
LABEL_VERSION = "dev.tfsdeploy.version"
LABEL_SUMS = "dev.tfsdeploy.sums-digest"
LAYER_ROOT = "version"  # the layer's only top-level directory

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_DOMAIN_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_REGISTRY = re.compile(rf"(?P<host>{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*|\[[0-9A-Fa-f:]+\])"
                       r"(?::(?P<port>[0-9]{1,5}))?")
_WHITEOUT = ".wh."


class ArtifactError(ValueError):
    """A version that cannot travel as an image, or a registry reference that is wrong."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a version: its path relative to the version directory, sha256, size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class FileManifest:
    """Every file of one version, sorted by path."""

    files: tuple[FileEntry, ...]

    @staticmethod
    def of(entries: Iterable[FileEntry]) -> FileManifest:
        """The manifest of ``entries``; a path whose layer entry would be a whiteout is
        refused."""
        files = tuple(sorted(entries, key=lambda e: e.path))
        for entry in files:
            if any(part.startswith(_WHITEOUT) for part in entry.path.split("/")):
                raise ArtifactError(
                    f"{entry.path}: a file or directory named '.wh.*' is an OCI whiteout: in "
                    "an image layer it deletes a file instead of holding one; rename it, or "
                    "stage this model with model_transfer 'push'")
        return FileManifest(files)

    def sums(self) -> str:
        """``sha256sum`` lines (GNU format), the text both transfers verify against."""
        return canonical_sums(self.files)

    def digest(self) -> str:
        """The version's digest: the sha256 of its sums (what a host records)."""
        return sums_digest(self.sums())

    @property
    def total_bytes(self) -> int:
        """The version's size."""
        return sum(e.size for e in self.files)

    def to_json(self) -> str:
        """Compact JSON: ``[[path, sha256, size], ...]``."""
        return json.dumps([[e.path, e.sha256, e.size] for e in self.files],
                          separators=(",", ":"))


def canonical_sums(entries: Iterable[FileEntry]) -> str:
    """The one text of a version's sums, whatever carries its files (push or pull):
    ``sha256sum`` lines (GNU format) sorted by path (code points: for UTF-8 names the byte
    order of ``LC_ALL=C sort``, which the hosts' checks use)."""
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path))


def sums_digest(sums: str) -> str:
    """A version's digest: the sha256 (hex) of its sums' text."""
    return hashlib.sha256(sums.encode()).hexdigest()


def _walk_key(path: str) -> tuple[tuple[int, str], ...]:
    *directories, name = path.split("/")
    return (*((1, d) for d in directories), (0, name))


def walk_order_sums(entries: Iterable[FileEntry]) -> str:
    """The sums as a push wrote them before they had one canonical order: in ``os.walk``
    order (in each directory its files, sorted, before its subdirectories, sorted). A
    version a host staged so records their digest; it is the same files, so it is still
    accepted (``stage_model``), never written again."""
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries,
                                                               key=lambda e: _walk_key(e.path)))


def parse_sums(text: str) -> dict[str, str]:
    """``sha256sum`` lines -> {path: sha256}; a malformed line is an ArtifactError."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, path = line.partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest) or not path:
            raise ArtifactError(f"line {number} of the sums is not '<sha256>  <path>'")
        found[path] = digest
    return found


def mismatches(expected: FileManifest, seen: Mapping[str, tuple[str, int]]) -> list[str]:
    """What differs between the manifest and the files seen ({path: (sha256, size)}): missing,
    extra, other size, other content; empty when they match exactly."""
    problems: list[str] = []
    want = {e.path: e for e in expected.files}
    for path in sorted(want.keys() - seen.keys()):
        problems.append(f"{path}: missing")
    for path in sorted(seen.keys() - want.keys()):
        problems.append(f"{path}: not in the manifest")
    for path in sorted(want.keys() & seen.keys()):
        digest, size = seen[path]
        if size != want[path].size:
            problems.append(f"{path}: {size} bytes, the manifest says {want[path].size}")
        elif digest != want[path].sha256:
            problems.append(f"{path}: sha256 {digest[:12]}, the manifest says "
                            f"{want[path].sha256[:12]}")
    return problems


def sha256_digest(data: bytes) -> str:
    """An OCI digest of ``data``: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(document: Mapping[str, object]) -> bytes:
    """The exact bytes of a JSON document as pushed (sorted keys, no spaces): the same
    document always has the same digest."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor."""

    media_type: str
    digest: str
    size: int

    def as_dict(self) -> dict[str, object]:
        """The descriptor as the image manifest holds it."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def config_document(*, model: str, version: int, files: FileManifest, layer_digest: str
                    ) -> bytes:
    """The image config: a linux image with one uncompressed layer, no command, and the
    version's identity and file manifest as labels (no timestamp: content-addressed)."""
    return canonical({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {LABEL_MODEL: model, LABEL_VERSION: str(version),
                              LABEL_SUMS: files.digest(), LABEL_MANIFEST: files.to_json()}},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    })


def image_manifest(config: Descriptor, layer: Descriptor, *, model: str, version: int
                   ) -> bytes:
    """The OCI image manifest of a version's image."""
    return canonical({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": config.as_dict(), "layers": [layer.as_dict()],
        "annotations": {"org.opencontainers.image.title": f"{model} version {version}",
                        LABEL_MODEL: model, LABEL_VERSION: str(version)},
    })


@dataclass(frozen=True)
class RegistryRepo:
    """Where a model's images live: the registry's host[:port] and the repository path."""

    registry: str
    repository: str

    def reference(self, digest: str) -> str:
        """The pull reference by digest: ``registry/repository@sha256:...``."""
        return f"{self.registry}/{self.repository}@{digest}"


def repository_component(model: str) -> str:
    """A model name as one repository path component: lowercased, any run of other
    characters turned into '-'; a name that changed gets 8 hex of its sha256 so that two
    models never share a repository (``ResNet50`` and ``resnet50``)."""
    if _COMPONENT.fullmatch(model):
        return model
    lowered = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "model"
    return f"{lowered}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def registry_problem(registry: str) -> str | None:
    """Why ``registry`` is not a registry ``host[:port]`` a Docker engine pulls from, as a
    predicate ("has ..."; None: it is one). The value reaches argvs and audit lines, so
    nothing else ever passes; credentials are named, never shown."""
    if "@" in registry:
        return ("has credentials (user:password@) before its registry: they never go there "
                "(the deploy machine pushes with its own docker login, the hosts pull with "
                "theirs)")
    if registry.startswith("-"):
        return f"has a registry starting with '-' ({registry!r}): it would read as an option"
    match = _REGISTRY.fullmatch(registry)
    if match is None:
        return (f"has no registry host[:port] ({registry!r} is not a DNS name, an IPv4 "
                "address or [IPv6] with an optional :port)")
    if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        return f"has port {match['port']}, not 1-65535"
    host = match["host"]
    if not (":" in registry or "." in host or host == "localhost" or host.lower() != host):
        return (f"has a registry Docker would take for a Docker Hub namespace ({registry!r}: "
                f"no '.' and no port, so docker.io/{registry}/...)")
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why ``model_registry`` is not ``host[:port]/repository`` by the OCI reference grammar,
    as a predicate (None: it is)."""
    registry, sep, path = prefix.strip("/").partition("/")
    if prefix != prefix.strip() or not registry or not sep or not path:
        return "is not 'host[:port]/repository'"
    problem = registry_problem(registry)
    if problem is not None:
        return problem
    for part in path.split("/"):
        if not _COMPONENT.fullmatch(part):
            return (f"has {part!r}, not a repository name component (lowercase letters, "
                    "digits, '.', '_', '-')")
    return None


def shown_registry(prefix: str) -> str:
    """``prefix`` as errors may show it: what stands before an '@' in its registry part (a
    password) replaced by '***'."""
    registry, sep, path = prefix.partition("/")
    if "@" in registry:
        registry = "***@" + registry.rpartition("@")[2]
    return registry + sep + path


def model_repo(prefix: str, model: str) -> RegistryRepo:
    """The repository of ``model`` under ``model_registry`` (``host[:port]/path``)."""
    problem = prefix_problem(prefix)
    if problem is not None:
        raise ArtifactError(f"model_registry {shown_registry(prefix)!r} {problem}; write "
                            "host[:port]/repository, e.g. 'registry:5000/tfsdeploy-models'")
    registry, _, path = prefix.strip("/").partition("/")
    return RegistryRepo(registry, f"{path}/{repository_component(model)}")


def version_tag(version: int, files: FileManifest) -> str:
    """A readable tag beside the digest: ``v<version>-<12 hex of the sums digest>`` (pulls
    are always by digest; the tag only names the image for people)."""
    return f"v{version}-{files.digest()[:12]}"
