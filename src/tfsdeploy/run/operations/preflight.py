"""Preflight: checks on every target host before anything changes anywhere, from the facts
read at the start of the run, and the decisions taken from them (the free slot, whether the
release is already live). Only ``pull_image`` changes a host (it adds an image); and
``remove_scratch`` (operations/scratch.py), which removes what a killed `fab tune` left,
serving nothing."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

from tfsdeploy.core.gpu.window import admit
from tfsdeploy.core.inventory.gpu import GpuPlan, check_gpu_plan
from tfsdeploy.core.inventory.layout import other_slot, server_name
from tfsdeploy.core.render.files import FLAGS
from tfsdeploy.core.render.host_proxy import FULL_WEIGHT, PortMove, config_ports, proxy_instances
from tfsdeploy.core.rollout.gates import GateFailed, Verdict, poll
from tfsdeploy.hosts.facts import coming_back, reread_serving
from tfsdeploy.run.changes import Check, PullImage
from tfsdeploy.run.jobs import HostJob, InstanceJob
from tfsdeploy.run.operations.gpu import beside_pool_mib
from tfsdeploy.run.operations.scratch import gpu_note
from tfsdeploy.run.operations.step import Ops, operation

REQUIRED_TOOLS = ("socat", "flock", "sha256sum", "tar")


@operation("check_ssh")
def check_ssh(job: HostJob) -> Ops:
    """SSH connected with a verified host key (the facts were read over it)."""
    yield from ()  # a check: no change
    return f"{job.host.vars.ssh_user}@{job.host.address}"


@operation("check_docker")
def check_docker(job: HostJob) -> Ops:
    """The Docker Engine answered, and the host has the tools the toolkit runs there."""
    yield from ()  # a check: no change
    missing = [t for t in REQUIRED_TOOLS if t not in job.facts.tools]
    if missing:
        raise GateFailed("check_docker", f"{', '.join(REQUIRED_TOOLS)} on the host",
                         f"missing {', '.join(missing)} (on Debian/Ubuntu: apt-get install "
                         f"{' '.join('util-linux' if t == 'flock' else t for t in missing)})")
    return f"docker {job.facts.docker_version}"


@operation("await_restarts")
def await_restarts(job: HostJob, timeout_s: float | None = None) -> Ops:
    """Before any decision: wait (at most ``timeout_s``, default the model's
    ``load_timeout_s``) for what a reboot or a crash is bringing back, the proxy and the
    servers whose containers run or restart while their health check fails, so that the run
    decides on what serves, not on a moment of its restart; what is still down then is
    treated as down."""
    waiting = coming_back(job.facts)
    if not waiting:
        return "nothing coming back"
    deadline = timeout_s or job.model.rollout.load_timeout_s

    def run() -> str:
        started = time.monotonic()

        def check() -> Verdict:
            job.facts = reread_serving(job.conn, job.facts, job.model.name, job.paths)
            left = coming_back(job.facts)
            return Verdict.wait(f"{', '.join(left)} coming back") if left else Verdict.ok("")

        try:
            poll(check, step="await_restarts", expected=f"{', '.join(waiting)} to serve again",
                 deadline_s=deadline, clock=job.run.clock, interval_s=0.5, max_interval_s=2.0)
        except GateFailed:
            return (f"{', '.join(coming_back(job.facts))} still not serving after "
                    f"{deadline:g} s: treated as down")
        return f"{', '.join(waiting)} back after {time.monotonic() - started:.1f} s"

    yield Check(f"wait until {', '.join(waiting)} serve again (a reboot or a crash brings "
                f"them back; {deadline:g} s at most)", run)
    return ""


@operation("discover")
def discover(job: HostJob, strategy: Literal["dual-slot", "recreate"] | None = None) -> Ops:
    """Take each instance's live release from the facts and choose its slot (the free one;
    the same one with ``recreate``); detect a release that is already live."""
    yield from ()  # a decision: no change
    facts = job.facts
    recreate = (strategy or job.model.rollout.strategy) == "recreate"
    for instance in job.instances:
        instance.old = facts.serving(instance.index)
        instance.down = None if instance.old else facts.down(instance.index)
        was = instance.old or instance.down
        instance.new_slot = ("blue" if not was else was.slot if recreate
                             else other_slot(was.slot))
        _canary_slots(job, instance)
    job.retiring = _retiring(job)
    job.down_slots = down_slots(job)
    job.port_move = port_move(job) if job.run.verb in ("deploy", "rollback") else PortMove()
    first = job.instances[0]
    note = "".join(f"; unreadable record {b.path} ignored ({b.error})" for b in facts.broken)
    note += "".join(f"; i{i} is not in the plan: it serves until finalize removes it"
                    for i in sorted(job.retiring))
    note += "".join(f"; {_down_note(job, index, slot)}" for index, slot in sorted(job.down_slots))
    note += f"; {absent_note(job)}" if job.absent_gpus else ""
    note += f"; ports move: {moved_ports(job)}" if job.port_move else ""
    if job.run.verb not in ("deploy", "rollback"):
        return (f"serving {first.old.release} in {first.old.slot}" if first.old
                else "nothing serving") + note
    if job.run.rollback:
        return _rollback_slots(job) + note
    serving = next((i.old.release for i in job.instances if i.old), None)
    live = facts.record(serving or (facts.current if job.down_slots else None))
    job.previous_record = live
    same = all(i.old and live and i.old.release == live.id for i in job.instances)
    job.unchanged = bool(same and live and live.version == job.run.version
                         and live.image == job.image and live.files == job.file_hashes()
                         and len(live.instances or (None,)) == len(job.instances))
    if all(i.old and i.old.release == job.run.release_id for i in job.instances):
        job.unchanged = True
    if job.port_move:  # the same files on other ports: the containers must move too
        job.unchanged = False
    return _describe_slots(job) + note


def _retiring(job: HostJob) -> dict[int, str | None]:
    """The instances the running proxy has servers for that the plan drops, with the slot
    serving each."""
    proxy = job.facts.proxy
    if not proxy.running or not proxy.answered:
        return {}
    dropped = proxy_instances(proxy.servers) - {i.index for i in job.instances}
    return {index: proxy.serving_slot(index) for index in sorted(dropped)}


def down_slots(job: HostJob) -> frozenset[tuple[int, str]]:
    """(instance, slot) of every server the running proxy has in rotation while its health
    check fails, for the planned instances and those the plan drops."""
    proxy = job.facts.proxy
    if not proxy.running or not proxy.answered:
        return frozenset()
    indices = {s.instance for s in proxy.servers}
    return frozenset((index, slot) for index in indices
                     if (slot := proxy.down_slot(index)) is not None)


def _down_note(job: HostJob, index: int, slot: str) -> str:
    """Why an instance counts as down, for the discover line."""
    seen = job.facts.in_slot(slot, index)
    what = ", ".join(f"{c.name} {c.state}" for c in seen) or "no container"
    planned = any(i.index == index for i in job.instances)
    return (f"i{index}-{slot} is down (its health check fails; {what}): "
            + ("replaced, never counted as serving" if planned else
               "out of rotation until finalize removes it"))


def _canary_slots(job: HostJob, instance: InstanceJob) -> None:
    """A canary shares the instance's traffic (a paused one, or one a killed run left): the
    old release is the one that is not this run's, the new slot the other one, and their
    weights must be made whole again by the switch."""
    sharing = job.facts.taking_requests(instance.index)
    weights = job.facts.proxy.weights(instance.index)
    instance.weighted = any(w != FULL_WEIGHT for w in weights.values())
    if len(sharing) != 2:
        return
    old = [c for c in sharing if c.release != job.run.release_id]
    instance.old = old[0] if old else sharing[0]
    instance.new_slot = other_slot(instance.old.slot)
    if job.run.verb == "abort":  # the canary to take back
        instance.started = instance.switched = instance.took_traffic = True


def _describe_slots(job: HostJob) -> str:
    first = job.instances[0]
    if job.unchanged and first.old:
        return f"already serving {first.old.release} (unchanged)"
    several = len(job.instances) > 1
    parts = []
    for i in job.instances:
        label = f"i{i.index} (GPU {','.join(map(str, i.gpus))}): " if several else ""
        parts.append(label + (f"serving {i.old.release} in {i.old.slot}; new slot {i.new_slot}"
                              if i.old else f"down in {i.down.slot}; new slot {i.new_slot}"
                              if i.down else f"no release yet; new slot {i.new_slot}"))
    return "; ".join(parts)


def _rollback_slots(job: HostJob) -> str:
    """A rollback's slots: where the retained release still runs (warm), else the free one."""
    first = job.instances[0]
    job.previous_record = job.facts.record(first.old.release) if first.old else None
    if all(i.old and i.old.release == job.run.release_id for i in job.instances):
        job.unchanged = True
        return f"already serving {job.run.release_id} (unchanged)"
    for instance in job.instances:
        retained = [c for c in job.facts.of_release(job.run.release_id)
                    if c.instance == instance.index]
        if retained and retained[0].running and (
                not instance.old or retained[0].slot != instance.old.slot):
            instance.new_slot = retained[0].slot
    where = f"serving {first.old.release} in {first.old.slot}" if first.old else \
        "nothing serving"
    return f"{where}; {job.run.release_id} in {first.new_slot}"


