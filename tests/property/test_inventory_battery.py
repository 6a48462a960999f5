"""Hostile-input battery for the pure tier: generated inventories go through build_inventory,
the catalog rules, rendering and the rendered-file rules. Whatever the input, the outcome is
success or a ConfigError whose every problem says where it is (file, and field or host):
never another exception.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.catalog import Model, Signature, TensorSpec
from tfsdeploy.core.inventory.load import build_inventory, load_inventory
from tfsdeploy.core.inventory.versions import choose_version
from tfsdeploy.core.render.files import render_fleet
from tfsdeploy.core.render.validate import check_port_clashes, validate_model, validate_render

from .budget import examples
from .strategies import (
    catalog_model,
    hostile_json,
    hostile_scalars,
    hostile_text,
    inventory_parts,
    mostly,
)

FILE = "inv.py"


def assert_located(problems: list[Problem]) -> None:
    """Every problem names its file, and its field or host (or, when the inventory's Python
    failed, the line of the file); and says how to fix it."""
    assert problems, "a ConfigError without a problem"
    for problem in problems:
        assert problem.file and (problem.field or problem.host
                                 or problem.file.rpartition(":")[2].isdigit()), problem
        assert problem.message and problem.fix, problem
        problem.render()


def render_everything(parts: dict[str, Any], version: int) -> int:
    """build -> per model: rules, render, rendered-file rules. The number of hosts rendered
    without a problem."""
    inventory = build_inventory(FILE, **parts)
    clean = 0
    for model in inventory.models.values():
        problems = validate_model(model, FILE) + check_port_clashes(inventory)
        assert problems == [], problems  # build_inventory has run the same rules
        hosts = inventory.select(None, model=model) if inventory.hosts else ()
        for render in render_fleet(inventory, model, version, hosts):
            problems = validate_render(render, FILE)
            if problems:
                assert_located(problems)
            else:
                clean += 1
    return clean


@examples(500)
@given(parts=inventory_parts(),
       version=mostly(st.just(3), st.sampled_from([1, 2, 2**63 - 1])))
def generated_inventories(outcomes: Counter[str], parts: dict[str, Any], version: int) -> None:
    """One generated inventory (the battery: hypothesis runs it over its cases), counted in
    ``outcomes``."""
    try:
        outcomes["clean_hosts"] += render_everything(parts, version)
        outcomes["built"] += 1
    except ConfigError as error:
        outcomes["refused"] += 1
        assert_located(error.problems)


def test_generated_inventories_render_or_are_refused_with_located_problems() -> None:
    outcomes: Counter[str] = Counter()
    generated_inventories(outcomes)
    # a generator that only ever produced refused inventories would test the first field's
    # check and nothing after it
    assert outcomes["built"] and outcomes["refused"] and outcomes["clean_hosts"], outcomes


@examples(300)
@given(hostile_json(6), hostile_json(6), hostile_json(6), hostile_json(6))
def test_any_shape_of_top_level_names(hosts: Any, groups: Any, defaults: Any,
                                      models: Any) -> None:
    try:
        build_inventory(FILE, hosts=hosts, groups=groups, defaults=defaults, models=models)
    except ConfigError as error:
        assert_located(error.problems)


@examples(300)
@given(catalog_model())
def test_catalog_entries_alone(model: Any) -> None:
    assert_located(validate_model(model, FILE) or [_ok()])


def _ok() -> Problem:
    return Problem("valid", fix="none", file=FILE, field="models")


@examples(200)
@given(st.one_of(hostile_text(), hostile_scalars()))
def test_version_argument(requested: Any) -> None:
    spec = TensorSpec("DT_FLOAT", (-1, 1))
    model = Model(name="m", source="/nonexistent", signature=Signature({"x": spec}, {"y": spec}),
                  memory_mib=1, latency_slo_ms=1)
    try:
        version = choose_version(model, requested, FILE)
    except ConfigError as error:
        # no version asked for: the newest in the source, which has none
        expected = "models.m.source" if requested is None else "--version"
        assert [p.field for p in error.problems] == [expected], (requested, error.problems)
    else:
        assert 0 < version < 2**63


PYTHON_ENDINGS = st.sampled_from([
    "sys.exit(0)", "sys.exit(3)", "raise SystemExit", "raise ValueError('x')", "1/0",
    "hosts = None", "models = 'm'", "defaults = []", "groups = 5", "import os",
    "hosts = [Host('a', '10.0.0.1')] * 2", "del Host", "raise KeyboardInterrupt",
    "def (:", "hosts = [", "\tx = 1", "import no_such_module", "hosts = [Host(*'ab')]",
])


@examples(40)  # 36 combinations: all of them
@given(PYTHON_ENDINGS, st.sampled_from(["", "hosts = [Host('a', '10.0.0.1')]\n"]))
def test_inventory_files_that_misbehave(tmp_path_factory: Any, ending: str, start: str) -> None:
    path = Path(tmp_path_factory.mktemp("inv")) / "inv.py"
    path.write_text("import sys\nfrom tfsdeploy.core.inventory.fleet import Host\n"
                    + start + ending + "\n")
    try:
        load_inventory(str(path))
    except ConfigError as error:
        assert_located(error.problems)
    except KeyboardInterrupt:
        assert "KeyboardInterrupt" in ending  # Ctrl-C in an inventory stays Ctrl-C
