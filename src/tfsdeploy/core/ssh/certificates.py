"""OpenSSH host certificates (pure): the wire format read strictly, and the checks a client
makes before it trusts one.

The format is PROTOCOL.certkeys (openssh-portable; now draft-miller-ssh-cert): the certificate
type, a nonce, the certified key's fields, serial, type, key id, principals, validity,
critical options, extensions, reserved, the CA's key, then the CA's signature over everything
before it. The checks are ``sshkey.c`` ``cert_parse`` (well-formed, a CA that is not itself a
certificate, a signature that verifies) and ``sshkey_cert_check_host`` (a host certificate,
valid now, a non-empty principal list with the host as connected matching one, no critical
options, a CA signature algorithm in the default ``CASignatureAlgorithms``), as of OpenSSH
10.3 (commit 5166b6c: an empty principal list is refused, principals may be glob patterns;
OpenSSH 10.2 and older accepted an empty list for any host and compared principals exactly).
paramiko negotiates certificates but checks none of this (``pkey.py`` ``load_certificate``:
"very little effort is made to validate the certificate contents").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfsdeploy.core.ssh.known_hosts import CERT_SUFFIX, pattern_matches, read_ssh_string

HOST_CERT = 2  # SSH2_CERT_TYPE_HOST
MAX_PRINCIPALS = 256  # SSHKEY_CERT_MAX_PRINCIPALS
# myproposal.h SSH_ALLOWED_CA_SIGALGS: no ssh-rsa (SHA-1) signatures. The sk- and webauthn
# algorithms are listed too; paramiko has no key class for them, so such a CA fails verifying.
ALLOWED_CA_SIGNATURES = (
    "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com", "rsa-sha2-512", "rsa-sha2-256")
# the certified key's fields after the nonce, per plain key type
KEY_FIELDS = {"ssh-ed25519": 1, "ecdsa-sha2-nistp256": 2, "ecdsa-sha2-nistp384": 2,
              "ecdsa-sha2-nistp521": 2, "ssh-rsa": 2}

SignatureCheck = Callable[[str, bytes, bytes, bytes], bool]
"""Whether ``signature`` (an SSH signature blob) by the CA key (type, blob) is valid over
``data``: ``check(ca_type, ca_blob, data, signature)``; the host layer's uses paramiko."""


class CertificateFormatError(ValueError):
    """The blob is not a well-formed OpenSSH certificate."""


@dataclass(frozen=True)
class HostCertificate:
    """The fields of a certificate a client checks."""

    certtype: str
    key_blob: bytes  # the certified (plain) key, as a known_hosts line would hold it
    serial: int
    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    ca_blob: bytes
    signed: bytes  # everything the signature covers
    signature: bytes

    @property
    def ca_type(self) -> str:
        """The CA key's type."""
        return _key_type(self.ca_blob)

    @property
    def signature_algorithm(self) -> str:
        """The algorithm the CA signed with (``rsa-sha2-512``, ``ssh-ed25519``, ...)."""
        return _signature_parts(self.signature)[0]