def live_server_ports(job: HostJob) -> dict[str, tuple[int, int]]:
    """Where each of the live proxy's servers forwards (gRPC, REST): its running worker's
    ``show stat`` (the ``addr`` column), else the configuration on the host."""
    written = config_ports(job.facts.proxy_config)
    found: dict[str, dict[str, int]] = {}
    for server in job.facts.proxy.servers:
        name = server_name(server.slot, server.instance)
        port = server.port or written.servers.get((server.backend, name), 0)
        if port:
            found.setdefault(name, {})[server.backend] = port
    return {name: (p["grpc"], p["rest"]) for name, p in found.items()
            if "grpc" in p and "rest" in p}


def proxy_binds(job: HostJob) -> dict[str, frozenset[int]]:
    """The stable ports the live proxy binds, per frontend (grpc, rest): its running
    worker's listeners (``show stat``), else, for a worker that reports none (loaded on a
    configuration written before they were reported), the configuration on the host. The
    file alone is not the truth: a run killed between writing it and the reload leaves the
    old worker bound elsewhere."""
    live = dict(job.facts.proxy.binds)
    return live if live else config_ports(job.facts.proxy_config).binds


def port_move(job: HostJob) -> PortMove:
    """What the proxy must keep of the ports this deploy moves: the old stable ports while the
    move is not done (served beside the new ones until the model's next deploy), and each
    serving (or retiring) server whose container listens elsewhere than the plan says (it
    keeps its address until that container is replaced)."""
    facts = job.facts
    if not facts.proxy.running or not facts.proxy.answered:
        return PortMove()
    ports, live = job.ports, live_server_ports(job)
    bound = proxy_binds(job)
    grpc, rest = sorted(bound.get("grpc", ())), sorted(bound.get("rest", ()))
    plan = (ports.grpc, ports.rest)
    binds = tuple(pair for pair in zip(grpc, rest, strict=False) if pair != plan) \
        if grpc and (ports.grpc not in grpc or _move_unrecorded(job)) else ()
    keep = [(i.index, i.old.slot) for i in job.instances if i.old]
    keep += [(index, slot) for index in job.retiring for slot in ports.slots]
    servers = tuple((name, *live[name]) for index, slot in keep
                    for name in [server_name(slot, index)]
                    if name in live and live[name] != (ports.slot_grpc(slot, index),
                                                       ports.slot_rest(slot, index)))
    return PortMove(binds, servers)


