"""GPU memory planning for the dual-version window (pure).

TensorFlow's default fraction 0 takes nearly all free GPU memory, so a second TFServing on the
same GPU fails to start. Every release therefore gets an explicit
``--per_process_gpu_memory_fraction`` sized from the model's footprint, and the old and the new
release must both fit during the window. The fraction applies to what CUDA can allocate
(nvidia-smi's ``memory.total`` less ``memory.reserved``: ``Gpu.cuda_mib``), not to
``memory.total``: TensorFlow's pool is ``fraction x`` cuMemGetInfo's total
(tensorflow/core/common_runtime/gpu/gpu_device.cc, SingleVirtualDeviceMemoryLimit). Each
process also holds memory beside its pool (CUDA context, cuBLAS, cuDNN: host var
``gpu_context_mib``, or what the host measured when larger); the window counts one per process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tfsdeploy.core.errors import Problem
from tfsdeploy.core.inventory.catalog import Model
from tfsdeploy.core.inventory.fleet import ResolvedHost


@dataclass(frozen=True)
class GpuPlan:
    """The fraction one release of ``model`` gets on ``host``, with the window arithmetic.

    Each TFServing process holds its fraction x the GPU's memory (TensorFlow's allocator
    pool) plus a CUDA context outside it (``context_mib``, the host var gpu_context_mib), on
    every GPU it sees. The window counts both for every process resident at once: one per
    other model placed on the host, and ``slots`` of this model."""

    host: str
    model: str
    gpu_memory_mib: int  # what CUDA can allocate: nvidia-smi's total less its reserved memory
    footprint_mib: int
    margin: float
    headroom: float
    fraction: float
    others: float  # fractions held by the other models on this host (one release each)
    slots: int = 2  # releases of this model resident at once: 2 in a dual-version window
    context_mib: int = 0  # per process, outside its fraction
    other_models: int = 0  # processes of the other models on this host
    where: str = "this GPU"  # "GPU 1" on a host with several
    reserved_mib: int = 0  # nvidia-smi's memory.reserved (memory.total = this + the CUDA total)

    @property
    def total_mib(self) -> int:
        """The GPU's memory as nvidia-smi's ``memory.total`` reports it."""
        return self.gpu_memory_mib + self.reserved_mib

    @property
    def pool_mib(self) -> int:
        """The allocator pool one process of this release gets: fraction x CUDA's total
        (TensorFlow computes it in bytes and truncates; so does this, in MiB)."""
        return pool_mib(self.fraction, self.gpu_memory_mib)

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

    def memory(self) -> str:
        """Both figures of the GPU's memory: what nvidia-smi reports and what CUDA can
        allocate (the one fractions apply to)."""
        return (f"CUDA total {self.gpu_memory_mib} MiB = {self.total_mib} MiB (nvidia-smi "
                f"memory.total) - {self.reserved_mib} MiB (memory.reserved)")

    def arithmetic(self) -> str:
        """The numbers, for error messages, `fab render`'s lines and the flags file."""
        window = (f"window = {self.others:.3f} (other models) + {self.slots} x "
                  f"{self.fraction:.3f} = {self.fractions_total:.3f}")
        if self.context_mib:
            window = (f"window = {self.others:.3f} (other models) + {self.slots} x "
                      f"{self.fraction:.3f} + {self.processes} x {self.context_mib} MiB beside "
                      f"each pool / {self.gpu_memory_mib} MiB = {self.fractions_total:.3f} + "
                      f"{self.contexts:.3f} = {self.window_total:.3f}")
        return (f"{self.memory()}; fraction = ceil({self.footprint_mib} MiB x {self.margin} / "
                f"{self.gpu_memory_mib} MiB, 3 places) = {self.fraction:.3f}, pool "
                f"{self.pool_mib} MiB per process; {window}, "
                f"limit 1 - {self.headroom} = {self.limit:.3f}")


def release_fraction(footprint_mib: int, margin: float, gpu_memory_mib: int) -> float:
    """Smallest fraction, rounded up to 3 places, that holds footprint x margin."""
    return math.ceil(footprint_mib * margin / gpu_memory_mib * 1000 - 1e-9) / 1000


