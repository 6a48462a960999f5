"""What one generated model version is: its recipe, builder, golden requests and expectations."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

# A builder writes one complete version into a directory that does not exist yet and returns
# extra facts for the catalog (for example a measured warmup time).
Builder = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class VersionSpec:
    """One version of one model, as the generator makes it."""

    model: str
    version: int
    summary: str
    recipe: dict[str, Any]
    build: Builder
    source_files: tuple[Path, ...]
    # golden request templates: {"signature", "inputs": {name: tensor}, "outputs": ..., tolerances}
    examples: tuple[dict[str, Any], ...] = ()
    # what a TFServing-compatible server should do with this version (see docs/models.md)
    expect: dict[str, Any] = field(default_factory=lambda: {"state": "AVAILABLE"})
    # False when the version breaks its model's signature contract (corrupt, wrong signature)
    honours_contract: bool = True
    # how many warmup records the build-time servability check runs (None: all of them)
    check_records: int | None = None

    @property
    def key(self) -> str:
        """Return ``model/version``."""
        return f"{self.model}/{self.version}"

    @property
    def must_serve(self) -> bool:
        """True when TFServing must load and warm this version up (checked at build time)."""
        return self.expect.get("state") == "AVAILABLE"

    def recipe_hash(self) -> str:
        """Hash everything that shapes this version: the recipe parameters, the golden request
        templates, the source of the code that builds it, and the TensorFlow and Keras
        releases that write it (a new release can change the files it saves)."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.recipe, sort_keys=True).encode())
        digest.update(json.dumps(toolchain(), sort_keys=True).encode())
        digest.update(json.dumps(self.examples, sort_keys=True).encode())
        for path in self.source_files:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]


def toolchain() -> dict[str, str | None]:
    """The installed releases of the packages that write SavedModels (no TensorFlow import)."""
    found: dict[str, str | None] = {}
    for name in ("tensorflow", "keras", "tensorflow-serving-api", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
