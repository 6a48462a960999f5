"""What the toolkit records on a host about its GPUs (host-wide, beside every model's home):
window reservations and the memory processes were measured to hold beside their pools.

Both live under ``<data_root>/gpu/`` (``gpu`` is no model name: the layout reserves it), so
every model, every run and every deploy machine sees them.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

GpuIndex = Annotated[int, Field(ge=0, le=1023)]
Mib = Annotated[int, Field(ge=0, le=1 << 24)]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class WindowReservation(_Record):
    """GPU memory a run's window is about to take on a host: the new release's process(es)
    of one instance, reserved before they start, released when the window ends.

    It lives as long as the run that took it holds its model's lock there (``lock_token``):
    a run that ended, or whose lock was broken, reserves nothing, and what its processes
    took is what nvidia-smi shows."""

    model: str
    instance: int = 0
    release: str
    lock_token: str
    who: str
    started: str
    need_mib: dict[GpuIndex, Mib]  # per host GPU: the pool and what a process holds beside it
    containers: tuple[str, ...] = ()  # the processes that take it, once they run
    seq: int = 0  # the host's order of reservations (set by the host when taken)

    def describe(self) -> str:
        """Whose window, for a refusal."""
        gpus = ", ".join(f"GPU {g}: {m} MiB" for g, m in sorted(self.need_mib.items()))
        return (f"{self.model} release {self.release} (instance {self.instance}; "
                f"by {self.who} since {self.started}; {gpus})")

    def to_json(self) -> bytes:
        """The record as the host keeps it."""
        return self.model_dump_json().encode()


class OverheadRecord(_Record):
    """What one process was measured to hold beside its pool on one GPU (after its warmup),
    kept per host, card and model: the next plan counts it where it exceeds
    ``gpu_context_mib``."""

    gpu: GpuIndex
    model: str
    release: str
    pool_mib: Mib
    held_mib: Mib
    overhead_mib: Mib
    at: str


def parse_reservation(text: str) -> WindowReservation | None:
    """A reservation, or None when ``text`` is not one."""
    try:
        return WindowReservation.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None


def parse_overhead(text: str) -> OverheadRecord | None:
    """An overhead record, or None when ``text`` is not one."""
    try:
        return OverheadRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None


def measured_overhead(records: list[OverheadRecord], gpu: int) -> OverheadRecord | None:
    """The largest overhead measured on a GPU (any model), or None."""
    found = [r for r in records if r.gpu == gpu]
    return max(found, key=lambda r: r.overhead_mib) if found else None


def reservation_seq(name: str) -> int:
    """The host's number of a reservation, from its file name (``<seq>.<model>.<k>.json``)."""
    head = name.split(".", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else 0


def lock_token(text: str) -> str:
    """The token of a model's lock record ('' when there is none or it cannot be read)."""
    try:
        found = json.loads(text)
    except ValueError:
        return ""
    token = found.get("token") if isinstance(found, dict) else None
    return token if isinstance(token, str) else ""


def live_reservations(found: list[tuple[str, str, str]]) -> tuple[WindowReservation, ...]:
    """(file name, record, its model's lock record) -> the reservations whose run still holds
    its model's lock, numbered by the host, in the host's order. A reservation whose lock is
    gone or held by another run is over: what its processes took, nvidia-smi shows."""
    live = []
    for name, text, lock in found:
        record = parse_reservation(text)
        if record is not None and record.lock_token and record.lock_token == lock_token(lock):
            live.append(record.model_copy(update={"seq": reservation_seq(name)}))
    return tuple(sorted(live, key=lambda r: r.seq))
