"""model_transfer pull on the real fleet: the version is published once to the testbed's
registry and every host's engine pulls it by digest; the deploy machine sends only commands.

Three hosts: what is proved is per host (each one's bytes, each one's refusal), and three make
the deploy machine's traffic visibly flat in the number of hosts. Every run pads its versions
with random bytes (4 MiB), so no registry or host has them yet and a copy per host would
show on the counters (test_model_push.py measures that copy)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollback_support import GOLDEN, SOURCE_MODEL, Fleet, write_fast_playbook
from testbed_support import (
    REGISTRY,
    REPO,
    STATE,
    Run,
    copy_version,
    fab_env,
    fleet_lifetime,
    inventory_text,
    ssh,
)
from transfer_support import pad_version, registry_blob, wire_counter

from tfsdeploy.run.publish import pack, write_layer

pytestmark = pytest.mark.testbed

MODEL, OFFSET = "itpull", 4200
PAD = 4 << 20
MB = 1_000_000
PULL = {"model_transfer": "pull", "model_registry": f"{REGISTRY}/tfsdeploy-models",
        "model_registry_insecure": True}


def _make(tmp: Path) -> Fleet:
    source = tmp / "models" / MODEL
    source.mkdir(parents=True)
    tag = f"{time.time_ns()}"
    for version in (1, 2, 3):
        copy_version(SOURCE_MODEL / str(version), source, version)
        pad_version(source / str(version), PAD, tag)
    inventory = tmp / "inventory.py"
    inventory.write_text(inventory_text(
        title="the pull tests", model=MODEL, source=source, golden=GOLDEN, offset=OFFSET,
        warmup="Warmup(samples=5)", extra_vars=PULL,
        rollout="Rollout(serial=('100%',), min_healthy_s=1.0, window_s=0.0, "
                "keep_releases=3, load_timeout_s=120)"))
    playbook = write_fast_playbook(tmp)
    return Fleet(model=MODEL, offset=OFFSET, tmp=tmp, source=source, inventory=inventory,
                 fast_playbook=playbook)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from fleet_lifetime(MODEL, lambda: _make(tmp_path_factory.mktemp(MODEL)),
                              keep_env="TFSDEPLOY_PULL_TESTS_KEEP")


def _measured(fleet: Fleet, counter: object, *args: str) -> Run:
    argv = counter.wrap(fleet.argv(*args))  # type: ignore[attr-defined]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=fab_env())
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    fleet.log.append(run.describe())
    return run


def _versions_on(host: str) -> list[str]:
    return ssh(host, f"ls -A /srv/tfsdeploy/models/{MODEL} 2>/dev/null; true").stdout.split()


def _sums_on(host: str, version: int) -> str:
    return ssh(host, f"cd /srv/tfsdeploy/models/{MODEL}/{version} && "
                     "find . -type f | sort | xargs sha256sum").stdout


def _sums_of(source: Path) -> str:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(source)}"
             for p in sorted(source.rglob("*")) if p.is_file()]
    return "\n".join(sorted(lines, key=lambda line: line.split("  ", 1)[1])) + "\n"


def test_pull_sends_commands_only_and_every_host_serves(fleet: Fleet) -> None:
    with wire_counter(fleet.hosts) as counter:
        run = _measured(fleet, counter, "deploy", "--version", "1", "--json",
                        "--playbook", str(fleet.fast_playbook))
        sent = counter.read()
    assert run.code == 0, run.describe()
    for host in fleet.hosts:
        # the version is 4 MiB; commands, sums and the engine's API calls are far below 1 MB
        assert sent["ssh"][host] < MB, (host, sent)
        assert sent["registry"][host] > PAD, (host, sent)  # the host's copy came from there
        assert _sums_on(host, 1) == _sums_of(fleet.source / "1"), host
        assert _versions_on(host) == ["1"], host  # no staging directory left behind
        images = ssh(host, "docker images --format '{{.Repository}}'").stdout
        assert f"tfsdeploy-models/{MODEL}" not in images, host  # the image went with the copy
    fleet.assert_serving(1)
    result = run.json()
    pulls = [e for e in result["events"] if e["event"] == "image_pull"
             and f"tfsdeploy-models/{MODEL}@sha256:" in e["image"]]
    assert {e["host"] for e in pulls} == set(fleet.hosts), pulls  # per-host progress
    details = {h: next(s["detail"] for s in o["steps"] if s["step"] == "stage_model")
               for h, o in result["hosts"].items()}
    assert all(f"pulled {REGISTRY}/tfsdeploy-models/{MODEL}@sha256:" in d
               for d in details.values()), details
    print(f"bytes sent over SSH per host: {sent['ssh']}; by the registry: {sent['registry']}")


def test_a_corrupt_blob_is_refused_by_every_host(fleet: Fleet) -> None:
    published = fleet.fab("publish", "--version", "2", "--json")
    assert published.code == 0, published.describe()
    again = fleet.fab("publish", "--version", "2", "--json")
    image, second = published.json()["images"][0], again.json()["images"][0]
    assert (second["digest"], second["uploaded"]) == (image["digest"], [])  # idempotent
    layer = pack(MODEL, 2, fleet.source / "2").layer
    blob = registry_blob(STATE, layer.digest)
    good = blob.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # same size, one byte flipped
    blob.write_bytes(bytes(damaged))
    try:
        run = fleet.fab("stage", "--version", "2", "--json")
        assert run.code == 1, run.describe()  # failed before anything serving changed
        result = run.json()
        for host in fleet.hosts:
            outcome = result["hosts"][host]
            assert outcome["status"] == "failed", (host, outcome)
            assert "verification failed" in outcome["error"], (host, outcome["error"])
            assert _versions_on(host) == ["1"], host  # nothing a server could load
        fleet.assert_serving(1)
    finally:
        blob.write_bytes(good)
    with open(blob, "rb") as handle:  # the registry's bytes are the layer's again
        assert hashlib.sha256(handle.read()).hexdigest() == layer.digest.split(":")[1]


def test_an_interrupted_pull_leaves_nothing_loadable_and_a_rerun_completes(
        fleet: Fleet) -> None:
    before = {h: (fleet.current(h) or {}).get("id") for h in fleet.hosts}
    watched = fleet.background("stage", "--version", "3", own_session=True)
    watched.kill_when(rf"pull {REGISTRY}/tfsdeploy-models/{MODEL}@sha256:")
    expected = _sums_of(fleet.source / "3")
    print("after the kill:", {h: _versions_on(h) for h in fleet.hosts})
    for host in fleet.hosts:
        # the version directory appears whole (verified, one rename) or not at all
        names = _versions_on(host)
        assert set(names) - {"1", "2", "3", ".pull-3"} == set(), (host, names)
        if "3" in names:
            assert _sums_on(host, 3) == expected, host
    run = fleet.fab("stage", "--version", "3", "--json", "--lock-wait", "60")
    assert run.code == 0, run.describe()
    for host in fleet.hosts:
        assert _sums_on(host, 3) == expected, host
        assert ".pull-3" not in _versions_on(host), host
        assert (fleet.current(host) or {}).get("id") == before[host], host  # what serves
    fleet.assert_serving(1)
    deploy = fleet.deploy(3, "--json")
    stages = [s["detail"] for o in deploy.json()["hosts"].values() for s in o["steps"]
              if s["step"] == "stage_model"]
    assert all("already staged" in d for d in stages), stages
    fleet.assert_serving(3)


def test_layer_bytes_are_reproducible_from_the_source(fleet: Fleet, tmp_path: Path) -> None:
    """What the corrupt-blob test restores is the very layer fab publish pushed."""
    with open(tmp_path / "layer", "wb") as handle:
        write_layer(fleet.source / "1", handle)
    digest = "sha256:" + hashlib.sha256((tmp_path / "layer").read_bytes()).hexdigest()
    assert digest == pack(MODEL, 1, fleet.source / "1").layer.digest
    assert registry_blob(STATE, digest).read_bytes() == (tmp_path / "layer").read_bytes()
    assert json.loads(fleet.fab("publish", "--version", "1", "--json").stdout)["images"][0][
        "uploaded"] == []
