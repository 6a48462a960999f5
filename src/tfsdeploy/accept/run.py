"""``fab accept``: plan, set up the generators, run the window (and the release), merge,
report, clean up. Returns the exit code documented in ``rows``."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Protocol

from tfsdeploy.accept import commands, loadgen, plot, rows
from tfsdeploy.accept.bundle import Bundle, BundleError, ensure_bundle
from tfsdeploy.accept.loadgen import GeneratorHost, HostRunner, LoadgenError
from tfsdeploy.accept.merge import (
    LOST,
    FleetMerge,
    GeneratorOutcome,
    Slice,
    merge_fleet,
    seconds_touching,
    slice_of,
    slices,
)
from tfsdeploy.accept.options import AcceptOptions
from tfsdeploy.accept.plan import (
    WARMUP_PER_TARGET,
    AcceptPlan,
    GeneratorSpec,
    build_plan,
    generator_procs,
    generator_workers,
    requests_file_note,
)
from tfsdeploy.accept.release import deploy_argv, run_release
from tfsdeploy.accept.report import (
    RunFacts,
    accept_json,
    closing_lines,
    generator_table,
    row_table,
)
from tfsdeploy.accept.rows import ReleaseOutcome
from tfsdeploy.core.errors import ConfigError, Problem
from tfsdeploy.core.inventory.fleet import ResolvedHost
from tfsdeploy.core.inventory.load import load_inventory
from tfsdeploy.core.tfserving import tfrecord
from tfsdeploy.core.tfserving import warmup_records as warmup
from tfsdeploy.hosts.ssh import SshConnection
from tfsdeploy.loadtest import payloads

GRACE_S = 60.0  # beyond the window and the last request's deadline, for results to arrive
EXIT_INTERRUPTED = 130
RunnerFactory = Callable[[ResolvedHost], HostRunner]
TablePrinter = Callable[[str, Sequence[str], Sequence[Sequence[str]]], None]


class Stopping(Protocol):
    """A run's stop (the engine's ``Stop``, set by Ctrl-C, SIGTERM or SIGHUP): whether it was
    asked, and by which signal."""

    signal: str

    def is_set(self) -> bool:
        """Whether the run was asked to stop."""


# what `fab accept` says at a stop signal (it runs on the engine's session: engine.operate),
# and at a later one
ACCEPT_STOPPING = ("ending the run once the set-up steps under way are done: every generator's "
                   "window ends, their figures are reported, their hosts cleaned up; a deploy "
                   "under way is waited for",
                   "already stopping: the generators' windows are ending")


class _StopAsked(Exception):
    """The run's stop was asked during the window."""


def say(text: str) -> None:
    """A progress line."""
    print(f"accept: {text}", flush=True)


def serialized_requests(plan: AcceptPlan) -> bytes:
    """The data version's warmup requests for this model, any version pin removed (the load
    must follow whatever version the fleet serves), serialized and framed as TFRecord."""
    source = Path(plan.model.source) / str(plan.data_version)
    try:
        requests = warmup.requests_from_warmup(source)
    except (OSError, ValueError) as err:
        raise ConfigError(Problem(
            f"no request data: {err}", field="--data-version",
            fix=f"give version {plan.data_version} warmup records "
                "(assets.extra/tf_serving_warmup_requests), or pick --data-version")) from err
    for request in requests:
        request.model_spec.ClearField("version_choice")
    bodies = payloads.build_payloads(requests, payloads.RequestSpec(model=plan.model.name),
                                     rest=False).grpc
    return b"".join(tfrecord.frame_record(body) for body in bodies)


def _announce(plan: AcceptPlan) -> None:
    shares = ", ".join(f"{g.name} {g.share_qps:g}" for g in plan.generators)
    say(f"{plan.model.name}: {plan.target_qps.value:g} QPS for {plan.duration_s:g} s, open "
        f"loop, against {', '.join(plan.targets)}; P99 SLO {plan.slo_p99_ms.value:g} ms "
        f"({plan.slo_p99_ms.source}); generators: {shares} QPS")
    if plan.release is not None:
        say(f"release: fab deploy --version {plan.release.version} at "
            f"{plan.release.at_s:g} s into the window")


