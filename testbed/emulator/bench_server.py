#!/usr/bin/env python3
"""Benchmark: gRPC Predict requests/s against the emulator on a small half_plus_two model.

Starts the emulator (batching on) on free loopback ports with a freshly written TF2
half_plus_two SavedModel, drives it with an asyncio gRPC client (tensorflow_serving.apis
stubs, one channel, --concurrency requests in flight) for --seconds, and prints requests/s,
latency percentiles and the server process's CPU time per request (user + system, from
/proc/<pid>/stat: less sensitive than requests/s to other work on the machine), after the CPU
its start took (until the gRPC port answered, the model loaded).
Use --target HOST:PORT --model NAME to measure an already running server instead, and
--emulator-dir DIR to start the package found in DIR (e.g. an older checkout) instead of this one.

  /var/cache/tfsdeploy/venv/bin/python testbed/emulator/bench_server.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
BATCHING = """max_batch_size {{ value: {max_batch} }}
batch_timeout_micros {{ value: {timeout} }}
max_enqueued_batches {{ value: 1000 }}
num_batch_threads {{ value: {threads} }}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_model(base: pathlib.Path) -> None:
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):  # type: ignore[misc]
        @tf.function(  # type: ignore[untyped-decorator]
            input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 0.5 * x + 2.0}

    module = HalfPlusTwo()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})


def _start_server(work: pathlib.Path, args: argparse.Namespace
                  ) -> tuple[subprocess.Popen[bytes], int]:
    _write_model(work / "hpt")
    batching = work / "batching.config"
    batching.write_text(BATCHING.format(max_batch=args.max_batch_size,
                                        timeout=args.batch_timeout_micros,
                                        threads=args.batch_threads))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(args.emulator_dir),
               SIMGPU_DIR=str(work / "no-simgpu"))
    # --grpc_max_threads is a thread quota, as in TFServing: with its default (4 x CPUs) most
    # of 64 concurrent requests would be refused RESOURCE_EXHAUSTED
    command = [sys.executable, "-m", "tfserving_emulator", f"--port={port}",
               f"--model_base_path={work / 'hpt'}", "--model_name=hpt",
               f"--grpc_max_threads={args.concurrency + 2}"]
    if not args.no_batching:
        command += ["--enable_batching", f"--batching_parameters_file={batching}"]
    log = open(work / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        if proc.poll() is not None:
            raise SystemExit((work / "server.log").read_text())
        time.sleep(0.2)
    raise SystemExit("server did not start")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(model: str) -> object:
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.
                                    TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.
                                                          Dim(size=1),
                                                          tensor_shape_pb2.TensorShapeProto.
                                                          Dim(size=1)]))
    tensor.float_val.append(1.0)
    request.inputs["x"].CopyFrom(tensor)
    return request


async def _drive(target: str, model: str, concurrency: int, seconds: float
                 ) -> tuple[int, int, list[float]]:
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    request = _request(model)
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        await stub.Predict(request, timeout=30)  # warm the connection
        end = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal errors
            while time.monotonic() < end:
                started = time.monotonic()
                try:
                    await stub.Predict(request, timeout=30)
                    latencies.append(time.monotonic() - started)
                except grpc.aio.AioRpcError:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), errors, latencies


def main() -> int:
    """Run the benchmark and print requests/s and latency percentiles."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="HOST:PORT of a running server (default: start one)")
    parser.add_argument("--model", default="hpt")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-timeout-micros", type=int, default=2000)
    parser.add_argument("--batch-threads", type=int, default=2)
    parser.add_argument("--no-batching", action="store_true")
    parser.add_argument("--emulator-dir", type=pathlib.Path, default=HERE,
                        help="directory holding the tfserving_emulator package")
    args = parser.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target
        if target is None:
            proc, port = _start_server(pathlib.Path(tmp), args)
            target = f"127.0.0.1:{port}"
        cpu_before = _cpu_seconds(proc.pid) if proc is not None else 0.0
        if proc is not None:  # the port opens once the model is loaded (server.cc's order)
            print(f"server start: {cpu_before:.2f} CPU-s until its gRPC port answered "
                  "(imports, the SavedModel load, warmup)")
        try:
            ok, errors, latencies = asyncio.run(
                _drive(target, args.model, args.concurrency, args.seconds))
            cpu = _cpu_seconds(proc.pid) - cpu_before if proc is not None else None
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3 \
            if latencies else float("nan")

    print(f"gRPC Predict: {ok / args.seconds:.0f} requests/s over {args.seconds:.0f} s "
          f"({ok} ok, {errors} errors), concurrency {args.concurrency}, batching "
          f"{'off' if args.no_batching else 'on'}")
    print(f"latency ms: p50 {pct(0.5):.2f}  p90 {pct(0.9):.2f}  p99 {pct(0.99):.2f}")
    if cpu is not None and ok:
        print(f"server CPU: {cpu * 1e6 / (ok + errors):.0f} us per request "
              f"({cpu:.1f} s for {ok + errors} requests)")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
