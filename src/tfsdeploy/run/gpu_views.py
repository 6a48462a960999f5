"""`fab status`'s GPU memory: per instance the pool its release planned and what its serving
process really holds (nvidia-smi on the host), and per GPU what processes were last measured
to hold beside their pools. Healthy: held >= planned (the process holds its pool and its
CUDA context, cuBLAS and cuDNN beside it)."""

from __future__ import annotations

from typing import Any

from tfsdeploy.core.gpu.records import measured_overhead
from tfsdeploy.core.inventory.gpu import pool_mib
from tfsdeploy.core.rollout.records import ReleaseRecord
from tfsdeploy.hosts.facts import HostFacts
from tfsdeploy.hosts.gpu_memory import with_holdings
from tfsdeploy.hosts.ssh import Connection


def instance_memory(facts: HostFacts, record: ReleaseRecord | None, instance: int
                    ) -> dict[str, int | None] | None:
    """``{"planned": N, "held": N}`` in MiB for one instance's serving process (held None:
    no process of it found on the GPU), or None for an instance without GPU."""
    planned = next((i for i in record.instances if i.index == instance), None) if record \
        else None
    if planned is None or planned.gpu_fraction is None or not planned.gpus:
        return None
    cards = {c.index: c for c in facts.gpus}
    pool = sum(pool_mib(planned.gpu_fraction, cards[g].cuda_mib) for g in planned.gpus
               if g in cards)
    serving = facts.serving(instance)
    held = facts.gpu_held(serving.name) if serving is not None else None
    return {"planned": pool,
            "held": sum(held.get(g, 0) for g in planned.gpus) if held is not None else None}


def overhead(facts: HostFacts) -> dict[str, dict[str, Any]]:
    """GPU index -> the largest memory a process was measured to hold beside its pool there
    (any model): MiB, model, release, when."""
    found = {}
    for card in facts.gpus:
        top = measured_overhead(list(facts.gpu_truth.overhead), card.index)
        if top is not None:
            found[str(card.index)] = {"mib": top.overhead_mib, "model": top.model,
                                      "release": top.release, "at": top.at}
    return found


def add_gpu_memory(row: dict[str, Any], conn: Connection, facts: HostFacts,
                   record: ReleaseRecord | None) -> dict[str, Any]:
    """The status row with ``gpu_memory_mib`` on each instance and ``gpu_beside_pool_mib``
    on the host (what the processes hold is read now, over ``conn``)."""
    facts = with_holdings(conn, facts)
    for instance in row["instances"]:
        instance["gpu_memory_mib"] = instance_memory(facts, record, instance["instance"])
    row["gpu_beside_pool_mib"] = overhead(facts)
    return row
