"""A playbook's own steps: a command on the deploy machine (``local``) or on the host
(``remote``), with a timeout and a failure policy. In the roll phase they fail and restore like
any other step; ``--check`` lists them.

Both get the run's facts as environment variables: TFSDEPLOY_HOST, TFSDEPLOY_ADDRESS,
TFSDEPLOY_MODEL, TFSDEPLOY_VERSION, TFSDEPLOY_RELEASE, TFSDEPLOY_INSTANCE, TFSDEPLOY_SLOT (the new
release's) and
TFSDEPLOY_SLOT_GRPC_PORT / TFSDEPLOY_SLOT_REST_PORT (its ports, to test the release before
it takes traffic).
"""

from __future__ import annotations

from typing import Any

from tfsdeploy.hosts.commands.steps import remote_step
from tfsdeploy.run.changes import Command, LocalCommand
from tfsdeploy.run.jobs import HostJob
from tfsdeploy.run.operations.step import Ops, operation


def run_variables(job: HostJob) -> dict[str, str]:
    """What a custom step knows of the run and the host."""
    return {"TFSDEPLOY_HOST": job.name, "TFSDEPLOY_ADDRESS": job.host.address,
            "TFSDEPLOY_MODEL": job.model.name, "TFSDEPLOY_VERSION": str(job.run.version),
            "TFSDEPLOY_RELEASE": job.run.release_id, "TFSDEPLOY_SLOT": job.new_slot,
            "TFSDEPLOY_INSTANCE": str(job.instance.index),
            "TFSDEPLOY_SLOT_GRPC_PORT": str(job.ports.slot_grpc(job.new_slot, job.instance.index)),
            "TFSDEPLOY_SLOT_REST_PORT": str(job.ports.slot_rest(job.new_slot, job.instance.index))}


def _codes(ignore_errors: bool) -> tuple[int, ...]:
    return tuple(range(256)) if ignore_errors else (0,)


@operation("local")
def local(job: HostJob, argv: list[str], timeout_s: float = 60.0,
          ignore_errors: bool = False) -> Ops:
    """Run ``argv`` on the deploy machine (once per host, with that host's variables)."""
    env = tuple(sorted(run_variables(job).items()))
    yield LocalCommand(tuple(argv), env, timeout_s, _codes(ignore_errors))
    return ""


@operation("remote")
def remote(job: HostJob, argv: list[str] | None = None, shell: str | None = None,
           timeout_s: float = 60.0, ignore_errors: bool = False) -> Ops:
    """Run ``argv`` on the host (an argument list, quoted once); ``shell`` runs a shell
    command line instead, when a step really needs the shell."""
    command = [*argv] if argv else ["sh", "-c", shell or ""]
    yield Command.of(remote_step(run_variables(job), command),
                     f"run on the host: {' '.join(command)}", timeout=timeout_s,
                     ok_codes=_codes(ignore_errors))
    return ""


def check_remote(params: dict[str, Any]) -> list[str]:
    """Exactly one of ``argv`` and ``shell``, neither empty."""
    given = [k for k in ("argv", "shell") if params.get(k)]
    return [] if len(given) == 1 else ["give exactly one of `argv: [...]` (preferred) and "
                                       "`shell: \"...\"`"]


def check_local(params: dict[str, Any]) -> list[str]:
    """A non-empty argument list."""
    return [] if params.get("argv") else ["give `argv: [command, arg, ...]`"]


remote.check_params = check_remote  # type: ignore[attr-defined]
local.check_params = check_local  # type: ignore[attr-defined]
