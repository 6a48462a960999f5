"""A fleet that switches from model_transfer push to pull keeps the versions push staged: one
digest per version whatever carried its files. The test model is a TensorFlow 2 export
(``assets/``, ``assets.extra/``, ``fingerprint.pb`` beside ``variables/``), the layout whose
``os.walk`` order and sorted order differ, as the testbed's resnet50's.

Two hosts: version 2 is staged on both by push (`fab stage`), then the inventory names a
registry and pull, and `fab deploy --version 2` runs under live traffic: it reuses the staged
version (nothing published, nothing pulled), exits 0, and no request fails."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import Traffic
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import (
    HOSTS,
    REGISTRY,
    copy_version,
    fleet_lifetime,
    inventory_text,
    ssh,
)

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itswitch", 5100
TWO = {name: HOSTS[name] for name in ("tb1", "tb2")}
ROLLOUT = ("Rollout(serial=(1, '100%'), min_healthy_s=1.0, window_s=0.0, keep_releases=3, "
           "load_timeout_s=120)")
PULL = {"model_transfer": "pull", "model_registry": f"{REGISTRY}/tfsdeploy-models",
        "model_registry_insecure": True}


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    for version in (1, 2):
        copy_version(SOURCE_MODEL / str(version), source, version)
        names = {p.name for p in (source / str(version)).iterdir()}
        assert {"assets", "assets.extra", "fingerprint.pb", "variables"} <= names, names
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the transfer switch test", model=MODEL, source=source, golden=GOLDEN,
        offset=OFFSET, warmup="Warmup(samples=5)", hosts=TWO,
        extra_vars={"model_transfer": "push"}, rollout=ROLLOUT))
    (tmp / "inventory_pull.py").write_text(inventory_text(
        title="the transfer switch test, pulling", model=MODEL, source=source, golden=GOLDEN,
        offset=OFFSET, warmup="Warmup(samples=5)", hosts=TWO, extra_vars=PULL,
        rollout=ROLLOUT))
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=write_fast_playbook(tmp), hosts=TWO)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_SWITCH_TESTS_KEEP", hosts=TWO)


def _in_registry() -> bool:
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/tfsdeploy-models/{MODEL}/tags/list",
                                    timeout=10) as reply:
            return bool(json.loads(reply.read()).get("tags"))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise


def test_a_version_staged_by_push_is_deployed_by_pull(fleet: Fleet) -> None:
    fleet.deploy(1)
    staged = fleet.fab("stage", "--version", "2", "--json")
    assert staged.code == 0, staged.describe()
    for host in fleet.hosts:
        assert ssh(host, f"test -d /srv/tfsdeploy/models/{MODEL}/2").returncode == 0
    pulling = fleet.tmp / "inventory_pull.py"
    with Traffic(fleet, "tb1", rest=True) as client, Traffic(fleet, "tb2") as other:
        time.sleep(1.0)
        run = fleet.fab("deploy", "--version", "2", "--json", inventory=pulling)
        time.sleep(1.0)
    assert run.code == 0, run.describe()
    stages = {h: next(s["detail"] for s in o["steps"] if s["step"] == "stage_model")
              for h, o in run.json()["hosts"].items()}
    assert all(d.startswith("version 2 already staged") for d in stages.values()), stages
    assert not _in_registry(), "the staged version was reused: nothing published"
    assert client.failures == [] and other.failures == [], (client.failures, other.failures)
    assert client.ok > 50 and other.ok > 50, (client.ok, other.ok)
    print(f"requests answered during the deploy: tb1 {client.ok}, tb2 {other.ok}; failed: 0")
    fleet.assert_serving(2)
