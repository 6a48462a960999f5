"""The GPU's truth in a roll: the window's memory reserved host-wide before the new process
starts (``reserve_gpu``) and given back when the window ends (``release_gpu``), and the gate
that reads what the new process really holds (``gate_gpu_memory``).

A TFServing process started into a GPU with too little free memory does not fail: its
allocator cuts the pool in 0.9x steps until something fits (BFCAllocator::Extend, measured on
an H200: gpu facts in docs/gpu-memory.md), serves, and fails later under a bigger batch. So
after warmup, nvidia-smi on the host is asked what the new container's processes hold; less
than the planned pool fails the gate before any traffic moves. What the process holds beside
its pool is recorded on the host (per card and model) when the window's reservation is given
back: the next plan counts it where it exceeds ``gpu_context_mib``.
"""

from __future__ import annotations

import time

from tfsdeploy.core.gpu.holding import SHORT_POOL_FIX, Holding, shortfall_text
from tfsdeploy.core.gpu.records import OverheadRecord, WindowReservation, measured_overhead
from tfsdeploy.core.inventory.gpu import pool_mib
from tfsdeploy.core.rollout.gate_diagnosis import Diagnosis, Kind
from tfsdeploy.core.rollout.gates import GateFailed
from tfsdeploy.core.rollout.records import now_iso
from tfsdeploy.hosts import gpu_memory
from tfsdeploy.hosts.commands.gpu import release_reservation
from tfsdeploy.run.changes import Check, Command, ReserveGpu
from tfsdeploy.run.jobs import HostJob, InstanceJob
from tfsdeploy.run.operations.gates import gate_errors, record_gate
from tfsdeploy.run.operations.step import Ops, operation


def cuda_mib(job: HostJob, gpu: int) -> int:
    """What CUDA can allocate on one of the host's GPUs: as its nvidia-smi says (memory.total
    less memory.reserved), else as the inventory declares it."""
    card = next((c for c in job.facts.gpus if c.index == gpu), None)
    if card is not None:
        return card.cuda_mib
    return next(g.cuda_mib for g in job.host.gpus if g.index == gpu)


def beside_pool_mib(job: HostJob, gpu: int) -> tuple[int, OverheadRecord | None]:
    """What each process is planned to hold beside its pool on ``gpu``: ``gpu_context_mib``,
    or what the host last measured there when that is more (with its record)."""
    configured = job.host.vars.gpu_context_mib
    measured = measured_overhead(list(job.facts.gpu_truth.overhead), gpu)
    if measured is not None and measured.overhead_mib > configured:
        return measured.overhead_mib, measured
    return configured, None


def window_need(job: HostJob, instance: InstanceJob) -> dict[int, int]:
    """GPU index -> MiB the instance's new process takes: its pool and what it holds
    beside it."""
    fraction = instance.fraction or 0.0
    return {g: pool_mib(fraction, cuda_mib(job, g)) + beside_pool_mib(job, g)[0]
            for g in instance.gpus}


def reclaimed(job: HostJob) -> tuple[str, ...]:
    """The running containers the start removes from the instance's free slot first (a
    drained release a killed run left there): their memory is freed before it starts."""
    keep = {job.container, job.instance.old.name if job.instance.old else ""}
    return tuple(c.name for c in job.facts.in_slot(job.new_slot, job.instance.index)
                 if c.running and c.name not in keep)


def _gpu_instance(job: HostJob) -> str | None:
    """Why the instance needs no GPU step (None: it does)."""
    if job.instance.fraction is None or not job.instance.gpus:
        return "no GPU"
    if job.gpus is None:
        return "its container is given no GPU (docker_gpus unset)"
    return None


@operation("reserve_gpu")
def reserve_gpu(job: HostJob) -> Ops:
    """Reserve, host-wide, the GPU memory the instance's new process will take, before it
    starts: refused (the step fails, nothing started) when earlier windows of other runs
    leave too little, naming them."""
    skip = _gpu_instance(job)
    if skip:
        return skip
    if any(c.running for c in job.facts.of_release(job.run.release_id)
           if c.instance == job.instance.index):
        return "the release already runs here: it holds its memory"
    record = WindowReservation(
        model=job.model.name, instance=job.instance.index, release=job.run.release_id,
        lock_token=job.run.lock_token, who=job.run.who, started=now_iso(),
        need_mib=window_need(job, job.instance), containers=(job.container,))
    job.gpu_reserved = True  # planned (--check) or taken: the window ends with its release
    yield ReserveGpu(record, reclaimed(job))
    return ""  # the reservation says where it stands


@operation("release_gpu")
def release_gpu(job: HostJob) -> Ops:
    """Give back the model's window reservations this run took on the host (its old
    release is retired, or the new one removed), and record on the host what the window's
    new processes held beside their pools after warmup (for the next plan on that card)."""
    if not job.host.gpus:
        return "no GPU"
    token = job.run.lock_token or "-"
    records = [(job.paths.overhead_file(r.gpu), r.model_dump_json())
               for i in job.instances for r in i.overhead]
    held = job.gpu_reserved or any(  # by this run, or by the run it finishes (canary)
        r.model == job.model.name and r.lock_token == job.run.lock_token
        for r in job.facts.gpu_truth.reservations)
    if not held:  # no window opened here: nothing to give back, no new process measured
        return "nothing reserved under this lock here"
    yield Command.of(release_reservation(job.paths.gpu_dir, job.model.name, token, records),
                     "give back the window's GPU reservation and record what its processes "
                     "held beside their pools (host-wide)", timeout=60)
    return ""


