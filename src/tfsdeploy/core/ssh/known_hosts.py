"""OpenSSH's known_hosts format, read as OpenSSH reads it (pure): markers, host patterns,
hashed names, the names a connection is looked up under, and the host-key algorithm order.

paramiko's own reader knows no markers (a ``@cert-authority`` line makes ``HostKeys.load``
raise ``InvalidHostKey``), no ``*``/``?`` patterns and no ``!`` negation, so the toolkit reads
the file itself. The rules below follow openssh-portable (read at 0ef0f5a, OpenSSH 10.x):

- ``hostfile.c`` ``hostkeys_foreach_file``: leading blanks skipped; empty and ``#`` lines
  ignored; a marker, then the host field up to a space or tab, then ``keytype base64``; a line
  that cannot be read is skipped, never fatal.
- ``hostfile.c`` ``check_markers``: a marker ends at the first space (a tab only when the line
  has no space at all); one marker per line, ``@cert-authority`` or ``@revoked``; anything
  else skips the line.
- ``hostfile.c`` ``match_maybe_hashed`` / ``host_hash`` / ``extract_salt``: a field starting
  with ``|`` is one ``|1|base64(salt)|base64(HMAC-SHA1(salt, name))`` with a 20-byte salt.
- ``match.c`` ``match_hostname`` / ``match_pattern_list`` / ``match_pattern``: comma-separated
  subpatterns, ASCII-lowercased; only ``*`` and ``?`` are special (``[`` is literal, unlike
  fnmatch); a matching ``!`` subpattern makes the line not match; a subpattern of 1023
  characters or more matches nothing.
- ``misc.c`` ``put_host_port`` and ``sshconnect.c`` ``check_host_key``: the name is
  ``[host]:port`` unless the port is 22, and, when nothing of the kind needed is listed under
  it, the bare host ("checking without port identifier").
- ``ssh.c``: a host name is lowercased, an address is not (it is canonicalised).
- ``sshconnect2.c`` ``order_hostkeyalgs``: which host-key algorithms a client asks for first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

CERT_SUFFIX = "-cert-v01@openssh.com"
SSH_PORT = 22
SALT_BYTES = 20  # SHA-1's HMAC size (hostfile.c extract_salt)
SUBPATTERN_MAX = 1023  # match.c match_pattern_list: sub[1024] with its terminator


class Marker(Enum):
    """A known_hosts line's marker."""

    NONE = ""
    CERT_AUTHORITY = "@cert-authority"
    REVOKED = "@revoked"


@dataclass(frozen=True)
class KnownHost:
    """One usable line: its marker, host field, key type and the key's wire blob (kept raw, so
    key types paramiko cannot load still take part in ``@revoked`` comparisons)."""

    marker: Marker
    hosts: str
    keytype: str
    blob: bytes
    lineno: int


def parse_known_hosts(text: str) -> tuple[KnownHost, ...]:
    """Every line of ``text`` that OpenSSH would use, in file order; others are skipped."""
    entries = (_parse_line(line, n) for n, line in enumerate(text.split("\n"), start=1))
    return tuple(e for e in entries if e is not None)


def _parse_line(line: str, lineno: int) -> KnownHost | None:
    rest = line.split("\0", 1)[0].lstrip(" \t")  # C reads a line up to a NUL
    if not rest or rest.startswith("#"):
        return None
    marker, rest = _take_marker(rest)
    if marker is None:
        return None
    # the host field ends at a space or tab; then the key type and its base64
    fields = re.split(r"[ \t]+", rest, maxsplit=3)
    if len(fields) < 3 or not fields[0]:
        return None
    hosts, keytype, encoded = fields[0], fields[1], fields[2]
    blob = _decode_key(keytype, encoded)
    return None if blob is None else KnownHost(marker, hosts, keytype, blob, lineno)


def _take_marker(line: str) -> tuple[Marker | None, str]:
    """The line's marker and what follows it; None for a line OpenSSH skips."""
    if not line.startswith("@"):
        return Marker.NONE, line
    end = line.find(" ")
    if end < 0:
        end = line.find("\t")
    if end < 0:
        return None, line
    word, rest = line[:end], line[end:].lstrip(" \t")
    if rest.startswith("@"):  # only one marker is allowed
        return None, line
    try:
        return Marker(word), rest
    except ValueError:
        return None, line


def _decode_key(keytype: str, encoded: str) -> bytes | None:
    """The key's blob, if ``encoded`` is base64 of an SSH key whose type string is
    ``keytype`` (sshkey_read refuses a type mismatch)."""
    try:  # b64_pton skips white space (a CRLF file's \r)
        blob = base64.b64decode(encoded.translate(_NO_SPACE), validate=True)
    except (binascii.Error, ValueError):
        return None
    name = read_ssh_string(blob, 0)
    if name is None or name[0] != keytype.encode():
        return None
    return blob


_NO_SPACE = str.maketrans("", "", " \t\r\n\v\f")


def read_ssh_string(data: bytes, at: int) -> tuple[bytes, int] | None:
    """The SSH ``string`` at ``at`` in ``data`` and the offset after it; None if truncated."""
    if at + 4 > len(data):
        return None
    size = int.from_bytes(data[at:at + 4], "big")
    end = at + 4 + size
    return None if end > len(data) else (data[at + 4:end], end)