def pool_mib(fraction: float, cuda_mib: int) -> int:
    """The allocator pool a process with ``fraction`` gets on a GPU where CUDA can allocate
    ``cuda_mib``."""
    return int(fraction * cuda_mib + 1e-9)


@dataclass(frozen=True)
class InstancePlan:
    """One TFServing instance of a model on a host: the host GPUs it sees (``gpus``, empty on
    a host without GPU) and its memory plan (None without GPU)."""

    index: int
    gpus: tuple[int, ...]
    plan: GpuPlan | None


def instance_gpus(host: ResolvedHost, model: Model) -> list[tuple[int, ...]]:
    """The host GPUs of each instance of ``model`` on ``host`` (pure): one instance per GPU
    (``per_gpu``), one seeing them all (``host``), or one with no GPU on a host without."""
    chosen = [g.index for g in host.gpus if model.gpus is None or g.index in model.gpus]
    if not chosen:
        return [()]
    if model.placement == "host":
        return [tuple(chosen)]
    return [(index,) for index in chosen]


def plan_instances(host: ResolvedHost, model: Model, co_located: Sequence[Model] = ()
                   ) -> tuple[InstancePlan, ...]:
    """Every instance of ``model`` on ``host`` with its fraction and the window arithmetic of
    the GPUs it sees.

    ``co_located`` are the models the inventory places on the same host: each keeps one
    release resident on every GPU one of its instances sees while this one rolls. An instance
    seeing several GPUs is sized by the smallest (TensorFlow applies one fraction to every GPU
    a process sees) and judged on its most crowded GPU.
    """
    memory = {g.index: g.cuda_mib for g in host.gpus}
    reserved = {g.index: g.reserved_mib for g in host.gpus}
    others = [m for m in co_located if m.name != model.name]
    seen = {m.name: {i for g in instance_gpus(host, m) for i in g} for m in others}
    plans = []
    for index, gpus in enumerate(instance_gpus(host, model)):
        if not gpus:
            plans.append(InstancePlan(index, (), None))
            continue
        smallest = min(gpus, key=lambda g: memory[g])
        plans.append(InstancePlan(index, gpus, max(
            (_plan_on(host, model, memory[smallest], reserved[smallest],
                      [m for m in others if card in seen[m.name]],
                      f"GPU {card}" if len(memory) > 1 else "this GPU") for card in gpus),
            key=lambda p: p.window_total)))
    return tuple(plans)


def _plan_on(host: ResolvedHost, model: Model, memory: int, reserved: int,
             others: Sequence[Model], where: str) -> GpuPlan:
    margin, headroom = host.vars.gpu_safety_margin, host.vars.gpu_headroom
    return GpuPlan(host=host.name, model=model.name, gpu_memory_mib=memory,
                   footprint_mib=model.memory_mib, margin=margin, headroom=headroom,
                   fraction=release_fraction(model.memory_mib, margin, memory),
                   others=round(sum(release_fraction(m.memory_mib, margin, memory)
                                    for m in others), 6),
                   slots=1 if model.rollout.strategy == "recreate" else 2,
                   context_mib=host.vars.gpu_context_mib, other_models=len(others),
                   where=where, reserved_mib=reserved)


def check_gpu_plan(plan: GpuPlan, file: str) -> list[Problem]:
    """Refuse plans that cannot hold the window's processes, naming the numbers."""
    alone = plan.fraction + plan.context_mib / plan.gpu_memory_mib
    if alone > 1.0 or plan.window_total > plan.limit:
        return [Problem(
            f"{plan.model} does not fit {plan.where} ({plan.slots} release(s) at once): "
            f"{plan.arithmetic()}",
            fix="give the host a larger GPU, lower the model's memory_mib or gpu_safety_margin "
                "if measured lower, or choose rollout strategy 'recreate' for this model "
                "(stops the old release first: not zero-downtime)",
            host=plan.host, file=file, field="per_process_gpu_memory_fraction")]
    return []
