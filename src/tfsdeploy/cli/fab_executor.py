"""Fabric's executor, letting `fab exec --model M -- CMD ...` keep its command.

Fabric treats anything after ``--`` as an ad-hoc command for ``-H`` hosts; ``fab exec`` takes it
as the command to run in the model's serving containers instead (its hosts come from the
inventory, never from ``-H``).
"""

from __future__ import annotations

from typing import Any

from fabric.executor import Executor as FabricExecutor

TAKES_REMAINDER = frozenset({"exec"})


class Executor(FabricExecutor):  # type: ignore[misc]
    """Fabric's executor; the remainder belongs to a task that takes it."""

    def expand_calls(self, calls: Any, apply_hosts: bool = True) -> Any:
        """As Fabric's, without the ad-hoc remainder task when ``exec`` runs."""
        names = {getattr(getattr(c, "task", c), "name", "") for c in calls}
        if self.core.remainder and names & TAKES_REMAINDER:
            self.remainder, self.core.remainder = self.core.remainder, ""
        return super().expand_calls(calls, apply_hosts)
