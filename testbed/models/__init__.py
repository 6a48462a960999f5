"""Test-model generator for the tfsdeploy testbed.

Writes TensorFlow SavedModels that the real TensorFlow Serving (and the testbed's emulator)
can load, under ``<out>/<model>/<version>/``, plus ``<out>/<model>/catalog.json`` describing
each model's signatures and golden requests. Run it as ``scripts/make-models`` or
``python -m testbed.models``; see docs/models.md.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_out_dir"]


def default_out_dir() -> Path:
    """Return the default model directory: ``${TFSDEPLOY_CACHE:-/var/cache/tfsdeploy}/models``."""
    return Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "models"
