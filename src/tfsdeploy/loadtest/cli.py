"""Command line of the load generator, and the plain functions the ``fab`` tasks wrap.

Exit codes: 0 ran and every gate passed; 1 bad input or the targets could not be reached
(nothing measured); 2 ran and a gate failed (or a sweep found no point under the SLO);
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tfsdeploy.core.tfserving import tfrecord
from tfsdeploy.core.tfserving import warmup_records as warmup
from tfsdeploy.core.timetext import duration_seconds
from tfsdeploy.loadtest import capacity, payloads, report, stats, sweep
from tfsdeploy.loadtest import slo_gates as gates
from tfsdeploy.loadtest.engine import DURATION_STOPS, ProcPlan
from tfsdeploy.loadtest.hostcpu import HostCpuMeter
from tfsdeploy.loadtest.parallel import WorkerFailed, run_processes
from tfsdeploy.loadtest.schedule import KINDS, Schedule, ScheduleError
from tfsdeploy.loadtest.transport import ConnectError

EXIT_OK = 0
EXIT_BAD_INPUT = 1
EXIT_GATE_FAILED = 2
EXIT_INTERRUPTED = 130
DEFAULT_TOTAL = 200  # ghz's default when neither -n nor -z is given
DEFAULT_SWEEP_DURATION_S = 10.0



class UsageError(ValueError):
    """Bad command-line input (exit code 1)."""


def parse_duration(text: str) -> float:
    """``10s``, ``500ms``, ``2m``, ``1.5h`` or a bare number of seconds, to seconds (an
    argparse type: a bad one is a usage error)."""
    try:
        return duration_seconds(str(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; our 2 means "a gate failed", so use 1."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request")
    group.add_argument("targets", nargs="*", metavar="HOST:PORT",
                       help="targets (several, or comma-separated); round-robin over connections")
    group.add_argument("--model", help="model name (overrides model_spec.name of the data)")
    group.add_argument("--signature", help="signature name")
    group.add_argument("--version", type=int, help="model version")
    group.add_argument("--version-label", help="model version label")
    group.add_argument("-d", "--data", help="request data as inline JSON")
    group.add_argument("-D", "--data-file", type=Path, help="request data JSON file")
    group.add_argument("--data-from-warmup", type=Path, metavar="PATH",
                       help="SavedModel version dir (or the TFRecord file) whose "
                            "assets.extra/tf_serving_warmup_requests give the requests")
    group.add_argument("--data-serialized", type=Path, metavar="PATH",
                       help="TFRecord file of serialized PredictRequest messages, sent as they "
                            "are (gRPC; no --model/--signature/--version overrides)")
    group.add_argument("--input-dtype", action="append", default=[], metavar="NAME=DT_X",
                       help="dtype of a JSON input (default DT_FLOAT for numbers)")
    group.add_argument("--rest", action="store_true",
                       help="send over TFServing's REST API (targets are REST ports)")
    group.add_argument("-t", "--timeout", type=parse_duration, default=20.0,
                       help="deadline per request (default 20s)")
    group.add_argument("--connect-timeout", type=parse_duration, default=10.0)
    group.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024)


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("load")
    group.add_argument("-c", "--concurrency", type=int, default=50,
                       help="workers = max requests in flight (default 50)")
    group.add_argument("-n", "--total", type=int, help=f"requests (default {DEFAULT_TOTAL} "
                       "unless -z); with -z, whichever ends first")
    group.add_argument("-z", "--duration", type=parse_duration,
                       help="run for this long; also the acceptance 'sustained for' gate")
    group.add_argument("-x", "--max-duration", type=parse_duration,
                       help="upper time limit while honouring -n")
    group.add_argument("--duration-stop", choices=DURATION_STOPS, default="wait",
                       help="requests in flight when time is up: wait for them (default), "
                            "close (cut, counted as Canceled errors, as ghz), ignore")
    group.add_argument("--connections", type=int, default=1,
                       help="gRPC connections in all (at least one per target per process)")
    group.add_argument("--procs", type=int, default=os.cpu_count() or 1,
                       help="worker processes (default: CPU count)")
    group.add_argument("--skip-first", type=int, default=0, metavar="N",
                       help="warm-up requests sent before the measured window, not reported")
    group.add_argument("-r", "--rps", type=float, default=0.0,
                       help="request rate in all processes (0: closed loop, as fast as "
                            "the workers go)")
    loop = group.add_mutually_exclusive_group()
    loop.add_argument("--open-loop", dest="open_loop", action="store_true", default=None,
                      help="with --rps (the default): latency from the intended send time")
    loop.add_argument("--closed-loop", dest="open_loop", action="store_false",
                      help="with --rps: latency from the actual send, as ghz (hides stalls)")
    for prefix, what in (("load", "rate"), ("concurrency", "worker count")):
        group.add_argument(f"--{prefix}-schedule", choices=KINDS, default="const",
                           help=f"{what} schedule")
        group.add_argument(f"--{prefix}-start", type=float, help=f"first {what}")
        group.add_argument(f"--{prefix}-end", type=float, default=0.0, help=f"last {what}")
        group.add_argument(f"--{prefix}-step", type=float, default=0.0, help=f"{what} change")
        group.add_argument(f"--{prefix}-step-duration", type=parse_duration, default=1.0)
        group.add_argument(f"--{prefix}-max-duration", type=parse_duration, default=0.0)


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-O", "--format", choices=("summary", "json", "pretty"),
                       default="summary", help="stdout format (default summary)")
    group.add_argument("-o", "--output", type=Path, help="write the formatted output here")
    group.add_argument("--report", type=Path, help="also write the JSON report here")
    group.add_argument("--name", default="", help="report name")
    group.add_argument("--tags", default="", help='JSON object of tags, e.g. {"env":"ci"}')
    group.add_argument("--count-errors", action="store_true",
                       help="errors count in fastest/slowest/histogram/percentiles too")
    group.add_argument("--details", type=int, default=0, metavar="N",
                       help="keep per-request details of up to N requests per process")


def _add_gate_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("acceptance gates (exit 2 when one fails)")
    group.add_argument("--slo-p99", type=float, metavar="MS", help="P99 must be <= MS")
    group.add_argument("--max-error-rate", type=float, metavar="PCT",
                       default=gates.DEFAULT_MAX_ERROR_RATE_PCT,
                       help="failed requests must be <= PCT percent (default 0.01)")
    group.add_argument("--min-qps", type=float, help="throughput must be >= this")
    group = parser.add_argument_group("sweep")
    group.add_argument("--sweep", action="store_true",
                       help="double concurrency until QPS stops rising or P99 breaks the SLO")
    group.add_argument("--sweep-start", type=int, default=64)
    group.add_argument("--sweep-max", type=int, default=4096)
    group.add_argument("--sweep-min-gain", type=float, default=5.0, metavar="PCT")
    group.add_argument("--sweep-report", type=Path, default=Path("sweep.json"))
    group.add_argument("--sweep-plot", type=Path, default=Path("sweep.png"))
    group.add_argument("--instances", type=int, metavar="N",
                       help="server instances behind the targets, for the per-instance figure "
                            "(default: one per target; a host with a server per GPU has more)")


def _add_coordination_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("one generator among several (fab accept)")
    group.add_argument("--start-at", type=float, metavar="EPOCH_S",
                       help="start the measured window at this wall-clock time (seconds since "
                            "the epoch, shared by every generator); not ready by then: exit 1")
    group.add_argument("--interval-histograms", action="store_true",
                       help="also keep one OK-latency histogram per second (for merging "
                            "per-second percentiles exactly)")
    group.add_argument("--raw-output", type=Path, metavar="PATH",
                       help="write every process's exact results (histograms, counts, CPU) "
                            "as JSON, for merging with other generators")


def build_parser() -> argparse.ArgumentParser:
    """The ``scripts/loadtest`` argument parser."""
    parser = _Parser(prog="loadtest", description="Predict load against TFServing targets "
                     "(ghz-compatible report, open loop, SLO gates, sweeps).")
    _add_request_options(parser)
    _add_load_options(parser)
    _add_output_options(parser)
    _add_gate_options(parser)
    _add_coordination_options(parser)
    return parser


# -- options -> plan ---------------------------------------------------------------------------

def _targets(raw: Sequence[str]) -> tuple[str, ...]:
    out = tuple(t for item in raw for t in item.split(",") if t)
    if not out:
        raise UsageError("give at least one target HOST:PORT")
    for target in out:
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"target {target!r}: expected HOST:PORT")
    return out


def _dtypes(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, dtype = item.partition("=")
        if not sep or not dtype.startswith("DT_"):
            raise UsageError(f"--input-dtype {item!r}: expected NAME=DT_FLOAT (or another DT_)")
        out[name] = dtype
    return out


def load_requests(ns: argparse.Namespace) -> payloads.Payloads:
    """The request bodies from -d / -D / --data-from-warmup / --data-serialized, with the
    overrides applied."""
    given = [x for x in (ns.data, ns.data_file, ns.data_from_warmup, ns.data_serialized)
             if x is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of -d/--data, -D/--data-file, --data-from-warmup, "
                         "--data-serialized")
    if ns.data_serialized is not None:
        return serialized_requests(ns)
    spec = payloads.RequestSpec(model=ns.model, signature=ns.signature, version=ns.version,
                                version_label=ns.version_label,
                                input_dtypes=_dtypes(ns.input_dtype))
    if ns.data_from_warmup is not None:
        requests = warmup.requests_from_warmup(ns.data_from_warmup)
    elif ns.data_file is not None:
        requests = payloads.requests_from_json_file(ns.data_file, spec)
    else:
        try:
            obj = json.loads(ns.data)
        except json.JSONDecodeError as err:
            raise UsageError(f"-d: not JSON: {err}") from err
        items = obj if isinstance(obj, list) else [obj]
        requests = [payloads.request_from_json(o, spec.input_dtypes) for o in items]
    return payloads.build_payloads(requests, spec, rest=ns.rest)


def serialized_requests(ns: argparse.Namespace) -> payloads.Payloads:
    """Pre-serialized PredictRequests (what fab accept ships to its generator hosts, which
    then need no TensorFlow definitions): sent byte for byte, so nothing can override them."""
    overrides = [f"--{name.replace('_', '-')}" for name in
                 ("model", "signature", "version", "version_label", "rest")
                 if getattr(ns, name) not in (None, False)]
    if overrides or ns.input_dtype:
        raise UsageError(f"--data-serialized requests are sent as they are: drop "
                         f"{', '.join(overrides) or '--input-dtype'} (set the model spec when "
                         "writing the file)")
    try:
        bodies = tuple(tfrecord.read_records(ns.data_serialized))
    except (OSError, tfrecord.TFRecordError) as err:
        raise UsageError(f"--data-serialized: {err}") from err
    if not bodies:
        raise UsageError(f"--data-serialized {ns.data_serialized}: no request in the file")
    return payloads.Payloads(grpc=bodies, rest=(), model=ns.name or "")


def _schedule(ns: argparse.Namespace, prefix: str, default_start: float) -> Schedule:
    start = getattr(ns, f"{prefix}_start")
    return Schedule(kind=getattr(ns, f"{prefix}_schedule"),
                    start=default_start if start is None else start,
                    step=getattr(ns, f"{prefix}_step"), end=getattr(ns, f"{prefix}_end"),
                    step_duration=getattr(ns, f"{prefix}_step_duration"),
                    max_duration=getattr(ns, f"{prefix}_max_duration"))


def _rate(ns: argparse.Namespace) -> Schedule | None:
    if ns.load_schedule == "const":
        return Schedule("const", ns.rps) if ns.rps > 0 else None
    return _schedule(ns, "load", ns.rps)


@dataclass(frozen=True)
class Run:
    """A validated run: the plan, the process count and what the report must echo."""

    plan: ProcPlan
    procs: int
    options: dict[str, Any]
    mode: str


def build_run(ns: argparse.Namespace, bodies: payloads.Payloads,
              concurrency: int | None = None) -> Run:
    """Check the options and turn them into a ProcPlan (``concurrency`` overrides -c)."""
    workers = concurrency if concurrency is not None else ns.concurrency
    conc = Schedule("const", workers) if ns.concurrency_schedule == "const" or concurrency \
        else _schedule(ns, "concurrency", workers)
    max_workers = int(conc.start if conc.kind == "const" else
                      (conc.end if conc.end > 0 and conc.step > 0 else workers))
    max_workers = max(max_workers, int(conc.start))
    rate = _rate(ns)
    _check_counts(ns, max_workers)
    total = ns.total if ns.total is not None else (0 if ns.duration or ns.max_duration
                                                   else DEFAULT_TOTAL)
    duration = ns.duration or ns.max_duration or 0.0
    procs = max(1, min(ns.procs, max_workers))
    open_loop = rate is not None and ns.open_loop is not False
    plan = ProcPlan(
        targets=_targets(ns.targets), grpc_bodies=bodies.grpc, rest_bodies=bodies.rest,
        transport="rest" if ns.rest else "grpc", concurrency=conc, max_workers=max_workers,
        rate=rate, open_loop=open_loop, total=total, duration_s=duration, warmup=ns.skip_first,
        connections=ns.connections, timeout_s=ns.timeout, connect_timeout_s=ns.connect_timeout,
        duration_stop=ns.duration_stop, procs=procs, details=ns.details,
        max_message_bytes=ns.max_message_bytes, interval_histograms=ns.interval_histograms)
    mode = "closed-loop" if rate is None else ("open-loop" if open_loop else "paced-closed-loop")
    return Run(plan, procs, _echo_options(ns, plan, bodies.model), mode)


def _check_counts(ns: argparse.Namespace, max_workers: int) -> None:
    if max_workers < 1:
        raise UsageError("concurrency must be at least 1")
    if ns.total is not None and ns.total < 1:
        raise UsageError("-n/--total must be at least 1")
    if ns.connections < 1 or ns.procs < 1:
        raise UsageError("--connections and --procs must be at least 1")
    if ns.connections > max_workers:
        raise UsageError(f"--connections {ns.connections} exceeds the concurrency {max_workers}")
    if ns.rps < 0 or ns.timeout <= 0:
        raise UsageError("--rps must be >= 0 and --timeout > 0")


def _echo_options(ns: argparse.Namespace, plan: ProcPlan, model: str) -> dict[str, Any]:
    """ghz's ``options`` object (durations in ns), plus our own keys."""
    rate = plan.rate
    def ns_of(seconds: float | None) -> int:
        return int((seconds or 0) * 1e9)
    return {
        "call": "tensorflow.serving.PredictionService.Predict", "host": ",".join(plan.targets),
        "insecure": True, "rps": int(ns.rps), "load-schedule": rate.kind if rate else "const",
        "load-start": int(rate.start) if rate else 0, "load-end": int(ns.load_end),
        "load-step": int(ns.load_step), "load-step-duration": ns_of(ns.load_step_duration),
        "load-max-duration": ns_of(ns.load_max_duration),
        "concurrency": plan.max_workers, "concurrency-schedule": plan.concurrency.kind,
        "concurrency-start": int(plan.concurrency.start),
        "concurrency-end": int(plan.concurrency.end),
        "concurrency-step": int(plan.concurrency.step),
        "concurrency-step-duration": ns_of(plan.concurrency.step_duration),
        "concurrency-max-duration": ns_of(plan.concurrency.max_duration),
        "total": plan.total, "duration": ns_of(ns.duration), "max-duration": ns_of(ns.max_duration),
        "duration-stop": plan.duration_stop, "timeout": ns_of(plan.timeout_s),
        "dial-timeout": ns_of(plan.connect_timeout_s), "connections": ns.connections,
        "skipFirst": ns.skip_first, "count-errors": ns.count_errors, "CPUs": os.cpu_count(),
        "async": plan.open_loop, "model": model, "procs": plan.procs,
        "transport": plan.transport,
    }


