"""Example production inventory: copy this file and edit it for your fleet.

24 GPU hosts in three groups, two models. Vars precedence, lowest first:
built-in defaults < `defaults` < groups (in the order declared here) < host vars.

- gpu_a: 8 hosts with one 24 GiB GPU, serving resnet50 (the latency-sensitive group);
- gpu_b: 8 hosts with one 16 GiB GPU, serving the ranker (throughput-oriented);
- gpu_c: 8 hosts with two 40 GiB GPUs, serving both models;
- monitoring: the Prometheus server (no GPU, no model), whose file_sd targets every deploy,
  rollback, promote and abort rewrites (`monitoring` at the end; `fab observe` renders its
  configuration, rules and dashboards).
"""

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
from tfsdeploy.core.inventory.monitoring import Monitoring

REGISTRY = "registry.internal.example:5000"


def _rack(prefix: str, first_octet: int, gpus: list[Gpu]) -> list[Host]:
    return [Host(f"{prefix}{n:02d}", f"10.20.{first_octet}.{n}", gpus=gpus) for n in range(1, 9)]


hosts = (
    _rack("gpu-a", 1, [Gpu(0, 24576, "NVIDIA A10")])
    + _rack("gpu-b", 2, [Gpu(0, 16384, "NVIDIA T4")])
    + _rack("gpu-c", 3, [Gpu(0, 40960, "NVIDIA A100-40GB"), Gpu(1, 40960, "NVIDIA A100-40GB")])
    + [Host("prom-01", "10.20.9.1")]
)

groups = {
    "gpu_a": Group([h.name for h in hosts if h.name.startswith("gpu-a")],
                   vars={"gpu_safety_margin": 1.3}),
    "gpu_b": Group([h.name for h in hosts if h.name.startswith("gpu-b")]),
    "gpu_c": Group([h.name for h in hosts if h.name.startswith("gpu-c")],
                   vars={"gpu_headroom": 0.15}),
    # a canary host per group, rolled first by the playbooks' `serial: [1, ...]`
    "canaries": Group(["gpu-a01", "gpu-b01", "gpu-c01"]),
    "monitoring": Group(["prom-01"]),
}

defaults = {
    "ssh_user": "deploy",
    "ssh_port": 22,
    "data_root": "/srv/tfsdeploy",
    "image": f"{REGISTRY}/tensorflow/serving:2.21.0-gpu",
    "tfserving_version": "2.21.0",
    "proxy_image": f"{REGISTRY}/tfsdeploy-proxy:2.6",
    "docker_gpus": "all",
    "grpc_max_connection_age_ms": 300000,
}

models = [
    Model(
        name="resnet50",
        source="/srv/model-store/resnet50",
        hosts="gpu_a,gpu_c",
        signature=Signature(inputs={"input_1": TensorSpec("DT_FLOAT", (-1, 224, 224, 3))},
                            outputs={"predictions": TensorSpec("DT_FLOAT", (-1, 1000))}),
        memory_mib=3500,
        latency_slo_ms=100,
        # a reproducible starting point: batch 32, timeout kept below SLO/3
        batching=Batching(max_batch_size=32, batch_timeout_micros=20000, max_enqueued_batches=32,
                          num_batch_threads=1, allowed_batch_sizes=(8, 16, 32)),
        # clients keep 2 x max_batch_size in flight (session_bundle_config.proto's advice);
        # gRPC's thread quota holds grpc_max_threads - 1 of them
        expected_concurrency=64,
        threads=Threads(intra_op=8, inter_op=4, grpc_max_threads=72),
        warmup=Warmup(samples=500, p99_ms=100),
        rollout=Rollout(serial=(1, "25%", "100%"), max_fail_percentage=0, keep_releases=5,
                        min_healthy_s=30),
        labels={"stable": "release"},
    ),
    Model(
        name="ranker",
        source="/srv/model-store/ranker",
        port_offset=100,  # shares gpu_c hosts with resnet50: stable ports 8600/8601
        hosts="gpu_b,gpu_c",
        signature=Signature(inputs={"features": TensorSpec("DT_FLOAT", (-1, 256))},
                            outputs={"scores": TensorSpec("DT_FLOAT", (-1, 1))}),
        memory_mib=5000,
        latency_slo_ms=300,
        batching=Batching(max_batch_size=256, batch_timeout_micros=50000,
                          max_enqueued_batches=16, num_batch_threads=2,
                          allowed_batch_sizes=(64, 128, 256)),
        expected_concurrency=512,
        threads=Threads(intra_op=4, inter_op=2, grpc_max_threads=520),
        warmup=Warmup(samples=300, p99_ms=250),
        rollout=Rollout(serial=(2, "50%", "100%"), max_fail_percentage=10),
    ),
]

# Prometheus on the monitoring group reads /etc/prometheus/tfsdeploy/<model>.json (file_sd);
# the deploy machines run node_exporter with its textfile collector reading the cron jobs'
# --metrics-file (scripts/unattended/crontab.example), and cron runs the guard every 5 minutes
# and the rollback drill nightly.
monitoring = Monitoring(
    hosts="monitoring",
    targets_dir="/etc/prometheus/tfsdeploy",
    node_exporters=("deploy-01.internal.example:9100",),
    error_budget=0.001,  # 99.9% of requests answered within latency_slo_ms
    cron_periods={"guard": 300, "rollback": 86400},
)

