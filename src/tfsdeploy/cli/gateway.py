"""`fab gateway [--check] [--diff]`: the gateway hosts' HAProxy rendered from the inventory and
rolled host by host (run/gateway.py)."""

from __future__ import annotations

import sys

from tfsdeploy.core.inventory.load import load_inventory
from tfsdeploy.core.render.gateway_proxy import plan_gateway


def cmd_gateway(inventory: str | None, *, check: bool, diff: bool) -> int:
    """Plan (every value checked when the inventory loads), then roll or only look."""
    from tfsdeploy.run.gateway import roll_gateway

    plan = plan_gateway(load_inventory(inventory))
    hosts = ", ".join(h.name for h in plan.hosts)
    routes = ", ".join(r.model for r in plan.routes)
    print(f"gateway: {len(plan.hosts)} host(s) ({hosts}), routing {routes}", flush=True)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = roll_gateway(plan, say=say, check=check or diff, diff=diff)
    for host, text in result.diffs.items():
        print(text or f"{host}: no difference")
    for host, what in result.hosts.items():
        print(f"  {host}: {what}")
    return int(result.exit_code)
