"""Restore: what a failed (or reverted) host runs to get back on its previous release. The
playbook names these steps in its ``rescue`` task list, beside ``switch_traffic`` with
``to: old``."""

from __future__ import annotations

from tfsdeploy.core.rollout.records import ReleaseStatus, now_iso
from tfsdeploy.run.changes import RemoveContainer, StopContainer, WriteFile
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation


@operation("remove_new")
def remove_new(job: HostJob) -> Ops:
    """Remove the container this run created (stop a retained one it started again)."""
    if job.started:
        yield RemoveContainer(job.container)
        job.started = False
        return f"removed {job.container}"
    if job.resumed:
        yield StopContainer(job.container)
        job.resumed = False
        return f"stopped {job.container} again"
    return "no container was started"


@operation("record_attempt")
def record_attempt(job: HostJob) -> Ops:
    """Record how the attempt ended in its release record: ``reverted`` when it had taken
    traffic, else ``failed`` (a deploy's own attempts only: a rollback leaves the retained
    release's record as it was)."""
    if job.run.verb == "abort":
        return (yield from _record_aborted(job))
    if job.run.rollback or not job.uploaded:
        return "nothing to record"
    outcome = ReleaseStatus.REVERTED if job.took_any_traffic else ReleaseStatus.FAILED
    yield WriteFile(f"{job.paths.release_dir(job.run.release_id)}/manifest.json",
                    job.release_record(outcome).to_json())
    return f"{job.run.release_id} recorded as {outcome.value}"


def _record_aborted(job: HostJob) -> Ops:
    """An aborted canary's record: reverted, its canary state aborted (its steps kept). The
    record says whether the host ran the canary (``remove_new``, earlier in the same task
    list, has already cleared what this run started)."""
    record = job.facts.record(job.run.release_id)
    state = (record.canary or {}).get("state") if record else None
    # an interrupted canary (its run killed at a split weight) recorded no canary: the host
    # ran it when its proxy gave the release a share of the requests
    interrupted = record is not None and state is None and any(
        c.release == record.id for c in job.facts.taking_requests(0))
    if record is None or (state not in ("running", "paused", "aborting") and not interrupted):
        return "no canary here"
    canary = {**(record.canary or {}), "state": "aborted", "updated_at": now_iso(),
              **({"interrupted": True} if interrupted else {})}
    yield WriteFile(f"{job.paths.release_dir(record.id)}/manifest.json",
                    record.with_status(ReleaseStatus.REVERTED).model_copy(
                        update={"canary": canary}).to_json())
    return f"{record.id} recorded as reverted (canary aborted)"
