"""The steps task lists name. Each is an operation (``step``): a generator that reads the host's
job and facts and yields the changes it makes, then returns a one-line detail.

Running and ``--check`` drive the same generators: the executor applies each change, or the
planner only lists it. An operation never touches a host itself.

A step called ``gate_available`` in ``tasks/*.yml`` is ``operations.gates.gate_available``;
``registry()`` maps every name to its function, module by module: ``preflight``, ``stage``,
``shape``, ``roll``, ``gates``, ``gpu`` (the GPU reservation and the holding gate), ``canary``,
``finalize``, ``restore``, ``prune``, ``retire``, ``scratch`` (`fab tune`'s leftovers) and
``custom`` (a playbook's own ``local`` and ``remote`` commands).
"""

from __future__ import annotations

from tfsdeploy.run.operations import (
    canary,
    custom,
    finalize,
    gates,
    gpu,
    preflight,
    prune,
    restore,
    retire,
    roll,
    scratch,
    shape,
    stage,
)
from tfsdeploy.run.operations.step import GATES, OPERATIONS, Operation

MODULES = (preflight, stage, shape, roll, gates, gpu, canary, finalize, restore, prune, retire,
           scratch, custom)


def registry() -> dict[str, Operation]:
    """Every operation, by name (each of ``MODULES`` registered its own when imported)."""
    return OPERATIONS


def is_gate(step: str) -> bool:
    """Whether ``step`` was registered as a gate (its failure is a gate's verdict)."""
    return step in GATES
