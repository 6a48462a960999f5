"""The Docker Engine API over the SSH connection the toolkit already holds for a host.

docker's own ssh transport reaches a remote engine by running ``docker system dial-stdio`` on
the host and speaking HTTP over that process's stdin and stdout. Here every HTTP connection of
the docker SDK is an exec channel running that command on the host's EXISTING paramiko
Transport: no second login, and the host key was checked (strictly) when the toolkit connected.
Channels are kept alive and pooled, so N API calls cost one channel and one remote process, not N.

Failures to reach the engine (connection closed or dead, exec refused, dial-stdio failing on
the host, no answer in time) raise EngineUnreachable, a HostUnreachable.

``pull_with_progress`` turns the engine's pull stream into typed PullProgress values (layers
done/total, bytes) for live output and JSON events; the folding of that stream is pure
(``advance``).
"""

from __future__ import annotations

import contextlib
import io
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import docker
import docker.constants
import docker.errors
import docker.utils
import paramiko
import requests
import requests.adapters
import urllib3.exceptions
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from tfsdeploy.core.errors import HostUnreachable, TfsDeployError

DIAL_STDIO = "docker system dial-stdio"
API_TIMEOUT_S = 60.0
OPEN_TIMEOUT_S = 10.0
POOL_SIZE = 4
# After the engine's end of a channel, how long to wait for dial-stdio's exit status (sshd
# sends it right after EOF) to tell a clean close from a failure of dial-stdio itself.
EXIT_STATUS_WAIT_S = 1.0
# docker-py reads hijacked streams (exec, attach) through ``fp.channel`` for base URLs of this
# prefix (APIClient._get_raw_response_socket): our HijackedStream is found there.
BASE_URL = "http+docker://ssh"


class EngineUnreachable(HostUnreachable):
    """The host's Docker engine cannot be reached over its SSH connection: the connection is
    closed or dead, the host refused the exec channel, ``docker system dial-stdio`` failed
    there (no docker CLI, engine down), or the engine gave no answer in time."""


class PullFailed(TfsDeployError):
    """The engine refused or aborted an image pull (unknown image or tag, registry error)."""


# -- the transport: one exec channel running dial-stdio = one HTTP connection ------------------

