#!/usr/bin/env python3
"""Another process taking a testbed host's GPU memory, as any program on a GPU host can: it
leaves ``LEAVE_MIB`` free on one GPU and holds the rest until killed (at most 10 minutes).

Usage: gpu_filler.py SIMGPU_DIR GPU LEAVE_MIB PIDFILE. Run as a playbook's `local` step: it
returns once the memory is held, the holder's pid in PIDFILE (the test kills it by that pid).
The holding is a simulated-GPU record (docs/testbed-contract.md): a procs/<token>.json under
an exclusive flock its owner keeps, written while holding the directory's lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path


def used_mib(procs: Path, gpu: int) -> int:
    """What the live records hold on ``gpu`` (a record whose flock can be taken is dead)."""
    used = 0
    for path in procs.glob("*.json"):
        try:
            with open(path) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    continue  # no live owner
                except BlockingIOError:
                    record = json.loads(handle.read() or "{}")
        except (OSError, ValueError):
            continue
        if int(record.get("gpu", -1)) == gpu:
            used += int(record.get("used_mib", 0))
    return used


def hold(directory: Path, gpu: int, leave: int, pidfile: Path) -> None:
    gpus = json.loads((directory / "gpus.json").read_text())["gpus"]
    card = next(g for g in gpus if int(g["index"]) == gpu)
    total = int(card["memory_total_mib"]) - int(card.get("memory_reserved_mib", 0))
    record = directory / "procs" / f"gpu-filler-{os.getpid()}.json"
    with open(directory / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        take = total - used_mib(directory / "procs", gpu) - leave
        handle = open(record, "w")  # noqa: SIM115 (held for the process lifetime)
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"gpu": gpu, "used_mib": max(0, take), "pid": os.getpid(),
                                 "process_name": "gpu-filler", "container": "none"}))
        handle.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # let go of the memory at once
    pidfile.write_text(f"{os.getpid()}\n")
    try:
        time.sleep(600)
    finally:
        record.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    directory, gpu, leave, pidfile = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    pidfile.unlink(missing_ok=True)
    if os.fork() == 0:  # the holder: its own session, no terminal, outlives the step
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        hold(directory, gpu, leave, pidfile)
        os._exit(0)
    for _ in range(200):  # the step returns once the memory is held
        if pidfile.exists() and pidfile.read_text().strip():
            return 0
        time.sleep(0.05)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
