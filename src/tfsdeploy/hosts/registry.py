"""The fleet's registry, spoken to over its HTTP API from the deploy machine (no Docker engine
needed here): blobs checked and uploaded, manifests checked and put.

The calls (OCI distribution-spec, github.com/opencontainers/distribution-spec spec.md, the
Docker Registry HTTP API V2 it grew from):
- ``HEAD /v2/<name>/blobs/<digest>``: 200 when the registry holds the blob (nothing to
  upload), 404 otherwise;
- a monolithic upload: ``POST /v2/<name>/blobs/uploads/`` answers 202 with the upload URL in
  ``Location`` (absolute or relative, treated as opaque), then
  ``PUT <location>?digest=<digest>`` with the whole blob (``Content-Type:
  application/octet-stream``) answers 201; the registry checks the bytes against the digest;
- ``HEAD /v2/<name>/manifests/<digest>`` (with ``Accept`` naming the manifest type): 200 when
  it is there; ``PUT /v2/<name>/manifests/<tag>`` with ``Content-Type`` the manifest's media
  type answers 201 and ``Docker-Content-Digest``;
- a 401 carries ``WWW-Authenticate``: ``Basic`` (send the login) or ``Bearer
  realm=...,service=...,scope=...`` (fetch a token from the realm with the login, then send
  ``Authorization: Bearer <token>``; the token answer holds ``token`` or ``access_token``).

Credentials are never the inventory's: they come from this machine's own ``docker login``
(``$DOCKER_CONFIG/config.json``, default ``~/.docker/config.json``, its ``auths`` entry for the
registry, ``auth`` = base64 of ``user:password``); the hosts' engines use their own logins
(``hosts.logins``). They are sent to the registry's own origin only (scheme, host, port):
an upload location on another origin is refused unless the registry is declared insecure
(and is then sent no credentials), no redirect is ever followed, and a ``Bearer`` token
service is asked for a token only over HTTPS (plain HTTP only for an insecure registry).
Neither the login nor a token shows in ``repr`` or in any message.

HTTPS is checked against this machine's trusted CAs and, as Docker does for a registry, the
CA certificates in ``/etc/docker/certs.d/<host:port>/*.crt`` (docs.docker.com, "Verify
repository client with certificates"): the file a fleet already gives its engines.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urljoin

import certifi
import httpx

from tfsdeploy.core.errors import TfsDeployError

TIMEOUT = httpx.Timeout(30.0, read=600.0, write=600.0)
CHUNK = 1 << 20
DOCKER_CERTS = "/etc/docker/certs.d"


class RegistryError(TfsDeployError):
    """The registry could not be reached, or refused a call (the message says which and
    why)."""


class Login(NamedTuple):
    """A registry login; its password never shows in ``repr``."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"Login(user={self.user!r}, password='***')"


