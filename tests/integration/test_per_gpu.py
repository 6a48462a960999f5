"""One server per GPU on the local fleet: a host with two GPUs runs two instances of the model,
each given only its GPU, behind the host's one proxy; a roll replaces them one at a time with
no failed request; status and the release record name each instance and its GPU; a rollback
brings both back.

Model ``itgpu`` on tb1, tb2 and the suite fleet's two-GPU host tb4 (testbed_support.GPU_HOST,
brought up by scripts/test: `scripts/testbed up --hosts 4 --gpus tb4=2`), port offset 4000
(acceptit's 2000 is on tb1 and tb2 too).
The module is in the xdist group "gpu-host": no other module uses tb4 while it runs.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import GOOD, Fleet, Traffic, fleet_fixture
from rollback_support import json_from
from testbed_support import ADDRESSES, GPU_HOST, STATE, SUITE_FLEET, run_testbed, ssh, ssh_argv

pytestmark = [pytest.mark.testbed, pytest.mark.xdist_group("gpu-host")]

MODEL, OFFSET = "itgpu", 4000
BIG, BIG_OFFSET = "itgpubig", 4100
WIDE = GPU_HOST
HOSTS = {name: ADDRESSES[name] for name in ("tb1", "tb2", WIDE)}
STRIDE = 20  # layout.INSTANCE_PORT_STRIDE: instance k's slot ports are instance 0's + k * 20
SLOT_REST = {"blue": 8511 + OFFSET, "green": 8521 + OFFSET}


def _gpu_counts() -> dict[str, int]:
    hosts = json.loads((STATE / "hosts.json").read_text())["hosts"]
    return {h["name"]: len(h["gpus"]) for h in hosts}


def ensure_wide_host() -> None:
    """The suite's fleet shape (a fleet brought up by hand may lack tb4 or its GPUs)."""
    if _gpu_counts().get(WIDE) != 2:
        proc = run_testbed("up", *SUITE_FLEET)
        assert proc.returncode == 0, f"scripts/testbed up failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    ensure_wide_host()
    for made in fleet_fixture(tmp_path_factory, MODEL, OFFSET, {1: GOOD[1], 2: GOOD[2]},
                              serial=(1, "100%"), hosts=HOSTS):
        text = made.inventory.read_text()
        marker = "for i in range(1)])"
        assert marker in text
        made.inventory.write_text(text.replace(
            marker, f"for i in range(2 if name == {WIDE!r} else 1)])"))
        yield made


