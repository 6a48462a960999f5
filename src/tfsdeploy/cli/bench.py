"""`fab bench`: the project's load generator against the selected hosts' stable gRPC ports,
with the model's warmup records as request data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfsdeploy.gpu import instance_gpus
from tfsdeploy.layout import model_ports
from tfsdeploy.target import Target
from tfsdeploy.versions import choose_version

PATHS = ("report", "sweep_plot")
PASSED_WHEN_GIVEN = ("rps", "procs", "min_qps", *PATHS)


def bench(target: Target, args: dict[str, Any]) -> int:
    """Run the load test with the command's (already typed) options; returns its exit code."""
    from tfsdeploy.loadtest.cli import run_bench

    model = target.model
    version = choose_version(model, args.get("version"), target.inventory.path)
    addresses = [f"{h.address}:{model_ports(h, model).grpc}" for h in target.hosts]
    # each stable port fronts the host's instances (one per GPU): the per-instance figure
    # divides by all of them
    instances = sum(len(instance_gpus(h, model)) for h in target.hosts)
    options: dict[str, Any] = {
        "model": model.name, "data_from_warmup": Path(model.source) / str(version),
        "duration": args["duration"], "concurrency": int(args["concurrency"]),
        "slo_p99": args["slo_p99"] or model.latency_slo_ms,
        "max_error_rate": args["max_error_rate"], "sweep": bool(args["sweep"]),
        "instances": instances}
    for key in PASSED_WHEN_GIVEN:
        if args.get(key) is not None:
            options[key] = Path(str(args[key])) if key in PATHS else args[key]
    return run_bench(addresses, **options)