def _move_unrecorded(job: HostJob) -> bool:
    """The proxy binds the plan's ports already, but the host's current release was rolled
    behind others: a run that moved the ports stopped after its proxy reloaded and before the
    host's record (the same deploy again keeps the old ports; the next one drops them)."""
    current = job.facts.record(job.facts.current)
    return current is not None and current.stable_ports is not None and \
        current.stable_ports != (job.ports.grpc, job.ports.rest)


def moved_ports(job: HostJob) -> str:
    """The ports this deploy moves, for people ('' when none)."""
    move = job.port_move
    parts = [f"stable ports :{g}/:{r} -> :{job.ports.grpc}/:{job.ports.rest} (the old ones "
             "stay bound beside the new ones until the model's next deploy)"
             for g, r in move.binds]
    parts += [f"{name} stays on :{g}/:{r} until its container is replaced"
              for name, g, r in move.servers]
    return "; ".join(parts)


@operation("check_ports")
def check_ports(job: HostJob) -> Ops:
    """The model's ports are free, or held by this model's own proxy and slots; the ports of
    a serving model do not move."""
    yield from ()  # a check: no change
    ports = job.ports
    mine, ours = {ports.grpc, ports.rest}, set()
    if job.facts.proxy.running:
        bound = proxy_binds(job)
        ours |= set().union(*bound.values()) if bound else {ports.grpc, ports.rest}
    for instance in job.instances:
        for slot in ports.slots:
            pair = {ports.slot_grpc(slot, instance.index), ports.slot_rest(slot, instance.index)}
            mine |= pair
            if any(c.running for c in job.facts.in_slot(slot, instance.index)):
                ours |= pair
    foreign = sorted((mine & job.facts.listening) - ours)
    if foreign:
        raise GateFailed("check_ports", f"ports {sorted(mine)} free or held by "
                         f"{job.model.name}'s own proxy and slots",
                         f"something else listens on {foreign} (another model without a "
                         "port_offset, or another service)")
    return f"{len(mine)} ports free or ours"