# -- host names and patterns ------------------------------------------------------------------

def ascii_lower(text: str) -> str:
    """Lowercase as C's tolower in the C locale: ASCII letters only."""
    return text.translate(_LOWER)


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def connect_name(address: str) -> str:
    """The host name as ssh uses it: an address canonicalised, a name lowercased."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return ascii_lower(address)


def lookup_names(address: str, port: int) -> tuple[str, ...]:
    """The names a host's keys are looked up under, in order: ``[host]:port`` (or ``host`` on
    port 22), then the bare host as the fallback."""
    host = connect_name(address)
    return (host,) if port == SSH_PORT else (f"[{host}]:{port}", host)


def pattern_matches(name: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: ``*`` any run, ``?`` one character, all else literal. Matched
    in O(len(name) x len(pattern)): on a miss, only the last ``*`` takes one more character
    (a regex, or match.c's recursion, backtracks exponentially on ``*a*a*a...b``)."""
    at = p = 0
    star, mark = -1, 0
    while at < len(name):
        if p < len(pattern) and pattern[p] == "*":
            star, mark = p, at
            p += 1
        elif p < len(pattern) and pattern[p] in ("?", name[at]):
            at, p = at + 1, p + 1
        elif star >= 0:
            mark += 1
            at, p = mark, star + 1
        else:
            return False
    return pattern[p:].strip("*") == ""


def hosts_match(name: str, field: str) -> bool:
    """Whether a line's host field names ``name`` (hashed, or a pattern list)."""
    if field.startswith("|"):
        return _hashed_matches(name, field)
    name = ascii_lower(name)
    positive = False
    for sub in field.split(","):
        negated = sub.startswith("!")
        sub = ascii_lower(sub[1:] if negated else sub)
        if len(sub) >= SUBPATTERN_MAX:
            return False
        if pattern_matches(name, sub):
            if negated:
                return False
            positive = True
    return positive


def _hashed_matches(name: str, field: str) -> bool:
    parts = field.split("|")
    if len(parts) < 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(salt) == SALT_BYTES and hmac.compare_digest(hash_name(name, salt).encode(),
                                                           field.encode())


def hash_name(name: str, salt: bytes) -> str:
    """``name`` as ``ssh-keygen -H`` writes it with ``salt``."""
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def entries_for(entries: Iterable[KnownHost], name: str) -> tuple[KnownHost, ...]:
    """The lines whose host field matches ``name`` (markers included: ``@revoked`` is scoped
    by its patterns too)."""
    return tuple(e for e in entries if hosts_match(name, e.hosts))


# -- host-key algorithms ----------------------------------------------------------------------

def plain_type(algorithm: str) -> str:
    """The key type a host-key algorithm carries: certificates and RSA's SHA-2 signature names
    map to the plain key type (``rsa-sha2-512-cert-v01@openssh.com`` -> ``ssh-rsa``)."""
    if algorithm.endswith(CERT_SUFFIX):
        algorithm = algorithm[: -len(CERT_SUFFIX)]
    return "ssh-rsa" if algorithm in ("rsa-sha2-256", "rsa-sha2-512") else algorithm


def _known_types(entries: Sequence[KnownHost]) -> set[str]:
    """The key types listed plain for a name whose first key of that type is not revoked
    (hostfile.c lookup_key_in_hostkeys_by_type)."""
    revoked = {e.blob for e in entries if e.marker is Marker.REVOKED}
    first: dict[str, bytes] = {}
    for e in entries:
        if e.marker is Marker.NONE:
            first.setdefault(e.keytype, e.blob)
    return {t for t, blob in first.items() if blob not in revoked}


def order_algorithms(algorithms: Sequence[str], entries: Sequence[KnownHost],
                     address: str, port: int) -> tuple[str, ...]:
    """``algorithms`` (certificates first, as OpenSSH's default HostKeyAlgorithms) reordered as
    ``order_hostkeyalgs`` does for the host's ``[host]:port`` name: kept as they are when the
    first one's key type is listed; otherwise, keeping their order, first every certificate
    algorithm (when a ``@cert-authority`` line names the host) and every algorithm of a listed
    key type, then the rest."""
    if not algorithms:
        return ()
    mine = entries_for(entries, lookup_names(address, port)[0])
    known = _known_types(mine)
    if plain_type(algorithms[0]) in known:
        return tuple(algorithms)
    has_ca = any(e.marker is Marker.CERT_AUTHORITY for e in mine)
    first = [a for a in algorithms
             if (has_ca and a.endswith(CERT_SUFFIX)) or plain_type(a) in known]
    return (*first, *(a for a in algorithms if a not in first))


def certificates_first(algorithms: Sequence[str]) -> tuple[str, ...]:
    """OpenSSH's default order: every certificate algorithm, then the plain ones (paramiko
    offers certificates after the plain keys, so a server with both would never show its
    certificate)."""
    certs = [a for a in algorithms if a.endswith(CERT_SUFFIX)]
    return (*certs, *(a for a in algorithms if not a.endswith(CERT_SUFFIX)))
