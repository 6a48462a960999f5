"""Preflight: checks on every target host before anything changes anywhere, from the facts
read at the start of the run, and the decisions taken from them (the free slot, whether the
release is already live). Only ``pull_image`` changes a host (it adds an image)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.changes import PullImage
from tfsdeploy.gates import GateFailed
from tfsdeploy.jobs import HostJob
from tfsdeploy.layout import other_slot
from tfsdeploy.operations import Ops, operation

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


@operation("discover")
def discover(job: HostJob) -> Ops:
    """Take the live release from the facts and choose the free slot; detect a release that
    is already live."""
    yield from ()  # a decision: no change
    facts = job.facts
    job.old = facts.serving(0)
    job.new_slot = other_slot(job.old.slot) if job.old else "blue"
    note = "".join(f"; unreadable record {b.path} ignored ({b.error})" for b in facts.broken)
    if job.run.verb not in ("deploy", "rollback"):
        return (f"serving {job.old.release} in {job.old.slot}" if job.old
                else "nothing serving") + note
    if job.run.rollback:
        return _rollback_slot(job) + note
    live = facts.record(job.old.release) if job.old else None
    job.previous_record = live
    job.unchanged = bool(job.old and live and live.version == job.run.version
                         and live.image == job.image and live.files == job.file_hashes())
    if job.old and job.old.release == job.run.release_id:
        job.unchanged = True
    if job.unchanged and job.old:
        return f"already serving {job.old.release} (unchanged){note}"
    if job.old:
        return f"serving {job.old.release} in {job.old.slot}; new slot {job.new_slot}{note}"
    return f"no release yet; new slot blue{note}"


def _rollback_slot(job: HostJob) -> str:
    """A rollback's slot: where the retained release still runs (warm), else the free one."""
    job.previous_record = job.facts.record(job.old.release) if job.old else None
    if job.old and job.old.release == job.run.release_id:
        job.unchanged = True
        return f"already serving {job.old.release} (unchanged)"
    retained = [c for c in job.facts.of_release(job.run.release_id) if c.instance == 0]
    if retained and retained[0].running and (not job.old or retained[0].slot != job.old.slot):
        job.new_slot = retained[0].slot
    where = f"serving {job.old.release} in {job.old.slot}" if job.old else "nothing serving"
    return f"{where}; {job.run.release_id} in {job.new_slot}"


@operation("check_ports")
def check_ports(job: HostJob) -> Ops:
    """The model's ports are free, or held by this model's own proxy and slots."""
    yield from ()  # a check: no change
    ports = job.ports
    mine = {ports.grpc, ports.rest, *(p for pair in ports.slots.values() for p in pair)}
    ours = {ports.grpc, ports.rest} if job.facts.proxy.running else set()
    for slot, pair in ports.slots.items():
        if any(c.running for c in job.facts.in_slot(slot)):
            ours |= set(pair)
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
    if free is None:
        raise GateFailed("check_disk", f"the free space under {job.paths.root}",
                         "df gave no answer")
    if free < need:
        raise GateFailed("check_disk", f">= {need} MiB free under {job.paths.root}",
                         f"{free} MiB free")
    return f"{free} MiB free, need {need}"


def _tree_mib(path: str) -> int:
    total = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return total // (1024 * 1024) + 1


@operation("check_gpu")
def check_gpu(job: HostJob) -> Ops:
    """Free GPU memory for the new release's fraction beside the old release."""
    yield from ()  # a check: no change
    gpu = job.render.gpu
    if gpu is None or job.unchanged:
        return "no GPU" if gpu is None else "unchanged"
    if job.target_running:
        return "the release's container already runs"
    if not job.facts.gpus:
        raise GateFailed("check_gpu", f"the host's GPUs ({len(job.host.gpus)} in the "
                         "inventory) in nvidia-smi", "nvidia-smi listed no GPU")
    need = gpu.fraction * gpu.gpu_memory_mib
    # a drained old release still running in the slot we take is replaced, freeing its share
    reclaim = need if any(c.running and c != job.old
                          for c in job.facts.in_slot(job.new_slot)) else 0.0
    for card in job.facts.gpus:
        free = card.total_mib - card.used_mib + int(reclaim)
        if free < need:
            raise GateFailed(
                "check_gpu", f"{need:.0f} MiB free on GPU {card.index} for the new release "
                f"(fraction {gpu.fraction:.3f} x {card.total_mib} MiB) beside the live one",
                f"{free} MiB free ({card.used_mib} of {card.total_mib} MiB used); "
                f"plan: {gpu.arithmetic()}")
    return f"{len(job.facts.gpus)} GPU(s), need {need:.0f} MiB free each"


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
