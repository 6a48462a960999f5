"""A playbook's own remote steps (the ``remote`` action): the step's argv run on the host as
given, with the run's variables in its environment (a pure argv builder)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfsdeploy.hosts.commands import Argv

# `env NAME=V ... argv` alone would parse the step's own argv: env takes every leading word
# holding '=' as one more assignment (POSIX env; GNU coreutils env.c assigns while
# strchr(argv[optind], '=')), so `argv: [A=1, prog]` ran prog with A=1 set instead of the
# program named "A=1". env therefore runs sh with a constant script, and sh runs its
# positional parameters as one simple command: words that come from an expansion are never
# assignments (POSIX Shell Command Language 2.9.1: assignments are recognised before
# expansion) and a simple command's first field is its name, never an option. Not `exec`:
# bash's exec parses options (`exec -x` is "invalid option") and dash's takes `--` for the
# command's name, so neither `exec "$0"` nor `exec -- "$0"` runs every argv as given.
RUN_AS_GIVEN = '"$0" "$@"'


def remote_step(variables: Mapping[str, str], argv: Sequence[str]) -> Argv:
    """``argv`` run on the host exactly as given, its environment holding ``variables``."""
    return ["env", *(f"{k}={v}" for k, v in sorted(variables.items())),
            "sh", "-c", RUN_AS_GIVEN, *argv]
