"""Host-key checking plugged into paramiko: the known_hosts file read by the toolkit
(core/ssh/known_hosts.py), OpenSSH's decision (core/ssh/policy.py) run by a MissingHostKeyPolicy,
and a Transport that asks servers for their certificates.

Why not paramiko's own HostKeys: ``HostKeys.load`` raises ``InvalidHostKey`` on a marker line
(paramiko 3.x to 5.1 parse no markers; paramiko#771, #2277), it matches no patterns, and
``SSHClient.connect`` consults the policy only when none of its loaded keys names the host
(``client.py`` ``connect``), so a loaded key could never be vetoed by ``@revoked``. With
nothing loaded, every connection's key reaches the policy, which ``connect`` calls after the
key exchange and before any authentication: no credential is offered to a refused host.

Why the Transport: paramiko offers the certificate host-key algorithms after the plain ones
(``transport.py`` ``preferred_keys``), and a server picks the first one the client lists that
it has, so a server with a key and a certificate would always show the plain key, and a
file holding only a ``@cert-authority`` line would refuse it. OpenSSH lists certificates first
(``myproposal.h`` KEX_DEFAULT_PK_ALG) and reorders for the host's known keys
(``order_hostkeyalgs``); OrderedTransport does the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import paramiko

from tfsdeploy.core.ssh.known_hosts import (
    CERT_SUFFIX,
    KnownHost,
    certificates_first,
    order_algorithms,
    parse_known_hosts,
)
from tfsdeploy.core.ssh.policy import Verdict, check_host_key

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


class HostKeyRefused(paramiko.SSHException):
    """The host's key is not trusted by the known-hosts file: the message says why and how to
    fix it."""


def read_known_hosts(path: str | None) -> tuple[KnownHost, ...]:
    """The usable lines of ``path`` (the user's ~/.ssh/known_hosts when None); OSError when
    it cannot be read. Lines OpenSSH would skip are skipped, as it does."""
    return parse_known_hosts(Path(path or USER_KNOWN_HOSTS).expanduser()
                             .read_text(encoding="utf-8", errors="replace"))


def ca_signature_valid(ca_type: str, ca_blob: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` by the CA key verifies over ``data``. paramiko's verifiers check
    the signature's algorithm against the key (ed25519, the ECDSA curve) and accept for RSA
    only rsa-sha2-256 and rsa-sha2-512 (``rsakey.py`` HASHES)."""
    try:
        ca = paramiko.PKey.from_type_string(ca_type, ca_blob)
        return bool(ca.verify_ssh_sig(data, paramiko.Message(signature)))
    except Exception:  # an unknown, malformed or unsupported CA key: nothing verifies
        return False


def certificate_blob(key: paramiko.PKey) -> bytes | None:
    """The certificate a server presented, if it presented one: paramiko keeps the whole
    certificate as the key's ``public_blob`` and the certified key as the key itself."""
    blob = key.public_blob
    if blob is not None and blob.key_type.endswith(CERT_SUFFIX):
        return bytes(blob.key_blob)
    return None


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Trust a host's key only as OpenSSH would with the known-hosts file's lines; the host
    and port are the ones connected to (paramiko's own ``hostname`` argument carries the port
    as ``[host]:port``, but principals need the bare host)."""

    def __init__(self, entries: Sequence[KnownHost], *, address: str, port: int, source: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.entries, self.address, self.port = entries, address, port
        self.source, self.clock = source, clock
        self.verdict: Verdict | None = None

    def judge(self, key: paramiko.PKey) -> Verdict:
        """The verdict on ``key`` presented by the host."""
        return check_host_key(self.entries, address=self.address, port=self.port,
                              key_blob=key.asbytes(), cert_blob=certificate_blob(key),
                              now=int(self.clock()), check_signature=ca_signature_valid,
                              source=self.source)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        """Raise HostKeyRefused unless the key is trusted."""
        self.verdict = self.judge(key)
        if not self.verdict.trusted:
            raise HostKeyRefused(f"{self.verdict.detail}; fix: {self.verdict.fix}")


class OrderedTransport(paramiko.Transport):
    """A Transport whose host-key algorithms are listed as OpenSSH lists them for this host,
    and whose later key exchanges (re-keying) are held to the known-hosts file too."""

    def __init__(self, sock: Any, *, entries: Sequence[KnownHost], address: str, port: int,
                 source: str, **kwargs: Any) -> None:
        super().__init__(sock, **kwargs)
        self.known_entries, self.known_address, self.known_port = entries, address, port
        self.known_source = source

    def _verify_key(self, host_key: bytes, sig: bytes) -> None:
        """paramiko's own check of the exchange's signature; then, on a re-key, the key judged
        again. paramiko replaces the host key at every exchange and consults the policy only
        once, at connect; OpenSSH verifies the host key at every exchange (kex.c
        kex_verify_host_key). Overrides a private method (``transport.py``, the same in
        paramiko 3.2 to 5.1): the key exchange calls nothing public."""
        super()._verify_key(host_key, sig)  # type: ignore[misc]
        if not self.initial_kex_done or self.host_key is None:
            return  # the first exchange: SSHClient.connect runs the policy next
        policy = KnownHostsPolicy(self.known_entries, address=self.known_address,
                                  port=self.known_port, source=self.known_source)
        verdict = policy.judge(self.host_key)
        if not verdict.trusted:
            raise HostKeyRefused(f"on re-keying, {verdict.detail}; fix: {verdict.fix}")

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        """paramiko's algorithms (disabled ones left out), certificates first, reordered for
        the host's listed keys and CAs."""
        offered = certificates_first(tuple(super().preferred_keys))
        return order_algorithms(offered, self.known_entries, self.known_address,
                                self.known_port)


def transport_factory(entries: Sequence[KnownHost], *, address: str, port: int,
                      source: str = USER_KNOWN_HOSTS) -> Callable[..., paramiko.Transport]:
    """What ``SSHClient.connect(transport_factory=...)`` calls with the socket (paramiko
    >= 2.12; ``client.py`` passes ``disabled_algorithms`` through)."""
    def make(sock: Any, **kwargs: Any) -> paramiko.Transport:
        return OrderedTransport(sock, entries=entries, address=address, port=port,
                                source=source, **kwargs)
    return make


def check_host_keys(client: paramiko.SSHClient, connect_kwargs: dict[str, Any],
                    entries: Sequence[KnownHost], *, address: str, port: int,
                    source: str) -> None:
    """Make one connection (a host or a ProxyJump hop) trust host keys only by ``entries``:
    paramiko's own key store left empty, the policy and the ordered Transport in place."""
    client.get_host_keys().clear()
    client.set_missing_host_key_policy(
        KnownHostsPolicy(entries, address=address, port=port, source=source))
    connect_kwargs["transport_factory"] = transport_factory(entries, address=address, port=port,
                                                            source=source)
