"""What one generated model version is: its recipe, builder, golden requests and expectations."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
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

    @property
    def key(self) -> str:
        """Return ``model/version``."""
        return f"{self.model}/{self.version}"

    def recipe_hash(self) -> str:
        """Hash the recipe parameters and the source of the code that builds this version."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.recipe, sort_keys=True).encode())
        digest.update(json.dumps(self.examples, sort_keys=True).encode())
        for path in self.source_files:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]