@operation("check_disk")
def check_disk(job: HostJob, reserve_mib: int = 512) -> Ops:
    """Room for the model version (when not staged yet) plus a reserve."""
    yield from ()  # a check: no change
    free = job.facts.disk_free_mib
    staged = job.run.version in job.facts.versions
    need = reserve_mib + (0 if staged else _tree_mib(job.run.source_dir))
    where = job.paths.model_dir
    if free is None:
        raise GateFailed("check_disk", f"the free space under {where}", "df gave no answer")
    if free < need:
        raise GateFailed("check_disk", f">= {need} MiB free under {where}",
                         f"{free} MiB free")
    return f"{free} MiB free, need {need}"


def _tree_mib(path: str) -> int:
    total = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return total // (1024 * 1024) + 1


@operation("check_gpu")
def check_gpu(job: HostJob) -> Ops:
    """``gpu_room``; a refusal names the `fab tune` scratch instances on the instances' GPUs
    and whose they are (a running tune's, or left by a killed one: ``remove_scratch`` before
    it removes those)."""
    try:
        return (yield from gpu_room(job))
    except GateFailed as refused:
        note = gpu_note(job, sorted({g for i in job.instances for g in i.gpus}))
        if not note:
            raise
        raise GateFailed(refused.step, refused.expected, refused.seen + note,
                         refused.log_tail, diagnosis=refused.diagnosis) from None


def gpu_room(job: HostJob) -> Ops:
    """The host's GPUs are the inventory's (count and memory, as nvidia-smi reports them), and
    each instance's GPU has room for its new release beside the live one: its pool sized
    against what CUDA can allocate (memory.total less memory.reserved), the window counted
    with what the host measured processes to hold beside their pools (when more than
    gpu_context_mib), and the memory free now less what other runs' windows have reserved."""
    yield from ()  # a check: no change
    if not job.host.gpus:
        return "no GPU"
    mismatch = gpu_mismatch(job)
    if mismatch:
        raise GateFailed("check_gpu", f"the inventory's GPUs: {mismatch[0]}", mismatch[1])
    if job.unchanged:
        return "unchanged"
    notes: list[str] = []
    for instance in job.instances:
        plan = job.render.instances[instance.index].plan
        if plan is None or any(c.running for c in job.facts.of_release(job.run.release_id)
                               if c.instance == instance.index):
            continue
        for index in instance.gpus:
            notes += _check_card(job, instance, plan, index)
    absent = f"; {absent_note(job)}" if job.absent_gpus else ""
    return "; ".join([f"{len(job.facts.gpus)} GPU(s) as in the inventory; "
                      f"{len(job.instances)} instance(s) have room{absent}", *notes])


def absent_note(job: HostJob) -> str:
    """The inventory's GPUs the host does not report, and the instances left out for them."""
    seen = ", ".join(str(g.index) for g in job.facts.gpus)
    return (f"GPU {', '.join(map(str, job.absent_gpus))} of the inventory absent "
            f"(nvidia-smi: GPU {seen}): the host serves on what it has; the instance(s) come "
            "back with the next `fab deploy` once the GPU is back")


