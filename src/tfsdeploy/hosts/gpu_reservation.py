"""The host-wide GPU reservation a window takes before its new process starts, and gives back
when the window ends (``core.gpu.window`` judges; ``commands.gpu`` builds the commands).

Taking one is one command under a flock on ``<data_root>/gpu/lock``: the record is written as
the host's next, and every reservation, its model's lock record and the GPUs' memory are read
in that same hold. The earlier live reservations' containers are then looked up in the Engine
(their main pid) to tell what they already hold from what they will still take. A refused
reservation is removed again. The record outlives a killed run (its model's lock does too, and
names the same token) and is seen by every deploy machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfsdeploy.core.gpu.records import WindowReservation
from tfsdeploy.core.gpu.window import Earlier, Refusal, admit
from tfsdeploy.core.inventory.layout import HostPaths
from tfsdeploy.hosts.commands.gpu import (
    release_reservation,
    remove_reservation,
    take_reservation,
)
from tfsdeploy.hosts.facts import gpu_truth, parse_sections
from tfsdeploy.hosts.gpu_memory import GpuReading, main_pid, parse_reading, read
from tfsdeploy.hosts.ssh import Connection


@dataclass(frozen=True)
class Taken:
    """A reservation's outcome: its file name on the host, the read it was judged on, and
    the refusal (None: it holds)."""

    name: str
    reading: GpuReading
    earlier: tuple[Earlier, ...]
    refusal: Refusal | None


def earlier_ones(conn: Connection, reservations: tuple[WindowReservation, ...], seq: int,
                 reading: GpuReading) -> tuple[Earlier, ...]:
    """The live reservations the host numbered before ``seq``, each with what its
    containers' processes already hold."""
    found = []
    for r in (r for r in reservations if r.seq < seq):
        held: dict[int, int] = {}
        for container in r.containers:
            for gpu, mib in reading.held(main_pid(conn, container)).items():
                held[gpu] = held.get(gpu, 0) + mib
        found.append(Earlier(r, held))
    return tuple(found)


def freed_by(conn: Connection, reading: GpuReading, containers: tuple[str, ...]
             ) -> dict[int, int]:
    """GPU index -> MiB the ``containers`` hold now (what removing them frees)."""
    if not containers:
        return {}
    if not reading.apps:  # the take did not read the processes (no other reservation)
        reading = read(conn, reading.cards)
    freed: dict[int, int] = {}
    for container in containers:
        for gpu, mib in reading.held(main_pid(conn, container)).items():
            freed[gpu] = freed.get(gpu, 0) + mib
    return freed


def take(conn: Connection, paths: HostPaths, record: WindowReservation, *,
         reclaim: tuple[str, ...] = ()) -> Taken:
    """Reserve ``record.need_mib`` for a window (``reclaim``: containers the start removes
    first, whose memory it frees); a refused reservation is removed again."""
    result = conn.run(take_reservation(paths.gpu_dir, paths.root, record.model,
                                       record.instance), stdin=record.to_json(), timeout=60)
    sections = parse_sections(result.stdout)
    mine = sections.get("mine")
    if not result.ok or "end" not in sections or not mine:
        raise RuntimeError(f"{conn.host.name}: reserving GPU memory under {paths.gpu_dir} "
                           f"failed: {result.tail()}")
    name = mine[0][0]
    seq = int(name.split(".", 1)[0])
    reading = parse_reading(sections)
    earlier = earlier_ones(conn, gpu_truth(sections).reservations, seq, reading)
    free = {c.index: c.available_mib for c in reading.cards}
    refusal = admit(record.need_mib, free, earlier, freed_by(conn, reading, reclaim))
    if refusal is not None:
        conn.run(remove_reservation(paths.gpu_dir, name), timeout=60)
    return Taken(name=name, reading=reading, earlier=earlier, refusal=refusal)


def release(conn: Connection, paths: HostPaths, token: str) -> str:
    """Give back every reservation of the model taken under the lock ``token`` (those of
    another run stay); returns what was released."""
    result = conn.run(release_reservation(paths.gpu_dir, paths.model, token), timeout=60)
    if not result.ok:
        raise RuntimeError(f"{conn.host.name}: releasing the GPU reservation failed: "
                           f"{result.tail()}")
    return result.stdout.strip()
