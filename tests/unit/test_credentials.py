"""Credentials stay where they belong.

The hosts' engines never get the deploy machine's login: each pull states the host's own
(its docker configuration, or a pull-only credential the inventory names by reference), or
none; a container is never created by pulling its image on the way (the docker SDK over a
recording engine, the deploy machine's docker configuration holding a push login). The deploy
machine's registry client sends its login to the registry's own origin only, asks a token
service for a token only over HTTPS, follows no redirect, trusts the CA Docker trusts for the
registry (a real HTTPS server here), and shows no secret in ``repr`` or a message."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import requests
import requests.adapters
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tfsdeploy.core.errors import ConfigError
from tfsdeploy.hosts.dockerapi import DockerFailed, SdkDocker
from tfsdeploy.hosts.dockerssh import BASE_URL
from tfsdeploy.hosts.logins import PullLogins, check_references, read_reference
from tfsdeploy.hosts.registry import Registry, RegistryError
from tfsdeploy.hosts.ssh import Result

PUSH = ("deployer", "push-s3cret")
PULL = ("fleetpull", "pull-s3cret")
IMAGE = "reg.example:5000/models/m@sha256:" + "a" * 64


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


# -- the hosts' engines ---------------------------------------------------------------------

class RecordingEngine(requests.adapters.BaseAdapter):
    """A Docker engine that records every request; it answers a container create with
    "No such image" and cuts every pull (what was sent is what these tests look at)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,
             verify: Any = True, cert: Any = None, proxies: Any = None) -> requests.Response:
        self.requests.append(request)
        if "/containers/create" in str(request.url):
            response = requests.Response()
            response.status_code, response.reason = 404, "Not Found"
            response._content = json.dumps({"message": "No such image: x"}).encode()
            response.request, response.url = request, str(request.url)
            return response
        raise requests.exceptions.ConnectionError("the test's engine ends here")

    def close(self) -> None:
        pass

    def pull_logins(self) -> list[dict[str, str]]:
        """The X-Registry-Auth of every pull, decoded ({} : anonymous)."""
        found = []
        for request in self.requests:
            if "/images/create" in str(request.url):
                header = request.headers["X-Registry-Auth"]
                text = header.decode() if isinstance(header, bytes) else header
                found.append(json.loads(base64.urlsafe_b64decode(text + "==")))
        return found


@pytest.fixture()
def push_login_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This (deploy) machine's docker configuration holds the push login."""
    config = tmp_path / "docker-config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps(
        {"auths": {"reg.example:5000": {"auth": _auth(*PUSH)}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))


def _engine(logins: PullLogins | None) -> tuple[SdkDocker, RecordingEngine]:
    client = docker.DockerClient(base_url="ssh://dial-stdio", use_ssh_client=True,
                                 version="1.41")
    engine = RecordingEngine()
    client.api.mount(BASE_URL, engine)
    return SdkDocker(client, "h1", logins), engine


def _host(config: dict[str, Any] | None, helper: dict[str, str] | None = None
          ) -> tuple[list[list[str]], Any]:
    """A host's commands: its docker configuration and credential helper, as ``run``."""
    ran: list[list[str]] = []

    def run(argv: list[str], stdin: bytes | None) -> Result:
        ran.append(argv)
        if argv[0].startswith("docker-credential-"):
            found = helper or {}
            return Result(tuple(argv), 0 if found else 1, json.dumps(found), "")
        return Result(tuple(argv), 0, json.dumps(config) if config else "", "")

    return ran, run


def _pull(docker_api: SdkDocker) -> None:
    with pytest.raises(Exception, match=r"engine ends here|Docker connection"):
        docker_api.pull(IMAGE, lambda _progress: None)


def test_a_host_without_a_login_pulls_anonymously_never_with_the_push_login(
        push_login_here: None) -> None:
    _, run = _host(None)
    docker_api, engine = _engine(PullLogins("h1", {}, run))
    _pull(docker_api)
    assert engine.pull_logins() == [{}]


