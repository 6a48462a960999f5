"""`fab tune`'s scratch instances that a killed tune (kill -9) left: they serve nothing, hold
GPU memory and ports, and never restart on their own. A deploy's and a rollback's preflight
(before ``check_gpu``), prune and retire remove them (``remove_scratch``), under the model's
tune lock on the host: a tune that runs keeps its own, and ``check_gpu`` names them when the
GPU has no room (``gpu_note``)."""

from __future__ import annotations

from dataclasses import replace

from tfsdeploy.hosts import scratch
from tfsdeploy.hosts.facts import gather
from tfsdeploy.run.changes import Check, ClearScratch
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation


@operation("remove_scratch")
def remove_scratch(job: HostJob) -> Ops:
    """Remove the model's scratch instances a tune no longer running left, then read the
    host's GPUs and ports again (what they held is free for the checks that follow)."""
    facts, model = job.facts, job.model.name
    mine = [f for f in facts.scratch if f.model == model]
    left = [f for f in mine if scratch.owner(facts, f) is None]
    kept = [scratch.whose(facts, f, model) for f in mine if f not in left]
    if left:
        yield ClearScratch(model, tuple(f.name for f in left))
        yield Check("read the host's GPUs and ports again", lambda: _reread(job))
    if kept or left:
        return "; ".join(kept)
    # retire counts a host whose steps all say so as one that held nothing of the model
    return "no scratch instance" if facts.holds_model else "nothing of the model here"


def _reread(job: HostJob) -> str:
    """The GPUs, ports and scratch instances as the host has them now (the rest of the facts,
    on which the run has decided, stay as read)."""
    fresh = gather(job.conn, job.model.name, job.paths)
    job.facts = replace(job.facts, gpus=fresh.gpus, listening=fresh.listening,
                        scratch=fresh.scratch)
    return ""


def gpu_note(job: HostJob, indexes: list[int]) -> str:
    """The scratch instances that may hold memory on the GPUs ``indexes``, named with whose
    they are ('' when none): what ``check_gpu`` adds to a refusal."""
    facts = job.facts
    found = [scratch.whose(facts, f, job.model.name) for f in facts.scratch
             if any(f.holds_gpu(i) for i in indexes)]
    return "; held beside it: " + "; ".join(found) if found else ""
