"""docs/architecture.md follows the folders: its tree names every module of the layers (the
steps in run/operations/ and the argv builders in hosts/commands/ are named as folders) and
every package of the core, so a module added or moved without its line is caught here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "tfsdeploy"
LAYERS = ("cli", "run", "hosts", "core")
NAMED_AS_FOLDERS = ("operations", "commands")


def tree() -> str:
    """The layers' tree: the first fenced block of docs/architecture.md."""
    return (ROOT / "docs" / "architecture.md").read_text().split("```")[1]


def unnamed(text: str) -> list[str]:
    """The layers' modules and core packages the tree does not name."""
    names = set(re.findall(r"[\w.]+/|\w+\.py", text))
    missing = []
    for layer in LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            parts = path.relative_to(PACKAGE).parts
            if path.name == "__init__.py" or parts[1] in NAMED_AS_FOLDERS:
                continue
            if path.name not in names:
                missing.append("/".join(parts))
    for package in sorted(p for p in (PACKAGE / "core").iterdir()
                          if p.is_dir() and (p / "__init__.py").exists()):
        if f"{package.name}/" not in names:
            missing.append(f"core/{package.name}/")
    return missing


def test_the_architecture_tree_names_every_module_and_core_package() -> None:
    assert unnamed(tree()) == []


def test_a_module_left_out_of_the_tree_is_caught() -> None:
    text = tree().replace("engine.py", "motor.py").replace("  gpu/ ", "  cards/ ")
    assert {"run/engine.py", "core/gpu/"} <= set(unnamed(text))