def before_mib(job: HostJob, gpu: int) -> int:
    """What this model's warm process held beside its pool on ``gpu`` at its last deploy
    (0: not recorded)."""
    return next((r.overhead_mib for r in job.facts.gpu_truth.overhead
                 if r.gpu == gpu and r.model == job.model.name), 0)


def holdings(job: HostJob) -> tuple[list[Holding], str | None]:
    """The new container's holding on each of its GPUs after warmup, read now and judged
    against what the model's warm processes held beside their pools before; or why it cannot
    be judged (None: it can)."""
    reading = gpu_memory.read(job.conn, job.facts.gpus)
    pid = job.instance.pid  # as gate_available last inspected it
    held = reading.held(pid) if pid > 0 else {}
    if not held:  # not inspected yet, or restarted since: inspect it now
        pid = job.instance.pid = gpu_memory.main_pid(job.conn, job.container)
        if pid <= 0:
            raise GateFailed("gate_gpu_memory", f"{job.container} running", "it is not running")
        held = reading.held(pid)
    if not reading.reported(pid):
        return [], "nvidia-smi reports no per-process memory on this host ([N/A])"
    fraction = job.instance.fraction or 0.0
    return [Holding(gpu=g, planned_mib=pool_mib(fraction, cuda_mib(job, g)),
                    held_mib=held.get(g, 0), before_mib=before_mib(job, g))
            for g in job.instance.gpus], None


def _short(job: HostJob, found: list[Holding]) -> GateFailed | None:
    """The failure of a holding short of its pool (None: every pool is whole)."""
    short = [h for h in found if h.short]
    if not short:
        return None
    fraction = job.instance.fraction or 0.0
    seen = "; ".join(shortfall_text(h, fraction=fraction, cuda_mib=cuda_mib(job, h.gpu))
                     for h in short)
    diagnosis = Diagnosis(kind=Kind.GPU_POOL_CUT, cause=seen, fix=SHORT_POOL_FIX,
                          evidence=f"nvidia-smi --query-compute-apps on {job.name}")
    return GateFailed("gate_gpu_memory", "the new process to hold its planned GPU pool",
                      "; ".join(f"GPU {h.gpu}: planned {h.planned_mib} MiB, held "
                                f"{h.held_mib} MiB" + (f" (a whole pool holds at least "
                                                      f"{h.expected_mib} MiB here)"
                                                      if h.expected_mib > h.planned_mib
                                                      else "") for h in short),
                      diagnosis=diagnosis)


@operation("gate_gpu_memory")
def gate_gpu_memory(job: HostJob) -> Ops:
    """After warmup, the new container's processes hold at least their planned pool on each
    GPU, as nvidia-smi on the host reports them (the gate fails, before any traffic moves,
    when the allocator cut the pool); what they hold beside it is recorded on the host for
    the next plan.

    One read, after warmup, not one before it too: the allocator cuts a pool at its first
    allocation, the model's load (``BFCAllocator::Extend``'s backpedal,
    tsl/framework/bfc_allocator.cc; docs/gpu-memory.md), and a pool cut there holds no more
    after warmup unless it got its memory back, which is what must be true when traffic
    moves; and only after warmup can the holding be judged against what the model's warm
    processes held beside their pools before, without which a small pool's cut can hide in
    what it holds beside it."""
    skip = _gpu_instance(job)
    if skip:
        return skip
    gate = "gpu_memory"
    found: list[Holding] = []

    def run() -> str:
        started = time.monotonic()
        with gate_errors(job, gate, started, step="gate_gpu_memory",
                         expected="the new process to hold its planned GPU pool"):
            seen, unjudged = holdings(job)
            if unjudged:
                record_gate(job, gate, started, True, f"not judged: {unjudged}")
                return f"not judged: {unjudged}"
            short = _short(job, seen)
            if short is not None:
                raise short
        found.extend(seen)
        detail = "; ".join(f"GPU {h.gpu}: holds {h.held_mib} MiB >= pool {h.planned_mib} MiB "
                           f"(+{h.beside_pool_mib} beside it)" for h in seen)
        record_gate(job, gate, started, True, detail)
        return detail

    yield Check(f"what {job.container}'s processes hold on GPU "
                f"{','.join(map(str, job.instance.gpus))} (nvidia-smi on the host) >= the "
                "planned pool", run)
    # written on the host with the reservation's release
    job.instance.overhead = [OverheadRecord(
        gpu=h.gpu, model=job.model.name, release=job.run.release_id,
        pool_mib=h.planned_mib, held_mib=h.held_mib, overhead_mib=h.beside_pool_mib,
        at=now_iso()) for h in found]
    return ""  # the check says what it saw
