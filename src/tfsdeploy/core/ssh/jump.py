"""A jump host as OpenSSH's ``ProxyJump`` names it, ``[user@]host[:port]`` (pure).

The inventory's ``ssh_proxy_jump`` takes one hop in that form: ssh(1) reads ``-J`` and
``ProxyJump`` with ``parse_ssh_uri`` / ``parse_user_host_port`` (misc.c), a user before the
last ``@``, an IPv6 address in brackets, a port after the last ``:``. A chain of hops
(``a,b``) stays the business of ``~/.ssh/config``, which the toolkit reads too.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_SHAPE = re.compile(r"(?:(?P<user>[^@]*)@)?(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]@]*))"
                    r"(?::(?P<port>[0-9]{1,5}))?")


@dataclass(frozen=True)
class JumpHost:
    """One hop: who logs in (None: ssh_config's ``User`` for it, else the local user, as
    OpenSSH), where, on which port."""

    address: str
    port: int = 22
    user: str | None = None

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"


def _is_address(value: str) -> bool:
    """An IP address, or a DNS name (RFC 1123) that is not all digits."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return (len(value) <= 253 and bool(_HOSTNAME.fullmatch(value))
                and not value.replace(".", "").isdigit())


def jump_problem(value: str) -> str | None:
    """Why ``value`` is not ``[user@]host[:port]`` (or None)."""
    if "," in value:
        return "names more than one hop (put a chain in ~/.ssh/config's ProxyJump)"
    found = _SHAPE.fullmatch(value)
    if found is None:
        return "is not [user@]host[:port]"
    user, port = found["user"], found["port"]
    address = found["v6"] if found["v6"] is not None else found["host"]
    if user is not None and not _USER.fullmatch(user):
        return "has a user that is not a user name ([A-Za-z0-9_][A-Za-z0-9_.-]*)"
    if not address or not _is_address(address):
        return "has a host that is neither an IP address nor a DNS name"
    if found["v6"] is not None and ":" not in address:
        return "has brackets around something that is not an IPv6 address"
    if port is not None and not 1 <= int(port) <= 65535:
        return "has a port outside 1-65535"
    return None


def parse_jump(value: str) -> JumpHost:
    """The hop ``value`` names; ValueError when ``jump_problem`` finds one."""
    problem = jump_problem(value)
    found = _SHAPE.fullmatch(value)
    if problem is not None or found is None:
        raise ValueError(f"ssh_proxy_jump {value!r} {problem}")
    address = found["v6"] if found["v6"] is not None else found["host"]
    return JumpHost(address=address, port=int(found["port"] or 22), user=found["user"])
