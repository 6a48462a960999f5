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

The bundle is code the generator hosts run, so its cache is private: a directory of the
invoking user's, mode 0700, trusted as ``core.trust`` trusts files (never a shared /tmp name
that another user could create first), and the sha256 of each bundle, recorded when it was
packed, is checked before the bundle is reused here, again before it is shipped, and on the
host before it is unpacked.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.metadata as metadata
import json
import os
import platform
import stat
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import tfsdeploy
from tfsdeploy.core.file_trust import trust_fix, untrusted

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
    sha256: str = ""  # of the packed file, recorded when it was packed


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
    found = member.source.stat()
    info.size = found.st_size
    info.mode = 0o755 if found.st_mode & 0o111 else 0o644
    info.mtime = int(found.st_mtime)  # keeps compiled caches valid against their sources
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
    """Where packed bundles are kept on this machine: ``$TFSDEPLOY_CACHE/loadgen`` (the
    project's cache, /var/cache/tfsdeploy) when this user can own it, else the user's own
    cache (``$XDG_CACHE_HOME`` or ~/.cache, then tfsdeploy/loadgen); never a shared /tmp."""
    base = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "loadgen"
    try:
        return private_dir(base)
    except (OSError, BundleError):
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return private_dir(home / "tfsdeploy" / "loadgen")


def private_dir(path: Path) -> Path:
    """``path`` as a private directory: created 0700 if missing, made 0700 if it is this
    user's, refused (BundleError naming the fix) when it is another user's, a link, or lies
    below a directory others could change."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise BundleError(f"the bundle cache {path} is not a directory of this user's "
                          f"(uid {os.geteuid()}): it could hold another user's code; fix: "
                          "remove it, or set TFSDEPLOY_CACHE to a directory of your own")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    problem = untrusted(path)
    if problem is not None:
        raise BundleError(f"the bundle cache {path} is not private: {problem}; fix: "
                          f"{trust_fix(problem)}, or set TFSDEPLOY_CACHE to a directory of "
                          "your own")
    return path


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _recorded(path: Path) -> str:
    try:
        return path.with_name(path.name + ".sha256").read_text().split()[0]
    except (OSError, IndexError):
        return ""


def verify_bundle(bundle: Bundle) -> None:
    """Raise BundleError unless the packed file still has the sha256 recorded at packing
    (checked before it is shipped to a host)."""
    if not bundle.sha256 or file_sha256(bundle.path) != bundle.sha256:
        raise BundleError(f"{bundle.path} changed since it was packed and verified (its "
                          "sha256 differs): it is not shipped; fix: run again (it is packed "
                          "anew)")


def ensure_bundle(directory: Path | None = None) -> Bundle:
    """The bundle of the generator environment, packed now unless one with its key exists
    whose sha256 is the one recorded when it was packed (a changed one is packed anew)."""
    names = closure_distributions()
    dists = tuple((n, metadata.version(n)) for n in names)
    own = _own_members()
    key = bundle_key(dists, own)
    where = private_dir(directory) if directory is not None else cache_dir()
    path = where / f"generator-{key}.tar.gz"
    recorded = _recorded(path) if path.is_file() else ""
    if not recorded or file_sha256(path) != recorded:
        write_bundle(path, [*own, *(m for n in names for m in _dist_members(n))])
        recorded = file_sha256(path)
        sidecar = path.with_name(path.name + ".sha256")
        part = sidecar.with_name(sidecar.name + f".part{os.getpid()}")
        part.write_text(f"{recorded}  {path.name}\n")
        part.replace(sidecar)
        _prune(where, keep=path)
    return Bundle(key=key, path=path, distributions=dists, sha256=recorded)


def _prune(where: Path, *, keep: Path) -> None:
    """Keep the newest few bundles here (each change of the toolkit's code makes a new one)."""
    older = sorted((p for p in where.glob("generator-*.tar.gz") if p != keep),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in older[KEEP_BUNDLES - 1:]:
        stale.unlink(missing_ok=True)
        stale.with_name(stale.name + ".sha256").unlink(missing_ok=True)


def iter_arcnames(path: Path) -> Iterator[str]:
    """The paths inside a bundle (for tests and inspection)."""
    with tarfile.open(path, "r:gz") as tar:
        for info in tar:
            yield info.name
