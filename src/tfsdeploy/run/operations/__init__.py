"""The steps task lists name. Each is an operation: a generator that reads the host's job and
facts and yields the changes it makes (``changes``), then returns a one-line detail.

Running and ``--check`` drive the same generators: the executor applies each change, or the
planner only lists it. An operation never touches a host itself.

A step called ``gate_available`` in ``tasks/*.yml`` is ``operations.gates.gate_available``;
``OPERATIONS`` maps every name to its function, module by module: ``preflight``, ``stage``,
``roll``, ``gates``, ``finalize``, ``restore``, and ``custom`` (a playbook's own ``local``
and ``remote`` commands).
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from tfsdeploy.run.changes import Change

Ops = Generator[Change, None, str]
Operation = Callable[..., Ops]
OPERATIONS: dict[str, Operation] = {}


def operation(name: str) -> Callable[[Operation], Operation]:
    """Register a step under ``name`` for task lists."""
    def register(func: Operation) -> Operation:
        OPERATIONS[name] = func
        return func
    return register


def registry() -> dict[str, Operation]:
    """Every operation, by name (imports the modules that define them)."""
    from tfsdeploy.run.operations import (  # noqa: F401
        canary,
        custom,
        finalize,
        gates,
        preflight,
        prune,
        restore,
        roll,
        stage,
    )

    return OPERATIONS


def parameters(func: Operation) -> set[str]:
    """The parameters a task list may pass to an operation (all but the job)."""
    import inspect

    return set(inspect.signature(func).parameters) - {"job"}


__all__ = ["OPERATIONS", "Operation", "Ops", "operation", "parameters", "registry"]
