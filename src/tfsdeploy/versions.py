"""Model versions offered by a model's version source (a local directory of numeric dirs)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.catalog import Model
from tfsdeploy.errors import ConfigError, Problem
from tfsdeploy.validate import check_version


def available_versions(source: str) -> list[int]:
    """Numeric version directories under ``source``, ascending (TFServing's int64 parse)."""
    root = Path(source)
    if not root.is_dir():
        return []
    versions = []
    for child in root.iterdir():
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0:
            versions.append(int(child.name))
    return sorted(set(versions))


def choose_version(model: Model, requested: int | str | None, inventory_file: str) -> int:
    """``requested`` checked, or the newest version in the model's source."""
    if requested is not None:
        try:
            version = int(requested)
        except (TypeError, ValueError):
            version = -1
        reason = check_version(version)
        if reason:
            raise ConfigError(Problem(f"--version {requested!r}: {reason}",
                                      fix="pass a positive integer, e.g. --version 2",
                                      field="--version"))
        return version
    versions = available_versions(model.source)
    if not versions:
        raise ConfigError(Problem(
            f"model {model.name!r}: no numeric version directory in its source {model.source!r}",
            fix="pass --version V, or put SavedModel versions under the source (for the "
                "testbed: scripts/make-models)", file=inventory_file,
            field=f"models.{model.name}.source"))
    return versions[-1]