# -- running -----------------------------------------------------------------------------------

def _start_at_ns(ns: argparse.Namespace) -> int | None:
    return None if ns.start_at is None else int(ns.start_at * 1e9)


def execute(run: Run, ns: argparse.Namespace) -> dict[str, Any]:
    """Run the load and build the report (gates not yet applied)."""
    meter = HostCpuMeter()
    meter.start_at(_start_at_ns(ns))
    results = run_processes(run.plan, run.procs, _start_at_ns(ns))
    host_cpu = meter.stop()
    if ns.raw_output is not None:
        # the monotonic clock of this machine, moved onto the wall clock shared by generators
        offset = time.time_ns() - time.perf_counter_ns()
        write_raw_output(ns.raw_output, results, offset_ns=offset, host_cpu=host_cpu,
                         options=run.options)
    merged = stats.merge_results(results)
    per_proc = math.ceil(ns.connections / run.procs)
    extra = {"targets": list(run.plan.targets), "transport": run.plan.transport,
             "loadMode": run.mode, "latencyFrom": "intended send time"
             if run.mode == "open-loop" else "actual send", "procs": run.procs,
             "connectionsPerProcess": max(per_proc, len(run.plan.targets))
             if run.plan.transport == "grpc" else None,
             "warmupRequests": run.plan.warmup, "hostCpu": host_cpu}
    tags = json.loads(ns.tags) if ns.tags else None
    return report.ghz_report(merged, options=run.options, run=extra,
                             count_errors=ns.count_errors, name=ns.name, tags=tags,
                             details=ns.details > 0)


