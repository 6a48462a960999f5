"""Capacity arithmetic (the worked example of docs/loadtest.md) and sweep-report input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfsdeploy.loadtest import capacity
from tfsdeploy.loadtest.cli import plan_capacity


def test_worked_example_of_the_docs() -> None:
    result = capacity.plan(100_000, 8_000)
    assert round(result.exact, 2) == 21.37
    assert result.minimum == 22
    assert result.recommended == 26  # ceil(22 x 1.15) = 26 > 22 + 1
    text = result.explain()
    assert "100,000 / (8,000.0 x 0.65 x 0.9)" in text and "21.37" in text


def test_exact_division_is_not_rounded_up() -> None:
    result = capacity.plan(441, 700, load_factor=0.7, availability_factor=0.9)
    assert result.exact > 1  # 441 / (700 x 0.7 x 0.9) = 1.0000000000000002 in floats
    assert result.minimum == 1


def test_spares_win_for_small_fleets() -> None:
    result = capacity.plan(500, 1000, failure_domains=2)
    assert (result.minimum, result.recommended) == (1, 3)


@pytest.mark.parametrize(("target", "per_instance", "load_factor"),
                         [(0, 1000, 0.65), (100, 0, 0.65), (100, 1000, 1.5), (100, 1000, 0)])
def test_bad_inputs(target: float, per_instance: float, load_factor: float) -> None:
    with pytest.raises(capacity.CapacityError):
        capacity.plan(target, per_instance, load_factor=load_factor)


@pytest.mark.parametrize("availability_factor", [1e-308, 5e-324])
def test_factors_so_small_the_plan_has_no_number_are_refused(availability_factor: float) -> None:
    # 1e-308: the quotient overflows to inf; 5e-324: the product underflows to 0
    with pytest.raises(capacity.CapacityError, match="check the factors"):
        capacity.plan(100, 10, availability_factor=availability_factor)


def test_from_sweep_report(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"kind": "tfsdeploy.sweep", "instances": 2,
                                "perInstanceQps": 8000.0,
                                "best": {"concurrency": 256, "p99_ms": 41.0}}))
    result = capacity.plan_from_sweep(100_000, path)
    assert result.minimum == 22 and "concurrency 256" in result.source
    code, text = plan_capacity(100_000, str(path))
    assert code == 0 and "minimum 22 instances, recommended 26" in text


def test_sweep_without_a_point_under_the_slo(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"kind": "tfsdeploy.sweep", "perInstanceQps": None}))
    code, text = plan_capacity(1000, path)
    assert code == 1 and "no point under the SLO" in text


def test_hosts_of_several_instances_each() -> None:
    result = capacity.plan(100_000, 8_000, instances_per_host=4)
    assert (result.recommended, result.hosts) == (26, 7)  # ceil(26 / 4)
    assert "hosts: ceil(26 / 4 instances per host) = 7" in result.explain()
    assert result.as_json()["hosts"] == 7
    code, text = plan_capacity(100_000, 8_000, instances_per_host=2)
    assert code == 0 and text.endswith("recommended 26 on 13 hosts of 2")
    with pytest.raises(capacity.CapacityError):
        capacity.plan(100, 10, instances_per_host=0)