def prepare_all(plan: AcceptPlan, requests: bytes, run_id: str,
                runner_factory: RunnerFactory) -> list[GeneratorHost]:
    """Every generator ready, set up in parallel; if one fails, the others are cleaned up
    and the error (exit 1, nothing measured) is raised."""
    bundle: Bundle | None = None
    if plan.remote:
        started = time.monotonic()
        try:
            bundle = ensure_bundle()
        except BundleError as err:
            raise LoadgenError(f"the generator environment: {err}") from err
        say(f"generator environment {bundle.key}: "
            f"{', '.join(f'{n} {v}' for n, v in bundle.distributions)} + tfsdeploy "
            f"({bundle.path.stat().st_size / 1e6:.1f} MB, {time.monotonic() - started:.1f} s)")

    def one(spec: GeneratorSpec) -> GeneratorHost:
        if spec.host is None:
            return loadgen.prepare_local(spec, requests)
        assert bundle is not None
        return loadgen.prepare_remote(spec, bundle, run_id, requests,
                                      runner_factory=runner_factory)

    ready: list[GeneratorHost] = []
    errors: list[Exception] = []
    with ThreadPoolExecutor(max_workers=min(16, len(plan.generators))) as pool:
        futures = [pool.submit(one, spec) for spec in plan.generators]
        try:
            for future in futures:
                try:
                    ready.append(future.result())
                except Exception as err:
                    errors.append(err)
        except BaseException:  # Ctrl-C during set-up: undo what is ready, including late ones
            ready += [f.result() for f in futures if not f.cancel() and f.exception() is None
                      and f.result() not in ready]
            _cleanup_all(ready)
            raise
    if errors:
        _cleanup_all(ready)
        first = errors[0]
        raise first if isinstance(first, LoadgenError) else LoadgenError(str(first))
    for gen in ready:
        say(f"{gen.name}: ready ({gen.note}; {gen.cores} cores)")
    return ready


def _cleanup_all(gens: Sequence[GeneratorHost]) -> list[str]:
    """Every generator's run directory removed and connection closed; the problems."""
    return [p for p in (loadgen.cleanup(g) for g in gens) if p]


def load_spec(plan: AcceptPlan, gen: GeneratorHost, start_at_s: float) -> commands.LoadSpec:
    """One generator's share and sizes."""
    share = gen.spec.share_qps
    procs = generator_procs(share, gen.cores, plan.procs)
    connections = len(plan.targets) * procs
    return commands.LoadSpec(
        share_qps=share, duration_s=plan.duration_s, start_at_s=start_at_s,
        targets=plan.targets,
        workers=generator_workers(share, plan.slo_p99_ms.value, plan.concurrency, connections),
        procs=procs, connections=connections, timeout_s=plan.timeout_s,
        warmup=WARMUP_PER_TARGET * connections, name=f"{plan.model.name} from {gen.name}")


RESTOP_S = 2.0  # after a stop, how often a generator still running is asked again


def _collect(futures: dict[Future[GeneratorOutcome], GeneratorHost], abort: threading.Event,
             loads: dict[str, commands.LoadSpec], stop: Stopping | None = None,
             restop: Callable[[GeneratorHost], None] | None = None) -> list[GeneratorOutcome]:
    """Each generator's outcome as it ends; a failed one cancels a release not yet begun.
    A ``stop`` asked while they run raises _StopAsked. After one, ``restop`` is given the
    generators still running every RESTOP_S (one asked before it had started, its pid file
    not yet written, would run its whole window)."""
    outcomes: dict[str, GeneratorOutcome] = {}
    pending = set(futures)
    asked = time.monotonic()
    while pending:
        if stop is not None and stop.is_set():
            raise _StopAsked
        done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        for future in done:
            _collected(future, futures[future], abort, loads, outcomes)
        if restop is not None and pending and time.monotonic() - asked >= RESTOP_S:
            asked = time.monotonic()
            for future in pending:
                restop(futures[future])
    return [outcomes[g.name] for g in futures.values()]


