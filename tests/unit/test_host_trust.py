"""Host-key trust as OpenSSH decides it (tfsdeploy.core.ssh.policy, .host_certs) and its
plumbing into paramiko (tfsdeploy.hosts.hostkeys): certificates minted here with the
`cryptography` package (and `ssh-keygen` for a SHA-1 CA signature, which cryptography does
not make), presented as paramiko's own key classes hand them to a host-key policy."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    SSHCertificateBuilder,
    SSHCertificateType,
)

from tfsdeploy.core.ssh.certificates import CertificateFormatError, parse_certificate
from tfsdeploy.core.ssh.known_hosts import hash_name, parse_known_hosts
from tfsdeploy.core.ssh.policy import Verdict
from tfsdeploy.hosts.hostkeys import HostKeyRefused, KnownHostsPolicy, transport_factory

NOW = 1_800_000_000
HOST, PORT = "10.87.0.13", 22
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def public_line(key: PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


CA = ed25519.Ed25519PrivateKey.generate()
OTHER_CA = ed25519.Ed25519PrivateKey.generate()
EC_CA = ec.generate_private_key(ec.SECP384R1())
RSA_CA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
HOST_KEY = ed25519.Ed25519PrivateKey.generate()
EC_HOST_KEY = ec.generate_private_key(ec.SECP256R1())
RSA_HOST_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def certificate(*, ca: PrivateKey = CA, key: PrivateKey = HOST_KEY,
                principals: list[str] | None = None, host: bool = True,
                after: int = NOW - 60, before: int = NOW + 3600,
                critical: dict[str, str] | None = None) -> bytes:
    """A certificate's wire blob."""
    builder = (SSHCertificateBuilder().public_key(key.public_key()).serial(7)
               .type(SSHCertificateType.HOST if host else SSHCertificateType.USER)
               .key_id(b"tb3-host").valid_after(after).valid_before(before))
    names = [HOST, "tb3"] if principals is None else principals
    builder = (builder.valid_principals([n.encode() for n in names]) if names
               else builder.valid_for_all_principals())
    for name, value in (critical or {}).items():
        builder = builder.add_critical_option(name.encode(), value.encode())
    return base64.b64decode(builder.sign(ca).public_bytes().split()[1])


def presented(blob: bytes) -> paramiko.PKey:
    """The key paramiko hands the policy for a certificate ``blob`` (or a plain key blob)."""
    kind = blob[4:4 + int.from_bytes(blob[:4], "big")].decode()
    if "ed25519" in kind:
        return paramiko.Ed25519Key(data=blob)
    if "ecdsa" in kind:
        return paramiko.ECDSAKey(data=blob)
    return paramiko.RSAKey(data=blob)


def plain(key: PrivateKey = HOST_KEY) -> paramiko.PKey:
    return presented(base64.b64decode(public_line(key).split()[1]))


def judge(lines: list[str], key: paramiko.PKey, *, host: str = HOST, port: int = PORT,
          now: int = NOW) -> Verdict:
    policy = KnownHostsPolicy(parse_known_hosts("\n".join(lines)), address=host, port=port,
                              source="known_hosts", clock=lambda: float(now))
    return policy.judge(key)


CA_LINE = f"@cert-authority * {public_line(CA)}"


# -- certificates signed by a listed CA ---------------------------------------------------------

@pytest.mark.parametrize("ca", [CA, EC_CA, RSA_CA], ids=["ed25519", "ecdsa", "rsa-sha2-512"])
def test_a_certificate_signed_by_a_listed_ca_is_trusted(ca: PrivateKey) -> None:
    verdict = judge([f"@cert-authority 10.87.0.* {public_line(ca)}"],
                    presented(certificate(ca=ca)))
    assert verdict.trusted, verdict
    assert "certificate 'tb3-host' (serial 7) signed by the CA on line 1" in verdict.detail


@pytest.mark.parametrize("key", [EC_HOST_KEY, RSA_HOST_KEY], ids=["ecdsa", "rsa"])
def test_ecdsa_and_rsa_host_certificates_are_trusted(key: PrivateKey) -> None:
    assert judge([CA_LINE], presented(certificate(key=key))).trusted


