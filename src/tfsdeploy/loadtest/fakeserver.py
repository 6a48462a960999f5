"""A tiny PredictionService for testing and benchmarking the load generator (test equipment).

It answers every ``Predict`` with one fixed response after a known delay, and can stall (hold
every answer) for a while, or fail every N-th request: what the load tool's tests need to check
reported latencies, open-loop behaviour and gates. It does no protobuf work per request, so it
is also the "fast server" of the benchmark. Optional REST ``:predict`` endpoint (HTTP/1.1).

Run: ``python -m tfsdeploy.loadtest.fakeserver --port 0 --latency-ms 5`` prints
``listening grpc=<port> rest=<port>`` on stdout once it serves, and ``stopped served=<n>``
(requests received, gRPC and REST) when SIGTERM or SIGINT stops it. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from tfsdeploy.core.tfserving import api as tfsapi


@dataclass
class Behaviour:
    """What the server does to each request."""

    latency_s: float = 0.0
    stall_after_s: float = -1.0  # seconds after the first request; < 0: never stall
    stall_for_s: float = 0.0
    error_every: int = 0  # every N-th request fails with UNAVAILABLE; 0: never

    def __post_init__(self) -> None:
        self.first_ns = 0
        self.seen = 0

    def delay_for(self, now_ns: int) -> float:
        """Seconds to hold this request (latency, plus the rest of a stall if one is on)."""
        if self.first_ns == 0:
            self.first_ns = now_ns
        delay = self.latency_s
        if self.stall_after_s >= 0:
            since = (now_ns - self.first_ns) / 1e9
            stall_end = self.stall_after_s + self.stall_for_s
            if self.stall_after_s <= since < stall_end:
                delay += stall_end - since
        return delay

    def should_fail(self) -> bool:
        """Count the request; True if it is one of the injected failures."""
        self.seen += 1
        return self.error_every > 0 and self.seen % self.error_every == 0


def fixed_response() -> bytes:
    """A PredictResponse like half_plus_two's: output ``y`` = [2.5]."""
    response: Any = tfsapi.new_message("tensorflow.serving.PredictResponse")
    response.model_spec.name = "half_plus_two"
    response.model_spec.version.value = 1
    tensor = response.outputs["y"]
    tensor.dtype = tfsapi.dtype_value("DT_FLOAT")
    tensor.tensor_shape.dim.add(size=1)
    tensor.float_val.append(2.5)
    return bytes(response.SerializeToString())


def _grpc_handler(behaviour: Behaviour, answer: bytes) -> grpc.GenericRpcHandler:
    async def predict(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        delay = behaviour.delay_for(time.perf_counter_ns())
        failing = behaviour.should_fail()
        if delay > 0:
            await asyncio.sleep(delay)
        if failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
        return answer

    return grpc.method_handlers_generic_handler(
        "tensorflow.serving.PredictionService",
        {"Predict": grpc.unary_unary_rpc_method_handler(predict)})


async def _rest_client(behaviour: Behaviour, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
    body = b'{"outputs":[2.5]}'
    try:
        while line := await reader.readline():
            length = 0
            while (header := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            delay = behaviour.delay_for(time.perf_counter_ns())
            failing = behaviour.should_fail()
            if delay > 0:
                await asyncio.sleep(delay)
            status = b"503 Service Unavailable" if failing or b":predict" not in line \
                else b"200 OK"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def serve(port: int, rest_port: int | None, behaviour: Behaviour) -> None:
    """Serve until SIGTERM/SIGINT; print the bound ports on stdout first."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((_grpc_handler(behaviour, fixed_response()),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    rest_bound = 0
    rest_server = None
    if rest_port is not None:
        rest_server = await asyncio.start_server(
            lambda r, w: _rest_client(behaviour, r, w), "127.0.0.1", rest_port)
        rest_bound = rest_server.sockets[0].getsockname()[1]
    print(f"listening grpc={bound} rest={rest_bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if rest_server is not None:
        rest_server.close()
    await server.stop(grace=0.2)
    # what a benchmark compares with the clients' merged count (nothing lost, nothing twice)
    print(f"stopped served={behaviour.seen}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rest-port", type=int, default=None)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--stall-after-s", type=float, default=-1.0)
    parser.add_argument("--stall-for-s", type=float, default=0.0)
    parser.add_argument("--error-every", type=int, default=0)
    args = parser.parse_args(argv)
    behaviour = Behaviour(args.latency_ms / 1000, args.stall_after_s, args.stall_for_s,
                          args.error_every)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.rest_port, behaviour))
    return 0


if __name__ == "__main__":
    sys.exit(main())
