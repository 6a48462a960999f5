"""model_transfer push on the real fleet (for hosts that reach no registry): the deploy
machine uploads the version over each host's SSH connection, as the counters of
test_model_pull.py see it: a copy per host over SSH, nothing from the registry (which never
gets a repository of the model: the registry's bytes to a host are not this run's alone, as
the other modules' pulls run beside it).

Two hosts: one copy per host is what is shown."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import (
    HOSTS,
    REGISTRY,
    REPO,
    Run,
    copy_version,
    fab_env,
    fleet_lifetime,
    inventory_text,
)
from transfer_support import pad_version, wire_counter

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itpush", 4300
PAD = 4 << 20
TWO = {name: HOSTS[name] for name in ("tb1", "tb2")}


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    copy_version(SOURCE_MODEL / "1", source, 1)
    pad_version(source / "1", PAD, f"{time.time_ns()}")
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the push test", model=MODEL, source=source, golden=GOLDEN, offset=OFFSET,
        warmup="Warmup(samples=5)", hosts=TWO,
        # a registry is named, yet push never uses it
        extra_vars={"model_transfer": "push", "model_registry": "10.87.0.1:5000/tfsdeploy-models"},
        rollout="Rollout(serial=('100%',), min_healthy_s=1.0, window_s=0.0, "
                "load_timeout_s=120)"))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=playbook, hosts=TWO)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_PUSH_TESTS_KEEP", hosts=TWO)


def registry_tags(repository: str) -> list[str] | None:
    """The registry's tags of ``repository`` (None: the registry has no such repository)."""
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/{repository}/tags/list",
                                    timeout=10) as reply:
            return list(json.loads(reply.read()).get("tags") or [])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def test_push_uploads_a_copy_per_host_over_ssh_and_every_host_serves(fleet: Fleet) -> None:
    repository = f"tfsdeploy-models/{MODEL}"
    assert registry_tags(repository) is None, repository  # nothing to pull before the deploy
    with wire_counter(fleet.hosts, count_registry=False) as counter:
        argv = counter.wrap(fleet.argv("deploy", "--version", "1", "--json",
                                       playbook=fleet.fast_playbook))
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO,
                              env=fab_env())
        sent = counter.read()
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    fleet.log.append(run.describe())
    assert run.code == 0, run.describe()
    print(f"bytes sent over SSH per host: {sent['ssh']}")
    for host in fleet.hosts:
        assert sent["ssh"][host] > PAD, (host, sent)  # the version's copy went over SSH
    assert registry_tags(repository) is None, repository  # none published: none pulled
    assert "image_pull" not in run.stdout, run.stdout[-2000:]
    details = [s["detail"] for o in run.json()["hosts"].values() for s in o["steps"]
               if s["step"] == "stage_model"]
    assert all(d.startswith("published /srv/tfsdeploy/models/itpush/1") for d in details), \
        details
    fleet.assert_serving(1, hosts=tuple(TWO))
