"""The two ways of sending one Predict request: gRPC (grpc.aio) and REST (HTTP/1.1).

Both take the pre-serialized body and raise ``RequestFailed`` (or a gRPC error) on failure;
``describe_error`` turns any failure into ghz's status name and error string.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from tfsdeploy.core.tfserving.api import PREDICT_METHOD

Sender = Callable[[bytes], Awaitable[object]]

# gRPC status names as ghz prints them (Go's codes.Code.String()).
_GHZ_CODE_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


class RequestFailed(Exception):
    """A request that completed with a non-OK status."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConnectError(RuntimeError):
    """A target that could not be reached before the connect timeout."""


def code_name(code: grpc.StatusCode) -> str:
    """ghz's name for a gRPC status code."""
    return _GHZ_CODE_NAMES.get(code, str(code.name).title())


def describe_error(err: BaseException) -> tuple[str, str]:
    """(status name, ghz-style error string) of a failed request."""
    if isinstance(err, grpc.aio.AioRpcError):
        name = code_name(err.code())
        return name, f"rpc error: code = {name} desc = {err.details() or ''}"
    if isinstance(err, RequestFailed):
        return err.status, err.message
    if isinstance(err, TimeoutError):
        return "DeadlineExceeded", "deadline exceeded"
    if isinstance(err, asyncio.CancelledError):
        return "Canceled", "rpc error: code = Canceled desc = run ended"
    if isinstance(err, OSError):
        return "Unavailable", f"connection error: {err}"
    return "Unknown", f"{type(err).__name__}: {err}"


# -- gRPC -------------------------------------------------------------------------------------

def grpc_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel arguments; a local subchannel pool makes each channel its own TCP connection."""
    return [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


async def open_grpc_channels(targets: Sequence[str], *, max_message_bytes: int,
                             connect_timeout_s: float) -> list[grpc.aio.Channel]:
    """One insecure channel per entry of ``targets``, each connected before returning."""
    channels = [grpc.aio.insecure_channel(t, options=grpc_channel_options(max_message_bytes))
                for t in targets]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(c.channel_ready() for c in channels)), connect_timeout_s)
    except TimeoutError as err:
        await close_grpc_channels(channels)
        raise ConnectError(
            f"could not connect to {', '.join(sorted(set(targets)))} "
            f"within {connect_timeout_s:g}s") from err
    return channels


async def close_grpc_channels(channels: Sequence[grpc.aio.Channel]) -> None:
    """Close channels, cancelling whatever is still in flight on them."""
    await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


def grpc_sender(channel: grpc.aio.Channel, timeout_s: float) -> Sender:
    """A Predict call on ``channel`` that sends and receives raw bytes (no protobuf work)."""
    call = channel.unary_unary(PREDICT_METHOD)

    def send(body: bytes) -> Awaitable[object]:
        return call(body, timeout=timeout_s)  # type: ignore[no-any-return]

    return send


# -- REST ---------------------------------------------------------------------------------------

@dataclass
class RestConnection:
    """One keep-alive HTTP/1.1 connection to a TFServing REST port (one request at a time)."""

    host: str
    port: int
    timeout_s: float
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    def close(self) -> None:
        """Drop the connection (the next request opens a new one)."""
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> bytes:
        """POST ``body`` to ``path``; raise RequestFailed unless the answer is 200."""
        try:
            async with asyncio.timeout(self.timeout_s):
                status, payload, keep = await self._exchange(path, body)
        except BaseException:
            self.close()  # a late answer would be read as the next request's
            raise
        if not keep:
            self.close()
        if status != 200:
            text = payload[:200].decode("utf-8", "replace")
            raise RequestFailed(f"HTTP {status}", f"http error: status = {status} desc = {text}")
        return payload

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes, bool]:
        reader, writer = await self._connect()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        payload = await _read_body(reader, headers)
        keep = headers.get("connection", "").lower() != "close"
        return status, payload, keep


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


def split_target(target: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) to its parts."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"target {target!r}: expected host:port")
    return host.strip("[]"), int(port)