class DialStdioSocket:
    """A socket-like view of one exec channel running ``docker system dial-stdio``: what
    http.client, urllib3 and docker-py's stream readers call on a socket.

    An empty read means end of stream only when the host closed the channel cleanly; a channel
    that died with its SSH connection, or a dial-stdio that failed, raises EngineUnreachable
    instead, so that a stream cut by a dead host is never mistaken for a finished one.
    """

    def __init__(self, channel: paramiko.Channel, host: str) -> None:
        self.channel = channel
        self.host = host
        self._ended_here = False

    @property
    def usable(self) -> bool:
        """Whether a new request may be sent on this channel (urllib3 asks before reusing a
        pooled connection; unexpected buffered bytes mean the engine ended the connection)."""
        chan = self.channel
        return (not self._ended_here and not chan.closed and not chan.eof_received
                and chan.get_transport().is_active() and not chan.recv_ready())

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; b"" only at a clean end of the engine's stream."""
        data: bytes = self.channel.recv(size)
        if not data and not self._ended_here:
            self._raise_unless_clean_end()
        return data

    def _raise_unless_clean_end(self) -> None:
        chan = self.channel
        if not chan.eof_received:  # closed with no EOF: the SSH connection went away
            raise EngineUnreachable(self._lost())
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        while not chan.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        errors = b""
        while chan.recv_stderr_ready():
            errors += chan.recv_stderr(65536)
        status = chan.exit_status if chan.exit_status_ready() else None
        if errors.strip() or status not in (0, None):
            text = errors.decode(errors="replace").strip() or f"exit status {status}"
            raise EngineUnreachable(f"{self.host}: `{DIAL_STDIO}` failed: {text}")

    def _lost(self) -> str:
        if self.channel.get_transport().is_active():
            return f"{self.host}: the host closed the channel running `{DIAL_STDIO}`"
        return f"{self.host}: SSH connection lost during a Docker Engine call"

    def sendall(self, data: bytes) -> None:
        """Send all of ``data``; a closed channel raises EngineUnreachable: with dial-stdio's
        own error when it ended first (an engine socket that is not there makes it exit at
        once, often before the first request is written), else as a lost channel."""
        try:
            self.channel.sendall(data)
        except TimeoutError as exc:  # the engine stopped reading (SSH window full)
            raise EngineUnreachable(f"{self.host}: the Docker engine took no data for "
                                    f"{self.gettimeout()} s") from exc
        except OSError as exc:
            if self.channel.eof_received:  # dial-stdio ended before the request: its words
                self._raise_unless_clean_end()
            raise EngineUnreachable(self._lost()) from exc

    def send(self, data: bytes) -> int:
        """Send ``data`` (all of it, as sendall) and return its length."""
        self.sendall(data)
        return len(data)

    def makefile(self, mode: str = "rb", buffering: int = -1) -> ResponseFile:
        """A buffered reader over ``recv``, as ``socket.makefile("rb")`` (http.client reads
        responses from it)."""
        if set(mode) - {"r", "b"}:
            raise ValueError(f"a dial-stdio channel is read through makefile, not {mode!r}")
        size = buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE
        return ResponseFile(_ChannelReader(self), size)

    def settimeout(self, timeout: float | None) -> None:
        """Seconds a read or write may block (None: forever)."""
        self.channel.settimeout(timeout)

    def gettimeout(self) -> float | None:
        """The current timeout."""
        timeout: float | None = self.channel.gettimeout()
        return timeout

    def fileno(self) -> int:
        """A descriptor for select/poll (docker-py polls hijacked streams)."""
        fd: int = self.channel.fileno()
        return fd

    def shutdown(self, how: int) -> None:
        """Shut down reading (0), writing (1) or both (2); reads end cleanly after."""
        if how in (0, 2):
            self._ended_here = True
        self.channel.shutdown(how)

    def close(self) -> None:
        """Close the channel: dial-stdio ends on the host; the SSH connection stays."""
        self._ended_here = True
        self.channel.close()


class _ChannelReader(io.RawIOBase):
    """The raw stream under ResponseFile; ``sock`` is where docker-py's CancellableStream
    finds the socket to shut down when a caller closes a stream (logs --follow, events)."""

    def __init__(self, sock: DialStdioSocket) -> None:
        super().__init__()
        self.sock = sock

    def readable(self) -> bool:
        """Always: this is a reader."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with what one recv brings (0 at a clean end)."""
        view = memoryview(buffer).cast("B")
        data = self.sock.recv(len(view))
        view[: len(data)] = data
        return len(data)


class ResponseFile(io.BufferedReader):
    """What makefile returns: a buffered reader whose ``channel`` attribute is where
    docker-py reads a hijacked stream of an engine behind SSH (exec, attach)."""

    def __init__(self, raw: _ChannelReader, buffer_size: int) -> None:
        super().__init__(raw, buffer_size)
        self.channel = HijackedStream(self, raw.sock)


