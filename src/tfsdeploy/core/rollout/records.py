"""What the toolkit records on a host, typed: release records, their steps and gates.

Records are written from Python as JSON (atomically: temp file + rename, see ``changes``) and
read back through these models, so that anything a host returns is validated before it is
used: a release id read from a host reaches paths and container names only after it matched
``layout.RELEASE_ID``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tfsdeploy.core.inventory.layout import RELEASE_ID

# pydantic matches patterns with Rust's regex engine, where $ ends the text (no newline
# before it passes)
ReleaseId = Annotated[str, Field(pattern=f"^{RELEASE_ID.pattern}$")]


class ReleaseStatus(StrEnum):
    """Where a release stands on one host."""

    STARTING = "starting"  # its container is being started and gated
    SERVING = "serving"  # it took traffic and passed every gate
    FAILED = "failed"  # a gate failed before it took traffic
    REVERTED = "reverted"  # it took traffic, then the roll was stopped and it was switched away
    ROLLED_BACK = "rolled_back"  # it served, and a rollback returned the host to an older one
    PAUSED = "paused"  # a canary holding part of the traffic, waiting for promote or abort


GOOD = frozenset({ReleaseStatus.SERVING})
"""Releases that served well and were never rolled back from: rollback targets, and what
pruning keeps."""


def now_iso() -> str:
    """UTC time, to the second, as records carry it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class GateRecord(_Record):
    """One gate's verdict."""

    gate: str
    ok: bool
    seconds: float
    detail: str = ""


class StepRecord(_Record):
    """One step of a task list, as it ran on the host."""

    phase: str
    step: str
    ok: bool
    seconds: float
    detail: str = ""


class InstanceRecord(_Record):
    """One serving instance of the release on the host."""

    index: int = Field(ge=0)
    slot: str
    container: str
    gpus: tuple[int, ...] = ()
    gpu_fraction: float | None = None


class ReleaseRecord(_Record):
    """``releases/<id>/manifest.json``: one release of one model on one host."""

    id: ReleaseId
    model: str
    version: int = Field(gt=0)
    image: str
    slot: str
    status: ReleaseStatus
    container: str = ""
    flags: tuple[str, ...] = ()
    files: dict[str, str] = Field(default_factory=dict)
    gpu_fraction: float | None = None
    instances: tuple[InstanceRecord, ...] = ()
    previous: ReleaseId | None = None
    deployed_by: str = ""
    updated_at: str = ""
    gates: tuple[GateRecord, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    canary: dict[str, Any] | None = None
    restored_by: str = ""  # "guard": the guard's rollback made this release current again
    diagnosis: dict[str, str] | None = None  # a failed gate's known failure: kind, cause, fix
    # the model's stable ports (gRPC, REST) the release was rolled behind (None: a record
    # written before they were recorded): a move of the ports is done once a release behind
    # the new ones is current
    stable_ports: tuple[int, int] | None = None

    def with_status(self, status: ReleaseStatus) -> ReleaseRecord:
        """The same record with another status, stamped now."""
        return self.model_copy(update={"status": status, "updated_at": now_iso()})

    def to_json(self) -> bytes:
        """The file's bytes."""
        return (self.model_dump_json(indent=2) + "\n").encode()


class BrokenRecord(_Record):
    """A record file that could not be read as a release record (truncated, edited)."""

    path: str
    error: str


def parse_release(text: str, path: str) -> ReleaseRecord | BrokenRecord:
    """One manifest's text -> a record, or a BrokenRecord naming the file and the problem."""
    try:
        return ReleaseRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError) as error:
        first = str(error).splitlines()
        return BrokenRecord(path=path, error=" ".join(first[:3])[:300])


class AuditEntry(_Record):
    """One line of the host's audit log (``who`` is what the deploying machine says)."""

    time: str
    who: str
    host: str
    model: str
    release: str
    event: str
    details: dict[str, Any] = Field(default_factory=dict)

    def to_line(self) -> str:
        """One JSON line."""
        return self.model_dump_json()


def parse_audit(text: str) -> list[AuditEntry]:
    """Audit lines -> entries; lines that are not entries (older formats, damage) are kept as
    an event ``unreadable`` so that nothing is silently dropped."""
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if isinstance(raw, dict) and "details" not in raw:
                known = set(AuditEntry.model_fields)
                raw = {**{k: v for k, v in raw.items() if k in known},
                       "details": {k: v for k, v in raw.items() if k not in known}}
            entries.append(AuditEntry.model_validate(raw))
        except (ValueError, ValidationError):
            entries.append(AuditEntry(time="", who="", host="", model="", release="",
                                      event="unreadable", details={"line": line[:300]}))
    return entries


class LockRecord(_Record):
    """What a host's part of the fleet lock records: who holds it, from which process.

    A process is identified by the kernel's boot id, its pid namespace, its pid and that
    pid's start time: two containers with one hostname, or a pid reused after the holder
    died, are never taken for the holder. The deploy machine is identified by its machine id
    (``/etc/machine-id``, machine-id(5): set once per installation, kept across reboots):
    the same machine id with another boot id is the same machine rebooted since, so the
    holder cannot return.
    """

    token: str = Field(pattern=r"^[0-9a-f]{8,64}$")
    who: str
    machine: str
    pid: int
    started: str
    command: str
    boot_id: str = ""
    pid_namespace: str = ""
    pid_start: int = 0
    machine_id: str = ""  # the deploy machine's /etc/machine-id ("": an older record)
    paused: str = ""  # a paused canary's release holds the lock (fab promote / abort take it)

    def describe(self) -> str:
        """One line for people."""
        if self.paused:
            return (f"the paused canary of release {self.paused} ({self.command} by "
                    f"{self.who}@{self.machine} since {self.started}): fab promote or fab abort")
        return (f"{self.command} by {self.who}@{self.machine} (pid {self.pid}) since "
                f"{self.started}")


def parse_lock(text: str) -> LockRecord | None:
    """A lock record, or None when ``text`` is not one (empty, truncated, another format)."""
    try:
        return LockRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None


class GatewayDrain(_Record):
    """A serving host drained for one model on a gateway host, as recorded there
    (``<data_root>/gateway/drains/<model>/<host>``): the runtime state of a gateway's worker
    lives in its process only, so the record is what a later run, or `fab gateway`'s next
    worker, reads of the drain. Written before the drain, removed before the host is put back
    (a kill in between leaves a recorded drain, never an unrecorded one)."""

    model: str
    host: str
    reason: str  # why it must take no request of the model
    run: str  # the run that drained it ("deploy resnet50 20240101T000000-v2")
    who: str = ""
    time: str = ""

    def describe(self) -> str:
        """One line for people."""
        by = f" by {self.who}" if self.who else ""
        at = f" at {self.time}" if self.time else ""
        return f"drained by `{self.run}`{by}{at}: {self.reason}"

    def to_json(self) -> bytes:
        """The file's bytes."""
        return (self.model_dump_json(indent=2) + "\n").encode()


def parse_gateway_drain(text: str) -> GatewayDrain | None:
    """A gateway drain record, or None when ``text`` is not one."""
    try:
        return GatewayDrain.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None
