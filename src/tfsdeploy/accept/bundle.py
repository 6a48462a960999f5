"""The generator's Python environment, packed from the toolkit's own for a generator host.

What a generator host receives: the installed files of exactly the distributions the load
generator imports (found by importing its entry modules in a clean interpreter), byte for byte
as this environment has them (each file checked against its distribution's RECORD hash), plus
the toolkit's own ``tfsdeploy`` package as this checkout has it. The host unpacks them into a
``python3 -m venv --without-pip`` environment: it needs only ``python3`` of the same version,
ABI and architecture (checked first), and no network, pip or compiler.

Why files and not wheels installed by pip: a stock Debian ``python3`` has no ``ensurepip``, so a
venv there has no pip; and the installed files are what this toolkit runs with (no rebuild,
nothing fetched). TensorFlow is not among them: the generator receives its requests already
serialized (``--data-serialized``), so it never needs TensorFlow's message definitions.

The bundle is named by a content hash (interpreter ABI, each distribution's name, version and
RECORD, each file of the toolkit's package): hosts keep one environment per hash and reuse it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.metadata as metadata
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import tfsdeploy

BUNDLE_FORMAT = 1
# what the generator imports: its command line, worker processes, transport, and what the
# worker processes import after a spawn
GENERATOR_MODULES = ("tfsdeploy.loadtest.cli", "tfsdeploy.loadtest.parallel",
                     "tfsdeploy.loadtest.engine", "tfsdeploy.loadtest.transport",
                     "tfsdeploy.loadtest.hostcpu", "grpc.aio", "hdrh.histogram")
OWN_PACKAGE = "tfsdeploy"
KEEP_BUNDLES = 3
_CLOSURE_SCRIPT = """\
import importlib, json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


class BundleError(RuntimeError):
    """The generator environment could not be packed from this one."""


@dataclass(frozen=True)
class Member:
    """One file of the bundle: where it is here, and its path inside site-packages."""

    source: Path
    arcname: str
    sha256: str | None  # from RECORD (urlsafe base64, unpadded), None when RECORD has none


@dataclass(frozen=True)
class Bundle:
    """A packed generator environment."""

    key: str
    path: Path
    distributions: tuple[tuple[str, str], ...]


def import_check() -> str:
    """Python code that imports what the generator needs (run on the host after unpacking)."""
    return "import " + ", ".join(GENERATOR_MODULES)


def platform_facts() -> dict[str, object]:
    """This interpreter's facts, as the host probe reports its own."""
    return {"python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "soabi": sysconfig.get_config_var("SOABI"), "machine": platform.machine(),
            "libc": list(platform.libc_ver())}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def compatibility_problem(local: dict[str, object], remote: dict[str, object]) -> str | None:
    """Why the host's python3 cannot run this environment's files, or None when it can.

    Compiled extensions (grpcio, numpy) need the same Python ABI and machine, and a C library
    at least as new as the one they run on here.
    """
    for key, what in (("soabi", "Python ABI"), ("machine", "architecture")):
        if local.get(key) != remote.get(key):
            return (f"{what} {remote.get(key)} (python3 {remote.get('python')}) differs from the "
                    f"toolkit's {local.get(key)} (Python {local.get('python')})")
    mine, theirs = local.get("libc") or ["", ""], remote.get("libc") or ["", ""]
    assert isinstance(mine, list) and isinstance(theirs, list)
    if mine[0] and (theirs[0] != mine[0]
                    or _version_tuple(str(theirs[1])) < _version_tuple(str(mine[1]))):
        return (f"C library {' '.join(map(str, theirs))} is older than the toolkit's "
                f"{' '.join(map(str, mine))}")
    return None


def closure_distributions(python: str = sys.executable) -> list[str]:
    """The distributions whose modules the generator imports, found in a clean interpreter
    (this process has imported far more), the toolkit itself left out (shipped as source)."""
    try:
        out = subprocess.run([python, "-c", _CLOSURE_SCRIPT, *GENERATOR_MODULES],
                             capture_output=True, text=True, timeout=120, check=True,
                             env={**os.environ, "PYTHONPATH": str(_package_dir().parent)})
    except (OSError, subprocess.SubprocessError) as err:
        raise BundleError(f"importing the generator's modules failed: {err}") from err
    tops = json.loads(out.stdout)
    owners = metadata.packages_distributions()
    names = {dist for top in tops for dist in owners.get(top, [])}
    names.discard(OWN_PACKAGE)
    return sorted(names, key=str.lower)


