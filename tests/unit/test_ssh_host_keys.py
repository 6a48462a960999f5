"""The toolkit's SSH connection (tfsdeploy.hosts.ssh) checks host keys by its own known_hosts
reader, before authentication, against a paramiko SSH server on 127.0.0.1 started here (it
presents a plain host key: certificates against a real sshd are the fleet tier's,
tests/integration/test_ssh_certificates.py)."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from tfsdeploy.core.errors import HostUnreachable
from tfsdeploy.core.inventory.fleet import HostVars, ResolvedHost
from tfsdeploy.hosts.hostkeys import HostKeyRefused
from tfsdeploy.hosts.ssh import SshConnection


def private_pem(key: ed25519.Ed25519PrivateKey) -> str:
    return key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()


def public_line(key: ed25519.Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


HOST_KEY = ed25519.Ed25519PrivateKey.generate()
OTHER = ed25519.Ed25519PrivateKey.generate()


@dataclass
class Server(paramiko.ServerInterface):
    """A one-client SSH server: any public key logs in; `exec` answers exit status 0;
    direct-tcpip channels (ProxyJump) are forwarded to the address asked for."""

    port: int = 0
    auth_attempts: int = 0
    forwards: dict[int, tuple[str, int]] = field(default_factory=dict)
    ended: threading.Event = field(default_factory=threading.Event)
    transport: paramiko.Transport | None = None

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.auth_attempts += 1
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.forwards[chanid] = destination
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        channel.send_exit_status(0)
        channel.shutdown_write()
        return True


def _pump(source: Any, sink: Any) -> None:
    with contextlib.suppress(OSError, EOFError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        sink.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, key: ed25519.Ed25519PrivateKey, state: Server) -> None:
    conn, _ = listener.accept()
    transport = state.transport = paramiko.Transport(conn)
    transport.add_server_key(paramiko.Ed25519Key.from_private_key(
        io.StringIO(private_pem(key))))
    try:
        transport.start_server(server=state)
        while transport.is_active():
            channel = transport.accept(0.2)
            if channel is not None and channel.get_id() in state.forwards:
                target = socket.create_connection(state.forwards[channel.get_id()])
                for a, b in ((channel, target), (target, channel)):
                    threading.Thread(target=_pump, args=(a, b), daemon=True).start()
    except (paramiko.SSHException, EOFError, OSError):
        pass
    finally:
        transport.close()
        state.ended.set()


@contextlib.contextmanager
def ssh_server(key: ed25519.Ed25519PrivateKey, address: str = "127.0.0.1") -> Iterator[Server]:
    """A one-client SSH server on ``address`` presenting ``key``."""
    listener = socket.create_server((address, 0))
    state = Server(port=listener.getsockname()[1])
    threading.Thread(target=_serve, args=(listener, key, state), daemon=True).start()
    try:
        yield state
    finally:
        listener.close()


@pytest.fixture()
def server() -> Iterator[Server]:
    with ssh_server(HOST_KEY) as state:
        yield state


def connection(tmp_path: Path, server: Server, known_hosts: list[str], *,
               address: str = "127.0.0.1") -> SshConnection:
    key = tmp_path / "id_ed25519"
    key.write_text(private_pem(ed25519.Ed25519PrivateKey.generate()))
    key.chmod(0o600)
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"{line}\n" for line in known_hosts))
    vars_ = HostVars(ssh_port=server.port, ssh_key=str(key), ssh_known_hosts=str(path))
    return SshConnection(ResolvedHost("tbx", address, (), (), vars_))


def test_a_file_with_marker_lines_still_trusts_the_listed_key(tmp_path: Path,
                                                             server: Server) -> None:
    # before: paramiko's HostKeys.load raised InvalidHostKey on the marker line, and every
    # host using the file was unreachable
    conn = connection(tmp_path, server, [
        f"@cert-authority *.example.com {public_line(OTHER)}",
        f"@revoked *.example.com {public_line(OTHER)}",
        f"[127.0.0.1]:{server.port} {public_line(HOST_KEY)}",
    ])
    try:
        assert conn.run(["true"]).ok
    finally:
        conn.close()


def test_a_pattern_line_trusts_the_host(tmp_path: Path, server: Server) -> None:
    conn = connection(tmp_path, server, [f"[127.0.0.*]:* {public_line(HOST_KEY)}"])
    try:
        assert conn.run(["true"]).ok
    finally:
        conn.close()


def test_a_revoked_key_is_refused_before_authentication_and_the_transport_closed(
        tmp_path: Path, server: Server) -> None:
    conn = connection(tmp_path, server, [
        f"[127.0.0.1]:{server.port} {public_line(HOST_KEY)}",
        f"@revoked * {public_line(HOST_KEY)}",
    ])
    with pytest.raises(HostUnreachable) as refused:
        conn.run(["true"])
    message = str(refused.value)
    assert message.startswith("tbx (127.0.0.1): HostKeyRefused: the host key of 127.0.0.1 ")
    assert f"is marked @revoked for [127.0.0.1]:{server.port} (line 2)" in message
    assert "fix: a revoked key may be in someone else's hands" in message
    assert server.auth_attempts == 0
    assert server.ended.wait(30), "the refused connection was left open"
    conn.close()


def test_a_rekey_with_a_key_the_file_does_not_trust_ends_the_connection(
        tmp_path: Path, server: Server) -> None:
    conn = connection(tmp_path, server, [f"[127.0.0.1]:{server.port} {public_line(HOST_KEY)}"])
    try:
        assert conn.run(["true"]).ok
        transport = conn.transport()
        assert server.transport is not None
        server.transport.add_server_key(paramiko.Ed25519Key.from_private_key(
            io.StringIO(private_pem(OTHER))))  # the server's ed25519 key is now another
        with pytest.raises(HostKeyRefused) as refused:
            transport.renegotiate_keys()
        assert "on re-keying, the host key of 127.0.0.1" in str(refused.value)
        transport.join(30)  # the transport's thread ends with its connection
        assert not transport.is_active(), "the re-key with an unknown key was accepted"
    finally:
        conn.close()


def test_an_unlisted_host_is_refused_with_the_fix(tmp_path: Path, server: Server) -> None:
    conn = connection(tmp_path, server, [f"@cert-authority * {public_line(OTHER)}"])
    with pytest.raises(HostUnreachable) as refused:
        conn.run(["true"])
    assert f"no key or CA in it names [127.0.0.1]:{server.port} or 127.0.0.1" in \
        str(refused.value)
    assert f"ssh-keyscan -p {server.port} 127.0.0.1" in str(refused.value)
    assert server.auth_attempts == 0 and server.ended.wait(30)
    conn.close()


def test_an_unreadable_file_makes_the_host_unreachable(tmp_path: Path) -> None:
    vars_ = HostVars(ssh_known_hosts=str(tmp_path / "missing"))
    conn = SshConnection(ResolvedHost("tbx", "127.0.0.1", (), (), vars_))
    with pytest.raises(HostUnreachable, match=r"the known-hosts file .*missing cannot be used"):
        conn.run(["true"])


@pytest.fixture()
def jump_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.ssh/config Fabric reads (ProxyJump) and whose key the hop logs in with."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text(private_pem(ed25519.Ed25519PrivateKey.generate()))
    key.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def test_every_proxyjump_hop_is_checked_before_authentication(tmp_path: Path,
                                                              jump_home: Path) -> None:
    with ssh_server(OTHER) as jump, ssh_server(HOST_KEY, "127.0.0.2") as target:
        (jump_home / ".ssh" / "config").write_text(
            f"Host 127.0.0.2\n  ProxyJump root@127.0.0.1:{jump.port}\n")
        hop_line = f"[127.0.0.1]:{jump.port} {public_line(OTHER)}"
        target_line = f"[127.0.0.2]:{target.port} {public_line(HOST_KEY)}"
        trusted = connection(tmp_path, target, [hop_line, target_line], address="127.0.0.2")
        try:
            assert trusted.run(["true"]).ok
        finally:
            trusted.close()
        assert list(jump.forwards.values()) == [("127.0.0.2", target.port)]
    with ssh_server(OTHER) as jump, ssh_server(HOST_KEY, "127.0.0.2") as target:
        (jump_home / ".ssh" / "config").write_text(
            f"Host 127.0.0.2\n  ProxyJump root@127.0.0.1:{jump.port}\n")
        refused = connection(tmp_path, target, [
            f"[127.0.0.1]:{jump.port} {public_line(OTHER)}",
            f"@revoked [127.0.0.1]:* {public_line(OTHER)}",
            f"[127.0.0.2]:{target.port} {public_line(HOST_KEY)}"], address="127.0.0.2")
        with pytest.raises(HostUnreachable) as stopped:
            refused.run(["true"])
        assert f"is marked @revoked for [127.0.0.1]:{jump.port} (line 2)" in str(stopped.value)
        assert jump.auth_attempts == 0 and not jump.forwards
        assert jump.ended.wait(30), "the refused hop's connection was left open"
        refused.close()
