"""`fab status`, `fab history` and `fab lock`: what runs where, what happened, who holds the
lock. Read-only (but `fab lock --break`), from each host's facts."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfsdeploy.core.canary.steps import CanaryState
from tfsdeploy.core.errors import ConfigError, ExitCode, Problem
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.layout import host_paths, model_ports
from tfsdeploy.core.render.files import HostRender, placements, render_host
from tfsdeploy.core.rollout.records import LockRecord, parse_audit
from tfsdeploy.core.target import Target
from tfsdeploy.core.timetext import SINCE_FIX, since_seconds
from tfsdeploy.hosts import lock as locks
from tfsdeploy.hosts import scratch
from tfsdeploy.hosts.commands.files import tail
from tfsdeploy.hosts.dockerapi import ContainerFact
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.hosts.probes import SlotClient
from tfsdeploy.hosts.ssh import Connection, ConnectionFactory, SshConnection
from tfsdeploy.run import engine, plans, survey
from tfsdeploy.run.gpu_views import add_gpu_memory
from tfsdeploy.run.jobs import Session


def _versions(host: ResolvedHost, model: str, port: int) -> list[dict[str, Any]]:
    client = SlotClient(host.address, port, model)
    try:
        return [{"version": s.version, "state": s.state, "error": s.error_message}
                for s in client.status(timeout=3)]
    except Exception as error:
        return [{"error": f"{type(error).__name__}"}]
    finally:
        client.close()


def live_render(target: Target, host: ResolvedHost, facts: HostFacts) -> HostRender | None:
    """What the inventory renders now for the host's live version (None: nothing live)."""
    record = facts.record(facts.current)
    if record is None:
        return None
    inventory = target.inventory
    placed = placements(inventory)
    return render_host(host, target.model, record.version,
                       co_located=[inventory.models[m] for m, on in placed.items()
                                   if host.name in on])


def drift(render: HostRender | None, facts: HostFacts) -> list[str]:
    """Files whose live content (``current``'s files) differs from what the inventory renders
    now for the live version."""
    if render is None:
        return []
    return [r.name for r in render.files
            if facts.live_files.get(r.name) != hashlib.sha256(r.text.encode()).hexdigest()]


def instance_drift(render: HostRender | None, facts: HostFacts, model: str
                   ) -> tuple[list[str], list[int]]:
    """Instances the plan has that do not serve (down: their server fails the proxy's health
    check or their container is gone; their GPU absent) and instances that run without being
    planned, each with the fix; and the planned instances that are down."""
    if render is None:
        return [], []
    planned = {i.index: i.gpus for i in render.instances}
    present = {g.index for g in facts.gpus}
    fix = f"fix: fab deploy --model {model}"
    notes, down = [], []
    for index, gpus in sorted(planned.items()):
        if facts.serving(index) is not None or facts.taking_requests(index):
            continue  # one slot serves, or two share its requests (a canary)
        dead = facts.down(index)
        absent = [g for g in gpus if g not in present]
        why = (f"GPU {', '.join(map(str, absent))} absent" if absent and facts.gpus else
               f"{dead.name} {dead.state}, failing its health check" if dead else
               "not running")
        notes.append(f"i{index} planned, down ({why}); {fix}")
        down.append(index)
    running = {c.instance for c in facts.servers if c.running}
    proxied = {s.instance for s in facts.proxy.servers if s.takes_new_requests}
    for index in sorted((running | proxied) - set(planned)):
        notes.append(f"i{index} runs, not planned; {fix}")
    return notes, down


def traffic_shares(facts: HostFacts, instance: int = 0) -> dict[str, int]:
    """Slot -> percent of the instance's new requests, as the proxy says (empty: it does not
    answer or no slot takes requests); two slots while a canary shares them."""
    weights = facts.proxy.weights(instance) if facts.proxy.answered else {}
    total = sum(weights.values())
    return {slot: round(w * 100 / total) for slot, w in sorted(weights.items())} if total else {}


