"""Fixtures for the model-generator tests: the cheap models are generated once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.models import default_out_dir, generate

CHEAP = ("half_plus_two", "half_plus_two_bad", "half_plus_two_tf1")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``resnet`` marker (tests that need the ~100 MB resnet50 versions)."""
    config.addinivalue_line(
        "markers", "resnet: needs resnet50 (default cache, or TFSDEPLOY_MAKE_RESNET=1 to make it)"
    )


@pytest.fixture(scope="session")
def models_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh model root holding the cheap models, made by the generator."""
    out = tmp_path_factory.mktemp("models")
    results = generate.generate(out, CHEAP, log=lambda _line: None)
    assert {r.action for r in results} == {"made"}
    return out


@pytest.fixture(scope="session")
def resnet_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model root with current resnet50 versions: the default cache if it has them, else
    one made here when TFSDEPLOY_MAKE_RESNET=1, else the test fails (a missing prerequisite,
    never a skip)."""
    specs = [s for s in generate.all_specs() if s.model == "resnet50"]
    cache = default_out_dir()
    if all(generate.is_current(cache, s) for s in specs):
        return cache
    if os.environ.get("TFSDEPLOY_MAKE_RESNET") != "1":
        pytest.fail(f"resnet50 is not in the model cache {cache}: run scripts/make-models, "
                    "or set TFSDEPLOY_MAKE_RESNET=1 to make it here")
    out = tmp_path_factory.mktemp("resnet")
    generate.generate(out, ["resnet50"], log=lambda _line: None)
    return out
