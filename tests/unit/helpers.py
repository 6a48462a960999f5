"""Small builders for inventories in unit tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tfsdeploy.core.inventory.catalog import Batching, Model, Signature, TensorSpec
from tfsdeploy.core.inventory.fleet import Gpu, Group, Host
from tfsdeploy.core.inventory.load import Inventory, build_inventory

SIGNATURE = Signature(inputs={"x": TensorSpec("DT_FLOAT", (-1, 1))},
                      outputs={"y": TensorSpec("DT_FLOAT", (-1, 1))})


def model(**changes: Any) -> Model:
    """A valid model, with ``changes`` applied."""
    base = Model(name="m", source="/nonexistent/m", signature=SIGNATURE, memory_mib=1024,
                 latency_slo_ms=60,
                 batching=Batching(max_batch_size=8, batch_timeout_micros=2000,
                                   max_enqueued_batches=8, num_batch_threads=1,
                                   allowed_batch_sizes=(4, 8)))
    return replace(base, **changes)


def inventory(*, models: list[Model] | None = None, host_vars: dict[str, Any] | None = None,
              defaults: dict[str, Any] | None = None, gpu_mib: int = 16384) -> Inventory:
    """Two hosts in group g, one model."""
    hosts = [Host("h1", "10.0.0.1", gpus=[Gpu(0, gpu_mib)], vars=host_vars or {}),
             Host("h2", "10.0.0.2", gpus=[Gpu(0, gpu_mib)])]
    return build_inventory("inv.py", hosts=hosts, groups={"g": Group(["h1", "h2"])},
                           defaults=defaults or {}, models=models or [model()])