def canary_on(facts: HostFacts) -> dict[str, str] | None:
    """The canary the host's records say is under way (running, paused, promoting, aborting):
    its release and state; or ``interrupted`` when the proxy shares the traffic with a newer
    release that records no canary (a canary run killed at a split weight: `fab abort` undoes
    it, `fab promote` finishes it); None when there is none."""
    open_states = {CanaryState.RUNNING, CanaryState.PAUSED, CanaryState.PROMOTING,
                   CanaryState.ABORTING}
    found = [(r.id, str((r.canary or {}).get("state"))) for r in facts.releases
             if str((r.canary or {}).get("state")) in open_states]
    split = plans.interrupted_canary({facts.host: facts})
    if split is not None and (not found or split[0].id > max(found)[0]):
        # a run that holds the lock and whose process may live is still in its steps
        holder = facts.lock
        live = holder is not None and not holder.paused and not locks.is_stale(holder)
        return {"release": split[0].id, "state": "running" if live else "interrupted"}
    if not found:
        return None
    release, state = max(found)
    return {"release": release, "state": state}


def orphans(target: Target, *, session: Session) -> list[dict[str, Any]]:
    """Status rows of the hosts outside the model's that still hold it, read over the
    engine's ``session``."""
    return survey.orphans(target, host_status, session=session)


def host_status(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
                ) -> dict[str, Any]:
    """Live release, slots, traffic, version states, drift and the lock, on one host; an
    orphan (the inventory no longer places the model here) is named so."""
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
                  "traffic_slot": facts.proxy.serving_slot(k),
                  "traffic": traffic_shares(facts, k), "slots": slots_of(k)}
                 for k in indexes]
    first = next((i for i in instances if i["instance"] == 0), instances[0])
    holder = facts.lock
    orphan = survey.is_orphan(target, host, facts)
    render = live_render(target, host, facts)
    shape, down = instance_drift(render, facts, target.model.name)
    row = {"orphan": orphan,
           "note": survey.orphan_note(target.model.name, host.name) if orphan else "",
           "current": serving or facts.current, "recorded_current": facts.current,
           "version": record.version if record else None,
           "image": record.image if record else None,
           "traffic_slot": first["traffic_slot"], "proxy_running": facts.proxy.running,
           "slots": first["slots"], "instances": instances,
           "canary": canary_on(facts), "drift": drift(render, facts),
           "instance_drift": shape, "down": down,
           "broken_records": [b.model_dump() for b in facts.broken],
           "lock": (holder.describe() + (" (STALE)" if locks.is_stale(holder) else "")
                    if holder else "unreadable lock record" if facts.lock_present else None)}
    return add_gpu_memory(row, conn, facts, record)


def scratch_rows(model: str, facts: HostFacts) -> list[dict[str, Any]]:
    """The model's `fab tune` scratch instances on the host: a running tune's, or left by a
    killed one (the next deploy, rollback, prune or retire removes those)."""
    return [{"name": f.name, "state": f.state, "gpus": f.gpus,
             "left": scratch.owner(facts, f) is None, "note": scratch.whose(facts, f, model)}
            for f in facts.scratch if f.model == model]


def _host_status_and_scratch(target: Target, host: ResolvedHost, conn: Connection,
                             facts: HostFacts) -> dict[str, Any]:
    return {**host_status(target, host, conn, facts),
            "scratch": scratch_rows(target.model.name, facts)}


def status(target: Target, *, connect: ConnectionFactory = SshConnection,
           with_orphans: bool = False) -> list[dict[str, Any]]:
    """`fab status`: one entry per selected host, unreachable ones included, with the model's
    `fab tune` scratch instances there; with ``with_orphans``, then the inventory's other
    hosts that still hold the model."""
    def read(session: Session) -> list[dict[str, Any]]:
        rows = survey.each_host(target, _host_status_and_scratch, session=session)
        return rows + (orphans(target, session=session) if with_orphans else [])

    return engine.look(target, read, connect=connect)


def gateway_drift(target: Target, *, connect: ConnectionFactory = SshConnection) -> list[str]:
    """`fab status`'s gateway lines: one per gateway host routing the model whose
    configuration no longer matches the inventory, read on the engine's look (its deadline,
    Ctrl-C, SIGTERM, SIGHUP); nothing when no gateway routes the model."""
    from tfsdeploy.run.gateway import drift_notes

    return engine.look(target, lambda session: drift_notes(
        target.inventory, target.model.name, session=session), connect=connect)