def _check_card(job: HostJob, instance: InstanceJob, plan: GpuPlan, index: int) -> list[str]:
    """One GPU of one instance: the pool, the window and the free memory, as the host's
    nvidia-smi and records have them; returns the lines worth saying (a measured overhead)."""
    card = next(c for c in job.facts.gpus if c.index == index)
    context, measured = beside_pool_mib(job, index)
    real = replace(plan, gpu_memory_mib=card.cuda_mib, reserved_mib=card.driver_reserve_mib,
                   context_mib=context)
    where = f"GPU {index}" + (f" (instance {instance.index})" if len(job.instances) > 1 else "")
    wanted = int(plan.footprint_mib * plan.margin + 1e-9)
    if real.pool_mib < wanted:
        declared = next(g for g in job.host.gpus if g.index == index)
        raise GateFailed(
            "check_gpu", f"a pool of >= {wanted} MiB on {where} ({plan.footprint_mib} MiB x "
            f"{plan.margin})", f"fraction {plan.fraction:.3f} x {card.cuda_mib} MiB that CUDA "
            f"can allocate = {real.pool_mib} MiB ({real.memory()}); the inventory declares "
            f"reserved_mib={declared.reserved_mib}: fix it to Gpu({index}, "
            f"{card.total_mib}, reserved_mib={card.driver_reserve_mib}) as nvidia-smi reports")
    notes = []
    if measured is not None:
        notes.append(f"{where}: processes were measured holding {context} MiB beside their "
                     f"pools ({measured.model} release {measured.release}, {measured.at}), "
                     f"more than gpu_context_mib {job.host.vars.gpu_context_mib}: planned "
                     f"with {context}")
    problems = check_gpu_plan(real, file=job.render.file(FLAGS).name)
    if problems:
        raise GateFailed("check_gpu", f"the window to fit {where} as the host has it (what "
                         f"CUDA can allocate, {context} MiB beside each pool)",
                         problems[0].message + "; fix: " + problems[0].fix)
    need = real.pool_mib + context
    # a drained old release still running in the slot we take is replaced, freeing it
    reclaim = need if any(c.running and c != instance.old for c in
                          job.facts.in_slot(instance.new_slot, instance.index)) else 0
    if job.model.rollout.strategy == "recreate" and instance.old:
        reclaim = need  # the old release stops before the new one starts
    refusal = admit({index: need}, {index: card.available_mib}, job.facts.gpu_earlier(),
                    {index: reclaim})
    if refusal is not None:
        whose = (f"instance {instance.index}'s" if len(job.instances) > 1 else "the")
        seen = (f"{card.available_mib} MiB free ({card.used_mib} of {card.cuda_mib} MiB "
                f"that CUDA can allocate used)")
        if refusal.pending_mib:
            seen += f", {refusal.pending_mib} MiB of it reserved by other runs' windows"
        if refusal.whose():
            seen += refusal.whose() + "; deploy again once they have ended"
        raise GateFailed(
            "check_gpu", f"{need} MiB free on GPU {index} for {whose} new release (fraction "
            f"{plan.fraction:.3f} x {card.cuda_mib} MiB + {context} MiB beside the pool)",
            f"{seen}; plan: {real.arithmetic()}")
    return notes


def gpu_mismatch(job: HostJob) -> tuple[str, str] | None:
    """(expected, seen) when nvidia-smi's GPUs differ from the inventory's (count or memory,
    within 1%), else None. GPUs the plan left out as absent (``absent_gpus``) are not
    expected."""
    want = {g.index: g.memory_mib for g in job.host.gpus if g.index not in job.absent_gpus}
    seen = {g.index: g.total_mib for g in job.facts.gpus}
    wrong = sorted(i for i in want if i not in seen or abs(seen[i] - want[i]) > want[i] / 100)
    if len(want) == len(seen) and not wrong:
        return None
    return (", ".join(f"GPU {i} {m} MiB" for i, m in sorted(want.items())),
            "nvidia-smi: " + (", ".join(f"GPU {i} {m} MiB" for i, m in sorted(seen.items()))
                              or "no GPU") + "; fix the host's gpus in the inventory")


@operation("pull_image")
def pull_image(job: HostJob) -> Ops:
    """The serving and proxy images are on the host before any host changes."""
    if job.target_running and job.facts.proxy.running:
        return "the release and the proxy run: their images are here"
    known = job.facts.images
    missing = [image for image in (job.image, job.host.vars.proxy_image)
               if not known.get(image, False)]
    for image in missing:
        yield PullImage(image, if_missing=image not in known)
    return f"pulled {', '.join(missing)}" if missing else "images present"