def _collected(future: Future[GeneratorOutcome], gen: GeneratorHost, abort: threading.Event,
               loads: dict[str, commands.LoadSpec],
               outcomes: dict[str, GeneratorOutcome]) -> None:
    """One generator's outcome kept, and said."""
    outcome = future.result()
    load = loads[gen.name]
    outcome.procs, outcome.workers, outcome.warmup = load.procs, load.workers, load.warmup
    outcomes[gen.name] = outcome
    if not outcome.measured:
        abort.set()
        say(f"{gen.name}: {outcome.status}: {outcome.error}")
    else:
        say(f"{gen.name}: done, {sum(r.ok.count + r.err.count for r in outcome.results)} "
            "requests")


def run_window(plan: AcceptPlan, gens: Sequence[GeneratorHost], start_at_s: float, *,
               root: Path, out_dir: Path, stop: Stopping | None = None
               ) -> tuple[list[GeneratorOutcome], ReleaseOutcome | None]:
    """Every generator's share from the common start; the release at its time. Ctrl-C, or
    the run's ``stop``, ends every generator's window (Interrupted, with their figures)."""
    loads = {g.name: load_spec(plan, g, start_at_s) for g in gens}
    timeout = plan.start_margin_s + plan.duration_s + plan.timeout_s + GRACE_S
    abort = threading.Event()
    say(f"load from {dt.datetime.fromtimestamp(start_at_s).strftime('%H:%M:%S')} "
        f"(in {start_at_s - time.time():.0f} s) for {plan.duration_s:g} s")
    with ThreadPoolExecutor(max_workers=len(gens) + 1) as pool:
        futures = {pool.submit(loadgen.run_generator, g,
                               commands.generator(g.python, g.files, loads[g.name]),
                               timeout_s=timeout, start_at_s=start_at_s): g for g in gens}
        release_future = None
        if plan.release is not None:
            argv = deploy_argv(root, model=plan.model.name, version=plan.release.version,
                               inventory=plan.inventory_path)
            release_future = pool.submit(
                run_release, argv, cwd=root, version=plan.release.version,
                at_wall_s=start_at_s + plan.release.at_s, start_wall_s=start_at_s,
                log=out_dir / "deploy.log", abort=abort)
        try:
            outcomes = _collect(futures, abort, loads, stop)
        except (KeyboardInterrupt, _StopAsked) as asked:
            if isinstance(asked, KeyboardInterrupt):  # the engine's stop said it already
                say("interrupted: ending every generator's window (their figures are kept)")
            abort.set()
            unasked = {g.name for g in gens if not loadgen.stop_generator(g)}

            def restop(gen: GeneratorHost) -> None:  # once: a second SIGINT cuts its results
                if gen.name in unasked and loadgen.stop_generator(gen):
                    unasked.discard(gen.name)

            outcomes = _collect(futures, abort, loads, restop=restop)
            raise Interrupted(outcomes, release_future) from None
        if release_future is not None and not release_future.done():
            say("waiting for the deploy to finish (a deploy is never cut short)")
        release = release_future.result() if release_future is not None else None
    return outcomes, release


class Interrupted(Exception):
    """Ctrl-C during the window: what was measured, and the release (still to be awaited)."""

    def __init__(self, outcomes: list[GeneratorOutcome],
                 release: Future[ReleaseOutcome] | None) -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes
        self.release = release


def _release_slice(merged: FleetMerge, release: ReleaseOutcome | None) -> Slice | None:
    if merged.fleet is None or release is None or release.started_s is None \
            or release.ended_s is None:
        return None
    first, last = seconds_touching(release.started_s, release.ended_s)
    return slice_of(merged.fleet, first, last)


def evaluate(plan: AcceptPlan, outcomes: Sequence[GeneratorOutcome],
             release: ReleaseOutcome | None
             ) -> tuple[FleetMerge, list[rows.Row], int, list[Slice]]:
    """Merge, per-second and per-interval slices, the rows and the exit code."""
    merged = merge_fleet(outcomes)
    per_second = slices(merged.fleet, plan.duration_s) if merged.fleet else []
    per_interval = slices(merged.fleet, plan.duration_s, plan.interval_s) if merged.fleet else []
    table = [rows.throughput_row(plan, merged, outcomes, per_interval),
             rows.interval_p99_row(plan, per_interval),
             rows.error_rate_row(plan, merged)]
    if release is not None:
        table.append(rows.release_row(plan, release, _release_slice(merged, release)))
    return merged, table, rows.exit_code(table, outcomes, merged, release), per_second