RAW_KIND = "tfsdeploy.loadgen"


def write_raw_output(path: Path, results: Sequence[stats.ProcResult], *, offset_ns: int,
                     host_cpu: Mapping[str, Any] | None, options: Mapping[str, Any]) -> None:
    """Every process's exact results (stats.result_to_json), written atomically."""
    data = {"kind": RAW_KIND, "procs": [stats.result_to_json(r, clock_offset_ns=offset_ns)
                                        for r in results],
            "hostCpu": host_cpu, "options": dict(options)}
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data) + "\n", encoding="utf-8")
    part.replace(path)


def gate_spec(ns: argparse.Namespace) -> gates.GateSpec:
    """The gates the options ask for."""
    return gates.GateSpec(slo_p99_ms=ns.slo_p99, max_error_rate_pct=ns.max_error_rate,
                          min_qps=ns.min_qps, min_duration_s=ns.duration)


def emit(data: Mapping[str, Any], ns: argparse.Namespace, gate_lines: Sequence[str]) -> None:
    """Print or write the report in the chosen format."""
    if ns.report is not None:
        ns.report.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if ns.format == "summary":
        if ns.output is not None:
            text = "\n".join([*report.summary_lines(data), *gate_lines]) + "\n"
            ns.output.write_text(text, encoding="utf-8")
        else:
            report.print_summary(data, gate_lines)
        return
    text = json.dumps(data, indent=2 if ns.format == "pretty" else None) + "\n"
    if ns.output is not None:
        ns.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    for line in gate_lines:
        print(line, file=sys.stderr)


