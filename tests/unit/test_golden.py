"""Golden files: exactly what each host receives, for the shipped inventories.

Regenerate after an intended template change with `UPDATE_GOLDEN=1 pytest tests/unit` and
review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tfsdeploy.core.target import load_target, render_release

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = [
    ("testbed", "inventory/testbed.py", "half_plus_two", 2, None),
    ("testbed", "inventory/testbed.py", "resnet50", 1, None),
    ("production", "inventory/example_production.py", "resnet50", 7, "gpu-a01,gpu-c01"),
    ("production", "inventory/example_production.py", "ranker", 12, "gpu-b01,gpu-c01"),
]


@pytest.mark.parametrize("name, inventory, model, version, hosts", CASES)
def test_rendered_files_match_golden(name: str, inventory: str, model: str, version: int,
                                     hosts: str | None, monkeypatch: pytest.MonkeyPatch,
                                     tmp_path: Path) -> None:
    # the testbed inventory reads the live testbed's hosts.json; golden files use the defaults
    monkeypatch.setenv("TFSDEPLOY_TESTBED_DIR", str(tmp_path / "no-testbed"))
    renders = render_release(load_target(model, inventory=inventory, hosts=hosts), version)
    assert renders, "nothing rendered"
    for render in renders:
        for rendered in render.files:
            path = GOLDEN / name / render.host.name / model / rendered.name
            if os.environ.get("UPDATE_GOLDEN") == "1":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(rendered.text)
            assert path.is_file(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
            assert rendered.text == path.read_text(), f"{path} differs from the rendering"
