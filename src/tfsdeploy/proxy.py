"""The per-host traffic switch: HAProxy owns the stable ports and forwards to one slot.

A switch is a handful of runtime-API commands (no reload): the new slot becomes ``ready``, the
old one ``drain`` (in-flight requests finish, new ones go to the new slot), then ``maint``
once its current sessions reach zero. Building commands and parsing answers is pure; talking
to the socket goes through an SSH tunnel (``remote.Runner.tunnel``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from tfsdeploy.catalog import Model
from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.layout import SLOTS, Ports
from tfsdeploy.remote import Runner
from tfsdeploy.render import _environment, templates_dir

BACKENDS = ("grpc", "rest")


def render_proxy_config(host: ResolvedHost, model: Model, ports: Ports, active: str) -> str:
    """haproxy.cfg with ``active`` serving and the other slot disabled."""
    env = _environment(str(templates_dir()))
    return env.get_template("haproxy.cfg.j2").render(host=host, model=model, ports=ports,
                                                     slots=SLOTS, active=active)


def switch_commands(new: str, old: str | None) -> list[str]:
    """Runtime commands that send new requests to ``new`` and start draining ``old``.

    With no live old release (its container died), the other slot goes straight to
    maintenance so that no request is sent to a dead server.
    """
    commands = [f"set server {b}/{new} state ready" for b in BACKENDS]
    if old:
        return commands + [f"set server {b}/{old} state drain" for b in BACKENDS]
    other = next(s for s in SLOTS if s != new)
    return commands + maint_commands(other)


def maint_commands(slot: str) -> list[str]:
    """Take ``slot`` out of service once it is drained."""
    return [f"set server {b}/{slot} state maint" for b in BACKENDS]


def parse_sessions(stat_csv: str) -> dict[tuple[str, str], int]:
    """(backend, server) -> current sessions, from ``show stat`` CSV."""
    text = stat_csv.lstrip("# ")
    sessions: dict[tuple[str, str], int] = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") in SLOTS and row.get("pxname") in BACKENDS:
            sessions[(row["pxname"], row["svname"])] = int(row.get("scur") or 0)
    return sessions


def parse_states(stat_csv: str) -> dict[tuple[str, str], str]:
    """(backend, server) -> status (UP, DRAIN, MAINT, no check ...), from ``show stat``."""
    text = stat_csv.lstrip("# ")
    return {(row["pxname"], row["svname"]): row.get("status", "")
            for row in csv.DictReader(io.StringIO(text))
            if row.get("svname") in SLOTS and row.get("pxname") in BACKENDS}


class ProxyAdmin:
    """HAProxy's admin socket on a host's loopback, reached through SSH."""

    def __init__(self, runner: Runner, port: int) -> None:
        self._runner = runner
        self._port = port

    def send(self, commands: Sequence[str]) -> str:
        """Send commands in one session (``;``-separated) and return the answer."""
        sock = self._runner.tunnel(self._port)
        try:
            sock.sendall(("; ".join(commands) + "\n").encode())
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        finally:
            sock.close()
        answer = b"".join(chunks).decode(errors="replace")
        errors = [line for line in answer.splitlines()
                  if line.strip() and not line.startswith("#") and "," not in line]
        if any(e.lower().startswith(("unknown", "no such", "require", "invalid")) for e in errors):
            raise RuntimeError(f"HAProxy refused {list(commands)}: {answer.strip()}")
        return answer

    def stat(self) -> str:
        """``show stat`` CSV."""
        return self.send(["show stat"])
