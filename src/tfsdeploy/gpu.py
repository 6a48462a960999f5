"""GPU memory planning for the dual-version window (pure).

TensorFlow's default fraction 0 takes nearly all free GPU memory, so a second TFServing on the
same GPU fails to start. Every release therefore gets an explicit
``--per_process_gpu_memory_fraction`` sized from the model's footprint, and the old and the new
release must both fit during the window. Each process also holds a CUDA context outside its
fraction (host var ``gpu_context_mib``); the window counts one per process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tfsdeploy.catalog import Model
from tfsdeploy.errors import Problem
from tfsdeploy.inventory import ResolvedHost


@dataclass(frozen=True)
class GpuPlan:
    """The fraction one release of ``model`` gets on ``host``, with the window arithmetic.

    Each TFServing process holds its fraction x the GPU's memory (TensorFlow's allocator
    pool) plus a CUDA context outside it (``context_mib``, the host var gpu_context_mib), on
    every GPU it sees. The window counts both for every process resident at once: one per
    other model placed on the host, and ``slots`` of this model."""

    host: str
    model: str
    gpu_memory_mib: int
    footprint_mib: int
    margin: float
    headroom: float
    fraction: float
    others: float  # fractions held by the other models on this host (one release each)
    slots: int = 2  # releases of this model resident at once: 2 in a dual-version window
    context_mib: int = 0  # per process, outside its fraction
    other_models: int = 0  # processes of the other models on this host

    @property
    def processes(self) -> int:
        """TFServing processes on the GPU during the window."""
        return self.other_models + self.slots

    @property
    def contexts(self) -> float:
        """Share of the GPU the processes' CUDA contexts take (rounded up to 3 places, as
        fractions are)."""
        return release_fraction(self.processes * self.context_mib, 1, self.gpu_memory_mib)

    @property
    def fractions_total(self) -> float:
        """Share the processes' fractions take while old and new release run side by side."""
        return round(self.others + self.slots * self.fraction, 6)

    @property
    def window_total(self) -> float:
        """GPU share in use while old and new release of this model run side by side."""
        return round(self.fractions_total + self.contexts, 6)

    @property
    def limit(self) -> float:
        """The most the GPU may be committed to: 1 - headroom (fragmentation, other users)."""
        return round(1.0 - self.headroom, 6)

    def arithmetic(self) -> str:
        """The numbers, for error messages and `fab render`'s summary."""
        window = (f"window = {self.others:.3f} (other models) + {self.slots} x "
                  f"{self.fraction:.3f} = {self.fractions_total:.3f}")
        if self.context_mib:
            window = (f"window = {self.others:.3f} (other models) + {self.slots} x "
                      f"{self.fraction:.3f} + {self.processes} x {self.context_mib} MiB CUDA "
                      f"context / {self.gpu_memory_mib} MiB = {self.fractions_total:.3f} + "
                      f"{self.contexts:.3f} = {self.window_total:.3f}")
        return (f"fraction = ceil({self.footprint_mib} MiB x {self.margin} / "
                f"{self.gpu_memory_mib} MiB, 3 places) = {self.fraction:.3f}; {window}, "
                f"limit 1 - {self.headroom} = {self.limit:.3f}")


def release_fraction(footprint_mib: int, margin: float, gpu_memory_mib: int) -> float:
    """Smallest fraction, rounded up to 3 places, that holds footprint x margin."""
    return math.ceil(footprint_mib * margin / gpu_memory_mib * 1000 - 1e-9) / 1000


def plan_gpu(host: ResolvedHost, model: Model, co_located: Sequence[Model] = ()
             ) -> GpuPlan | None:
    """The GPU plan of ``model`` on ``host``; None when the host has no GPU.

    ``co_located`` are the other models the inventory places on the same host: each keeps
    one release resident while this one rolls. A host's smallest GPU bounds the fraction,
    because TensorFlow applies one fraction to every GPU the process sees.
    """
    if not host.gpus:
        return None
    memory = min(g.memory_mib for g in host.gpus)
    margin, headroom = host.vars.gpu_safety_margin, host.vars.gpu_headroom
    others = [m for m in co_located if m.name != model.name]
    return GpuPlan(host=host.name, model=model.name, gpu_memory_mib=memory,
                   footprint_mib=model.memory_mib, margin=margin, headroom=headroom,
                   fraction=release_fraction(model.memory_mib, margin, memory),
                   others=round(sum(release_fraction(m.memory_mib, margin, memory)
                                    for m in others), 6),
                   slots=1 if model.rollout.strategy == "recreate" else 2,
                   context_mib=host.vars.gpu_context_mib, other_models=len(others))


def check_gpu_plan(plan: GpuPlan, file: str) -> list[Problem]:
    """Refuse plans that cannot hold the window's processes, naming the numbers."""
    alone = plan.fraction + plan.context_mib / plan.gpu_memory_mib
    if alone > 1.0 or plan.window_total > plan.limit:
        return [Problem(
            f"{plan.model} does not fit this GPU ({plan.slots} release(s) at once): "
            f"{plan.arithmetic()}",
            fix="give the host a larger GPU, lower the model's memory_mib or gpu_safety_margin "
                "if measured lower, or choose rollout strategy 'recreate' for this model "
                "(stops the old release first: not zero-downtime)",
            host=plan.host, file=file, field="per_process_gpu_memory_fraction")]
    return []