class _Reader:
    """SSH wire fields from a blob; truncated input is an error, never zero-padded."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def string(self) -> bytes:
        value, self.at = _string(self.data, self.at)
        return value

    def uint(self, size: int) -> int:
        if self.at + size > len(self.data):
            raise CertificateFormatError("the certificate is truncated")
        value = int.from_bytes(self.data[self.at:self.at + size], "big")
        self.at += size
        return value


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    found = read_ssh_string(data, at)
    if found is None:
        raise CertificateFormatError("the certificate is truncated")
    return found


def _text(raw: bytes) -> str:
    """A C string field: no NUL, and text."""
    if b"\0" in raw:
        raise CertificateFormatError("a text field holds a NUL byte")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CertificateFormatError("a text field is not UTF-8") from None


def parse_certificate(blob: bytes) -> HostCertificate:
    """The certificate in ``blob`` (its wire form), or CertificateFormatError."""
    r = _Reader(blob)
    certtype = _text(r.string())
    plain = certtype.removesuffix(CERT_SUFFIX)
    if plain == certtype or plain not in KEY_FIELDS:
        raise CertificateFormatError(f"{certtype!r} is not a certificate type paramiko uses")
    r.string()  # nonce
    fields = [r.string() for _ in range(KEY_FIELDS[plain])]
    key_blob = b"".join(_pack(f) for f in (plain.encode(), *fields))
    serial, cert_type, key_id = r.uint(8), r.uint(4), _text(r.string())
    principals = _principals(r.string())
    valid_after, valid_before = r.uint(8), r.uint(8)
    critical = r.string()
    _pairs(critical)
    _pairs(r.string())  # extensions
    r.string()  # reserved
    ca_blob = r.string()
    signed = blob[:r.at]
    signature = r.string()
    if r.at != len(blob):
        raise CertificateFormatError("the certificate has trailing data")
    _key_type(ca_blob)
    _signature_parts(signature)
    return HostCertificate(certtype, key_blob, serial, cert_type, key_id, principals,
                           valid_after, valid_before, critical, ca_blob, signed, signature)


def _key_type(blob: bytes) -> str:
    """The type string a key blob starts with."""
    return _text(_string(blob, 0)[0])


def _signature_parts(signature: bytes) -> tuple[str, bytes]:
    """An SSH signature: the algorithm's name and the signature bytes, nothing after them."""
    r = _Reader(signature)
    algorithm, raw = _text(r.string()), r.string()
    if r.at != len(signature):
        raise CertificateFormatError("the CA's signature has trailing data")
    return algorithm, raw


def _pack(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def _principals(raw: bytes) -> tuple[str, ...]:
    r, names = _Reader(raw), list[str]()
    while r.at < len(raw):
        if len(names) >= MAX_PRINCIPALS:
            raise CertificateFormatError(f"more than {MAX_PRINCIPALS} principals")
        names.append(_text(r.string()))
    return tuple(names)


def _pairs(raw: bytes) -> None:
    """Critical options and extensions are (name, data) string pairs."""
    r = _Reader(raw)
    while r.at < len(raw):
        r.string()
        r.string()


def certificate_defect(cert: HostCertificate, check_signature: SignatureCheck) -> str | None:
    """Why OpenSSH could not even load ``cert`` (``cert_parse``: a CA key that is a
    certificate, a signature that does not verify), or None."""
    if cert.ca_type.endswith(CERT_SUFFIX):
        return "its CA key is itself a certificate"
    if cert.signature_algorithm not in ALLOWED_CA_SIGNATURES:
        return None  # refused by certificate_problem (paramiko verifies no SHA-1 signature)
    if not check_signature(cert.ca_type, cert.ca_blob, cert.signed, cert.signature):
        return "the CA's signature on it does not verify"
    return None


def certificate_problem(cert: HostCertificate, host: str, now: int) -> str | None:
    """Why ``cert`` cannot vouch for ``host`` (the name as connected, no port) at ``now``
    (seconds since the epoch), or None when it can (``sshkey_cert_check_host``)."""
    if cert.cert_type != HOST_CERT:
        return "it is not a host certificate"
    if now < cert.valid_after:
        return "it is not yet valid"
    if now >= cert.valid_before:
        return "it has expired"
    if not cert.principals:
        return "it lacks a principal list"
    if not any(pattern_matches(host, p) for p in cert.principals):
        listed = ", ".join(cert.principals[:5]) + (", ..." if len(cert.principals) > 5 else "")
        return f"{host} is not a listed principal (it lists {listed})"
    if cert.critical_options:
        return "it has critical options, which a host certificate may not carry"
    if cert.signature_algorithm not in ALLOWED_CA_SIGNATURES:
        return (f"its CA signed it with {cert.signature_algorithm}, which OpenSSH's "
                "CASignatureAlgorithms refuses")
    return None