@pytest.mark.parametrize(("cert", "reason"), [
    (dict(principals=["tb3", "10.87.0.14"]), "10.87.0.13 is not a listed principal"),
    (dict(principals=[]), "it lacks a principal list"),
    (dict(after=NOW + 60), "it is not yet valid"),
    (dict(before=NOW), "it has expired"),
    (dict(host=False), "it is not a host certificate"),
    (dict(critical={"force-command": "true"}), "it has critical options"),
])
def test_a_certificate_that_fails_a_host_check_is_refused(cert: dict[str, Any],
                                                          reason: str) -> None:
    verdict = judge([CA_LINE], presented(certificate(**cert)))
    assert not verdict.trusted
    assert f"its certificate (CA on line 1) was refused: {reason}" in verdict.detail
    assert "ssh-keygen -s CA_KEY -h -n 10.87.0.13" in verdict.fix


def test_principals_may_be_patterns_as_in_openssh_10_3() -> None:
    assert judge([CA_LINE], presented(certificate(principals=["10.87.0.*"]))).trusted
    assert not judge([CA_LINE], presented(certificate(principals=["10.87.1.*"]))).trusted


def test_the_principal_is_the_host_as_connected_without_its_port() -> None:
    cert = presented(certificate(principals=["tb3.example.com"]))
    assert judge([CA_LINE], cert, host="TB3.example.com", port=2222).trusted
    assert not judge([CA_LINE], cert, host="10.87.0.13", port=2222).trusted


def test_a_ca_that_is_not_listed_or_listed_for_other_hosts_does_not_vouch() -> None:
    cert = presented(certificate())
    for lines in ([f"@cert-authority * {public_line(OTHER_CA)}"],
                  [f"@cert-authority *.example.com {public_line(CA)}"],
                  [f"@cert-authority *,!10.87.0.13 {public_line(CA)}"],
                  [f"* {public_line(CA)}"]):  # the CA's key listed as a plain host key
        verdict = judge(lines, cert)
        assert not verdict.trusted, lines
        assert "@cert-authority PATTERN CA_PUBLIC_KEY" in verdict.fix or \
            "host key changed" in verdict.detail


def test_a_certificate_of_another_ca_is_refused_naming_both_cas() -> None:
    verdict = judge([f"@cert-authority 10.87.0.* {public_line(OTHER_CA)}"],
                    presented(certificate()))
    assert not verdict.trusted
    assert "its certificate was signed by the CA SHA256:" in verdict.detail
    assert "which no @cert-authority line for 10.87.0.13 trusts (they trust SHA256:" in \
        verdict.detail and "(line 1))" in verdict.detail
    assert verdict.fix.startswith("if the host was certified by another CA on purpose")
    assert "someone may be presenting a certificate you never issued" in verdict.fix


def test_a_ca_listed_under_the_hashed_or_bracketed_name_vouches() -> None:
    cert = presented(certificate())
    hashed = hash_name("[10.87.0.13]:2222", bytes(20))
    assert judge([f"@cert-authority {hashed} {public_line(CA)}"], cert, port=2222).trusted
    assert judge([f"@cert-authority [10.87.0.13]:2222 {public_line(CA)}"], cert,
                 port=2222).trusted
    # the bare name is the fallback for a port other than 22
    assert judge([f"@cert-authority 10.87.0.* {public_line(CA)}"], cert, port=2222).trusted


def test_a_certificate_falls_back_to_the_plain_key_when_it_is_listed() -> None:
    plain_line = f"{HOST} {public_line(HOST_KEY)}"
    assert judge([plain_line], presented(certificate(ca=OTHER_CA))).trusted
    # an expired certificate of a listed CA: OpenSSH drops it and checks the plain key
    assert judge([CA_LINE, plain_line], presented(certificate(before=NOW))).trusted


def test_a_sha1_rsa_ca_signature_is_refused(tmp_path: Path) -> None:
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        pytest.fail("OpenSSH's ssh-keygen is not installed: run scripts/setup (it installs "
                    "openssh-client)")
    ca_file, pub = tmp_path / "ca", tmp_path / "host.pub"
    ca_file.write_bytes(RSA_CA.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH,
                                             NoEncryption()))
    ca_file.chmod(0o600)
    pub.write_text(public_line(HOST_KEY) + "\n")
    for alg in ("ssh-rsa", "rsa-sha2-256"):
        subprocess.run([keygen, "-q", "-s", str(ca_file), "-t", alg, "-h", "-I", "tb3",
                        "-n", HOST, str(pub)], check=True, capture_output=True)
        cert = presented(base64.b64decode((tmp_path / "host-cert.pub").read_text().split()[1]))
        verdict = judge([f"@cert-authority * {public_line(RSA_CA)}"], cert,
                        now=int(time.time()))
        assert verdict.trusted is (alg != "ssh-rsa"), verdict


