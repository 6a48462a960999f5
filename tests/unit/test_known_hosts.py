"""The known_hosts reader (tfsdeploy.core.ssh.known_hosts): lines, markers, host patterns and
hashed names as OpenSSH reads them, with OpenSSH's own `ssh-keygen -F` as the judge of which
lines name a host; and the host-key algorithm order a connection asks for."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from tfsdeploy.core.ssh.known_hosts import (
    Marker,
    certificates_first,
    entries_for,
    hash_name,
    hosts_match,
    lookup_names,
    order_algorithms,
    parse_known_hosts,
)


def openssh_line(key: ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey) -> str:
    """``keytype base64`` of a public key, as a .pub file holds it."""
    return key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


ED = openssh_line(ed25519.Ed25519PrivateKey.generate().public_key())
ED2 = openssh_line(ed25519.Ed25519PrivateKey.generate().public_key())
EC = openssh_line(ec.generate_private_key(ec.SECP256R1()).public_key())


def blob_of(line: str) -> bytes:
    return base64.b64decode(line.split()[1])


# -- reading lines -----------------------------------------------------------------------------

def test_markers_plain_lines_comments_and_skipped_lines() -> None:
    text = "\n".join([
        "# a comment",
        "",
        f"  host1 {ED} comment with spaces",
        f"@cert-authority *.example.com,10.87.0.* {ED2} the fleet CA",
        f"@revoked * {EC}",
        f"@bogus host2 {ED}",  # unknown marker: skipped
        f"@revoked @cert-authority host3 {ED}",  # two markers: skipped
        f"@cert-authority\thost4 {ED}",  # a marker ends at a space, not this tab: skipped
        f"host5 {ED.split()[0]} not*base64!",  # not base64: skipped
        f"host6 ecdsa-sha2-nistp256 {ED.split()[1]}",  # type and blob disagree: skipped
        "host7",  # truncated: skipped
        f"host8\t{ED}",
        "host9 sk-ssh-ed25519@openssh.com "  # a key type paramiko cannot load still counts
        + base64.b64encode(b"\0\0\0\x1ask-ssh-ed25519@openssh.com\0\0\0\x01x").decode(),
    ])
    entries = parse_known_hosts(text)
    assert [(e.lineno, e.marker, e.hosts, e.keytype) for e in entries] == [
        (3, Marker.NONE, "host1", "ssh-ed25519"),
        (4, Marker.CERT_AUTHORITY, "*.example.com,10.87.0.*", "ssh-ed25519"),
        (5, Marker.REVOKED, "*", "ecdsa-sha2-nistp256"),
        (12, Marker.NONE, "host8", "ssh-ed25519"),
        (13, Marker.NONE, "host9", "sk-ssh-ed25519@openssh.com"),
    ]
    assert entries[0].blob == blob_of(ED)


def test_a_marker_alone_on_a_line_with_only_tabs_is_read() -> None:
    # check_markers: the marker ends at a tab only when the line holds no space at all
    (entry,) = parse_known_hosts(f"@revoked\thost\t{ED.replace(' ', chr(9))}")
    assert entry.marker is Marker.REVOKED and entry.hosts == "host"


def test_crlf_lines_and_nul_bytes_are_read_as_openssh_reads_them() -> None:
    entries = parse_known_hosts(f"host1 {ED}\r\nhost2 {ED}\0 junk\nho\0st3 {ED}\n")
    assert [(e.hosts, e.blob) for e in entries] == [("host1", blob_of(ED)),
                                                     ("host2", blob_of(ED))]


# -- names and patterns ------------------------------------------------------------------------

def test_lookup_names_add_the_port_and_fall_back_to_the_bare_host() -> None:
    assert lookup_names("Tb1.Example.COM", 22) == ("tb1.example.com",)
    assert lookup_names("10.87.0.11", 2222) == ("[10.87.0.11]:2222", "10.87.0.11")
    assert lookup_names("FE80::0001", 2222) == ("[fe80::1]:2222", "fe80::1")


@pytest.mark.parametrize(("name", "field", "matches"), [
    ("host.example.com", "*.example.com", True),
    ("example.com", "*.example.com", False),
    ("HOST.Example.com", "*.EXAMPLE.com", True),
    ("tb1", "tb?", True),
    ("tb10", "tb?", False),
    ("10.87.0.11", "10.87.0.*", True),
    ("[10.87.0.11]:2222", "10.87.0.*", False),
    ("[10.87.0.11]:2222", "[10.87.0.11]:2222", True),  # brackets are literal (not fnmatch)
    ("[10.87.0.11]:2222", "[10.87.0.*]:*", True),
    ("10.87.0.11", "[10.87.0.11]:22", False),
    ("bad.example.com", "*.example.com,!bad.example.com", False),
    ("bad.example.com", "!bad.example.com,*.example.com", False),
    ("good.example.com", "*.example.com,!bad.example.com", True),
    ("other", "!bad", False),  # a negation alone matches nothing
    ("a.b", "a?b", True),
    ("a.b", "a.b,", True),
])
def test_patterns(name: str, field: str, matches: bool) -> None:
    assert hosts_match(name, field) is matches


def test_a_pattern_of_many_stars_is_matched_without_backtracking_forever() -> None:
    # a regex (or match.c's recursion) takes exponential time on this miss
    assert not hosts_match("a" * 300, "*a" * 100 + "b")
    assert hosts_match("a" * 300 + "b", "*a" * 100 + "b")


def test_a_hashed_name_matches_only_its_own_name() -> None:
    salt = os.urandom(20)
    field = hash_name("10.87.0.11", salt)
    assert hosts_match("10.87.0.11", field)
    assert not hosts_match("10.87.0.12", field)
    assert not hosts_match("10.87.0.11", hash_name("10.87.0.11", os.urandom(16)))  # salt size
    assert not hosts_match("10.87.0.11", "|1|not base64|x")
    assert not hosts_match("10.87.0.11", "|2|" + field[3:])


KEYGEN = shutil.which("ssh-keygen")
ORACLE_FIELDS = ["*.example.com", "tb?", "10.87.0.*", "[10.87.0.11]:2222", "[10.87.0.*]:*",
                 "*.example.com,!bad.example.com", "!bad.example.com", "Tb1,TB2",
                 "a*b*c", "*", "[*]:2222", "10.87.0.1?", "x.example.com,y.example.com"]
ORACLE_NAMES = ["host.example.com", "bad.example.com", "example.com", "tb1", "tb2", "tb10",
                "10.87.0.11", "10.87.0.1", "[10.87.0.11]:2222", "[10.87.0.12]:2222",
                "[tb1]:2222", "abc", "aXbYc", "acb", "y.example.com"]


@pytest.mark.skipif(KEYGEN is None, reason="OpenSSH's ssh-keygen is not installed")
def test_the_lines_that_name_a_host_are_those_ssh_keygen_finds(tmp_path: Path) -> None:
    salted = [hash_name(n, bytes(range(i, i + 20))) for i, n in enumerate(ORACLE_NAMES[:4])]
    fields = ORACLE_FIELDS + salted
    lines = [f"{field} {ED}" for field in fields]
    lines += [f"@cert-authority {field} {ED2}" for field in fields]
    lines += [f"@revoked {field} {EC}" for field in fields]
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    entries = parse_known_hosts(path.read_text())
    assert len(entries) == len(lines)
    for name in ORACLE_NAMES:
        found = subprocess.run([str(KEYGEN), "-F", name, "-f", str(path)], capture_output=True,
                               text=True, check=False).stdout
        theirs = {int(n) for n in re.findall(r"found: line (\d+)", found)}
        ours = {e.lineno for e in entries_for(entries, name)}
        assert ours == theirs, name


@pytest.mark.skipif(KEYGEN is None, reason="OpenSSH's ssh-keygen is not installed")
@settings(max_examples=25, deadline=None, database=None)
@given(field=st.text("ab.*?!,[]:1#", min_size=1, max_size=12),
       names=st.lists(st.text("ab.[]:1", min_size=1, max_size=8), min_size=1, max_size=3))
def test_generated_patterns_match_as_ssh_keygen_matches(field: str, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "known_hosts"
        path.write_text(f"{field} {ED}\n")
        entries = parse_known_hosts(path.read_text())  # none when the field starts with #
        for name in names:
            found = subprocess.run([str(KEYGEN), "-F", name, "-f", str(path)],
                                   capture_output=True, text=True, check=False).stdout
            ours = bool(entries_for(entries, name))
            assert ours is ("found: line 1" in found), (field, name)


# -- the host-key algorithm order ---------------------------------------------------------------

PARAMIKO_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                  "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256")
PARAMIKO_OFFER = PARAMIKO_ORDER + tuple(f"{a}-cert-v01@openssh.com" for a in PARAMIKO_ORDER)
OPENSSH_DEFAULT = certificates_first(PARAMIKO_OFFER)


def test_certificates_come_first_as_in_openssh_s_default() -> None:
    assert OPENSSH_DEFAULT[:2] == ("ssh-ed25519-cert-v01@openssh.com",
                                   "ecdsa-sha2-nistp256-cert-v01@openssh.com")
    assert OPENSSH_DEFAULT[6] == "ssh-ed25519"


@pytest.mark.parametrize(("lines", "first"), [
    # nothing known: the default order (certificates first)
    ([], OPENSSH_DEFAULT[:2]),
    # the best algorithm's key type is listed: the default order, verbatim
    ([f"h {ED}"], OPENSSH_DEFAULT[:2]),
    # only an ECDSA key listed: its certificate and plain algorithms first
    ([f"h {EC}"], ("ecdsa-sha2-nistp256-cert-v01@openssh.com", "ecdsa-sha2-nistp256",
                   "ssh-ed25519-cert-v01@openssh.com")),
    # a CA and an ECDSA key: every certificate, then ECDSA, then the rest
    ([f"@cert-authority * {ED2}", f"h {EC}"],
     (*[a for a in OPENSSH_DEFAULT if a.endswith("-cert-v01@openssh.com")],
      "ecdsa-sha2-nistp256", "ssh-ed25519")),
    # a listed ECDSA key that is also revoked does not count
    ([f"h {EC}", f"@revoked * {EC}"], OPENSSH_DEFAULT[:2]),
    # lines of another host change nothing
    ([f"other {EC}"], OPENSSH_DEFAULT[:2]),
])
def test_order_follows_openssh_order_hostkeyalgs(lines: list[str], first: tuple[str, ...]) -> None:
    order = order_algorithms(OPENSSH_DEFAULT, parse_known_hosts("\n".join(lines)), "h", 22)
    assert order[:len(first)] == first
    assert sorted(order) == sorted(OPENSSH_DEFAULT)


def test_order_looks_the_host_up_with_its_port() -> None:
    entries = parse_known_hosts(f"[h]:2222 {EC}")
    assert order_algorithms(OPENSSH_DEFAULT, entries, "h", 2222)[0] == \
        "ecdsa-sha2-nistp256-cert-v01@openssh.com"
    assert order_algorithms(OPENSSH_DEFAULT, entries, "h", 22) == OPENSSH_DEFAULT
