"""`fab status`, `fab history` and `fab lock`: what runs where, what happened, who holds the
lock. Read-only (but `fab lock --break`), from each host's facts."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfsdeploy import lock as locks
from tfsdeploy.engine import ConnectionFactory
from tfsdeploy.facts import HostFacts, gather
from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.layout import host_paths, model_ports
from tfsdeploy.records import parse_audit
from tfsdeploy.remote import Connection, SshConnection
from tfsdeploy.render import placements, render_host
from tfsdeploy.target import Target

Look = Callable[[Target, ResolvedHost, Connection, HostFacts], dict[str, Any]]


def each_host(target: Target, look: Look, *, hosts: tuple[ResolvedHost, ...] | None = None,
              connect: ConnectionFactory = SshConnection) -> list[dict[str, Any]]:
    """``look`` at every host's facts at once; an unreachable host is shown as such."""
    def one(host: ResolvedHost) -> dict[str, Any]:
        conn = connect(host)
        try:
            facts = gather(conn, target.model.name, host_paths(host, target.model))
            return {"host": host.name, "address": host.address, "reachable": True,
                    **look(target, host, conn, facts)}
        except Exception as error:  # shown as such, never skipped
            return {"host": host.name, "address": host.address, "reachable": False,
                    "error": f"{type(error).__name__}: {error}"}
        finally:
            conn.close()

    chosen = hosts or target.hosts
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(chosen)))) as pool:
        return list(pool.map(one, chosen))


def _versions(host: ResolvedHost, model: str, port: int) -> list[dict[str, Any]]:
    from tfsdeploy.probes import SlotClient

    client = SlotClient(host.address, port, model)
    try:
        return [{"version": s.version, "state": s.state, "error": s.error_message}
                for s in client.status(timeout=3)]
    except Exception as error:
        return [{"error": f"{type(error).__name__}"}]
    finally:
        client.close()


def drift(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
          ) -> list[str]:
    """Files whose live content (``current``'s files) differs from what the inventory renders
    now for the live version."""
    record = facts.record(facts.current)
    if record is None:
        return []
    inventory = target.inventory
    placed = placements(inventory)
    render = render_host(host, target.model, record.version,
                         co_located=[inventory.models[m] for m, on in placed.items()
                                     if host.name in on])
    return [r.name for r in render.files
            if facts.live_files.get(r.name) != hashlib.sha256(r.text.encode()).hexdigest()]


def host_status(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
                ) -> dict[str, Any]:
    """Live release, slots, traffic, version states, drift and the lock, on one host."""
    ports = model_ports(host, target.model)
    serving = facts.serving_release
    record = facts.record(serving or facts.current)
    gpus = {i.index: list(i.gpus) for i in record.instances} if record else {}
    indexes = sorted({c.instance for c in facts.servers} | set(gpus)) or [0]

    def slots_of(instance: int) -> dict[str, Any]:
        return {slot: [{"release": c.release, "version": c.version, "running": c.running,
                        "status": c.status,
                        "versions": _versions(host, target.model.name,
                                              ports.slot_grpc(slot, instance))
                        if c.running else []}
                       for c in facts.in_slot(slot, instance)]
                for slot in ports.slots}

    instances = [{"instance": k, "gpus": gpus.get(k, []),
                  "traffic_slot": facts.proxy.serving_slot(k), "slots": slots_of(k)}
                 for k in indexes]
    first = next((i for i in instances if i["instance"] == 0), instances[0])
    holder = facts.lock
    return {"current": serving or facts.current, "recorded_current": facts.current,
            "version": record.version if record else None,
            "image": record.image if record else None,
            "traffic_slot": first["traffic_slot"], "proxy_running": facts.proxy.running,
            "slots": first["slots"], "instances": instances,
            "drift": drift(target, host, conn, facts),
            "broken_records": [b.model_dump() for b in facts.broken],
            "lock": (holder.describe() + (" (STALE)" if locks.is_stale(holder) else "")
                     if holder else "unreadable lock record" if facts.lock_present else None)}


def status(target: Target, *, connect: ConnectionFactory = SshConnection
           ) -> list[dict[str, Any]]:
    """`fab status`: one entry per selected host, unreachable ones included."""
    return each_host(target, host_status, connect=connect)


def host_history(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts,
                 lines: int = 50) -> dict[str, Any]:
    """Retained releases with results and step durations, and the audit log's tail."""
    releases = [{"id": r.id, "version": r.version, "status": r.status.value, "slot": r.slot,
                 "by": r.deployed_by, "at": r.updated_at,
                 "seconds": round(sum(s.seconds for s in r.steps), 1),
                 "gates": {g.gate: g.seconds for g in r.gates}} for r in facts.releases]
    audit = conn.run(["tail", "-n", str(lines), host_paths(host, target.model).audit_log])
    entries = parse_audit(audit.stdout) if audit.ok else []
    return {"releases": releases, "broken_records": [b.model_dump() for b in facts.broken],
            "audit": [e.model_dump() for e in entries]}


def history(target: Target, *, connect: ConnectionFactory = SshConnection
            ) -> list[dict[str, Any]]:
    """`fab history`: per host."""
    return each_host(target, host_history, connect=connect)


