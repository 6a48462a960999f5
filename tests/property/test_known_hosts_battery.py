"""Hostile known_hosts files and host certificates: whatever the file holds (markers, tabs,
NULs, control characters, broken base64, huge patterns) reading it never raises and keeps only
well-formed lines; whatever bytes a server presents as a certificate, the verdict is a value,
never an exception, and no altered certificate is ever trusted."""

from __future__ import annotations

import base64
import contextlib

from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    SSHCertificateBuilder,
    SSHCertificateType,
)
from hypothesis import given
from hypothesis import strategies as st

from tfsdeploy.core.ssh.certificates import CertificateFormatError, parse_certificate
from tfsdeploy.core.ssh.known_hosts import hosts_match, parse_known_hosts, read_ssh_string
from tfsdeploy.core.ssh.policy import check_host_key
from tfsdeploy.hosts.hostkeys import ca_signature_valid

from .budget import examples

CA = ed25519.Ed25519PrivateKey.generate()
HOST_KEY = ed25519.Ed25519PrivateKey.generate()
CA_PUBLIC = CA.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
NOW = 1_800_000_000
CERT = base64.b64decode(
    SSHCertificateBuilder().public_key(HOST_KEY.public_key()).serial(1)
    .type(SSHCertificateType.HOST).key_id(b"tb3").valid_principals([b"10.87.0.13"])
    .valid_after(NOW - 60).valid_before(NOW + 60).sign(CA).public_bytes().split()[1])
PLAIN = base64.b64decode(
    HOST_KEY.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).split()[1])

FRAGMENTS = st.sampled_from([
    "@cert-authority", "@revoked", "@bogus", "@", "#", " ", "\t", "\x00", "\x1b[31m", "\r",
    "*", "?", "!", ",", "|1|", "[10.87.0.13]:2222", "10.87.0.*", "ssh-ed25519", "ssh-rsa",
    CA_PUBLIC.split()[1], CA_PUBLIC.split()[1][:-3], "====", "*" * 1100, "é", "\u2028"])
LINE = st.lists(st.one_of(FRAGMENTS, st.text(max_size=12)), max_size=8).map("".join)
FILE = st.lists(st.one_of(LINE, st.just(f"@cert-authority * {CA_PUBLIC}")),
                max_size=8).map("\n".join)


@examples(150)
@given(FILE)
def test_reading_a_hostile_file_never_raises_and_keeps_only_well_formed_lines(text: str) -> None:
    for entry in parse_known_hosts(text):
        name = read_ssh_string(entry.blob, 0)
        assert name is not None and name[0] == entry.keytype.encode()
        assert entry.hosts and not any(c in entry.hosts for c in " \t")


@examples(300)
@given(st.text(max_size=60), LINE)
def test_matching_a_hostile_name_against_a_hostile_field_never_raises(name: str,
                                                                      field: str) -> None:
    assert hosts_match(name, field) in (True, False)


CERT_TYPE = CERT[:4 + 32]  # the length-prefixed "ssh-ed25519-cert-v01@openssh.com"


@examples(200)
@given(st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(CERT_TYPE.__add__)))
def test_any_bytes_parse_as_a_certificate_or_raise_the_format_error(blob: bytes) -> None:
    with contextlib.suppress(CertificateFormatError):
        parse_certificate(blob)


def verdict_on(cert: bytes, text: str) -> bool:
    return check_host_key(parse_known_hosts(text), address="10.87.0.13", port=22,
                          key_blob=PLAIN, cert_blob=cert, now=NOW,
                          check_signature=ca_signature_valid, source="known_hosts").trusted


def test_the_unaltered_certificate_is_trusted() -> None:
    assert verdict_on(CERT, f"@cert-authority * {CA_PUBLIC}")


@examples(300)
@given(st.data())
def test_no_altered_certificate_is_trusted(data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(CERT)))
    flip = data.draw(st.integers(0, len(CERT) - 1))
    mask = data.draw(st.integers(1, 255))
    altered = bytearray(CERT)
    altered[flip] ^= mask
    for cert in (bytes(altered), CERT[:cut] if cut < len(CERT) else CERT + b"\0"):
        assert not verdict_on(cert, f"@cert-authority * {CA_PUBLIC}\n"
                                    f"@revoked *.example.com {CA_PUBLIC}")