def single_run(ns: argparse.Namespace, bodies: payloads.Payloads) -> int:
    """One load run with gates; returns the exit code."""
    data = execute(build_run(ns, bodies), ns)
    results = gates.evaluate(data, gate_spec(ns))
    data["tfsdeploy"]["gates"] = [r.as_json() for r in results]
    emit(data, ns, [r.line() for r in results])
    if data["endReason"] == "cancel":
        return EXIT_INTERRUPTED
    return EXIT_OK if gates.all_passed(results) else EXIT_GATE_FAILED


def sweep_run(ns: argparse.Namespace, bodies: payloads.Payloads) -> int:
    """The concurrency sweep; exit 2 when no point met the SLO."""
    if not ns.duration and ns.total is None:
        ns.duration = DEFAULT_SWEEP_DURATION_S
    limits = sweep.SweepLimits(slo_p99_ms=ns.slo_p99, max_error_rate_pct=ns.max_error_rate,
                               min_gain=ns.sweep_min_gain / 100, max_concurrency=ns.sweep_max)
    if ns.sweep_start < 1 or ns.sweep_start > ns.sweep_max:
        raise UsageError("--sweep-start must be between 1 and --sweep-max")

    def measure(concurrency: int) -> sweep.SweepPoint:
        data = execute(build_run(ns, bodies, concurrency), ns)
        point = sweep.SweepPoint.from_report(concurrency, data)
        print(f"concurrency {concurrency:5d}: {point.rps:10.1f} QPS  p50 {point.p50_ms:8.2f} ms"
              f"  p99 {point.p99_ms:8.2f} ms  errors {point.error_rate_pct:.4g}%", flush=True)
        return point

    points, reason = sweep.run_sweep(measure, ns.sweep_start, limits)
    sweep.draw_plot(points, ns.sweep_plot, limits)
    data = sweep.sweep_report(points, reason, limits, targets=_targets(ns.targets),
                              plot=str(ns.sweep_plot), instances=ns.instances)
    sweep.write_json(ns.sweep_report, data)
    _print_sweep_end(data, ns)
    return EXIT_OK if data["best"] is not None else EXIT_GATE_FAILED


