"""A free TCP port on 127.0.0.1 for a server a test starts (test support).

A port that ``bind(("127.0.0.1", 0))`` returns comes from the kernel's ephemeral range, the
range it also gives every outgoing connection its local port from: in the seconds between the
test closing its probe and the server binding the port (an emulator imports TensorFlow first),
a connection of another test (a load generator's, an SSH client's) may take it, and the server
then fails with "Address already in use" (seen once in a full run). ``free_port`` picks below
that range, where the kernel hands out nothing by itself, from a block of its own per xdist
worker (a run without xdist, as scripts/test's alone phase beside the workers of the fleet-free
tiers, has the last block), and never twice in one process.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

LOWEST = 20000
BLOCKS = 8  # xdist workers that get a block of their own (more share them, round robin)

_given: set[int] = set()  # the ports this process handed out (its servers may not bind yet)
_giving = threading.Lock()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port nothing is bound to on 127.0.0.1 right now, below the ephemeral range, in
    this worker's block (see the module's docstring)."""
    top = ephemeral_low()
    if top - LOWEST < BLOCKS * 100:
        raise RuntimeError(f"the ephemeral range starts at {top}: too low for the tests' ports "
                           f"(they need {LOWEST}..{LOWEST + BLOCKS * 100})")
    size = (top - LOWEST) // BLOCKS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    block = int(worker) % (BLOCKS - 1) if worker.isdigit() else BLOCKS - 1
    first = LOWEST + block * size
    for port in random.sample(range(first, first + size), k=min(size, 200)):
        with _giving, socket.socket() as sock:
            if port in _given:
                continue
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _given.add(port)
            return port
    raise RuntimeError(f"no free port among 200 tried in {first}..{first + size - 1}")