@pytest.fixture(scope="module")
def big(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Model ``itgpubig`` (port offset 4100) whose 9,000 MiB do not fit twice on a 16 GiB GPU:
    rolled with ``strategy="recreate"``, on the wide host only."""
    for made in fleet_fixture(tmp_path_factory, BIG, BIG_OFFSET, {1: GOOD[1], 2: GOOD[2]},
                              serial=(1,), memory_mib=9000, hosts=HOSTS):
        text = made.inventory.read_text().replace(
            "for i in range(1)])", f"for i in range(2 if name == {WIDE!r} else 1)])").replace(
            "rollout=Rollout(", 'rollout=Rollout(strategy="recreate", ', 1)
        made.inventory.write_text(text)
        yield made


def device_requests(host: str, container: str) -> Any:
    out = ssh(host, f"docker inspect --format '{{{{json .HostConfig.DeviceRequests}}}}' "
                    f"{container}").stdout
    return json.loads(out)


def request_count(host: str, port: int) -> float:
    url = f"http://{ADDRESSES[host]}:{port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(":tensorflow:serving:request_count{")
               and f'model_name="{MODEL}"' in line)


def Client(fleet: Fleet) -> Traffic:
    """gRPC and REST on the wide host's stable ports."""
    return Traffic(fleet, WIDE, rest=True)


class Rotation:
    """Samples, every 0.2 s, how many of the wide host's gRPC servers of ``model`` the proxy
    sends new requests to (neither in maintenance nor draining, weight > 0: the servers have
    no health checks, so their status is "no check" when in rotation), from its admin socket
    over one SSH session."""

    def __init__(self, model: str = MODEL) -> None:
        self.socket = f"/srv/tfsdeploy/{model}/proxy-admin/admin.sock"
        self.samples: list[int] = []

    def __enter__(self) -> Rotation:
        # the loop ends when its output has nowhere to go (this ssh client gone: sshd does not
        # stop a command without a terminal) and after 15 minutes whatever happens
        script = ("end=$((SECONDS + 900)); while [ $SECONDS -lt $end ]; do echo 'show stat' "
                  "| socat -t 2 - UNIX-CONNECT:" + self.socket
                  + " | awk -F, '$1 == \"grpc\" && $2 !~ /END$/ && $18 !~ /^(MAINT|DRAIN)/"
                  " && $19 > 0 {n++} END {print n + 0; fflush()}' || break; sleep 0.2; done")
        self._proc = subprocess.Popen(ssh_argv(ADDRESSES[WIDE], script), stdout=subprocess.PIPE,
                                      text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        self.samples = [int(line) for line in out.split()]


def test_a_host_with_two_gpus_runs_one_instance_per_gpu(fleet: Fleet) -> None:
    fleet.deploy(1)
    fleet.assert_serving(1)
    record = fleet.current(WIDE)
    assert record is not None
    assert [(i["index"], i["gpus"]) for i in record["instances"]] == [(0, [0]), (1, [1])]
    containers = {c["name"]: c for c in fleet.containers(WIDE)}
    assert len(containers) == 2, containers
    for instance in record["instances"]:
        (request,) = device_requests(WIDE, instance["container"])
        assert request["DeviceIDs"] == [str(instance["gpus"][0])], request
        assert request["Capabilities"] == [["gpu"]], request
    narrow = fleet.current("tb1")
    assert narrow is not None and [i["index"] for i in narrow["instances"]] == [0]
    used = ssh(WIDE, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"
               ).stdout.split("\n")
    per_gpu = {int(a): int(b) for a, b in (line.split(",") for line in used if line.strip())}
    assert per_gpu[0] > 0 and per_gpu[1] > 0, per_gpu


def test_the_proxy_spreads_requests_over_both_instances(fleet: Fleet) -> None:
    slot = fleet.current(WIDE)["instances"][0]["slot"]  # type: ignore[index]
    ports = [SLOT_REST[slot] + k * STRIDE for k in (0, 1)]
    before = [request_count(WIDE, p) for p in ports]
    with Client(fleet) as client:
        while client.ok < 100:
            time.sleep(0.1)
    assert not client.failures, client.failures[:5]
    grown = [request_count(WIDE, p) - b for p, b in zip(ports, before, strict=True)]
    assert all(g >= client.ok * 0.25 for g in grown), (client.ok, grown)


def test_a_roll_replaces_each_instance_with_no_failed_request(fleet: Fleet) -> None:
    with Client(fleet) as client, Rotation() as rotation:
        run = fleet.deploy(2, "--json")
        time.sleep(1)
    assert not client.failures, client.failures[:5]
    assert client.ok > 50
    assert len(rotation.samples) > 20 and min(rotation.samples) >= 1, rotation.samples
    assert max(rotation.samples) == 2, rotation.samples
    fleet.assert_serving(2)
    result: dict[str, Any] = json_from(run.stdout)
    assert result["hosts"][WIDE]["status"] == "rolled", result["hosts"][WIDE]
    record = fleet.current(WIDE)
    assert record is not None
    changes = " ".join(e["details"].get("change", "") for e in fleet.audit(WIDE)
                       if e["release"] == record["id"])
    assert all(i["container"] in changes for i in record["instances"]), changes

def test_status_names_each_instance_and_its_gpu(fleet: Fleet) -> None:
    run = fleet.fab("status", "--json")
    assert run.code == 0, run.describe()
    rows = {r["host"]: r for r in json_from(run.stdout)}
    wide = rows[WIDE]["instances"]
    assert [(i["instance"], i["gpus"]) for i in wide] == [(0, [0]), (1, [1])], wide
    assert all(i["traffic_slot"] == wide[0]["traffic_slot"] for i in wide), wide
    serving = [c for i in wide for c in i["slots"][i["traffic_slot"]] if c["running"]]
    assert len(serving) == 2 and all(c["version"] == 2 for c in serving), serving
    assert len(rows["tb1"]["instances"]) == 1
    table = fleet.fab("status")
    assert "i0 " in table.out and "i1 " in table.out, table.describe()


def test_a_rollback_brings_both_instances_back(fleet: Fleet) -> None:
    with Client(fleet) as client:
        run = fleet.fab("rollback", "--json", timeout=900)
    assert run.code == 0, run.describe()
    assert not client.failures, client.failures[:5]
    fleet.assert_serving(1)
    record = fleet.current(WIDE)
    assert record is not None and record["version"] == 1
    running = [c for c in fleet.containers(WIDE) if c["status"] == "running"]
    assert sorted(c["version"] for c in running) == ["1", "1"], running


def test_recreate_on_gpus_too_small_for_two_releases_keeps_one_instance_serving(
        big: Fleet) -> None:
    dual = big.inventory.read_text().replace('strategy="recreate", ', "")
    refused_inventory = big.tmp / "inventory_dual.py"
    refused_inventory.write_text(dual)
    refused = big.fab("deploy", "--version", "1", "--hosts", WIDE, inventory=refused_inventory)
    assert refused.code == 1 and "MiB" in refused.out, refused.describe()
    assert big.containers(WIDE) == []
    big.deploy(1, "--hosts", WIDE)
    plan = big.fab("deploy", "--version", "2", "--hosts", WIDE, "--check")
    assert plan.code == 0 and "the host keeps 1 of 2 instance(s) serving" in plan.out, \
        plan.describe()
    with Client(big) as client, Rotation(BIG) as rotation:
        big.deploy(2, "--hosts", WIDE)
        time.sleep(1)
    assert not client.failures, client.failures[:5]
    assert client.ok > 50
    # one instance out of rotation at a time, never both
    assert len(rotation.samples) > 20 and min(rotation.samples) == 1, rotation.samples
    big.assert_serving(2, hosts=(WIDE,))
