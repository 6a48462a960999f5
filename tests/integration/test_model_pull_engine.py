"""model_transfer pull when the registry refuses the host's engine (as a stopped registry
does), and when the host's Docker engine dies mid-pull (kill -9 of tb3's dockerd,
the process a real host's systemd would restart): the stage fails on that host with nothing a
server could load in the model's directory, and once the engine is back (`scripts/testbed up`
repairs the host as a reboot would) the same `fab stage` completes it.

It kills a whole host's engine, which every other module's containers on tb3 depend on: it
runs alone (``fleet_exclusive``). Nothing is deployed: model ``itpulleng`` is only staged, on
tb3 alone. Its version is padded with 192 MiB of random bytes so that the pull is under way
when the engine dies (about 2 s of pulling here)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import (
    HOSTS,
    REGISTRY,
    copy_version,
    fleet_lifetime,
    inventory_text,
    netns,
    run_testbed,
    ssh,
)
from transfer_support import pad_version

pytestmark = [pytest.mark.testbed, pytest.mark.fleet_exclusive]

MODEL, OFFSET, HOST = "itpulleng", 4250, "tb3"
PULL = {"model_transfer": "pull", "model_registry": f"{REGISTRY}/tfsdeploy-models",
        "model_registry_insecure": True}
# the suite fleet's shape (scripts/test), given back to `up` when it repairs tb3
SUITE_UP = ("up", "--hosts", "4", "--reserve", "tb4", "--gpus", "tb4=2", "--gpu-mib",
            "tb4=16384", "--no-images")


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    copy_version(SOURCE_MODEL / "1", source, 1)
    pad_version(source / "1", 192 << 20, f"{time.time_ns()}")
    copy_version(SOURCE_MODEL / "2", source, 2)  # the registry-refused test's
    pad_version(source / "2", 4 << 20, f"{time.time_ns()}")
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the engine-killed pull test", model=MODEL, source=source, golden=GOLDEN,
        offset=OFFSET, warmup="Warmup(samples=5)", extra_vars=PULL,
        hosts={HOST: HOSTS[HOST]},
        rollout="Rollout(serial=('100%',), min_healthy_s=1.0, keep_releases=3)"))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=playbook, hosts={HOST: HOSTS[HOST]})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_PULL_TESTS_KEEP")


def _dockerd_pid() -> int:
    status = json.loads(run_testbed("status", "--json").stdout)
    return int(next(h["dockerd"] for h in status["hosts"] if h["name"] == HOST))


def _names() -> list[str]:
    return ssh(HOST, f"ls -A /srv/tfsdeploy/models/{MODEL} 2>/dev/null; true").stdout.split()


def _sums_ok(source: Path, version: int = 1) -> bool:
    listed = ssh(HOST, f"cd /srv/tfsdeploy/models/{MODEL}/{version} && find . -type f | sort | "
                       "xargs sha256sum", check=False).stdout
    want = sorted(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(source)}"
                  for p in source.rglob("*") if p.is_file())
    return sorted(listed.splitlines()) == want


def test_an_engine_killed_mid_pull_leaves_nothing_loadable_and_a_rerun_completes(
        fleet: Fleet) -> None:
    engine = _dockerd_pid()
    stage = fleet.background("stage", "--version", "1")
    try:
        # the pull's first progress line (0 of its layers yet)
        stage.wait_for(rf"{HOST}: pull {REGISTRY}/tfsdeploy-models/{MODEL}@sha256:")
        os.kill(engine, signal.SIGKILL)
        run = stage.finish(timeout=300)
        assert run.code == 1, run.describe()  # the stage failed; nothing serving changed
        assert f"{HOST}" in run.out and "failed" in run.out, run.describe()
        # the version directory appears whole (verified, one rename) or not at all
        assert set(_names()) <= {".pull-1"}, _names()
    finally:
        repaired = run_testbed(*SUITE_UP)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    again = fleet.fab("stage", "--version", "1", "--json")
    assert again.code == 0, again.describe()
    assert _names() == ["1"], _names()
    assert _sums_ok(fleet.source / "1")


class registry_refused:
    """Connections from ``host`` (its engine) to the registry's port refused with a reset
    while inside, as a stopped registry refuses them; always undone."""

    def __init__(self, host: str) -> None:
        address, port = REGISTRY.split(":")
        self.rule = ["OUTPUT", "-p", "tcp", "-d", address, "--dport", port, "-m", "comment",
                     "--comment", f"tfsdeploy-pull-tests-{MODEL}", "-j", "REJECT",
                     "--reject-with", "tcp-reset"]
        self.host = host

    def __enter__(self) -> registry_refused:
        subprocess.run(netns(self.host, "iptables", "-I", *self.rule), check=True,
                       capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        while subprocess.run(netns(self.host, "iptables", "-D", *self.rule),
                             capture_output=True).returncode == 0:
            pass


def test_a_host_that_cannot_reach_the_registry_fails_its_stage_and_a_rerun_completes(
        fleet: Fleet) -> None:
    """The registry refuses the host (tb3) while it stages a version it does not have: the
    stage fails naming the registry, with no version directory a server could load; once the
    host reaches the registry again, the same `fab stage` completes. Alone, as the module: the
    cut refuses every pull of tb3's engine."""
    cut = HOST
    with registry_refused(cut):
        run = fleet.fab("stage", "--version", "2", "--json")
    assert run.code == 1, run.describe()  # the stage failed; nothing serving changed
    outcome = run.json()["hosts"][cut]
    assert outcome["status"] == "failed", outcome
    assert REGISTRY in outcome["error"], outcome["error"]  # names where it could not pull
    assert set(_names()) - {"1", ".pull-2"} == set(), _names()
    again = fleet.fab("stage", "--version", "2", "--json")
    assert again.code == 0, again.describe()
    assert _sums_ok(fleet.source / "2", 2)
    assert ".pull-2" not in _names()