def lock_state(target: Target, *, breaking: bool = False,
               connect: ConnectionFactory = SshConnection) -> tuple[list[str], str]:
    """`fab lock`: each host's part of the model's lock (every host of the model, whatever
    --hosts selects), and the verdict; with ``breaking`` each part is removed, for the token
    that was read there (a lock taken meanwhile is left alone and reported)."""
    def look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
             ) -> dict[str, Any]:
        holder, present = facts.lock, facts.lock_present
        line = "free" if not present else (
            holder.describe() + (" STALE: that process is gone" if locks.is_stale(holder)
                                 else "") if holder else "a lock with an unreadable record")
        if breaking and present:
            site = locks.LockSite(host.name, conn, host_paths(host, target.model))
            removed, now = locks.remove(site, holder.token if holder else "",
                                        facts.lock_digest)
            line = f"broken, was {line}" if removed else (
                f"NOT broken: it changed meanwhile, now {now.describe() if now else '?'}")
        return {"line": line, "held": present}

    rows = each_host(target, look, hosts=target.model_hosts, connect=connect)
    lines = [f"{r['host']}: {r['line']}" if r["reachable"] else
             f"{r['host']}: unreachable ({r['error']})" for r in rows]
    held = sum(1 for r in rows if r.get("held"))
    verdict = "broken" if breaking else (
        "locked" if held * 2 > len(rows) else "partly locked" if held else "free")
    return lines, f"{target.model.name}: {verdict} ({held} of {len(rows)} hosts hold a " \
                  "lock record)"


def serving_containers(facts: HostFacts, *, every: bool = False) -> list[tuple[str, str]]:
    """(label, container) of the host's serving containers (every model container with
    ``every``); the label names the instance when the host runs several."""
    chosen = [c for c in facts.servers if c.running or every]
    if not every:
        live = {c.name for i in {c.instance for c in chosen}
                if (c := facts.serving(i)) is not None}
        chosen = [c for c in chosen if c.name in live] or chosen
    several = len({c.instance for c in chosen}) > 1
    return [(f"{facts.host}/i{c.instance}" if several else facts.host, c.name)
            for c in sorted(chosen, key=lambda c: (c.instance, c.name))]


def logs(target: Target, *, lines: int, since: str | None, follow: bool,
         out: Callable[[str], None], connect: ConnectionFactory = SshConnection) -> int:
    """`fab logs`: the serving containers' log lines from every selected host, each prefixed
    with its host (and instance), merged in time order (as they come with ``follow``)."""
    import queue
    import threading

    found: queue.Queue[tuple[str, str] | None] = queue.Queue()
    failed: list[str] = []

    def read(host: ResolvedHost) -> None:
        conn = connect(host)
        try:
            facts = gather(conn, target.model.name, host_paths(host, target.model))
            for label, name in serving_containers(facts):
                for line in conn.docker.log_lines(name, lines=lines, since=since,
                                                  follow=follow):
                    found.put((line, label))
        except Exception as error:
            failed.append(host.name)
            found.put((f"~ unreachable: {type(error).__name__}: {error}", host.name))
        finally:
            conn.close()
            found.put(None)

    threads = [threading.Thread(target=read, args=(h,), daemon=True) for h in target.hosts]
    for thread in threads:
        thread.start()
    pending, collected = len(threads), []
    while pending:
        item = found.get()
        if item is None:
            pending -= 1
            continue
        if follow:
            out(_log_line(*item))
        else:
            collected.append(item)
    for item in sorted(collected):  # RFC 3339 time stamps sort as text
        out(_log_line(*item))
    return 3 if failed else 0


def _log_line(line: str, label: str) -> str:
    stamp, _, text = line.partition(" ")
    return f"{stamp} {label:<8} {text}"


def exec_in(target: Target, argv: list[str], *, force: bool, out: Callable[[str], None],
            connect: ConnectionFactory = SshConnection) -> int:
    """`fab exec`: run ``argv`` in every selected host's serving containers; output prefixed,
    a summary of exit codes. Refused while a run holds the model's lock, unless ``force``."""
    from tfsdeploy.errors import ConfigError, ExitCode, Problem

    if not argv:
        raise ConfigError(Problem("no command given", fix="fab exec --model M -- CMD ARG ...",
                                  field="--"))

    def run(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
            ) -> dict[str, Any]:
        if facts.lock_present and not force:
            return {"refused": f"a run holds the lock of {target.model.name} "
                               f"({facts.lock.describe() if facts.lock else 'unreadable'})"}
        results = []
        for label, name in serving_containers(facts):
            code, text = conn.docker.exec(name, argv)
            results.append({"label": label, "container": name, "code": code, "output": text})
        return {"results": results}

    rows = each_host(target, run, connect=connect)
    codes = []
    for row in rows:
        if not row["reachable"]:
            out(f"{row['host']}: UNREACHABLE ({row['error']})")
            continue
        if "refused" in row:
            out(f"{row['host']}: refused: {row['refused']} (--force to run anyway)")
            continue
        for result in row["results"]:
            for line in result["output"].splitlines():
                out(f"{result['label']:<8} {line}")
            codes.append((result["label"], result["code"]))
    out("exit codes: " + (", ".join(f"{label} {code}" for label, code in codes) or "none"))
    if any("refused" in r for r in rows):
        return int(ExitCode.INVALID)
    unreachable = any(not r["reachable"] for r in rows)
    return 3 if unreachable or any(code != 0 for _, code in codes) else 0
