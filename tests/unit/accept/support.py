"""Test inventories and plans for the acceptance-run unit tests (pure, no host touched)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.accept.merge import OK, GeneratorOutcome
from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.accept.plan import AcceptPlan, build_plan
from tfsdeploy.core.inventory.catalog import Model, Signature, TensorSpec
from tfsdeploy.core.inventory.fleet import Group, Host
from tfsdeploy.core.inventory.load import Inventory, build_inventory
from tfsdeploy.loadtest import stats


def model_source(root: Path, versions: tuple[int, ...] = (1, 2)) -> Path:
    """A model source with empty numeric version directories (enough for planning)."""
    source = root / "source"
    for version in versions:
        (source / str(version)).mkdir(parents=True, exist_ok=True)
    return source


def inventory(source: Path, *, slo_ms: float = 50.0, port_offset: int = 0,
              hosts: dict[str, str] | None = None, grpc_port: int | None = None) -> Inventory:
    """Three serving hosts and a ``loadgens`` group of two of them."""
    hosts = hosts or {"tb1": "10.87.0.11", "tb2": "10.87.0.12", "tb3": "10.87.0.13"}
    host_vars = {"grpc_port": grpc_port} if grpc_port is not None else {}
    return build_inventory(
        "test-inventory.py",
        hosts=[Host(name, address, vars=host_vars) for name, address in hosts.items()],
        groups={"loadgens": Group(list(hosts)[:2])}, defaults={},
        models=[Model(name="m", source=str(source), port_offset=port_offset,
                      signature=Signature(inputs={"x": TensorSpec("DT_FLOAT", (-1, 1))},
                                          outputs={"y": TensorSpec("DT_FLOAT", (-1, 1))}),
                      memory_mib=512, latency_slo_ms=slo_ms)])


def plan(tmp: Path, **options: object) -> AcceptPlan:
    """A validated plan for model ``m`` over ``inventory``."""
    inv = inventory(model_source(tmp))
    return build_plan(AcceptOptions(model="m", **options), inv)  # type: ignore[arg-type]


# -- results as the generators return them ------------------------------------------------

S = 1_000_000_000
Request = tuple[int, int, bool]  # (completion ns after the common start, latency ns, ok?)


def proc_result(requests: list[Request], *, origin_ns: int = 0, cpu_s: float = 0.2,
                late: int = 0, own_late: int = 0) -> stats.ProcResult:
    """One generator process's result, recorded the way the engine records it; ``late``
    requests sent late for want of a free worker, ``own_late`` by the client's own lag."""
    rec = stats.Recorder(keep_service_time=False, intervals=True)
    rec.origin_ns = origin_ns
    for done, latency, ok in sorted(requests):
        if ok:
            rec.record_ok(latency, origin_ns + done)
        else:
            rec.record_error(latency, origin_ns + done, "Unavailable", "rpc error: x")
    return stats.finish(rec, start_ns=origin_ns, end_ns=origin_ns + 10 * S, cpu_user_s=cpu_s,
                        cpu_system_s=0.0, end_reason="timeout",
                        late_sends=late + own_late, own_late_sends=own_late,
                        max_send_lag_ns=25_000_000 if own_late else 0)


def outcome(name: str, results: list[stats.ProcResult]) -> GeneratorOutcome:
    """A generator that returned ``results``."""
    return GeneratorOutcome(name, 100.0, OK, results=results, procs=len(results))
