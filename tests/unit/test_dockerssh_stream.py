"""A hijacked stream read over a dial-stdio channel (exec, attach) keeps the bytes that came in
the same read as the 101 response's headers: docker-py reads such a stream from
``response.raw._fp.fp.channel``, and http.client has read the headers through the buffered
file before it. A fake channel plays the engine: each request written gets its answer, the
exec's output right behind its 101 headers (what `fab exec` once printed as exit code 0 and
no output)."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from tfsdeploy.hosts.dockerssh import docker_client

OUTPUT = b"tb3\n"


def _answer(method: str, path: str) -> tuple[bytes, bool]:
    """The engine's answer to one request, and whether the connection ends after it."""
    if path.endswith("/_ping"):
        return (b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 2\r\n\r\nOK"), False
    if method == "POST" and path.endswith("/containers/c1/exec"):
        body = json.dumps({"Id": "e1"}).encode()
        return (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body), False
    if method == "POST" and path.endswith("/exec/e1/start"):
        frame = struct.pack(">BxxxL", 1, len(OUTPUT)) + OUTPUT  # stdout, multiplexed
        return (b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + frame), True
    if method == "GET" and path.endswith("/exec/e1/json"):
        body = json.dumps({"ExitCode": 0, "Running": False}).encode()
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body), False
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", False


class EngineChannel:
    """What DialStdioSocket calls on a paramiko channel, answered by ``_answer``."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.answers = bytearray()
        self.eof_received = False
        self.closed = False
        self.exit_status = 0
        self._timeout: float | None = None
        self._ready, writer = os.pipe()  # always readable: docker-py polls before reading
        os.write(writer, b"x")
        os.close(writer)

    def exec_command(self, command: str) -> None:
        assert command == "docker system dial-stdio"

    def sendall(self, data: bytes) -> None:
        self.sent += data
        while b"\r\n\r\n" in self.sent:
            head, _, rest = bytes(self.sent).partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) < length:
                return
            self.sent = bytearray(rest[length:])
            method, path = head.split(b" ")[:2]
            answer, ends = _answer(method.decode(), path.decode())
            self.answers += answer
            self.eof_received = self.eof_received or ends

    def recv(self, size: int) -> bytes:
        data = bytes(self.answers[:size])  # a whole answer in one read, as a busy link gives
        del self.answers[:size]
        return data

    def recv_ready(self) -> bool:
        return bool(self.answers)

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return self.eof_received

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def fileno(self) -> int:
        return self._ready

    def get_transport(self) -> Any:
        return Transport()

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Transport:
    sock = None  # tunnelled: no TCP option to set

    def is_active(self) -> bool:
        return True


def test_an_exec_keeps_the_output_that_came_with_its_headers() -> None:
    channels: list[EngineChannel] = []

    def open_session() -> Any:
        channels.append(EngineChannel())
        return channels[-1]

    client = docker_client(Transport(), host="h1", open_session=open_session)  # type: ignore[arg-type]
    created = client.api.exec_create("c1", ["sh", "-c", "echo $HOSTNAME"])
    assert client.api.exec_start(created["Id"]) == OUTPUT
    assert client.api.exec_inspect(created["Id"])["ExitCode"] == 0