def write_report(plan: AcceptPlan, outcomes: Sequence[GeneratorOutcome],
                 release: ReleaseOutcome | None, *, start_at_s: float, out_dir: Path,
                 cleanup_problems: Sequence[str], interrupted: bool = False,
                 show_table: TablePrinter | None = None) -> int:
    """Evaluate, write accept.json and accept.png, print the tables; the exit code."""
    merged, table, code, per_second = evaluate(plan, outcomes, release)
    if interrupted:
        code = EXIT_INTERRUPTED
    png = out_dir / "accept.png"
    facts = RunFacts(start_at_s, requests_file_note(plan.model, plan.data_version), str(png),
                     tuple(cleanup_problems))
    addresses = {g.name: g.host.address if g.host else None for g in plan.generators}
    data = accept_json(plan, merged, per_second, table, outcomes, release, code, facts,
                       addresses)
    path = out_dir / "accept.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    plot.draw(png, data["tfsdeploy"]["accept"]["series"],
              title=f"fab accept {plan.model.name}: {plan.target_qps.value:g} QPS target",
              target_qps=plan.target_qps.value, slo_ms=plan.slo_p99_ms.value,
              duration_s=plan.duration_s, release=_release_mark(release),
              lost=[plot.Mark(f"{o.name} lost", o.ended_s or 0.0)
                    for o in outcomes if o.status == LOST])
    if show_table is not None:
        show_table(f"accept {plan.model.name}: the acceptance table",
                   ("row", "figure", "threshold", "result", "detail", "threshold from"),
                   row_table(data))
        show_table("load generators", ("generator", "share QPS", "status", "count", "QPS",
                                       "P99", "late sends", "CPU"), generator_table(data))
    for line in closing_lines(data, str(path)):
        print(line)
    return code


def _release_mark(release: ReleaseOutcome | None) -> plot.Mark | None:
    if release is None or release.started_s is None:
        return None
    return plot.Mark(f"release v{release.version} (fab deploy, exit {release.exit_code})",
                     release.started_s, release.ended_s)


def new_run_id() -> str:
    """Unique per run: time, then a random part (two runs may share a host)."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def run_accept(options: AcceptOptions, *, root: Path, out: Path | None = None,
               runner_factory: RunnerFactory = SshConnection,
               show_table: TablePrinter | None = None, stop: Stopping | None = None) -> int:
    """The whole acceptance run; returns the exit code. ``show_table`` prints the report's
    tables for people (the command passes its table printer; without it only the report
    files hold them). ``stop`` (the engine's, when the command runs on its session) ends the
    set-up before the window (exit 1, nothing measured) or the window early (exit 130, the
    figures reported); the generator hosts are cleaned up either way."""
    inventory = load_inventory(options.inventory)
    plan = build_plan(options, inventory)
    requests = serialized_requests(plan)
    run_id = new_run_id()
    out_dir = out or Path("out") / "accept" / f"{plan.model.name}-{run_id}"
    out_dir.mkdir(parents=True, exist_ok=True)
    _announce(plan)
    say(f"run {run_id}; report in {out_dir}")
    gens = prepare_all(plan, requests, run_id, runner_factory)
    if stop is not None and stop.is_set():
        problems = _cleanup_all(gens)
        raise LoadgenError(f"{stop.signal or 'stopped'} during the generators' set-up: nothing "
                           "was measured; " + ("; ".join(problems) if problems else
                                                "every generator host was cleaned up"))
    start_at = time.time() + plan.start_margin_s
    release: ReleaseOutcome | None = None
    interrupted = False
    try:
        outcomes, release = run_window(plan, gens, start_at, root=root, out_dir=out_dir,
                                       stop=stop)
    except Interrupted as ended:
        interrupted = True
        outcomes = ended.outcomes
        if ended.release is not None:
            say("waiting for the deploy to finish (a deploy is never cut short)")
            release = ended.release.result()
    finally:
        problems = _cleanup_all(gens)
    return write_report(plan, outcomes, release, start_at_s=start_at, out_dir=out_dir,
                        cleanup_problems=problems, interrupted=interrupted,
                        show_table=show_table)