def host_history(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts,
                 lines: int = 50) -> dict[str, Any]:
    """Retained releases with results, step durations and a failed one's diagnosis (cause
    and fix), and the audit log's tail."""
    releases = [{"id": r.id, "version": r.version, "status": r.status.value, "slot": r.slot,
                 "by": r.deployed_by, "at": r.updated_at,
                 "seconds": round(sum(s.seconds for s in r.steps), 1),
                 "gates": {g.gate: g.seconds for g in r.gates},
                 "diagnosis": r.diagnosis} for r in facts.releases]
    audit = conn.run(tail(host_paths(host, target.model).audit_log, lines))
    entries = parse_audit(audit.stdout) if audit.ok else []
    return {"releases": releases, "broken_records": [b.model_dump() for b in facts.broken],
            "audit": [e.model_dump() for e in entries]}


def history(target: Target, *, connect: ConnectionFactory = SshConnection
            ) -> list[dict[str, Any]]:
    """`fab history`: per host."""
    return engine.look(target, lambda session: survey.each_host(
        target, host_history, session=session), connect=connect)


def lock_line(holder: LockRecord | None, present: bool) -> str:
    """One host's part of the lock, for people (STALE and why, when provably so)."""
    if not present:
        return "free"
    if holder is None:
        return "a lock with an unreadable record (a killed acquisition leaves an empty one)"
    why = locks.stale_reason(holder)
    return holder.describe() + (f" STALE: {why}" if why else "")


def lock_state(target: Target, *, breaking: bool = False,
               connect: ConnectionFactory = SshConnection) -> tuple[list[str], str]:
    """`fab lock`: each host's part of the model's lock (every host of the model, whatever
    --hosts selects), and the verdict; with ``breaking`` each part is removed, for the token
    that was read there (a lock taken meanwhile is left alone and reported). A paused
    canary's part is broken only when every host of the model answers and none keeps that
    canary open (`plans.canary_open`): a part left by a finished canary."""
    open_on: dict[str, list[str]] = {}

    def read(session: Session) -> list[dict[str, Any]]:
        if breaking:
            seen = survey.each_host(target, lambda t, h, c, f: {"facts": f},
                                    hosts=target.model_hosts, session=session)
            facts = {r["host"]: r["facts"] for r in seen if r["reachable"]}
            everywhere = len(facts) == len(seen)
            for release in {f.lock.paused for f in facts.values() if f.lock and f.lock.paused}:
                open_on[release] = (plans.canary_open(facts, release) if everywhere
                                    else ["an unreachable host"])
        return survey.each_host(target, look, hosts=target.model_hosts, session=session)

    def look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
             ) -> dict[str, Any]:
        holder, present = facts.lock, facts.lock_present
        line = lock_line(holder, present)
        if breaking and holder is not None and open_on.get(holder.paused):
            # the canary's release holds it on purpose: breaking it would leave the canary
            # hosts half on the new release with nothing to finish them
            line = (f"NOT broken: {line}; the canary is open on "
                    f"{', '.join(open_on[holder.paused])}: finish it with `fab promote "
                    f"--model {target.model.name}` or `fab abort --model {target.model.name}`")
        elif breaking and present:
            site = locks.LockSite(host.name, conn, host_paths(host, target.model))
            removed, now = locks.remove(site, holder.token if holder else "",
                                        facts.lock_digest)
            line = f"broken, was {line}" if removed else (
                f"NOT broken: it changed meanwhile, now {now.describe() if now else '?'}")
        return {"line": line, "held": present}

    rows = engine.look(target, read, connect=connect)
    lines = [f"{r['host']}: {r['line']}" if r["reachable"] else
             f"{r['host']}: unreachable ({r['error']})" for r in rows]
    held = sum(1 for r in rows if r.get("held"))
    kept = any("NOT broken" in r.get("line", "") for r in rows)
    verdict = ("not broken" if kept else "broken") if breaking else (
        "locked" if held * 2 > len(rows) else "partly locked" if held else "free")
    return lines, f"{target.model.name}: {verdict} ({held} of {len(rows)} hosts hold a " \
                  "lock record)"


@dataclass(frozen=True)
class Served:
    """One container that takes a host's requests, as the fleet commands name it."""

    label: str  # host, then /i<k> when the host runs several instances, then /<slot> when
    # two slots of that instance take requests (a canary)
    container: str
    release: str
    version: int
    slot: str
    share: int | None  # percent of its instance's new requests; None: the proxy did not say

    @property
    def split(self) -> bool:
        """Whether this container shares its instance's requests with another slot."""
        return self.share is not None and self.share < 100