def docker_login(registry: str, config_dir: str | None = None) -> Login | None:
    """(user, password) of this machine's ``docker login`` to ``registry``, or None."""
    base = Path(config_dir or os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    try:
        auths = json.loads((base / "config.json").read_text()).get("auths", {})
    except (OSError, ValueError, AttributeError):
        return None
    entry = auths.get(registry) or auths.get(f"https://{registry}") or {}
    encoded = entry.get("auth") if isinstance(entry, dict) else None
    if not encoded:
        return None
    try:
        user, _, password = base64.b64decode(encoded).decode().partition(":")
    except ValueError:
        return None
    return Login(user, password)


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    return url.scheme, url.host, port


def trust_for(host: str, certs_dir: str = DOCKER_CERTS) -> ssl.SSLContext:
    """The TLS trust for ``host``: this machine's CAs, certifi's, and the CA certificates
    Docker trusts for that registry (``certs_dir/<host:port>/*.crt``)."""
    context = ssl.create_default_context()  # the system's CAs, SSL_CERT_FILE, SSL_CERT_DIR
    context.load_verify_locations(certifi.where())
    for certificate in sorted(Path(certs_dir, host).glob("*.crt")):
        context.load_verify_locations(str(certificate))
    return context


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


@dataclass
class Registry:
    """One registry (``host[:port]``), over HTTPS, or plain HTTP when ``insecure`` (as the
    engines' ``--insecure-registry``)."""

    host: str
    insecure: bool = False
    login: tuple[str, str] | None = field(default=None, repr=False)
    transport: httpx.BaseTransport | None = field(default=None, repr=False)  # tests: a fake
    sent_bytes: int = 0  # blob and manifest bytes this client uploaded
    certs_dir: str = field(default=DOCKER_CERTS, repr=False)
    _token: str | None = field(default=None, repr=False)
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        scheme = "http" if self.insecure else "https"
        if self.login is not None:
            self.login = Login(*self.login)
        # redirects are never followed: one to another origin would take the credentials
        # along (see has_blob for the one a registry answers with)
        self._client = httpx.Client(
            base_url=f"{scheme}://{self.host}", timeout=TIMEOUT, transport=self.transport,
            follow_redirects=False,
            verify=True if self.insecure else trust_for(self.host, self.certs_dir))
        self._origin = _origin(self._client.base_url)

    def close(self) -> None:
        """Close the connections."""
        self._client.close()

    def __repr__(self) -> str:
        return (f"Registry(host={self.host!r}, insecure={self.insecure!r}, "
                f"login={'set' if self.login else None!r}, sent_bytes={self.sent_bytes!r})")

    def _target(self, method: str, url: str) -> tuple[httpx.URL, bool]:
        """The absolute URL of ``url`` and whether it is the registry's own origin (the only
        one credentials go to); another origin is refused unless the registry is insecure."""
        target = self._client.base_url.join(url) if url.startswith("/") else httpx.URL(url)
        own = _origin(target) == self._origin
        if not own and not self.insecure:
            raise RegistryError(
                f"registry {self.host} sent {method} to another origin "
                f"({target.scheme}://{target.netloc.decode()}): refused, this machine's login "
                f"goes to {self.host} only\n    fix: serve uploads from the registry's own "
                "address, or declare it insecure (model_registry_insecure) to send them there "
                "without the login")
        return target, own

    def _request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        target, own = self._target(method, url)
        for attempt in (1, 2):
            headers = dict(kwargs.pop("headers", {}) or {})  # type: ignore[call-overload]
            if self._token and own:
                headers["Authorization"] = self._token
            try:
                response = self._client.request(method, target, headers=headers,
                                                **kwargs)  # type: ignore[arg-type]
            except httpx.HTTPError as error:
                raise RegistryError(self._unreachable(f"{method} {target.path}", error)) \
                    from None
            if response.status_code != 401 or attempt == 2 or not own \
                    or not self._authenticate(response):
                return response
            kwargs["headers"] = headers
        raise AssertionError("unreachable")

    def _unreachable(self, what: str, error: httpx.HTTPError) -> str:
        text = f"registry {self.host} unreachable ({what}): {error}"
        if "CERTIFICATE_VERIFY_FAILED" in str(error):
            text += (f"\n    fix: this machine does not trust its certificate: put the CA that "
                     f"signed it in {DOCKER_CERTS}/{self.host}/ca.crt (as for the engines), "
                     "or in SSL_CERT_FILE")
        return text

    def _authenticate(self, response: httpx.Response) -> bool:
        scheme, params = _challenge(response.headers.get("WWW-Authenticate", ""))
        login = self.login or docker_login(self.host)
        if scheme == "basic" and login:
            self._token = "Basic " + base64.b64encode(":".join(login).encode()).decode()
            return True
        if scheme != "bearer" or "realm" not in params:
            return False
        realm = httpx.URL(params["realm"])
        if realm.scheme != "https" and not self.insecure:
            raise RegistryError(
                f"registry {self.host} names a token service over plain HTTP "
                f"({realm.scheme}://{realm.netloc.decode()}): refused, the login would travel "
                "in clear\n    fix: serve the token service over HTTPS, or declare the "
                "registry insecure (model_registry_insecure) if that is meant")
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        try:
            answer = self._client.get(realm, params=query, auth=login)
        except httpx.HTTPError as error:
            raise RegistryError(f"registry {self.host}: token service unreachable: "
                                f"{error}") from None
        if answer.status_code != 200:
            raise RegistryError(f"registry {self.host}: the token service refused "
                                f"({answer.status_code}): `docker login {self.host}` on "
                                "this machine")
        body = answer.json()
        token = body.get("token") or body.get("access_token")
        self._token = f"Bearer {token}" if token else None
        return bool(token)

    def _refused(self, what: str, response: httpx.Response) -> RegistryError:
        hint = (f"; log in with `docker login {self.host}` on this machine"
                if response.status_code in (401, 403) else "")
        return RegistryError(f"registry {self.host} refused {what}: HTTP "
                             f"{response.status_code} {response.text[:300].strip()}{hint}")

    def has_blob(self, repository: str, digest: str) -> bool:
        """Whether the repository holds the blob. A registry that keeps its blobs elsewhere
        answers with a redirect to them, only once it found the blob (distribution
        registry/handlers/blob.go, ``GetBlob``: the descriptor is read before ``ServeBlob``
        redirects): present, and the redirect is not followed."""
        response = self._request("HEAD", f"/v2/{repository}/blobs/{digest}")
        if response.is_redirect:
            return True
        if response.status_code in (200, 404):
            return response.status_code == 200
        raise self._refused(f"HEAD of blob {digest}", response)

    def upload_blob(self, repository: str, digest: str, size: int,
                    chunks: Callable[[], object]) -> None:
        """Upload one blob in one PUT (``chunks()`` gives its bytes: bytes or an iterator of
        bytes); the registry verifies the digest."""
        started = self._request("POST", f"/v2/{repository}/blobs/uploads/")
        if started.status_code != 202 or "Location" not in started.headers:
            raise self._refused("the start of an upload", started)
        location = urljoin(str(self._client.base_url) + "/", started.headers["Location"])
        self._target("PUT", location)  # another origin: refused before any byte is read
        separator = "&" if "?" in location else "?"
        done = self._request("PUT", f"{location}{separator}digest={digest}",
                             content=chunks(), headers={
                                 "Content-Type": "application/octet-stream",
                                 "Content-Length": str(size)})
        if done.status_code != 201:
            raise self._refused(f"blob {digest}", done)
        self.sent_bytes += size

    def has_manifest(self, repository: str, digest: str, media_type: str) -> bool:
        """Whether the repository holds the manifest of ``digest``."""
        response = self._request("HEAD", f"/v2/{repository}/manifests/{digest}",
                                 headers={"Accept": media_type})
        if response.status_code in (200, 404):
            return response.status_code == 200
        raise self._refused(f"HEAD of manifest {digest}", response)

    def put_manifest(self, repository: str, tag: str, body: bytes, media_type: str) -> str:
        """Put a manifest under ``tag``; returns the digest the registry gives it."""
        response = self._request("PUT", f"/v2/{repository}/manifests/{tag}", content=body,
                                 headers={"Content-Type": media_type})
        if response.status_code != 201:
            raise self._refused(f"manifest {repository}:{tag}", response)
        self.sent_bytes += len(body)
        return str(response.headers.get("Docker-Content-Digest", ""))
