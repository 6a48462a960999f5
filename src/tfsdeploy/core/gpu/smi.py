"""nvidia-smi's CSV answers, parsed (pure).

The toolkit asks nvidia-smi two things on a host: each GPU's memory
(``--query-gpu=index,uuid,memory.total,memory.used,memory.free,memory.reserved
--format=csv,nounits``, its header naming the columns) and each compute process's holding
(``--query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits``). Run on the
host, nvidia-smi names processes by their host pid.

Facts from a real card (an H200 on driver 580, tests/fixtures/nvidia-smi/h200): ``memory.total``
143,771 MiB includes 616 MiB the driver reserves (``memory.reserved``); ``memory.free`` is what
is left of the rest (143,156 at idle), and CUDA's own total (cuMemGetInfo) is
``memory.total - memory.reserved``. A driver whose nvidia-smi does not know
``memory.reserved`` refuses the whole query ("Field ... is not a valid field to query"): the
facts command then asks without it, and the reserve is what total, used and free leave
unexplained. A value nvidia-smi cannot give is ``[N/A]`` or ``[Not Supported]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

QUERY_GPU = ("index", "uuid", "memory.total", "memory.used", "memory.free", "memory.reserved")
QUERY_APPS = ("pid", "used_memory", "gpu_uuid")
HEADER = re.compile(r"[a-z_]+(\.[a-z_]+)*")  # a column name (``memory.total``), not a value


@dataclass(frozen=True)
class GpuCard:
    """One GPU as the host's nvidia-smi reports it (MiB)."""

    index: int
    total_mib: int
    used_mib: int
    free_mib: int | None = None
    reserved_mib: int | None = None  # None: this nvidia-smi does not report it
    uuid: str = ""

    @property
    def driver_reserve_mib(self) -> int:
        """The driver's reserve: as reported, else what total, used and free leave
        unexplained (0 when free is unknown too)."""
        if self.reserved_mib is not None:
            return self.reserved_mib
        if self.free_mib is None:
            return 0
        return max(0, self.total_mib - self.used_mib - self.free_mib)

    @property
    def cuda_mib(self) -> int:
        """What CUDA can allocate on the card: its total less the driver's reserve."""
        return self.total_mib - self.driver_reserve_mib

    @property
    def available_mib(self) -> int:
        """What a new process could allocate now: nvidia-smi's free memory (else what the
        CUDA total less the used memory leaves)."""
        return self.free_mib if self.free_mib is not None else self.cuda_mib - self.used_mib


@dataclass(frozen=True)
class GpuApp:
    """One compute process on one GPU: its pid as the reader's pid namespace numbers it (the
    host's, when nvidia-smi runs on the host) and what it holds (None: not reported)."""

    pid: int
    used_mib: int | None
    gpu_uuid: str = ""


def _number(cell: str) -> int | None:
    """``143771``, ``143771 MiB``, ``930`` -> MiB; ``[N/A]``, ``[Not Supported]``, and what
    is no finite number (``inf``, ``nan``, ``1e999``: a host's output is not trusted) -> None."""
    value = cell.strip()
    if value.endswith(" MiB"):
        value = value[:-4].strip()
    try:
        return int(float(value))
    except (ValueError, OverflowError):
        return None


def _column(header: str) -> str:
    """``memory.total [MiB]`` -> ``memory.total``."""
    return header.split(" [", 1)[0].strip()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def parse_gpus(text: str, fields: Sequence[str] = ("index", "memory.total", "memory.used")
               ) -> tuple[GpuCard, ...]:
    """``--query-gpu`` CSV -> one card per line. With a header (``--format=csv``), the header
    names the columns; without one they are ``fields`` in order. Lines that are not a card
    (an error message, a card without total) are skipped."""
    lines = [line for line in text.splitlines() if line.strip()]
    names = list(fields)
    if lines and HEADER.fullmatch(_column(_cells(lines[0])[0])):
        names = [_column(cell) for cell in _cells(lines[0])]
        lines = lines[1:]
    cards = []
    for position, line in enumerate(lines):
        row = dict(zip(names, _cells(line), strict=False))
        # a query without `index` lists the cards in index order
        index = _number(row["index"]) if "index" in row else position
        total = _number(row.get("memory.total", ""))
        if index is None or total is None or index < 0:
            continue
        cards.append(GpuCard(
            index=index, total_mib=total, used_mib=_number(row.get("memory.used", "")) or 0,
            free_mib=_number(row["memory.free"]) if "memory.free" in row else None,
            reserved_mib=_number(row["memory.reserved"]) if "memory.reserved" in row else None,
            uuid=row.get("uuid", "")))
    return tuple(cards)


def parse_apps(text: str) -> tuple[GpuApp, ...]:
    """``--query-compute-apps=pid,used_memory[,gpu_uuid] --format=csv,noheader,nounits`` ->
    one process per line (a line without a pid is skipped)."""
    found = []
    for line in text.splitlines():
        cells = _cells(line)
        pid = _number(cells[0]) if cells and cells[0] else None
        if pid is None or pid <= 0:
            continue
        used = _number(cells[1]) if len(cells) > 1 else None
        found.append(GpuApp(pid=pid, used_mib=used, gpu_uuid=cells[2] if len(cells) > 2 else ""))
    return tuple(found)
