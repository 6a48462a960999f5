"""Whether a host's key is trusted, decided as OpenSSH's client decides it under
``StrictHostKeyChecking yes`` with ``CheckHostIP no`` (its default) (pure).

The flow is ``sshconnect.c`` ``check_host_key`` over ``hostfile.c``
``check_hostkeys_by_key_or_type`` and ``check_key_not_revoked`` (openssh-portable 0ef0f5a):

1. The lines for ``[host]:port`` (``host`` on port 22) are consulted. A certificate counts only
   against ``@cert-authority`` lines (one holding its CA's key: known), a plain key only
   against unmarked lines (an equal one: known; only others: changed).
2. A matching ``@revoked`` line holding the key, or the certificate's CA key, overrides that:
   revoked, refused, never downgraded.
3. A known certificate must pass the host checks (host_certs.py); one that fails, or whose
   CA is not listed, is dropped and the certified key checked as a plain key.
4. When nothing of the kind is listed under ``[host]:port``, the bare ``host`` is tried the
   same way ("checking without port identifier").

A certificate OpenSSH could not load at all (malformed, a CA signature that does not verify)
is refused before any of this, as ssh fails the key exchange.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from tfsdeploy.core.ssh.certificates import (
    CertificateFormatError,
    HostCertificate,
    SignatureCheck,
    certificate_defect,
    certificate_problem,
    parse_certificate,
)
from tfsdeploy.core.ssh.known_hosts import KnownHost, Marker, entries_for, lookup_names


class Status(Enum):
    """hostfile.h HostStatus, as far as a strict client distinguishes."""

    OK = "known"
    NEW = "not listed"
    CHANGED = "changed"
    REVOKED = "revoked"


@dataclass(frozen=True)
class Verdict:
    """Trusted (``detail`` says by which line) or refused (``detail`` why, ``fix`` how)."""

    trusted: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class _Key:
    """The key being checked: plain, or a certificate over ``blob``."""

    blob: bytes
    cert: HostCertificate | None


@dataclass
class _Check:
    """One connection's check: the file's lines, the host as connected, what was seen."""

    entries: Sequence[KnownHost]
    host: str
    port: int
    now: int
    source: str
    notes: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


def fingerprint(blob: bytes) -> str:
    """``ssh-keygen -l``'s SHA256 fingerprint of a key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def check_host_key(entries: Sequence[KnownHost], *, address: str, port: int, key_blob: bytes,
                   cert_blob: bytes | None, now: int, check_signature: SignatureCheck,
                   source: str) -> Verdict:
    """The verdict on the key a host presented at ``address``:``port``: ``key_blob`` is the
    plain key, ``cert_blob`` its certificate when the host presented one; ``source`` names
    the known_hosts file in messages."""
    names = lookup_names(address, port)
    state = _Check(entries, names[-1], port, now, source)
    key = _Key(key_blob, None)
    if cert_blob is not None:
        try:
            cert = parse_certificate(cert_blob)
        except CertificateFormatError as exc:
            return _unusable_certificate(state, str(exc))
        defect = certificate_defect(cert, check_signature)
        if defect:
            return _unusable_certificate(state, defect)
        key = _Key(cert.key_blob, cert)
    return _check(state, names, key) or _refusal(state, key)


def _check(state: _Check, names: Sequence[str], key: _Key) -> Verdict | None:
    """check_host_key for ``names[0]`` (then the bare name): a trust, or None (refused)."""
    name = names[0]
    mine = entries_for(state.entries, name)
    status, line = _status(mine, key)
    if status is Status.REVOKED:
        state.revoked.append(_revoked_note(mine, key, name))
        return None
    if status is Status.OK and key.cert is not None:
        problem = certificate_problem(key.cert, state.host, state.now)
        if problem is None:
            return Verdict(True, f"{name}: certificate {key.cert.key_id!r} (serial "
                                 f"{key.cert.serial}) signed by the CA on line {line.lineno} "
                                 f"of {state.source}")
        state.notes.append(f"its certificate (CA on line {line.lineno}) was refused: {problem}")
    elif status is Status.OK:
        return Verdict(True, f"{name}: its key is listed on line {line.lineno} of "
                             f"{state.source}")
    elif status is Status.NEW and len(names) > 1:
        found = _check(state, names[1:], key)
        if found is not None:
            return found
    elif status is Status.CHANGED:
        state.changed.append(f"{name} (line {line.lineno})")
    if key.cert is not None:  # drop the certificate, check the certified key as plain
        return _check(state, names, _Key(key.blob, None))
    return None


