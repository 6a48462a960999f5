"""What one TFServing process really holds on its GPUs, against what its plan gave it (pure).

nvidia-smi on the host lists each compute process by its host pid. A container's processes are
its main process (``docker inspect``'s ``State.Pid``, a host pid) and every process below it,
so a process belongs to a container when the container's main pid is on its line of
ancestors (its parent, its parent's parent, ... as the host's /proc says).

A process holds its allocator pool (``fraction x`` CUDA's total: TensorFlow's BFC allocator
takes the whole pool at its first allocation when memory growth is off, TFServing's default)
plus what it holds beside it (CUDA context, cuBLAS, cuDNN). A pool the allocator had to cut
(BFCAllocator::Extend backs off by 0.9 while the pool does not fit, tsl/framework/
bfc_allocator.cc) leaves the process holding less than its planned pool: it serves until a
bigger batch or a second version needs the rest, then fails with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfsdeploy.core.gpu.smi import GpuApp, GpuCard

Ancestry = Mapping[int, tuple[int, ...]]
"""pid -> (pid, its parent, its parent's parent, ...), as the host's /proc gave them."""


def parse_ancestry(text: str) -> dict[int, tuple[int, ...]]:
    """Lines ``pid ppid ppid2 ...`` (each process of nvidia-smi's list, then its ancestors)
    -> pid -> the whole line."""
    found: dict[int, tuple[int, ...]] = {}
    for line in text.splitlines():
        try:
            chain = tuple(int(word) for word in line.split())
        except ValueError:
            continue
        if chain and chain[0] > 0:
            found[chain[0]] = chain
    return found


def card_of(app: GpuApp, cards: Sequence[GpuCard]) -> int | None:
    """The index of the GPU an app is on: by its UUID, or the only card when nvidia-smi gave
    none (``--query-compute-apps=pid,used_memory``); None when it cannot be told."""
    if app.gpu_uuid:
        return next((c.index for c in cards if c.uuid == app.gpu_uuid), None)
    return cards[0].index if len(cards) == 1 else None


def held_by(root_pid: int, apps: Sequence[GpuApp], ancestry: Ancestry,
            cards: Sequence[GpuCard]) -> dict[int, int]:
    """GPU index -> MiB the processes at and below ``root_pid`` hold there (a GPU where they
    hold nothing is absent; an app whose holding nvidia-smi does not report counts 0)."""
    held: dict[int, int] = {}
    if root_pid <= 0:
        return held
    for app in apps:
        if root_pid not in ancestry.get(app.pid, (app.pid,)):
            continue
        index = card_of(app, cards)
        if index is not None:
            held[index] = held.get(index, 0) + (app.used_mib or 0)
    return held


def reported(root_pid: int, apps: Sequence[GpuApp], ancestry: Ancestry) -> bool:
    """Whether nvidia-smi gave a figure for every process of the container it lists (False
    when one shows ``[N/A]``: its holding cannot be judged)."""
    return all(app.used_mib is not None for app in apps
               if root_pid in ancestry.get(app.pid, (app.pid,)))


CUT_SLACK_MIB = 128  # how much less beside its pool than before a warm process may hold


@dataclass(frozen=True)
class Holding:
    """One process's GPU memory on one card: its planned pool, what it holds there, and what
    this model's processes held beside their pools on this card before (0: not known).

    A pool the allocator cut is short by at least a tenth (one 0.9 step). Held memory counts
    what the process holds beside its pool too (530-940 MiB on an H200), which can hide a cut
    of a small pool; so a warm process is also judged against what this model's warm
    processes held beside their pools on this card at the last deploy: holding less than
    that, by more than the slack (5% of the pool, at least ``CUT_SLACK_MIB``), is a cut."""

    gpu: int
    planned_mib: int  # fraction x CUDA's total on this card
    held_mib: int  # nvidia-smi's figure: pool and what it holds beside it
    before_mib: int = 0  # what this model's warm process held beside its pool here before

    @property
    def slack_mib(self) -> int:
        """How much less beside its pool than before is still taken for a whole pool."""
        return max(CUT_SLACK_MIB, self.planned_mib // 20)

    @property
    def expected_mib(self) -> int:
        """The least a process with its whole pool holds."""
        if self.before_mib <= 0:
            return self.planned_mib
        return max(self.planned_mib, self.planned_mib + self.before_mib - self.slack_mib)

    @property
    def short(self) -> bool:
        """It holds less than a whole pool (and what it held beside it before) allows: the
        allocator cut its pool."""
        return self.held_mib < self.expected_mib

    @property
    def beside_pool_mib(self) -> int:
        """What it holds beside its pool (0 when it holds less than the pool)."""
        return max(0, self.held_mib - self.planned_mib)


def shortfall_text(holding: Holding, *, fraction: float, cuda_mib: int) -> str:
    """What a short holding is, for a failed gate."""
    text = (f"GPU {holding.gpu}: holds {holding.held_mib} MiB; its planned pool is "
            f"{holding.planned_mib} MiB (fraction {fraction:.3f} x {cuda_mib} MiB CUDA total)")
    if holding.held_mib == 0:
        return text + (": nvidia-smi on the host lists no process of the container on this GPU "
                       "(it runs without its GPU, a CPU-only image say; or this nvidia-smi does "
                       "not name processes by their host pid)")
    if holding.held_mib >= holding.planned_mib:
        text += (f", and this model's processes held {holding.before_mib} MiB beside their "
                 f"pools here before: a whole pool would hold at least "
                 f"{holding.expected_mib} MiB")
    return text + (": the GPU had too little free memory when it allocated, and TensorFlow's "
                   "allocator cut the pool (0.9x steps) instead of failing")


SHORT_POOL_FIX = ("lower the model's memory_mib or gpu_safety_margin if measured lower, place "
                  "fewer models on the GPU, or roll it with strategy 'recreate' (stops the old "
                  "release first: not zero-downtime); `nvidia-smi` on the host shows what else "
                  "holds the GPU")