class HijackedStream:
    """The socket docker-py reads a hijacked stream from (``_get_raw_response_socket`` takes
    ``response.raw._fp.fp.channel`` for an ssh base URL): first the bytes the response file
    already holds, then the channel's; every other call goes to the socket.

    http.client reads the 101 response's headers through the buffered file, and one read may
    bring the stream's first frames with them. Read from the socket alone, those bytes were
    lost: a `fab exec` whose output came in the same read as the headers printed exit code 0
    and no output."""

    def __init__(self, file: ResponseFile, sock: DialStdioSocket) -> None:
        self._file = file
        self._sock = sock

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes: buffered ones first; b"" only at a clean end."""
        return self._file.read1(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DialStdioConnection(HTTPConnection):
    """An HTTP connection whose socket is a dial-stdio channel (opened on first use)."""

    def __init__(self, dial: Callable[[], DialStdioSocket], timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._dial = dial

    def _new_conn(self) -> Any:  # urllib3 types a socket.socket; ours is socket-like
        sock = self._dial()
        sock.settimeout(self.timeout if isinstance(self.timeout, int | float) else None)
        return sock

    @property
    def is_connected(self) -> bool:
        # urllib3's own check polls a descriptor; the channel knows its state exactly
        return isinstance(self.sock, DialStdioSocket) and self.sock.usable


class _DialStdioPool(HTTPConnectionPool):
    """Keeps up to ``maxsize`` idle channels; more concurrent calls open more, closed after."""

    def __init__(self, dial: Callable[[], DialStdioSocket], *, timeout: float,
                 maxsize: int) -> None:
        super().__init__("localhost", timeout=timeout, maxsize=maxsize, block=False)
        self._dial = dial
        self._connect_timeout = timeout

    def _new_conn(self) -> HTTPConnection:
        self.num_connections += 1
        return _DialStdioConnection(self._dial, self._connect_timeout)


class DialStdioAdapter(requests.adapters.HTTPAdapter):
    """The requests adapter of a DockerClient: every request goes over a pooled dial-stdio
    channel of ``transport``; failures to reach the engine become EngineUnreachable."""

    def __init__(self, transport: paramiko.Transport, *, host: str, timeout: float,
                 pool_size: int,
                 open_session: Callable[[], paramiko.Channel] | None = None) -> None:
        super().__init__(max_retries=0)  # a retried POST could run twice on the engine
        self.transport = transport
        self.open_session = open_session or (
            lambda: transport.open_session(timeout=OPEN_TIMEOUT_S))
        self.host = host
        self.timeout = timeout
        self.channels_opened = 0
        self._pool = _DialStdioPool(self._dial, timeout=timeout, maxsize=pool_size)

    def _dial(self) -> DialStdioSocket:
        if not self.transport.is_active():
            raise EngineUnreachable(f"{self.host}: the SSH connection is closed")
        try:
            channel = self.open_session()
            channel.exec_command(DIAL_STDIO)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise EngineUnreachable(f"{self.host}: cannot start `{DIAL_STDIO}` over SSH: "
                                    f"{exc or type(exc).__name__}") from exc
        self.channels_opened += 1
        return DialStdioSocket(channel, self.host)

    def get_connection_with_tls_context(self, request: requests.PreparedRequest,
                                        verify: bool | str | None,
                                        proxies: Mapping[str, str] | None = None,
                                        cert: Any = None) -> HTTPConnectionPool:
        """Every URL of this adapter is the one engine: one pool."""
        return self._pool

    def get_connection(self, url: str | bytes,
                       proxies: Mapping[str, str] | None = None) -> HTTPConnectionPool:
        """As get_connection_with_tls_context (older requests call this one)."""
        return self._pool

    def request_url(self, request: requests.PreparedRequest,
                    proxies: dict[str, str] | None) -> str:
        """The path only: no proxy ever sits between us and the engine."""
        return request.path_url

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: bool | str = True, cert: Any = None,
             proxies: Mapping[str, str] | None = None) -> requests.Response:
        """Send ``request`` to the engine (environment proxies are ignored)."""
        try:
            return super().send(request, stream=stream, timeout=timeout, verify=verify,
                                cert=cert, proxies={})
        except requests.exceptions.Timeout as exc:
            raise EngineUnreachable(f"{self.host}: the Docker engine gave no answer in "
                                    f"{_seconds(timeout, self.timeout):g} s") from exc
        except requests.exceptions.ConnectionError as exc:
            raise EngineUnreachable(self._why(exc)) from exc

    def _why(self, exc: Exception) -> str:
        if not self.transport.is_active():
            return f"{self.host}: SSH connection lost during a Docker Engine call"
        return f"{self.host}: the Docker engine connection failed: {exc}"

    def close(self) -> None:
        """Close the pooled channels (the SSH connection is the caller's and stays open)."""
        super().close()
        self._pool.close()


def _seconds(timeout: Any, default: float) -> float:
    if isinstance(timeout, tuple):
        timeout = timeout[-1]
    return float(timeout) if isinstance(timeout, int | float) else default


def _api_version(adapter: DialStdioAdapter, timeout: float) -> str:
    """The API version to speak: the engine's, capped at the newest the SDK knows.

    The engine names its version in the ``Api-Version`` header of /_ping, which docker's own
    CLI reads to negotiate. /version costs ~35 ms on the testbed against ~2 ms: the engine runs
    its default runtime and init binaries with ``--version`` to answer it (moby
    daemon/info_unix.go).
    """
    with requests.Session() as probe:
        probe.mount(BASE_URL, adapter)
        reply = probe.get(f"{BASE_URL}/_ping", timeout=timeout)
        try:
            reply.raise_for_status()
            server = reply.headers["Api-Version"]
        except (requests.exceptions.RequestException, KeyError) as exc:
            raise EngineUnreachable(f"{adapter.host}: the Docker engine's /_ping answer is not "
                                    f"usable: {exc}") from exc
        finally:
            reply.close()
        # Session.__exit__ closes mounted adapters: detach ours first (it serves the client)
        probe.adapters.pop(BASE_URL)
    newest = docker.constants.DEFAULT_DOCKER_API_VERSION
    return server if docker.utils.version_lt(server, newest) else newest


def docker_client(transport: paramiko.Transport, *, host: str | None = None,
                  timeout: float = API_TIMEOUT_S, pool_size: int = POOL_SIZE,
                  open_session: Callable[[], paramiko.Channel] | None = None
                  ) -> docker.DockerClient:
    """A DockerClient for the engine of the host at the other end of ``transport``.

    Its HTTP connections are exec channels running ``docker system dial-stdio`` on
    ``transport`` (kept alive, at most ``pool_size`` idle ones kept); no new SSH login is made.
    ``timeout`` bounds each call's wait for an answer (streams such as logs --follow are not
    bounded). ``host`` names the host in errors (default: the peer address). One call to the
    engine (/_ping) picks the API version. Closing the client closes its channels, never
    ``transport``. Sets TCP_NODELAY on the transport's socket (see ``_no_delay``). Raises
    EngineUnreachable when the engine cannot be reached. ``open_session`` opens each channel
    (default: ``transport.open_session``; the host's connection bounds its sessions).
    """
    name = host or _peer(transport)
    _no_delay(transport)
    adapter = DialStdioAdapter(transport, host=name, timeout=timeout, pool_size=pool_size,
                               open_session=open_session)
    version = _api_version(adapter, timeout)
    # The SDK's ssh:// set-up gives the base URL and the stream handling of an engine behind
    # SSH; with use_ssh_client=True it makes no connection of its own (it would start the ssh
    # binary on first use); mounting our adapter on its prefix replaces that transport.
    client = docker.DockerClient(base_url="ssh://dial-stdio", use_ssh_client=True,
                                 version=version, timeout=timeout)
    client.api.mount(BASE_URL, adapter)
    return client


def _no_delay(transport: paramiko.Transport) -> None:
    # An API call is a small request answered by a small response. With Nagle's algorithm on,
    # a request written while paramiko's last window adjustment is still unacknowledged waits
    # for the host's delayed ACK (40 ms on Linux): measured on the testbed, ~35 ms per call
    # instead of ~2 ms (benchmarks/bench_docker_ssh.py). Commands run over the same
    # connection gain as much.
    sock = transport.sock  # a Channel when the connection is tunnelled: nothing to set then
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def engine_adapter(client: docker.DockerClient) -> DialStdioAdapter | None:
    """The dial-stdio adapter behind ``client`` (None for a client made otherwise)."""
    adapter = client.api.get_adapter(BASE_URL)
    return adapter if isinstance(adapter, DialStdioAdapter) else None


def _peer(transport: paramiko.Transport) -> str:
    try:
        return str(transport.getpeername()[0])
    except (OSError, AttributeError, IndexError):
        return "host"


# -- image pulls with progress ----------------------------------------------------------------
# The engine's pull stream (moby distribution/xfer/download.go, distribution/pull_v2.go): one
# JSON object per update, {"status", "id", "progressDetail": {"current", "total"}}; per layer
# "Pulling fs layer" / "Waiting", "Downloading" (bytes of the compressed layer), "Verifying
# Checksum", "Download complete", "Extracting", "Pull complete", or "Already exists"; lines
# without a layer ("Pulling from <repo>" whose id is the tag, "Digest: ...", "Status: ...");
# a failure is {"error", "errorDetail": {"message"}}.

class LayerPhase(StrEnum):
    """Where one layer of a pull is."""

    WAITING = "waiting"
    DOWNLOADING = "downloading"
    DOWNLOADED = "downloaded"
    EXTRACTING = "extracting"
    DONE = "done"  # pulled and registered
    PRESENT = "present"  # already on the host: nothing to fetch

    @property
    def finished(self) -> bool:
        """Whether the layer needs nothing more."""
        return self in (LayerPhase.DONE, LayerPhase.PRESENT)


_PHASES = {
    "Pulling fs layer": LayerPhase.WAITING,
    "Waiting": LayerPhase.WAITING,
    "Downloading": LayerPhase.DOWNLOADING,
    "Verifying Checksum": LayerPhase.DOWNLOADING,
    "Download complete": LayerPhase.DOWNLOADED,
    "Extracting": LayerPhase.EXTRACTING,
    "Pull complete": LayerPhase.DONE,
    "Already exists": LayerPhase.PRESENT,
}


@dataclass(frozen=True)
class Layer:
    """One layer of a pull: its phase and bytes of the compressed layer, downloaded and
    extracted so far (``size`` 0 while the engine has not told it)."""

    id: str
    phase: LayerPhase
    downloaded: int = 0
    extracted: int = 0
    size: int = 0


@dataclass(frozen=True)
class PullProgress:
    """Where a pull stands after one event of the engine, for live output and JSON events.

    Bytes are those of the compressed layers. ``bytes_total`` sums the layer sizes known so far
    (the engine tells a layer's size when its download starts), so it can grow during a pull;
    layers already on the host count as done and add no bytes. Extraction follows the download
    and can take as long on big layers: ``bytes_extracted`` shows it.
    """

    image: str
    layers_done: int
    layers_total: int
    bytes_done: int
    bytes_total: int
    bytes_extracted: int
    status: str  # the engine's words for this event
    layer: str | None = None  # the layer the event is about

    def as_event(self) -> dict[str, object]:
        """A JSON-ready event."""
        return {"event": "image_pull", "image": self.image, "layer": self.layer,
                "status": self.status, "layers_done": self.layers_done,
                "layers_total": self.layers_total, "bytes_done": self.bytes_done,
                "bytes_total": self.bytes_total, "bytes_extracted": self.bytes_extracted}


@dataclass(frozen=True)
class PullState:
    """A pull folded from the engine's events so far (pure; see ``advance``)."""

    image: str
    layers: Mapping[str, Layer] = field(default_factory=dict)
    status: str = ""
    layer: str | None = None
    error: str | None = None

    def progress(self) -> PullProgress:
        """The figures of this state."""
        layers = self.layers.values()
        return PullProgress(
            image=self.image, layers_done=sum(1 for x in layers if x.phase.finished),
            layers_total=len(self.layers), bytes_done=sum(x.downloaded for x in layers),
            bytes_total=sum(x.size for x in layers),
            bytes_extracted=sum(x.extracted for x in layers), status=self.status,
            layer=self.layer)


def advance(state: PullState, event: Mapping[str, Any]) -> PullState:
    """``state`` after one event of the engine's pull stream."""
    if event.get("error") or event.get("errorDetail"):
        detail = event.get("errorDetail") or {}
        return replace(state, error=str(detail.get("message") or event.get("error")))
    status = str(event.get("status", ""))
    phase = _PHASES.get(status)
    if status.startswith("Retrying in"):
        phase = LayerPhase.DOWNLOADING
    layer_id = event.get("id")
    if phase is None or not layer_id:
        return replace(state, status=status, layer=None)
    old = state.layers.get(str(layer_id), Layer(str(layer_id), LayerPhase.WAITING))
    layers = dict(state.layers)
    layers[old.id] = _layer_after(old, phase, event.get("progressDetail") or {})
    return replace(state, layers=layers, status=status, layer=old.id)


def _layer_after(layer: Layer, phase: LayerPhase, detail: Mapping[str, Any]) -> Layer:
    if layer.phase.finished:  # an engine never goes back; a stray event changes nothing
        return layer
    current, total = int(detail.get("current") or 0), int(detail.get("total") or 0)
    # Downloading and Extracting both report progress through the compressed layer, so
    # either one's total is the layer's size
    size = total or layer.size
    if phase is LayerPhase.PRESENT:
        return Layer(layer.id, phase)
    if phase is LayerPhase.WAITING:
        return replace(layer, phase=phase)
    if phase is LayerPhase.DOWNLOADING:
        return replace(layer, phase=phase, size=size,
                       downloaded=current if total else layer.downloaded)
    if phase is LayerPhase.DOWNLOADED:
        return replace(layer, phase=phase, size=size, downloaded=size)
    if phase is LayerPhase.EXTRACTING:
        return replace(layer, phase=phase, size=size, downloaded=size, extracted=current)
    return replace(layer, phase=phase, size=size, downloaded=size, extracted=size)


def pull_with_progress(client: docker.DockerClient, image: str,
                       on_progress: Callable[[PullProgress], None], *,
                       auth_config: Mapping[str, str]) -> str:
    """Pull ``image`` on the client's engine with ``auth_config`` (the login the engine sends
    the registry; empty: none), calling ``on_progress`` after every event of the engine's
    stream; returns the pulled image's id (``sha256:...``). The login is always given: left
    out, docker-py would send the login of this machine's own docker configuration
    (``hosts.logins``).

    Raises PullFailed when the engine refuses or aborts the pull, EngineUnreachable when the
    engine cannot be reached or the stream is cut.
    """
    repository, tag = docker.utils.parse_repository_tag(image)
    tag = tag or "latest"
    reference = f"{repository}@{tag}" if ":" in tag else f"{repository}:{tag}"
    adapter = engine_adapter(client)
    where = f"{adapter.host}: " if adapter else ""
    state = PullState(image=reference)
    try:
        for event in client.api.pull(repository, tag=tag, stream=True, decode=True,
                                     auth_config=dict(auth_config)):
            state = advance(state, event)
            if state.error is not None:
                break
            on_progress(state.progress())
        if state.error is None:
            return str(client.api.inspect_image(reference)["Id"])
    except docker.errors.APIError as exc:
        state = replace(state, error=str(exc.explanation or exc))
    except (urllib3.exceptions.HTTPError, requests.exceptions.RequestException) as exc:
        raise EngineUnreachable(f"{where}the pull stream of {reference} was cut: {exc}") from exc
    raise PullFailed(f"{where}pull of {reference} failed: {state.error}\n    fix: check the "
                     f"image name and tag, and that the host can reach the registry and log in "
                     f"to it (the host's own `docker login`, or pull_logins in the inventory)")