def serving_containers(facts: HostFacts) -> list[Served]:
    """The host's containers that take requests: per instance the proxy's ready slot, or
    both slots of a canary with their shares of the requests; where the proxy does not
    answer, the running container of the recorded ``current`` (every running server when
    none is found)."""
    answered = facts.proxy.running and facts.proxy.answered
    picked: list[tuple[ContainerFact, int | None]] = []
    for instance in sorted({c.instance for c in facts.servers if c.running}):
        if answered:
            picked += _shares(facts.taking_requests(instance), facts.proxy.weights(instance))
        elif (live := facts.serving(instance)) is not None:
            picked.append((live, None))
    if not picked:
        picked = [(c, None) for c in facts.servers if c.running]
    several = len({c.instance for c, _ in picked}) > 1
    split = {i for i in {c.instance for c, _ in picked}
             if sum(1 for c, _ in picked if c.instance == i) > 1}
    return [Served(label=facts.host + (f"/i{c.instance}" if several else "")
                   + (f"/{c.slot}" if c.instance in split else ""),
                   container=c.name, release=c.release, version=c.version, slot=c.slot,
                   share=share)
            for c, share in sorted(picked, key=lambda p: (p[0].instance, p[0].slot,
                                                          p[0].name))]


def _shares(taking: list[ContainerFact], weights: dict[str, int]
            ) -> list[tuple[ContainerFact, int | None]]:
    """Each container with its percent of the instance's new requests (HAProxy sends a
    server weight / sum of the ready servers' weights of them)."""
    total = sum(weights.get(c.slot, 0) for c in taking)
    return [(c, round(weights.get(c.slot, 0) * 100 / total) if total else None)
            for c in taking]


def since_timestamp(text: str, now: float) -> float:
    """``since_seconds``, its refusal a ConfigError naming the option and the fix."""
    try:
        return since_seconds(text, now)
    except ValueError as error:
        raise ConfigError(Problem(f"--since {text!r} {error}", fix=SINCE_FIX,
                                  field="--since")) from None


def logs(target: Target, *, lines: int, since: str | None, follow: bool,
         out: Callable[[str], None], connect: ConnectionFactory = SshConnection,
         now: Callable[[], float] = time.time) -> int:
    """`fab logs`: the log lines of every selected host's serving containers (both slots of
    a canary, every instance) and of its proxy (servers going down or up, each failed
    request), each prefixed host[/instance][/slot] or host/proxy, merged in time order; with
    ``follow``, every container at once, lines printed as they come, until Ctrl-C.
    ``since`` is checked before any host is contacted."""
    after = since_timestamp(since, now()) if since is not None else None
    found: queue.Queue[tuple[str, str] | None] = queue.Queue()
    stopping = threading.Event()
    failed: list[str] = []

    def look(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
             ) -> dict[str, Any]:
        return {"errors": _read_each(conn, logged_containers(facts), lines=lines,
                                     since=after, follow=follow, put=found.put,
                                     stopping=stopping)}

    def read(session: Session) -> list[tuple[str, str]]:
        def one(host: ResolvedHost) -> None:
            row = survey.visit(target, host, look, session)
            errors = row["errors"] if row["reachable"] else [(host.name, row["error"])]
            # after Ctrl-C (or the look's end), a stream its close cut is no failure
            if not (stopping.is_set() or session.ended.is_set()):
                for label, problem in errors:
                    failed.append(label)
                    found.put((f"~ unreachable: {problem}", label))
            found.put(None)

        # daemon threads: a followed stream never ends; the look's end closes its connection
        for host in target.hosts:
            threading.Thread(target=one, args=(host,), daemon=True).start()
        return _drain(found, len(target.hosts), out if follow else None)

    # the engine's look: its connections, its signals; a followed read has no deadline and
    # ends at Ctrl-C, its normal end
    try:
        collected = engine.look(target, read, connect=connect,
                                deadline_s=None if follow else engine.LOOK_DEADLINE_S)
    except engine.LookStopped as stop:
        stopping.set()
        if follow and stop.signal_name == "SIGINT":
            return 3 if failed else 0
        raise
    for item in sorted(collected):  # RFC 3339 time stamps sort as text
        out(_log_line(*item))
    return 3 if failed else 0


def logged_containers(facts: HostFacts) -> list[tuple[str, str]]:
    """(label, container) of each container `fab logs` reads on the host: the serving ones,
    then the proxy (host/proxy) when there is one."""
    chosen = [(s.label, s.container) for s in serving_containers(facts)]
    proxy = facts.proxy_container
    return chosen + ([(f"{facts.host}/proxy", proxy.name)] if proxy is not None else [])