def test_a_host_pulls_with_its_own_docker_login(push_login_here: None) -> None:
    ran, run = _host({"auths": {"reg.example:5000": {"auth": _auth(*PULL)}}})
    docker_api, engine = _engine(PullLogins("h1", {}, run))
    _pull(docker_api)
    _pull(docker_api)
    assert engine.pull_logins() == [{"username": "fleetpull", "password": "pull-s3cret",
                                     "serveraddress": "reg.example:5000"}] * 2
    assert len(ran) == 1, "the host's login is read once per connection"
    assert all("s3cret" not in " ".join(argv) for argv in ran)


def test_a_host_s_credential_helper_is_asked_with_the_registry_on_stdin(
        push_login_here: None) -> None:
    ran, run = _host({"credHelpers": {"reg.example:5000": "ecr-login"}, "auths": {}},
                     {"ServerURL": "reg.example:5000", "Username": "AWS",
                      "Secret": "helper-s3cret"})
    docker_api, engine = _engine(PullLogins("h1", {}, run))
    _pull(docker_api)
    assert ran[1] == ["docker-credential-ecr-login", "get"]
    assert engine.pull_logins()[0]["password"] == "helper-s3cret"


def test_a_pull_login_named_by_reference_is_sent_to_that_registry_only(
        push_login_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_PULL", ":".join(PULL))
    _, run = _host({"auths": {"reg.example:5000": {"auth": _auth("other", "x")}}})
    docker_api, engine = _engine(PullLogins("h1", {"reg.example:5000": "env:FLEET_PULL"}, run))
    _pull(docker_api)
    with pytest.raises(Exception, match=r"engine ends here|Docker connection"):
        docker_api.pull("10.0.0.1:5000/serving:1", lambda _progress: None)
    assert engine.pull_logins() == [
        {"username": "fleetpull", "password": "pull-s3cret", "serveraddress": "reg.example:5000"},
        {}]  # the other registry: the host's own login (none for it here)
    assert "s3cret" not in repr(docker_api._logins)


def test_a_container_is_never_created_by_pulling_its_image(push_login_here: None) -> None:
    from tfsdeploy.hosts.commands.containers import ContainerSpec

    docker_api, engine = _engine(PullLogins("h1", {}, _host(None)[1]))
    with pytest.raises(DockerFailed, match="No such image"):
        docker_api.run(ContainerSpec(name="tfs-m-r1-i0", image=IMAGE, command=()))
    assert not [r for r in engine.requests if "/images/create" in str(r.url)]


def test_a_pull_login_reference_is_checked_and_never_shown(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    secret = tmp_path / "pull.login"
    secret.write_text("fleetpull:pull-s3cret\n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError) as shared:
        check_references({"reg.example:5000": f"file:{secret}"})
    assert "field pull_logins.reg.example:5000" in str(shared.value)
    assert "is readable by others (mode 0644)" in str(shared.value)
    assert f"chmod 600 {secret}" in str(shared.value)
    secret.chmod(0o600)
    assert read_reference("reg.example:5000", f"file:{secret}")["password"] == "pull-s3cret"
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(ConfigError, match=r"env:NOPE for reg\.example:5000 is not set"):
        check_references({"reg.example:5000": "env:NOPE"})
    monkeypatch.setenv("BROKEN", "pull-s3cret")
    with pytest.raises(ConfigError) as broken:
        check_references({"reg.example:5000": "env:BROKEN"})
    assert "does not hold one line USER:PASSWORD" in str(broken.value)
    assert "s3cret" not in str(broken.value) and "s3cret" not in str(shared.value)


# -- the deploy machine's registry client ------------------------------------------------------

class Origins:
    """Registry, token service and another origin in one fake network: every request kept."""

    def __init__(self, *, realm: str = "", location: str = "/v2/upload/1",
                 redirect: str = "") -> None:
        self.seen: list[httpx.Request] = []
        self.realm, self.location, self.redirect = realm, location, redirect

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        host, path = request.url.host, request.url.path
        if host != "reg.example":
            return httpx.Response(200, json={"token": "tok-s3cret"}) if "token" in path \
                else httpx.Response(201)
        if self.realm and request.headers.get("Authorization") != "Bearer tok-s3cret":
            return httpx.Response(401, headers={
                "WWW-Authenticate": f'Bearer realm="{self.realm}",service="reg"'})
        if self.redirect and request.method == "HEAD":
            return httpx.Response(307, headers={"Location": self.redirect})
        if path.endswith("/blobs/uploads/"):
            return httpx.Response(202, headers={"Location": self.location})
        return httpx.Response(201 if request.method == "PUT" else 404)

    def to(self, host: str) -> list[httpx.Request]:
        return [r for r in self.seen if r.url.host == host]


def _client(origins: Origins, *, insecure: bool = False) -> Registry:
    return Registry("reg.example:5000", insecure=insecure, login=PUSH,
                    transport=httpx.MockTransport(origins.handle))


def test_repr_shows_no_login_and_no_token() -> None:
    origins = Origins(realm="https://auth.example/token")
    registry = _client(origins)
    assert registry.has_blob("models/m", "sha256:00") is False
    assert registry._token == "Bearer tok-s3cret"
    for text in (repr(registry), str(registry), repr(registry.login)):
        assert "s3cret" not in text, text
    assert "login='set'" in repr(registry)


def test_an_upload_location_on_another_origin_gets_no_credentials() -> None:
    origins = Origins(location="https://storage.example/upload/1")
    with pytest.raises(RegistryError, match=r"sent PUT to another origin "
                                            r"\(https://storage.example\): refused"):
        _client(origins).upload_blob("models/m", "sha256:00", 1, lambda: b"x")
    assert origins.to("storage.example") == []
    insecure = Origins(location="http://storage.example/upload/1")
    registry = Registry("reg.example:5000", insecure=True, login=PUSH,
                        transport=httpx.MockTransport(insecure.handle))
    registry._token = "Basic " + _auth(*PUSH)  # logged in at the registry already
    registry.upload_blob("models/m", "sha256:00", 1, lambda: b"x")
    (put,) = insecure.to("storage.example")
    assert "Authorization" not in put.headers


def test_a_token_service_over_plain_http_is_never_sent_the_login() -> None:
    origins = Origins(realm="http://auth.example/token")
    with pytest.raises(RegistryError, match="names a token service over plain HTTP"):
        _client(origins).has_blob("models/m", "sha256:00")
    assert origins.to("auth.example") == []


def test_a_token_service_over_https_gets_the_login_and_the_registry_the_token() -> None:
    origins = Origins(realm="https://auth.example/token")
    assert _client(origins).has_blob("models/m", "sha256:00") is False
    (asked,) = origins.to("auth.example")
    assert asked.headers["Authorization"] == "Basic " + _auth(*PUSH)
    assert origins.to("reg.example")[-1].headers["Authorization"] == "Bearer tok-s3cret"


def test_a_redirect_is_never_followed() -> None:
    origins = Origins(redirect="https://storage.example/blob")
    assert _client(origins).has_blob("models/m", "sha256:00") is True  # found, served there
    assert origins.to("storage.example") == []


# -- HTTPS with the CA Docker trusts for the registry ---------------------------------------

def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 signer: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        import ipaddress
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(signer, hashes.SHA256())


@pytest.fixture()
def https_registry(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A registry answering 404 to every blob HEAD over HTTPS with a private CA's certificate;
    (its host:port, the CA's PEM)."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = _certificate("test CA", ca_key, ca_name, ca_key, ca=True)
    cert = _certificate("127.0.0.1", key, ca_name, ca_key, ca=False)
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", tmp_path / "ca.pem"
    finally:
        server.shutdown()
        server.server_close()


def test_https_trusts_the_ca_docker_trusts_for_that_registry(https_registry: tuple[str, Path],
                                                             tmp_path: Path) -> None:
    host, ca = https_registry
    certs = tmp_path / "certs.d"
    with pytest.raises(RegistryError) as untrusted:
        Registry(host, certs_dir=str(certs)).has_blob("models/m", "sha256:00")
    assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
    assert f"fix: this machine does not trust its certificate: put the CA that signed it in " \
           f"/etc/docker/certs.d/{host}/ca.crt" in str(untrusted.value)
    (certs / host).mkdir(parents=True)
    (certs / host / "ca.crt").write_bytes(ca.read_bytes())
    assert Registry(host, certs_dir=str(certs)).has_blob("models/m", "sha256:00") is False
