"""`fab status` and `fab history`: what runs where, and what happened (read-only)."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tfsdeploy import lock
from tfsdeploy.catalog import Model
from tfsdeploy.inventory import Inventory, ResolvedHost, load_inventory
from tfsdeploy.layout import host_paths, model_ports
from tfsdeploy.remote import Runner, SshRunner
from tfsdeploy.render import placements, render_host
from tfsdeploy.state import discover, parse_json_stream, read_releases


@dataclass(frozen=True)
class FleetRequest:
    """Which model and hosts to look at."""

    model: str
    inventory: str | None = None
    hosts: str | None = None
    limit: str | None = None


def _each_host(request: FleetRequest, look: Any) -> tuple[Inventory, Model, list[dict[str, Any]]]:
    inventory = load_inventory(request.inventory)
    model = inventory.model(request.model)
    hosts = inventory.select(request.hosts, limit=request.limit, model=model)

    def one(host: ResolvedHost) -> dict[str, Any]:
        runner = SshRunner(host)
        try:
            return {"host": host.name, "address": host.address, "reachable": True,
                    **look(inventory, model, host, runner)}
        except Exception as error:  # shown as such, never skipped
            return {"host": host.name, "address": host.address, "reachable": False,
                    "error": f"{type(error).__name__}: {error}"}
        finally:
            runner.close()

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return inventory, model, list(pool.map(one, hosts))


def _versions(host: ResolvedHost, model: Model, slot_port: int) -> list[dict[str, Any]]:
    from tfsdeploy.probes import SlotClient

    client = SlotClient(host.address, slot_port, model.name)
    try:
        return [{"version": s.version, "state": s.state, "error": s.error_message}
                for s in client.status(timeout=3)]
    except Exception as error:
        return [{"error": f"{type(error).__name__}"}]
    finally:
        client.close()


def drift(inventory: Inventory, model: Model, host: ResolvedHost, runner: Runner,
          current: dict[str, Any]) -> list[str]:
    """Files whose live content differs from what the inventory renders now."""
    placed = placements(inventory)
    render = render_host(host, model, int(current["version"]),
                         co_located=[inventory.models[m] for m, on in placed.items()
                                     if host.name in on])
    changed = []
    for rendered in render.files:
        live = runner.run(["cat", f"{host_paths(host, model).current}/{rendered.name}"])
        if not live.ok or hashlib.sha256(live.stdout.encode()).digest() != \
                hashlib.sha256(rendered.text.encode()).digest():
            changed.append(rendered.name)
    return changed


def host_status(inventory: Inventory, model: Model, host: ResolvedHost, runner: Runner
                ) -> dict[str, Any]:
    """Live release, slots, traffic, version states, drift and the lock, on one host."""
    ports = model_ports(host, model)
    paths = host_paths(host, model)
    state = discover(runner, model.name, paths, ports.admin)
    slots: dict[str, Any] = {}
    for slot in ports.slots:
        slots[slot] = [{"release": c.release, "version": c.version, "running": c.running,
                        "status": c.status,
                        "versions": _versions(host, model, ports.slot_grpc(slot))
                        if c.running else []}
                       for c in state.in_slot(slot)]
    current = state.current or {}
    holder = lock.read_lock(runner, paths.lock_dir)
    return {"current": current.get("id"), "version": current.get("version"),
            "image": current.get("image"), "traffic_slot": state.traffic_slot,
            "proxy_running": state.proxy_running, "slots": slots,
            "drift": drift(inventory, model, host, runner, current) if current else [],
            "lock": holder.describe() + (" (STALE)" if lock.is_stale(holder) else "")
            if holder else None}


def status(request: FleetRequest) -> list[dict[str, Any]]:
    """`fab status`: one entry per selected host, unreachable ones included."""
    return _each_host(request, host_status)[2]


def host_history(inventory: Inventory, model: Model, host: ResolvedHost, runner: Runner,
                 lines: int = 50) -> dict[str, Any]:
    """Retained releases with results and step durations, and the audit log's tail."""
    paths = host_paths(host, model)
    releases = []
    for record in read_releases(runner, paths):
        steps = record.get("steps") or []
        releases.append({"id": record.get("id"), "version": record.get("version"),
                         "status": record.get("status"), "slot": record.get("slot"),
                         "by": record.get("deployed_by"), "at": record.get("updated_at"),
                         "seconds": round(sum(s.get("seconds", 0) for s in steps), 1),
                         "gates": {g["gate"]: g["seconds"] for g in record.get("gates") or []}})
    audit = runner.run(["tail", "-n", str(lines), paths.audit_log])
    return {"releases": releases,
            "audit": parse_json_stream(audit.stdout) if audit.ok else []}


def history(request: FleetRequest) -> list[dict[str, Any]]:
    """`fab history`: per host."""
    return _each_host(request, host_history)[2]
