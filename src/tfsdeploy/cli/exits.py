"""How every command ends: its exit code, whatever happens. A toolkit error gives its own; any
other exception (a defect) gives 1 when it came before any host was changed (a run in
progress records where it stands, 3 after a change), one clear line, the traceback only with
``--debug`` (or TFSDEPLOY_DEBUG=1), and ``--json-file``/``--metrics-file`` still written."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable

from tfsdeploy.cli.output import print_error
from tfsdeploy.cli.unattended import update_textfile, write_json_file
from tfsdeploy.core.errors import ExitCode, TfsDeployError


def debugging() -> bool:
    """Whether tracebacks are wanted (``fab --debug`` or TFSDEPLOY_DEBUG=1)."""
    return os.environ.get("TFSDEPLOY_DEBUG") == "1" or "--debug" in sys.argv or "-d" in sys.argv


Outputs = Callable[[int, str], None]


def run_command(body: Callable[[], int], *, record: Outputs | None = None) -> int:
    """Run a command's body; map every way it can end to its exit code and one clear line."""
    try:
        return body()
    except TfsDeployError as error:
        code = int(error.exit_code)
        message = str(error)
        print_error(error)
    except KeyboardInterrupt:
        code, message = int(ExitCode.INVALID), "interrupted before any host was changed"
        print(f"tfsdeploy: {message}", file=sys.stderr)
    except Exception as error:  # a defect: still a documented exit code and outputs
        code, message = int(ExitCode.INVALID), f"unexpected {type(error).__name__}: {error}"
        print_error(error)
        if debugging():
            traceback.print_exc()
    if record is not None:
        record(code, message)
    return code


def unattended_outputs(command: str, model: str, json_file: str | None,
                       metrics_file: str | None) -> Outputs:
    """Write the JSON result and metrics of a run that ended early (invalid input, lock held,
    a defect): cron and dashboards still see it."""
    started = time.monotonic()

    def record(code: int, message: str) -> None:
        try:
            if json_file:
                write_json_file(json_file, {
                    "command": command, "model": model, "exit_code": code,
                    "result": ExitCode(code).name.lower(), "message": message, "hosts": {}})
            if metrics_file:
                update_textfile(metrics_file, model=model, command=command, exit_code=code,
                                seconds=time.monotonic() - started, release="", version=None)
        except (OSError, ValueError) as error:  # the paths were refused, or the disk is full
            print(f"tfsdeploy: the result could not be written: {error}", file=sys.stderr)

    return record
