"""Inventory values at the edges: integers too long for Python to write out (its int-str
limit, 4300 digits) or beyond 64 bits are located problems like every other bad value, never
a bare ValueError or OverflowError; relative ``ssh_key`` and ``ssh_known_hosts`` are beside
the inventory file, wherever the command runs from."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfsdeploy.core.errors import ConfigError, digits
from tfsdeploy.core.inventory.canary_policy import CanaryPolicy
from tfsdeploy.core.inventory.catalog import Batching, Model, Rollout, Threads, Warmup
from tfsdeploy.core.inventory.fleet import Gpu, Host
from tfsdeploy.core.inventory.load import build_inventory, load_inventory

from .helpers import model

HUGE = 10**5000  # str() of it raises ValueError (sys.get_int_max_str_digits() is 4300)
WIDE = 2**64


def _inventory(*, gpu: Gpu | None = None, host_vars: dict[str, Any] | None = None,
               **model_changes: Any) -> None:
    build_inventory("inv.py", hosts=[Host("h1", "10.0.0.1", gpus=[gpu or Gpu(0, 16384)],
                                          vars=host_vars or {})],
                    groups={}, defaults={}, models=[model(**model_changes)])


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "ssh_port": lambda n: {"host_vars": {"ssh_port": n}},
    "slot_ports": lambda n: {"host_vars": {"slot_ports": {"blue": (n, 1), "green": (2, 3)}}},
    "gpu_context_mib": lambda n: {"host_vars": {"gpu_context_mib": n}},
    "gpu_safety_margin": lambda n: {"host_vars": {"gpu_safety_margin": n}},
    "gpus[0].index": lambda n: {"gpu": Gpu(n, 16384)},
    "gpus[0].memory_mib": lambda n: {"gpu": Gpu(0, n)},
    "memory_mib": lambda n: {"memory_mib": n},
    "port_offset": lambda n: {"port_offset": n},
    "labels": lambda n: {"labels": {"stable": n}},
    "placement": lambda n: {"placement": n},
    "batching.max_batch_size": lambda n: {"batching": Batching(max_batch_size=n)},
    "threads.intra_op": lambda n: {"threads": Threads(intra_op=n)},
    "warmup.samples": lambda n: {"warmup": Warmup(samples=n)},
    "rollout.keep_releases": lambda n: {"rollout": Rollout(keep_releases=n)},
    "rollout.on_failure": lambda n: {"rollout": Rollout(on_failure=n)},
    "rollout.canary": lambda n: {"rollout": Rollout(canary=n)},
    "rollout.canary.weights": lambda n: {"rollout": Rollout(canary=CanaryPolicy(weights=(5, n)))},
    "rollout.canary.step_s": lambda n: {"rollout": Rollout(canary=CanaryPolicy(step_s=n))},
    "rollout.canary.max_p99_ratio": lambda n: {
        "rollout": Rollout(canary=CanaryPolicy(max_p99_ratio=n))},
    "rollout.canary.min_requests": lambda n: {
        "rollout": Rollout(canary=CanaryPolicy(min_requests=n))},
    "rollout.canary.inconclusive": lambda n: {
        "rollout": Rollout(canary=CanaryPolicy(inconclusive=n))},
}


@pytest.mark.parametrize("number", [HUGE, -HUGE, WIDE], ids=["5001 digits", "-5001 digits",
                                                             "2**64"])
@pytest.mark.parametrize("where", list(CASES))
def test_a_huge_integer_is_a_located_problem(where: str, number: int) -> None:
    with pytest.raises(ConfigError) as refused:
        _inventory(**CASES[where](number))
    fields = [p.field or "" for p in refused.value.problems]
    assert any(where in f for f in fields), refused.value.problems
    text = str(refused.value)
    assert "fix:" in text and len(text) < 4000  # the number is never written out


def test_digits_counts_without_writing_the_number_out() -> None:
    assert [digits(n) for n in (0, 9, 10, -99, 10**15, WIDE, HUGE, HUGE - 1)] == \
        [1, 1, 2, 2, 16, 20, 5001, 5000]


def _inventory_file(directory: Path, **host_vars: str) -> Path:
    path = directory / "inv.py"
    path.write_text(
        "from tfsdeploy.core.inventory.fleet import Host\n"
        f"hosts = [Host('h1', '10.0.0.1', vars={host_vars!r})]\n")
    return path


def test_relative_ssh_files_are_beside_the_inventory_wherever_fab_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "deploy"
    home.mkdir()
    path = _inventory_file(home, ssh_key="keys/id_ed25519", ssh_known_hosts="known_hosts")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # cron runs from /, a person from anywhere
    for given in (str(path), os.path.relpath(path, elsewhere)):
        host = load_inventory(given).host("h1")
        assert host.vars.ssh_key == str(home / "keys" / "id_ed25519")
        assert host.vars.ssh_known_hosts == str(home / "known_hosts")


def test_absolute_and_home_ssh_files_are_kept_as_written(tmp_path: Path) -> None:
    path = _inventory_file(tmp_path, ssh_key="~/.ssh/id_deploy",
                           ssh_known_hosts="/etc/ssh/ssh_known_hosts")
    host = load_inventory(str(path)).host("h1")
    assert (host.vars.ssh_key, host.vars.ssh_known_hosts) == (
        "~/.ssh/id_deploy", "/etc/ssh/ssh_known_hosts")


def test_a_model_catalog_entry_is_still_valid_with_ordinary_numbers() -> None:
    _inventory(memory_mib=1024, rollout=Rollout(canary=CanaryPolicy(step_s=30)))
    assert isinstance(model(), Model)