def test_a_tampered_or_malformed_certificate_is_refused_outright() -> None:
    good = certificate()
    tampered = bytearray(good)
    tampered[-5] ^= 1  # in the signature
    plain_line = f"{HOST} {public_line(HOST_KEY)}"
    verdict = judge([CA_LINE, plain_line], presented(bytes(tampered)))
    assert not verdict.trusted
    assert "the CA's signature on it does not verify" in verdict.detail
    for broken in (good[:-3], good + b"\0"):
        with pytest.raises(CertificateFormatError):
            parse_certificate(broken)


# -- plain keys and @revoked --------------------------------------------------------------------

def test_plain_keys_known_changed_and_missing() -> None:
    assert judge([f"{HOST} {public_line(HOST_KEY)}"], plain()).trusted
    changed = judge([f"{HOST} {public_line(EC_HOST_KEY)}"], plain())
    assert not changed.trusted and "the host key changed" in changed.detail
    missing = judge([f"10.87.0.11 {public_line(HOST_KEY)}"], plain())
    assert not missing.trusted and "no key or CA in it names 10.87.0.13" in missing.detail
    assert "ssh-keyscan -p 22 10.87.0.13" in missing.fix


def test_revoked_refuses_the_key_and_the_ca_where_its_pattern_matches() -> None:
    cert = presented(certificate())
    revoked_key = judge([CA_LINE, f"@revoked * {public_line(HOST_KEY)}"], cert)
    assert not revoked_key.trusted and "is marked @revoked for 10.87.0.13 (line 2)" in \
        revoked_key.detail
    revoked_ca = judge([CA_LINE, f"@revoked 10.87.0.* {public_line(CA)}"], cert)
    assert not revoked_ca.trusted
    assert "its certificate's CA key is marked @revoked" in revoked_ca.detail
    assert "re-key the host" in revoked_ca.fix
    # a revoked certificate is never downgraded to its (listed) plain key
    listed = f"{HOST} {public_line(HOST_KEY)}"
    assert not judge([CA_LINE, listed, f"@revoked * {public_line(CA)}"], cert).trusted
    assert not judge([listed, f"@revoked * {public_line(HOST_KEY)}"], plain()).trusted
    # @revoked of other hosts does not apply
    assert judge([CA_LINE, f"@revoked *.example.com {public_line(CA)}"], cert).trusted


# -- the plumbing into paramiko -----------------------------------------------------------------

def test_the_policy_raises_an_ssh_exception_naming_the_reason_and_the_fix() -> None:
    policy = KnownHostsPolicy(parse_known_hosts(f"@revoked * {public_line(HOST_KEY)}"),
                              address=HOST, port=PORT, source="/etc/fleet_known_hosts")
    with pytest.raises(HostKeyRefused) as refused:
        policy.missing_host_key(paramiko.SSHClient(), HOST, plain())
    assert isinstance(refused.value, paramiko.SSHException)
    assert "refused by /etc/fleet_known_hosts" in str(refused.value)
    assert "; fix: a revoked key may be in someone else's hands" in str(refused.value)


@pytest.fixture()
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def make_transport(lines: list[str], sock: socket.socket, **kwargs: Any) -> paramiko.Transport:
    make: Callable[..., paramiko.Transport] = transport_factory(
        parse_known_hosts("\n".join(lines)), address=HOST, port=PORT)
    return make(sock, **kwargs)


def test_the_transport_asks_for_certificates_first(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    stock = paramiko.Transport(sockets[0]).preferred_keys
    assert stock[0] == "ssh-ed25519"  # paramiko's own order: certificates last
    ours = make_transport([CA_LINE], sockets[0]).preferred_keys
    assert ours[0] == "ssh-ed25519-cert-v01@openssh.com" and sorted(ours) == sorted(stock)


def test_the_transport_puts_a_listed_key_type_first_and_keeps_disabled_ones_out(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    ours = make_transport([f"{HOST} {public_line(EC_HOST_KEY)}"], sockets[0],
                          disabled_algorithms={"keys": ["rsa-sha2-256"]}).preferred_keys
    assert ours[:2] == ("ecdsa-sha2-nistp256-cert-v01@openssh.com", "ecdsa-sha2-nistp256")
    assert not any(a.startswith("rsa-sha2-256") for a in ours)
