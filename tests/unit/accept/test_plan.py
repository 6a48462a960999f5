"""Planning an acceptance run: validation before any connection, thresholds with their
sources, shares of the rate (tfsdeploy.accept.plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.accept.plan import (
    LOCAL,
    build_plan,
    generator_procs,
    generator_workers,
)
from tfsdeploy.core.errors import ConfigError

from .support import inventory, model_source, plan


def test_targets_are_the_model_hosts_stable_grpc_ports(tmp_path: Path) -> None:
    inv = inventory(model_source(tmp_path), port_offset=2000)
    got = build_plan(AcceptOptions(model="m"), inv)
    assert got.targets == ("10.87.0.11:10500", "10.87.0.12:10500", "10.87.0.13:10500")


def test_defaults_this_machine_five_minutes_catalog_slo(tmp_path: Path) -> None:
    got = plan(tmp_path)
    assert [(g.name, g.host, g.share_qps) for g in got.generators] == [(LOCAL, None, 100.0)]
    assert got.duration_s == 300 and got.interval_s == 1 and got.release is None
    assert got.slo_p99_ms.value == 50.0
    assert "latency_slo_ms" in got.slo_p99_ms.source and "test-inventory.py" in \
        got.slo_p99_ms.source
    assert got.max_error_rate_pct.value == 0.01
    assert got.target_qps.source.startswith("default")
    assert got.data_version == 2  # the newest version in the source


def test_a_group_shares_the_rate_equally(tmp_path: Path) -> None:
    got = plan(tmp_path, target_qps=300.0, loadgens="loadgens")
    assert [(g.name, g.share_qps) for g in got.generators] == [("tb1", 150.0), ("tb2", 150.0)]
    assert sum(g.share_qps for g in got.generators) == 300.0
    assert got.remote and got.target_qps.source == "--target-qps"


def test_release_defaults_to_a_quarter_into_the_window(tmp_path: Path) -> None:
    got = plan(tmp_path, duration="60s", release="2")
    assert got.release is not None and (got.release.version, got.release.at_s) == (2, 15.0)
    assert plan(tmp_path, duration="60s", release=2, release_at="10s").release.at_s == 10.0  # type: ignore[union-attr]
    assert plan(tmp_path, duration="1m", release=1, release_at="50%").release.at_s == 30.0  # type: ignore[union-attr]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        plan(tmp_path, duration="60s", release="7", release_at="90s", interval="1.5s",
             target_qps=-3.0, concurrency=0)
    text = str(caught.value)
    assert "--release '7': no such version" in text and "offered: 1, 2" in text
    assert "--release-at '90s' is 90 s, outside the 60 s window" in text
    assert "--interval '1.5s'" in text
    assert "--target-qps -3.0 must be a positive number" in text
    assert "--concurrency 0 must be at least 1" in text
    assert text.count("fix:") == 5


def test_bad_duration_and_unknown_group_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--duration 'five minutes' is not a duration"):
        plan(tmp_path, duration="five minutes")
    with pytest.raises(ConfigError, match=r"--loadgens 'nowhere' matches no host"):
        plan(tmp_path, loadgens="nowhere")
    with pytest.raises(ConfigError, match=r"model 'x' is not in the catalog"):
        build_plan(AcceptOptions(model="x"), inventory(model_source(tmp_path)))


def test_generator_sizes() -> None:
    assert generator_procs(150, cores=2, asked=None) == 1
    assert generator_procs(5000, cores=2, asked=None) == 2  # capped at the cores
    assert generator_procs(5000, cores=8, asked=None) == 3
    assert generator_procs(10, cores=8, asked=4) == 4
    # 150 QPS at 4x a 50 ms SLO: 30 in flight; at least 16, at least the connections
    assert generator_workers(150, 50, None, floor=3) == 30
    assert generator_workers(10, 50, None, floor=3) == 16
    assert generator_workers(10, 50, 2, floor=3) == 3