def _status(mine: Sequence[KnownHost], key: _Key) -> tuple[Status, KnownHost]:
    """check_hostkeys_by_key_or_type for the lines of one name: the status and its line."""
    status, line = Status.NEW, _NO_LINE
    if key.cert is not None:
        for e in mine:
            if e.marker is Marker.CERT_AUTHORITY and e.blob == key.cert.ca_blob:
                status, line = Status.OK, e
                break
    else:
        for e in mine:
            if e.marker is not Marker.NONE:
                continue
            status, line = (Status.OK, e) if e.blob == key.blob else (Status.CHANGED, e)
            if status is Status.OK:
                break
    if _revoking(mine, key) is not None:
        return Status.REVOKED, _NO_LINE
    return status, line


_NO_LINE = KnownHost(Marker.NONE, "", "", b"", 0)


def _revoking(mine: Sequence[KnownHost], key: _Key) -> KnownHost | None:
    """The ``@revoked`` line holding the key or its certificate's CA key (check_key_not_revoked)."""
    blobs = {key.blob} | ({key.cert.ca_blob} if key.cert is not None else set())
    return next((e for e in mine if e.marker is Marker.REVOKED and e.blob in blobs), None)


def _revoked_note(mine: Sequence[KnownHost], key: _Key, name: str) -> str:
    line = _revoking(mine, key)
    assert line is not None
    what = ("its certificate's CA key" if key.cert is not None and line.blob == key.cert.ca_blob
            else f"its key {fingerprint(key.blob)}")
    return f"{what} is marked @revoked for {name} (line {line.lineno})"


def _unusable_certificate(state: _Check, why: str) -> Verdict:
    return Verdict(False, f"the host key of {state.host} cannot be trusted: its certificate "
                          f"cannot be used ({why})",
                   "have the host present a well-formed certificate signed by its CA "
                   "(ssh-keygen -s CA_KEY -h -n HOST HOST_KEY.pub), then reload its sshd")


def _refusal(state: _Check, key: _Key) -> Verdict:
    """Why nothing trusted the key, and what to do."""
    head = f"the host key of {state.host} ({fingerprint(key.blob)}) is refused by {state.source}"
    if state.revoked:
        return Verdict(False, f"{head}: {'; '.join(dict.fromkeys(state.revoked))}",
                       "a revoked key may be in someone else's hands: re-key the host (a new "
                       "host key, certified by a CA you trust) and find out how the old one "
                       "leaked; remove the @revoked line only if it was written by mistake")
    # a name can be consulted twice (with the certificate, then its plain key): say it once
    notes = "; ".join(dict.fromkeys(state.notes))
    if state.changed:
        changed = ", ".join(dict.fromkeys(state.changed))
        return Verdict(False, f"{head}: the host key changed (another key is listed for "
                              f"{changed})" + (f"; {notes}" if notes else ""),
                       "if the host was re-keyed on purpose, replace its line with the new key "
                       "(ssh-keyscan, checked out of band); otherwise someone may be "
                       "intercepting the connection")
    names = " or ".join(lookup_names(state.host, state.port))
    others = _other_authorities(state, key)
    if others and not notes:
        assert key.cert is not None
        trusted = ", ".join(f"{fingerprint(e.blob)} (line {e.lineno})" for e in others)
        return Verdict(False, f"{head}: its certificate was signed by the CA "
                              f"{fingerprint(key.cert.ca_blob)}, which no @cert-authority line "
                              f"for {names} trusts (they trust {trusted})",
                       "if the host was certified by another CA on purpose, add a line "
                       "'@cert-authority PATTERN CA_PUBLIC_KEY' for that CA (its key checked "
                       "out of band); otherwise someone may be presenting a certificate you "
                       "never issued: do not connect")
    if notes:
        return Verdict(False, f"{head}: {notes}",
                       _certificate_fix(state) + "; or list the host's plain key")
    return Verdict(False, f"{head}: no key or CA in it names {names}",
                   f"add the host's key (ssh-keyscan -p {state.port} {state.host}, checked out "
                   "of band), or a line '@cert-authority PATTERN CA_PUBLIC_KEY' for the CA that "
                   "signs its host certificate")


def _other_authorities(state: _Check, key: _Key) -> list[KnownHost]:
    """The @cert-authority lines that name the host but hold another CA than the one that
    signed its certificate (none when it presented no certificate)."""
    if key.cert is None:
        return []
    found = [e for name in lookup_names(state.host, state.port)
             for e in entries_for(state.entries, name) if e.marker is Marker.CERT_AUTHORITY]
    return list({e.lineno: e for e in found if e.blob != key.cert.ca_blob}.values())


def _certificate_fix(state: _Check) -> str:
    return ("re-sign the host's certificate with the name it is reached by as a principal, "
            f"valid now and without critical options (ssh-keygen -s CA_KEY -h -n {state.host} "
            "-V -5m:+52w HOST_KEY.pub), then reload its sshd")
