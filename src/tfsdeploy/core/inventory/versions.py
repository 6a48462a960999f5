"""Model versions offered by a model's version source (a local directory of numeric dirs)."""

from __future__ import annotations

import re
from pathlib import Path

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.schema import INT64_MAX

# A version is what TFServing's file-system source reads as an int64 (absl::SimpleAtoi in
# file_system_storage_path_source.cc). Only ASCII digits are taken: Python's str.isdigit and
# int() also accept '²' or '٣', which the server never loads as a version.
VERSION_TEXT = re.compile(r"[0-9]{1,19}")


def parse_version_text(text: str) -> int | None:
    """The positive int64 version ``text`` names, or None."""
    if not VERSION_TEXT.fullmatch(text):
        return None
    version = int(text)
    return version if 0 < version <= INT64_MAX else None


def available_versions(source: str) -> list[int]:
    """Numeric version directories under ``source``, ascending."""
    root = Path(source)
    try:
        children = list(root.iterdir()) if root.is_dir() else []
    except OSError as exc:
        raise ConfigError(Problem(f"cannot list the model source {source!r}: {exc}",
                                  fix="make the source directory readable",
                                  file=source)) from exc
    versions = {parse_version_text(c.name) for c in children if c.is_dir()}
    return sorted(v for v in versions if v is not None)


def choose_version(model: Model, requested: int | str | None, inventory_file: str) -> int:
    """``requested`` checked, or the newest version in the model's source."""
    if requested is not None:
        version = requested if isinstance(requested, int) and not isinstance(requested, bool) \
            else parse_version_text(str(requested))
        if version is None or not 0 < version <= INT64_MAX:
            raise ConfigError(Problem(
                f"--version {requested!r} must be a positive integer up to {INT64_MAX} (a "
                "numeric directory name)",
                fix="pass a positive integer, e.g. --version 2", field="--version"))
        return version
    versions = available_versions(model.source)
    if not versions:
        raise ConfigError(Problem(
            f"model {model.name!r}: no numeric version directory in its source {model.source!r}",
            fix="pass --version V, or put SavedModel versions under the source (for the "
                "testbed: scripts/make-models)", file=inventory_file,
            field=f"models.{model.name}.source"))
    return versions[-1]
