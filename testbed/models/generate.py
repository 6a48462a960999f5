"""Make model versions into ``<out>/<model>/<version>/``, cached, atomically, with catalogs.

Layout of ``<out>``::

    <model>/<version>/        a SavedModel (published by rename of a finished temp dir)
    <model>/catalog.json      versions, signatures and golden examples (see golden.py)
    .stamps/<model>-<version>.json   recipe hash, file sizes, facts of the version
    .tmp/                     work dirs (never inside a model base path)
    .lock                     flock held while generating
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.models import golden, savedmodel
from testbed.models.spec import VersionSpec, toolchain

CATALOG_FORMAT = 1
CATALOG_NAME = "catalog.json"


@dataclass(frozen=True)
class Result:
    """What happened to one version: ``made`` or ``cached``, and how long it took."""

    key: str
    action: str
    seconds: float


def all_specs() -> list[VersionSpec]:
    """Every version the generator knows, small models first."""
    from testbed.models import half_plus_two, resnet, serving_failures

    return [*half_plus_two.specs(), *serving_failures.specs(), *resnet.specs()]


def model_names() -> list[str]:
    """The model names, in generation order."""
    return list(dict.fromkeys(spec.model for spec in all_specs()))


def stamp_path(out: Path, spec: VersionSpec) -> Path:
    """Where the stamp of a version lives (outside every model base path)."""
    return out / ".stamps" / f"{spec.model}-{spec.version}.json"


def version_dir(out: Path, spec: VersionSpec) -> Path:
    """The published directory of a version."""
    return out / spec.model / str(spec.version)


def file_manifest(root: Path) -> dict[str, int]:
    """Map every file under ``root`` (relative path) to its size in bytes."""
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()
    }


def read_stamp(out: Path, spec: VersionSpec) -> dict[str, Any] | None:
    """Return the stamp of a version, or None if it is missing or unreadable."""
    try:
        stamp: dict[str, Any] = json.loads(stamp_path(out, spec).read_text())
    except (OSError, ValueError):
        return None
    return stamp


def is_current(out: Path, spec: VersionSpec) -> bool:
    """True if the version dir exists, matches its stamp's files, and the recipe is unchanged."""
    stamp = read_stamp(out, spec)
    target = version_dir(out, spec)
    if stamp is None or stamp.get("recipe_hash") != spec.recipe_hash() or not target.is_dir():
        return False
    return bool(file_manifest(target) == stamp.get("files"))


def _write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same dir, then rename); same content: no write."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def publish(built: Path, target: Path, trash_root: Path) -> None:
    """Move a finished version dir into place with a rename; an old one is moved away first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(built, 0o755)
    if target.exists():
        trash = Path(tempfile.mkdtemp(dir=trash_root, prefix="old-")) / target.name
        os.rename(target, trash)
        os.rename(built, target)
        shutil.rmtree(trash.parent)
    else:
        os.rename(built, target)


def _signatures_or_none(built: Path) -> dict[str, Any] | None:
    """The signature facts of a built version, or None if its saved_model.pb does not parse."""
    from google.protobuf.message import DecodeError

    try:
        return savedmodel.signature_facts(built)
    except DecodeError:
        return None


class UnservableModel(Exception):
    """A version meant to serve that TensorFlow Serving's loader cannot restore or run."""


def _check_servable(spec: VersionSpec, built: Path) -> int:
    """Load the built version Session-style and run its warmup records, or refuse to cache it."""
    try:
        return savedmodel.check_servable(built, spec.check_records)
    except savedmodel.NotServable as err:
        raise UnservableModel(
            f"{spec.key} is not servable by TensorFlow Serving: {err}; not cached"
        ) from err


def make_version(out: Path, spec: VersionSpec) -> dict[str, Any]:
    """Build one version in a temp dir, compute its facts, publish it and write its stamp."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    work_root = out / ".tmp"
    work_root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(dir=work_root, prefix=f"{spec.model}-{spec.version}-"))
    try:
        built = work / str(spec.version)
        facts = spec.build(built)
        if spec.must_serve:
            facts["checked_warmup_records"] = _check_servable(spec, built)
        signatures = _signatures_or_none(built)
        examples = golden.compute(built, spec.examples)
        files = file_manifest(built)
        publish(built, version_dir(out, spec), work_root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = {
        "recipe_hash": spec.recipe_hash(),
        "recipe": spec.recipe,
        "files": files,
        "seconds": round(time.perf_counter() - start, 2),
        "made_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tensorflow": tf.__version__,
        "toolchain": toolchain(),
        "summary": spec.summary,
        "expect": spec.expect,
        "honours_contract": spec.honours_contract,
        "signatures": signatures,
        "golden": examples,
        "size_bytes": sum(files.values()),
        **facts,
    }
    _write_json(stamp_path(out, spec), stamp)
    return stamp


def _common_signatures(details: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The signatures identical in every version that honours the model's contract."""
    common: dict[str, Any] | None = None
    for detail in details:
        sigs = detail["signatures"]
        if not detail["honours_contract"] or sigs is None:
            continue
        common = (
            dict(sigs) if common is None else {k: v for k, v in common.items() if sigs.get(k) == v}
        )
    return common or {}


def write_catalog(out: Path, model: str, specs: Sequence[VersionSpec]) -> Path | None:
    """Write ``<out>/<model>/catalog.json`` from the stamps of the versions present."""
    details: dict[str, dict[str, Any]] = {}
    for spec in sorted(specs, key=lambda s: s.version):
        stamp = read_stamp(out, spec)
        if spec.model != model or stamp is None or not version_dir(out, spec).is_dir():
            continue
        details[str(spec.version)] = {
            k: v for k, v in stamp.items() if k not in ("files", "made_at")
        }
    if not details:
        return None
    path = out / model / CATALOG_NAME
    _write_json(
        path,
        {
            "catalog_format": CATALOG_FORMAT,
            "model": model,
            "base_path": str((out / model).resolve()),
            "versions": sorted(int(v) for v in details),
            "signatures": _common_signatures(details.values()),
            "version_details": details,
        },
    )
    return path


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<out>/.lock`` so two generators never race."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def generate(
    out: Path,
    only: Sequence[str] = (),
    force: bool = False,
    log: Callable[[str], None] = print,
) -> list[Result]:
    """Make every (or only the named) model's versions that are missing or stale."""
    specs = [s for s in all_specs() if not only or s.model in only]
    unknown = set(only) - {s.model for s in all_specs()}
    if unknown:
        raise ValueError(f"unknown model(s): {', '.join(sorted(unknown))}")
    results = []
    with locked(out):
        for spec in specs:
            if not force and is_current(out, spec):
                results.append(Result(spec.key, "cached", 0.0))
                log(f"cached {spec.key}")
                continue
            log(f"making {spec.key}: {spec.summary}")
            stamp = make_version(out, spec)
            results.append(Result(spec.key, "made", stamp["seconds"]))
            size = stamp["size_bytes"] / 1e6
            log(f"made   {spec.key} in {stamp['seconds']:.1f} s ({size:.1f} MB)")
        for model in dict.fromkeys(s.model for s in specs):
            write_catalog(out, model, specs)
    return results
