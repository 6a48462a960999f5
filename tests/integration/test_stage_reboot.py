"""A staged model version is re-verified against its recorded sums when it is reused after
a reboot of the host: on the real fleet, a file of a staged version is cut short (as a power
loss can leave it) and the recorded boot id changed (the host "rebooted"); the next deploy of
that version re-verifies it, finds the damage, stages it again and serves it.

One host (tb3): the failure is one host's files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import HOSTS, copy_version, fleet_lifetime, inventory_text, ssh

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itrestage", 3500
HOST = "tb3"
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    for version in (1, 2):
        copy_version(SOURCE_MODEL / str(version), source, version)
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the re-staging test", model=MODEL, source=source, golden=GOLDEN, offset=OFFSET,
        warmup="Warmup(samples=5)", hosts={HOST: HOSTS[HOST]},
        rollout="Rollout(serial=('100%',), min_healthy_s=1.0, window_s=0.0, "
                "keep_releases=3, load_timeout_s=120)"))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=playbook, hosts={HOST: HOSTS[HOST]})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_RESTAGE_TESTS_KEEP", hosts={HOST: HOSTS[HOST]})


def test_a_version_cut_short_before_a_reboot_is_staged_again(fleet: Fleet) -> None:
    fleet.deploy(1)
    fleet.deploy(2)
    version_dir = f"/srv/tfsdeploy/models/{MODEL}/1"
    digest_file = f"/srv/tfsdeploy/{MODEL}/versions/1.sha256"
    recorded = ssh(HOST, f"cat {digest_file}; cat /proc/sys/kernel/random/boot_id").stdout
    digest, boot, now = recorded.split()
    assert boot == now, recorded  # staging recorded the host's boot
    ssh(HOST, f"truncate -s 10 {version_dir}/saved_model.pb && "
              f"printf '%s %s\\n' {digest} {OTHER_BOOT} > {digest_file}")
    run = fleet.fab("deploy", "--version", "1", "--json", playbook=fleet.fast_playbook)
    assert run.code == 0, run.describe()
    assert "failed its re-verification and was replaced" in run.stdout, run.describe()
    origin = (fleet.source / "1" / "saved_model.pb").read_bytes()
    on_host = ssh(HOST, f"sha256sum < {version_dir}/saved_model.pb; cat {digest_file}").stdout
    assert on_host.split()[0] == hashlib.sha256(origin).hexdigest()
    assert on_host.split()[-2:] == [digest, now]
    assert fleet.served_version(HOST) == 1