def _read_each(conn: Connection, chosen: list[tuple[str, str]], *, lines: int,
               since: float | None, follow: bool, put: Callable[[tuple[str, str]], None],
               stopping: threading.Event) -> list[tuple[str, str]]:
    """Read every chosen (label, container)'s log at once, one thread each; the errors by
    label."""
    errors: list[tuple[str, str]] = []

    def one(label: str, container: str) -> None:
        try:
            for line in conn.docker.log_lines(container, lines=lines, since=since,
                                              follow=follow):
                if stopping.is_set():
                    return
                put((line, label))
        except Exception as error:
            errors.append((label, f"{type(error).__name__}: {error}"))

    threads = [threading.Thread(target=one, args=pair, daemon=True) for pair in chosen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _drain(found: queue.Queue[tuple[str, str] | None], hosts: int,
           show: Callable[[str], None] | None) -> list[tuple[str, str]]:
    """Take lines until every host's reader is done: shown at once with ``show``, else
    collected."""
    collected: list[tuple[str, str]] = []
    pending = hosts
    while pending:
        item = found.get()
        if item is None:
            pending -= 1
        elif show is not None:
            show(_log_line(*item))
        else:
            collected.append(item)
    return collected


def _log_line(line: str, label: str) -> str:
    stamp, _, text = line.partition(" ")
    return f"{stamp} {label:<9} {text}"


def exec_in(target: Target, argv: list[str], *, force: bool, out: Callable[[str], None],
            connect: ConnectionFactory = SshConnection) -> int:
    """`fab exec`: run ``argv`` in every selected host's serving containers (both slots of a
    canary, each labelled host[/instance][/slot]); output prefixed, which container takes
    which share of the requests, a summary of exit codes. Refused while a run holds the
    model's lock, unless ``force`` (a paused canary is no run: its containers are there to
    be looked at)."""
    if not argv:
        raise ConfigError(Problem("no command given", fix="fab exec --model M -- CMD ARG ...",
                                  field="--"))

    def run(target: Target, host: ResolvedHost, conn: Connection, facts: HostFacts
            ) -> dict[str, Any]:
        holder = facts.lock
        if facts.lock_present and not force and not (holder and holder.paused):
            return {"refused": f"a run holds the lock of {target.model.name} "
                               f"({holder.describe() if holder else 'unreadable'})"}
        results = []
        for served in serving_containers(facts):
            code, text = conn.docker.exec(served.container, argv)
            results.append({"served": served, "code": code, "output": text})
        return {"results": results}

    rows = engine.look(target, lambda session: survey.each_host(target, run, session=session),
                       connect=connect, deadline_s=None)  # a command may take its time
    codes = []
    for row in rows:
        if not row["reachable"]:
            out(f"{row['host']}: UNREACHABLE ({row['error']})")
            continue
        if "refused" in row:
            out(f"{row['host']}: refused: {row['refused']} (--force to run anyway)")
            continue
        for result in row["results"]:
            # newlines only: a CR (or FF, VT, U+2028) is shown escaped inside its line, never
            # taken for a line break that starts a line with no prefix of its own
            text = result["output"].removesuffix("\n")
            for line in text.split("\n") if text else []:
                out(f"{result['served'].label:<9} {line}")
            codes.append((result["served"].label, result["code"]))
    for line in split_lines([r["served"] for row in rows for r in row.get("results", [])]):
        out(line)
    out("exit codes: " + (", ".join(f"{label} {code}" for label, code in codes) or "none"))
    if any("refused" in r for r in rows):
        return int(ExitCode.INVALID)
    unreachable = any(not r["reachable"] for r in rows)
    return 3 if unreachable or any(code != 0 for _, code in codes) else 0


def split_lines(served: list[Served]) -> list[str]:
    """One line per instance whose requests two slots share (a canary): which container is
    which release, with its share."""
    groups: dict[str, list[Served]] = {}
    for one in served:
        if one.split:
            groups.setdefault(one.label.rsplit("/", 1)[0], []).append(one)
    return [f"{where}: " + ", ".join(f"{s.slot} serves {s.release} (v{s.version}) "
                                     f"{s.share}% of new requests" for s in group)
            for where, group in groups.items()]
