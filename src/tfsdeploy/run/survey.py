"""The read-only commands' pass over the hosts (status, history, lock, logs, exec, bench's data
version, the guard's look for a paused canary), over the engine's session (a run's, or
``engine.look``'s, which closes its connections): one connection per host, its facts read once,
a look taken at them. An unreachable host is shown as such, never skipped."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import host_paths
from tfsdeploy.core.target import Target
from tfsdeploy.hosts.facts import HostFacts, gather
from tfsdeploy.hosts.ssh import Connection
from tfsdeploy.run.jobs import Session

Look = Callable[[Target, ResolvedHost, Connection, HostFacts], dict[str, Any]]
MAX_AT_ONCE = 16


def visit(target: Target, host: ResolvedHost, look: Look, session: Session) -> dict[str, Any]:
    """``look`` at one host's facts, over the session's connection to it (left open: the
    session closes it): ``host``, ``address``, ``reachable`` and what the look found, or the
    ``error`` that made the host unreachable."""
    try:
        conn = session.connection(host)
        facts = gather(conn, target.model.name, host_paths(host, target.model))
        return {"host": host.name, "address": host.address, "reachable": True,
                **look(target, host, conn, facts)}
    except Exception as error:  # shown as such, never skipped
        return {"host": host.name, "address": host.address, "reachable": False,
                "error": f"{type(error).__name__}: {error}"}


def each_host(target: Target, look: Look, *, session: Session,
              hosts: tuple[ResolvedHost, ...] | None = None) -> list[dict[str, Any]]:
    """``look`` at every selected host (or ``hosts``) at once, in their order, over the
    engine's ``session`` (a run's or a look's)."""
    chosen = hosts or target.hosts
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_AT_ONCE, len(chosen)))) as pool:
        return list(pool.map(lambda h: visit(target, h, look, session), chosen))


# -- hosts outside the model's that still hold it ----------------------------------------------

def orphan_note(model: str, host: str) -> str:
    """What status, deploy and deploy --check say of a host that holds a model its inventory
    no longer places there."""
    return (f"no longer in the inventory for {model}: fab retire --model {model} "
            f"--hosts {host}")


def outside_hosts(target: Target) -> tuple[ResolvedHost, ...]:
    """The inventory's hosts that are neither the model's (its ``hosts`` pattern) nor
    selected: where an orphaned server of the model may still run."""
    known = {h.name for h in target.model_hosts} | {h.name for h in target.hosts}
    return tuple(h for h in target.inventory.hosts if h.name not in known)


def is_orphan(target: Target, host: ResolvedHost, facts: HostFacts) -> bool:
    """The host holds the model, which the inventory no longer places on it."""
    return facts.holds_model and host.name not in {h.name for h in target.model_hosts}


def _orphan_look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
                 ) -> dict[str, Any]:
    return {"orphan": is_orphan(target, host, facts)}


def orphans(target: Target, look: Look, *, session: Session) -> list[dict[str, Any]]:
    """``look``'s rows of the inventory's hosts outside the model's that still hold it (its
    row says ``orphan``; an unreachable host is not the model's host: left out); over the
    engine's ``session`` (a run's or a look's)."""
    outside = outside_hosts(target)
    if not outside:
        return []
    rows = each_host(target, look, hosts=outside, session=session)
    return [r for r in rows if r["reachable"] and r["orphan"]]


def orphan_notes(target: Target, session: Session) -> list[str]:
    """A deploy's note, over its session: one line per inventory host outside the model's
    that still holds it."""
    return [f"{r['host']}: {orphan_note(target.model.name, r['host'])}"
            for r in orphans(target, _orphan_look, session=session)]
