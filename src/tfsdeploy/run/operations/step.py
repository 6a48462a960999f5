"""What an operation is: a generator that reads the host's job and facts, yields the changes it
makes (``changes``) and returns a one-line detail; ``@operation(name)`` registers it under the
name task lists give it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator

from tfsdeploy.run.changes import Change

Ops = Generator[Change, None, str]
Operation = Callable[..., Ops]
OPERATIONS: dict[str, Operation] = {}
GATES: set[str] = set()  # the steps whose failure is a gate's verdict


def operation(name: str, *, gate: bool = False) -> Callable[[Operation], Operation]:
    """Register a step under ``name`` for task lists (``gate``: its failure is a gate's
    verdict: the run's ``gate_failed`` event, the release record's gate times)."""
    def register(func: Operation) -> Operation:
        OPERATIONS[name] = func
        if gate:
            GATES.add(name)
        return func
    return register


def parameters(func: Operation) -> set[str]:
    """The parameters a task list may pass to an operation (all but the job)."""
    return set(inspect.signature(func).parameters) - {"job"}
