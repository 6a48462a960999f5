"""Two dual-version windows never overcommit a GPU (pure): the judgement a host-wide
reservation is taken on.

Per-model locks do not serialize two models sharing a GPU, and each model's plan counts the
other with one release resident; during both windows each has two. A run therefore reserves
what its new process will take on each GPU before it starts it; the host orders reservations
(under a host-wide flock), and one is admitted only when the GPU's free memory, less what every
EARLIER live reservation has not taken yet, holds it. An earlier reservation is never judged
against a later one, so two runs cannot refuse each other, and the second of two windows that
do not fit together is refused, naming the first, before its process starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfsdeploy.core.gpu.records import WindowReservation


@dataclass(frozen=True)
class Earlier:
    """An earlier live reservation and what its processes already hold (they count in
    nvidia-smi's used memory; the rest is still to come)."""

    reservation: WindowReservation
    held_mib: Mapping[int, int]

    def pending(self, gpu: int) -> int:
        """What it will still take on ``gpu``."""
        return max(0, self.reservation.need_mib.get(gpu, 0) - self.held_mib.get(gpu, 0))


@dataclass(frozen=True)
class Refusal:
    """A window that does not fit a GPU beside the earlier ones."""

    gpu: int
    need_mib: int
    free_mib: int
    pending_mib: int
    holders: tuple[WindowReservation, ...]  # earlier windows on the GPU with memory to come
    open_windows: tuple[WindowReservation, ...] = ()  # every earlier window on the GPU

    def text(self) -> str:
        """The numbers and the windows that hold the GPU."""
        text = (f"GPU {self.gpu}: the window needs {self.need_mib} MiB; {self.free_mib} MiB "
                f"free, of which {self.pending_mib} MiB are reserved for other runs' "
                "windows that have not taken them yet")
        return text + self.whose()

    def whose(self) -> str:
        """The other runs whose windows are open on the GPU ('' when none is)."""
        windows = self.open_windows or self.holders
        if not windows:
            return ""
        return "; other runs' windows open on this GPU: " + "; ".join(
            r.describe() for r in windows)


def admit(need_mib: Mapping[int, int], free_mib: Mapping[int, int],
          earlier: Sequence[Earlier], reclaim_mib: Mapping[int, int] | None = None
          ) -> Refusal | None:
    """None when, on every GPU, the need fits what is free (plus ``reclaim_mib``: what the
    run frees before its process starts) less what earlier windows have still to take."""
    reclaim = reclaim_mib or {}
    for gpu, need in sorted(need_mib.items()):
        holders = tuple(e.reservation for e in earlier if e.pending(gpu) > 0)
        pending = sum(e.pending(gpu) for e in earlier)
        free = free_mib.get(gpu, 0) + reclaim.get(gpu, 0)
        if need > free - pending:
            return Refusal(gpu=gpu, need_mib=need, free_mib=free, pending_mib=pending,
                           holders=holders, open_windows=tuple(
                               e.reservation for e in earlier
                               if gpu in e.reservation.need_mib))
    return None
