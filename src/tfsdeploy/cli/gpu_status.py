"""`fab status`'s GPU memory column: per instance the pool its release planned and what its
serving process holds (``run.gpu_views`` reads them), then what processes were measured to hold
beside their pools per GPU."""

from __future__ import annotations

from typing import Any


def gpu_cell(row: dict[str, Any]) -> str:
    """The table's cell: planned/held MiB per instance, then what was measured beside the
    pools per GPU."""
    instances = row.get("instances") or []
    several = len(instances) > 1
    parts = []
    for instance in instances:
        memory = instance.get("gpu_memory_mib")
        if memory:
            held = "?" if memory["held"] is None else str(memory["held"])
            label = f"i{instance['instance']} " if several else ""
            parts.append(f"{label}{memory['planned']}/{held}")
    beside = row.get("gpu_beside_pool_mib") or {}
    text = ", ".join(parts) or "-"
    if beside:
        text += "; beside pool " + ", ".join(f"GPU {g} {v['mib']}" for g, v in beside.items())
    return text
