"""`fab prune` on the real fleet never removes the live release, what the proxy serves or the
rollback window, whatever their containers' state: after `fab rollback --to` an old release
whose container then stopped, a prune that keeps fewer releases leaves that release's record,
container, files and model version in place.

One host (tb2): the failure is a host's facts, and one host keeps the module short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import HOSTS, copy_version, fleet_lifetime, inventory_text, ssh

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itprune", 3400
HOST = "tb2"


def _inventory(fleet_tmp: Path, source: Path, keep: int) -> Path:
    path = fleet_tmp / f"inventory-keep{keep}.py"
    path.write_text(inventory_text(
        title="the prune test", model=MODEL, source=source, golden=fleet_tmp / "golden.json",
        offset=OFFSET,
        warmup="Warmup(samples=5)", hosts={HOST: HOSTS[HOST]},
        rollout=f"Rollout(serial=('100%',), min_healthy_s=1.0, window_s=0.0, "
                f"keep_releases={keep}, load_timeout_s=120)"))
    return path


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    for version in (1, 2, 3):
        copy_version(SOURCE_MODEL / str(version), source, version)
    # a fourth version: version 3's files, with version 3's golden answers
    copy_version(SOURCE_MODEL / "3", source, 4)
    golden = json.loads(GOLDEN.read_text())
    golden["version_details"]["4"] = golden["version_details"]["3"]
    golden["versions"] = [*golden["versions"], 4]
    (tmp / "golden.json").write_text(json.dumps(golden))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source,
                 inventory=_inventory(tmp, source, keep=4), fast_playbook=playbook,
                 hosts={HOST: HOSTS[HOST]})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_PRUNE_TESTS_KEEP", hosts={HOST: HOSTS[HOST]})


def test_prune_keeps_the_live_release_whose_container_stopped(fleet: Fleet) -> None:
    for version in (1, 2, 3, 4):
        fleet.deploy(version)
    first = next(m["id"] for m in fleet.releases(HOST).values() if m["version"] == 1)
    back = fleet.fab("rollback", "--to", first, "--json")
    assert back.code == 0, back.describe()
    name = f"tfs-{MODEL}-{first}-i0"
    ssh(HOST, f"docker stop -t 1 {name} >/dev/null")  # crashed: the proxy still serves its slot
    home = f"/srv/tfsdeploy/{MODEL}"
    fewer = _inventory(fleet.tmp, fleet.source, keep=2)  # v1 is older than the 2 newest good
    run = fleet.fab("prune", "--json", inventory=fewer)
    assert run.code == 0, run.describe()
    left = ssh(HOST, f"readlink {home}/current; ls {home}/releases/{first}; "
                     f"ls /srv/tfsdeploy/models/{MODEL}/1; docker inspect --format "
                     f"'{{{{.State.Status}}}}' {name}", check=False)
    assert left.returncode == 0, (
        f"prune removed part of the live release {first}: {left.stdout}{left.stderr}\n"
        f"{run.describe()}")
    assert left.stdout.splitlines()[0] == f"releases/{first}"
    assert "manifest.json" in left.stdout and "saved_model.pb" in left.stdout
    assert left.stdout.split()[-1] == "exited"