def _print_sweep_end(data: Mapping[str, Any], ns: argparse.Namespace) -> None:
    print(f"stopped: {data['stopReason']}")
    for key, label in (("knee", "knee"), ("best", "best under SLO")):
        point = data[key]
        print(f"{label}: " + (f"concurrency {point['concurrency']}, {point['rps']:.1f} QPS, "
                              f"p99 {point['p99_ms']:.2f} ms" if point else "none"))
    if data["perInstanceQps"] is not None:
        print(f"per-instance QPS at the SLO: {data['perInstanceQps']:.1f}")
    print(f"sweep report: {ns.sweep_report}  plot: {ns.sweep_plot}")


def run_namespace(ns: argparse.Namespace) -> int:
    """Validate, then run once or sweep; map failures to exit codes."""
    try:
        _targets(ns.targets)
        if ns.sweep and ns.start_at is not None:
            raise UsageError("--start-at starts one run; a sweep runs several: drop one")
        bodies = load_requests(ns)
        return sweep_run(ns, bodies) if ns.sweep else single_run(ns, bodies)
    except (UsageError, ScheduleError, payloads.PayloadError, warmup.WarmupError) as err:
        print(f"loadtest: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (WorkerFailed, ConnectError, OSError) as err:  # LateStart is a WorkerFailed
        print(f"loadtest: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("loadtest: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfsdeploy.loadtest`` / ``scripts/loadtest``."""
    ns = build_parser().parse_args(argv)
    return run_namespace(ns)


# -- functions for the fab tasks ---------------------------------------------------------------

def run_bench(targets: Sequence[str], **options: Any) -> int:
    """Run the load test from Python; returns the exit code (0 / 1 / 2 as the CLI).

    ``options`` are the long command-line options with ``_`` for ``-`` and parsed values:
    ``model="resnet50", data_from_warmup=Path(...), concurrency=64, duration=30.0 (seconds),
    rps=500.0, slo_p99=50.0 (ms), max_error_rate=0.01 (percent), min_qps=..., sweep=True,
    sweep_report=Path(...), sweep_plot=Path(...), report=Path(...), format="summary"``.
    Unknown names raise TypeError. Durations may be numbers (seconds) or strings ("30s").
    """
    ns = build_parser().parse_args(list(targets))
    for key, value in options.items():
        if not hasattr(ns, key) or key == "targets":
            raise TypeError(f"run_bench: unknown option {key!r}")
        if isinstance(value, str) and key in _DURATION_KEYS:
            value = parse_duration(value)
        setattr(ns, key, value)
    return run_namespace(ns)


_DURATION_KEYS = frozenset({
    "timeout", "connect_timeout", "duration", "max_duration", "load_step_duration",
    "load_max_duration", "concurrency_step_duration", "concurrency_max_duration"})


def plan_capacity(target_qps: float, source: str | Path | float, *,
                  load_factor: float = 0.65, availability_factor: float = 0.9,
                  headroom: float = 0.15, failure_domains: int = 1,
                  instances_per_host: int = 1, as_json: bool = False,
                  tune: bool = False) -> tuple[int, str]:
    """Capacity plan from a sweep report path (with ``tune``: a `fab tune` report's) or a
    per-instance QPS number.

    Returns ``(exit_code, text)``: 0 and the arithmetic (or JSON), or 1 and the error.
    """
    factors = {"load_factor": load_factor, "availability_factor": availability_factor,
               "headroom": headroom, "failure_domains": failure_domains,
               "instances_per_host": instances_per_host}
    try:
        if isinstance(source, (int, float)):
            result = capacity.plan(target_qps, float(source), **factors)  # type: ignore[arg-type]
        elif tune:
            result = capacity.plan_from_tune(target_qps, Path(source), **factors)
        else:
            result = capacity.plan_from_sweep(target_qps, Path(source), **factors)
    except capacity.CapacityError as err:
        return EXIT_BAD_INPUT, f"plan-capacity: error: {err}"
    if as_json:
        return EXIT_OK, json.dumps(result.as_json(), indent=2)
    hosts = (f" on {result.hosts} hosts of {instances_per_host}" if instances_per_host > 1
             else "")
    return EXIT_OK, (result.explain() + f"\n=> minimum {result.minimum} instances, "
                     f"recommended {result.recommended}{hosts}")


def warmup_payloads(model: str, data_from_warmup: Path) -> payloads.Payloads:
    """The request bodies of a version's warmup records (what `fab bench` sends)."""
    ns = build_parser().parse_args(["localhost:1"])
    ns.model, ns.data_from_warmup = model, data_from_warmup
    return load_requests(ns)


def measure_once(targets: Sequence[str], bodies: payloads.Payloads, **options: Any
                 ) -> dict[str, Any]:
    """One load run from Python with already loaded request bodies; returns its report
    (the ghz-style JSON of `fab bench --report`). ``options`` as ``run_bench``'s, e.g.
    ``rps=200.0, duration=3.0, concurrency=64, procs=1``; no gate is applied."""
    ns = build_parser().parse_args(list(targets))
    for key, value in options.items():
        if not hasattr(ns, key) or key == "targets":
            raise TypeError(f"measure_once: unknown option {key!r}")
        setattr(ns, key, value)
    return execute(build_run(ns, bodies), ns)