def _package_dir() -> Path:
    return Path(tfsdeploy.__file__).resolve().parent


def _own_members() -> list[Member]:
    root = _package_dir()
    return [Member(path, f"{OWN_PACKAGE}/{path.relative_to(root).as_posix()}", None)
            for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts]


def _dist_members(name: str) -> list[Member]:
    """The installed files of one distribution inside site-packages (scripts in bin/ and
    compiled caches left out: the generator runs ``python -m``, and Python recompiles)."""
    dist = metadata.distribution(name)
    members = []
    for item in dist.files or []:
        rel = item.as_posix()
        if rel.startswith("..") or "__pycache__" in rel:
            continue
        digest = item.hash.value if item.hash and item.hash.mode == "sha256" else None
        members.append(Member(Path(str(item.locate())), rel, digest))
    if not members:
        raise BundleError(f"distribution {name}: no installed file listed in its RECORD")
    return members


def _record_bytes(name: str) -> bytes:
    return (metadata.distribution(name).read_text("RECORD") or "").encode()


def bundle_key(distributions: Sequence[tuple[str, str]], own: Sequence[Member]) -> str:
    """Content hash of a bundle, computed without reading the large files (their RECORD
    lists their hashes)."""
    digest = hashlib.sha256(f"format {BUNDLE_FORMAT}\n".encode())
    digest.update(json.dumps(platform_facts(), sort_keys=True).encode())
    for name, version in distributions:
        digest.update(f"{name}=={version}\n".encode())
        digest.update(hashlib.sha256(_record_bytes(name)).digest())
    for member in own:
        digest.update(member.arcname.encode() + b"\0" + member.source.read_bytes())
    return digest.hexdigest()[:20]


def _checked(member: Member) -> Member:
    """The member, after its bytes were compared with its RECORD hash."""
    if member.sha256 is None:
        return member
    data = member.source.read_bytes()
    found = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if found != member.sha256:
        raise BundleError(f"{member.source} differs from its distribution's RECORD: the "
                          "environment was modified; reinstall that distribution")
    return member


def _tar_info(member: Member) -> tarfile.TarInfo:
    info = tarfile.TarInfo(member.arcname)
    stat = member.source.stat()
    info.size = stat.st_size
    info.mode = 0o755 if stat.st_mode & 0o111 else 0o644
    info.mtime = int(stat.st_mtime)  # keeps compiled caches valid against their sources
    info.uname = info.gname = ""
    return info


def write_bundle(path: Path, members: Sequence[Member]) -> None:
    """A gzip'd tar of ``members`` (sorted, owner-free), written to a temp name then renamed."""
    part = path.with_name(path.name + f".part{os.getpid()}")
    try:
        with open(part, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3,
                                                    mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for member in sorted(members, key=lambda m: m.arcname):
                with open(_checked(member).source, "rb") as handle:
                    tar.addfile(_tar_info(member), handle)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(path)


def cache_dir() -> Path:
    """Where packed bundles are kept on this machine: the project's cache if writable."""
    base = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "loadgen"
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=base)  # noqa: SIM115
        probe.close()
        return base
    except OSError:
        return Path(tempfile.gettempdir()) / f"tfsdeploy-loadgen-{os.getuid()}"


def ensure_bundle(directory: Path | None = None) -> Bundle:
    """The bundle of the generator environment, packed now unless one with its key exists."""
    names = closure_distributions()
    dists = tuple((n, metadata.version(n)) for n in names)
    own = _own_members()
    key = bundle_key(dists, own)
    where = directory or cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"generator-{key}.tar.gz"
    if not path.is_file():
        write_bundle(path, [*own, *(m for n in names for m in _dist_members(n))])
        _prune(where, keep=path)
    return Bundle(key=key, path=path, distributions=dists)


def _prune(where: Path, *, keep: Path) -> None:
    """Keep the newest few bundles here (each change of the toolkit's code makes a new one)."""
    older = sorted((p for p in where.glob("generator-*.tar.gz") if p != keep),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in older[KEEP_BUNDLES - 1:]:
        stale.unlink(missing_ok=True)


def iter_arcnames(path: Path) -> Iterator[str]:
    """The paths inside a bundle (for tests and inspection)."""
    with tarfile.open(path, "r:gz") as tar:
        for info in tar:
            yield info.name
