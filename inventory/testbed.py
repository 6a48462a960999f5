"""The local test fleet started by `scripts/testbed up` (the default inventory).

Hosts come from the testbed's hosts.json when it exists (so `up --hosts 5` gives 5 hosts, and
`up --gpus 2` two GPUs per host), except the hosts `up --reserve` keeps for the test suite's own
models; otherwise the default three hosts tb1..tb3 with one GPU each are declared, which is
enough to render files. Hosts started behind the bastion (`up --bastion --hosts N`) are
reached through it (`ssh_proxy_jump`): their sshd answers the bastion alone.

The testbed's engines hand out GPUs as a host with the NVIDIA Container Toolkit does: only to a
container that asks (docs/testbed.md), so the servers ask for every GPU of their host
(`docker_gpus: all`, docker's `--gpus all`), as on the production inventory's GPU hosts.
"""

import json
import os
from pathlib import Path

from tfsdeploy.core.inventory.catalog import (
    Batching,
    Model,
    Rollout,
    Signature,
    TensorSpec,
    Threads,
    Warmup,
)
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host
from tfsdeploy.core.inventory.gateway import Gateway, Route
from tfsdeploy.core.inventory.monitoring import Monitoring

STATE = Path(os.environ.get("TFSDEPLOY_TESTBED_DIR", "/var/lib/tfsdeploy-testbed"))
MODELS = Path(os.environ.get("TFSDEPLOY_CACHE", "/var/cache/tfsdeploy")) / "models"
REGISTRY = "10.87.0.1:5000"


def _hosts() -> list[Host]:
    state_file = STATE / "hosts.json"
    if state_file.is_file():
        entries = [e for e in json.loads(state_file.read_text())["hosts"]
                   if not e.get("reserved")]
    else:
        entries = [{"name": f"tb{i}", "address": f"10.87.0.{10 + i}",
                    "gpus": [{"index": 0, "memory_mib": 16384, "name": "Simulated Tesla T4"}]}
                   for i in (1, 2, 3)]
    return [Host(e["name"], e["address"],
                 gpus=[Gpu(g["index"], g["memory_mib"], g.get("name", "GPU"),
                           reserved_mib=g.get("reserved_mib", 0)) for g in e["gpus"]],
                 vars={"ssh_proxy_jump": e["via"]} if e.get("via") else {})
            for e in entries]


hosts = _hosts()
serving = [h.name for h in hosts]


def _gateway_hosts() -> list[Host]:
    """The gateway host `scripts/testbed up --gateway` started (none: no gateway), with its
    own pinned key (a plain `up` rewrites known_hosts with tb1..tbN only)."""
    state_file = STATE / "gateway.json"
    if not state_file.is_file():
        return []
    return [Host(e["name"], e["address"], vars={"ssh_known_hosts": e["known_hosts"]})
            for e in json.loads(state_file.read_text())["hosts"]]


gateway_hosts = _gateway_hosts()
hosts += gateway_hosts

groups = {
    "canary": Group([serving[0]]),
    "main": Group(serving[1:]),
    # where `fab accept --loadgens loadgens` runs its load generators
    "loadgens": Group(serving[:2]),
}
if gateway_hosts:
    # routes, does not serve: the implicit group `all` (every model's default hosts) leaves
    # the gateway's group out
    groups["gateway"] = Group([h.name for h in gateway_hosts])

defaults = {
    "ssh_user": "root",
    "ssh_key": str(STATE / "ssh" / "id_ed25519"),
    "ssh_known_hosts": str(STATE / "ssh" / "known_hosts"),
    "data_root": "/srv/tfsdeploy",
    "image": f"{REGISTRY}/tfserving-emulator:2.21.0",
    "tfserving_version": "2.21.0",
    "proxy_image": f"{REGISTRY}/tfsdeploy-proxy:2.6",
    "docker_gpus": "all",
    "gpu_safety_margin": 1.2,
    "gpu_headroom": 0.1,
    # model versions go to the testbed's registry once; every host pulls them by digest
    # (docs/distribution.md)
    "model_transfer": "pull",
    "model_registry": f"{REGISTRY}/tfsdeploy-models",
    "model_registry_insecure": True,  # plain HTTP, as the engines' --insecure-registry
}

models = [
    Model(
        name="half_plus_two",
        port_offset=100,  # beside resnet50 on every host: stable ports 8600/8601
        source=str(MODELS / "half_plus_two"),
        signature=Signature(inputs={"x": TensorSpec("DT_FLOAT", (-1, 1))},
                            outputs={"y": TensorSpec("DT_FLOAT", (-1, 1))}),
        memory_mib=512,
        latency_slo_ms=50,
        batching=Batching(max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=64,
                          num_batch_threads=2, allowed_batch_sizes=(8, 16, 32)),
        # TFServing's default gRPC thread quota is 4 x the host's CPUs (8 on a 2-CPU testbed
        # host), and a quota of N holds N - 1 requests at once: load tests run far more
        threads=Threads(intra_op=1, inter_op=2, grpc_max_threads=256),
        warmup=Warmup(samples=200),
        rollout=Rollout(serial=(1, "100%"), min_healthy_s=3),
        labels={"stable": "release"},
        golden=str(MODELS / "half_plus_two" / "catalog.json"),
    ),
    Model(
        name="resnet50",
        source=str(MODELS / "resnet50"),
        signature=Signature(inputs={"inputs": TensorSpec("DT_FLOAT", (-1, 224, 224, 3))},
                            outputs={"predictions": TensorSpec("DT_FLOAT", (-1, 1000))}),
        memory_mib=2048,
        latency_slo_ms=1500,
        batching=Batching(max_batch_size=8, batch_timeout_micros=20000, max_enqueued_batches=32,
                          num_batch_threads=1, allowed_batch_sizes=(1, 2, 4, 8)),
        threads=Threads(intra_op=2, inter_op=2, grpc_max_threads=256),
        warmup=Warmup(samples=20, p99_ms=1500),
        rollout=Rollout(serial=(1, "100%"), min_healthy_s=3),
        golden=str(MODELS / "resnet50" / "catalog.json"),
    ),
]

# The testbed's Prometheus (`scripts/testbed up`: 10.87.0.1:9090) reads the targets from the
# state dir; every deploy, rollback, promote and abort made with this inventory rewrites its
# model's file there. Short intervals: a test fleet's releases last minutes.
monitoring = Monitoring(
    local_targets_dir=str(STATE / "prometheus" / "targets"),
    scrape_interval_s=5, evaluation_interval_s=5, rate_window_s=30, p99_for_s=60,
    alert_for_s=60,
)

if gateway_hosts:
    # `fab gateway`: each model on its own pair of ports of the gateway host
    gateway = Gateway(routes=[Route("half_plus_two", grpc_port=9600, rest_port=9601),
                              Route("resnet50", grpc_port=9500, rest_port=9501)])
