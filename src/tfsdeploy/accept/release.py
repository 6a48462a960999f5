"""The release in the window: ``fab deploy --model M --version V`` as a subprocess of this
checkout's ``fab``, started at a given instant, its output kept in a log and echoed.

A subprocess keeps the acceptance run independent of the deploy's Python API, and the deploy
runs exactly as a person would run it (its own lock, gates, exit codes). It is never killed:
a deploy stopped half-way could leave the fleet inconsistent, so the run waits for its end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tfsdeploy.accept.rows import ReleaseOutcome


def fab_command(root: Path) -> list[str]:
    """This checkout's ``fab``: the one beside this interpreter, else the one on PATH, run
    with the checkout's tasks.py (``--search-root``)."""
    beside = Path(sys.executable).with_name("fab")
    fab = str(beside) if beside.exists() else (shutil.which("fab") or "fab")
    return [fab, "--search-root", str(root)]


def deploy_argv(root: Path, *, model: str, version: int, inventory: str) -> list[str]:
    """The deploy command line (pure apart from locating ``fab``)."""
    return [*fab_command(root), "deploy", "--model", model, "--version", str(version),
            "--inventory", inventory]


def run_release(argv: list[str], *, cwd: Path, version: int, at_wall_s: float,
                start_wall_s: float, log: Path, abort: threading.Event) -> ReleaseOutcome:
    """Wait until ``at_wall_s`` (unless ``abort`` is set first), run the deploy to its end.

    Times in the outcome are seconds after ``start_wall_s`` (the window's start).
    """
    if abort.wait(timeout=max(at_wall_s - time.time(), 0.0)):
        return ReleaseOutcome(version, tuple(argv), None, None, None, str(log),
                              skipped="the load had already failed")
    started = time.time()
    print(f"release: fab deploy --version {version} started at {started - start_wall_s:.1f} s "
          f"(log: {log})", flush=True)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "COLUMNS": "160"})
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            print(f"  [deploy] {line.rstrip()}", flush=True)
        code = proc.wait()
    ended = time.time()
    print(f"release: deploy v{version} exited {code} at {ended - start_wall_s:.1f} s",
          flush=True)
    return ReleaseOutcome(version, tuple(argv), started - start_wall_s, ended - start_wall_s,
                          code, str(log))
