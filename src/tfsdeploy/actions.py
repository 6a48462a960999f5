"""The steps a playbook's task lists can name. Each acts on one host (effects).

An action takes the host's job and its parameters from the task list, returns a short detail
for the progress line, and raises ``GateFailed`` (or a host error) when it cannot go on.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tfsdeploy import commands
from tfsdeploy.catalog import Model
from tfsdeploy.gates import Clock, GateFailed, Verdict, percentile, poll
from tfsdeploy.golden import GoldenExample, mismatch
from tfsdeploy.inventory import ResolvedHost
from tfsdeploy.layout import (
    HostPaths,
    Ports,
    container_name,
    host_paths,
    model_ports,
    other_slot,
    proxy_name,
)
from tfsdeploy.proxy import ProxyAdmin, maint_commands, parse_sessions, render_proxy_config
from tfsdeploy.proxy import switch_commands as proxy_switch_commands
from tfsdeploy.remote import HostUnreachable, Runner
from tfsdeploy.render import FLAGS, HostRender
from tfsdeploy.state import GOOD, Container, HostState, discover, list_containers, read_releases

Action = Callable[..., str]
ACTIONS: dict[str, Action] = {}


def action(name: str) -> Callable[[Action], Action]:
    """Register a step under ``name`` for task lists."""
    def register(func: Action) -> Action:
        ACTIONS[name] = func
        return func
    return register


@dataclass
class Release:
    """The fleet-wide facts of one deploy (same on every host)."""

    model: Model
    version: int
    release_id: str
    image: str
    source_dir: str
    golden: list[GoldenExample]
    who: str
    clock: Clock
    stage_lock: threading.Lock = field(default_factory=threading.Lock)
    archive: str | None = None
    client_factory: Callable[[str, int, str], Any] | None = None  # tests pass a fake
    rollback: bool = False  # rolling back to a retained release (its record stays as it is)


def grpc_client(job: HostJob, port: int) -> Any:
    """A gRPC client of the model on one of the host's ports (``probes.SlotClient`` unless a
    test injects a factory)."""
    factory = job.release.client_factory
    if factory is None:
        from tfsdeploy.probes import SlotClient

        factory = SlotClient
    return factory(job.host.address, port, job.release.model.name)


def slot_client(job: HostJob) -> Any:
    """A gRPC client of the new slot."""
    return grpc_client(job, job.ports.slot_grpc(job.new_slot))


@dataclass
class HostJob:
    """One host's part of a deploy: what it runs, what it saw, what it did."""

    release: Release
    host: ResolvedHost
    runner: Runner
    render: HostRender
    state: HostState = field(default_factory=HostState)
    new_slot: str = "blue"
    old: Container | None = None
    unchanged: bool = False
    started: bool = False  # we created the new container (restore removes it)
    resumed: bool = False  # we started a retained, stopped container (restore stops it)
    warm: bool = False  # the target container was already running and loaded
    switched: bool = False
    gates: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def paths(self) -> HostPaths:
        """Where the model lives on this host."""
        return host_paths(self.host, self.release.model)

    @property
    def ports(self) -> Ports:
        """The model's ports on this host."""
        return model_ports(self.host, self.release.model)

    @property
    def container(self) -> str:
        """The new release's container name."""
        return container_name(self.release.model.name, self.release.release_id)

    def must(self, argv: list[str], step: str, *, timeout: float | None = None) -> str:
        """Run ``argv``; a non-zero exit fails ``step`` with the command's output."""
        result = self.runner.run(argv, timeout=timeout)
        if not result.ok:
            raise GateFailed(step, f"`{' '.join(argv[:3])} ...` to succeed",
                             f"exit {result.code}: {result.tail()}")
        return result.stdout

    def log_tail(self, lines: int = 20) -> str:
        """The new container's log tail (TFServing prints load errors there)."""
        result = self.runner.run(commands.container_logs(self.container, lines))
        return (result.stdout + result.stderr).strip()

    def audit_line(self, event: str, **details: Any) -> str:
        """One audit record: who did what to which release, when."""
        return json.dumps({"time": _now(), "who": self.release.who, "host": self.host.name,
                           "model": self.release.model.name,
                           "release": self.release.release_id, "event": event, **details},
                          sort_keys=True)

    def audit(self, event: str, **details: Any) -> None:
        """Append one JSON line to the host's audit log."""
        self.runner.run(commands.append_line(self.paths.audit_log,
                                             self.audit_line(event, **details)))

    @property
    def target_running(self) -> bool:
        """The release being deployed already runs here (a rollback within the window)."""
        return any(c.release == self.release.release_id and c.running
                   for c in self.state.containers)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def file_hashes(render: HostRender) -> dict[str, str]:
    """sha256 of each rendered file."""
    return {f.name: hashlib.sha256(f.text.encode()).hexdigest() for f in render.files}


def flag_lines(render: HostRender) -> list[str]:
    """The server flags of the release, without comments."""
    return [line.strip() for line in render.file(FLAGS).text.splitlines()
            if line.strip().startswith("--")]


# -- preflight ----------------------------------------------------------------------------

@action("check_ssh")
def check_ssh(job: HostJob) -> str:
    """SSH connects with a verified host key and runs a command."""
    job.must(["true"], "check_ssh")
    return f"{job.host.vars.ssh_user}@{job.host.address}"


@action("check_docker")
def check_docker(job: HostJob) -> str:
    """The Docker engine answers."""
    return "docker " + job.must(commands.docker_version(), "check_docker").strip()


@action("discover")
def discover_state(job: HostJob) -> str:
    """Read what is live and choose the free slot; detect a release that is already live."""
    job.state = discover(job.runner, job.release.model.name, job.paths, job.ports.admin)
    job.old = job.state.serving
    job.new_slot = other_slot(job.old.slot) if job.old else "blue"
    current = job.state.current or {}
    if job.old and current.get("id") != job.old.release:
        # a killed run switched traffic without recording it: compare with what serves
        found = job.runner.run(commands.read_file(
            f"{job.paths.release_dir(job.old.release)}/manifest.json"))
        current = json.loads(found.stdout) if found.ok and found.stdout.strip() else {}
    job.unchanged = bool(job.old and current.get("version") == job.release.version
                         and current.get("image") == job.release.image
                         and current.get("files") == file_hashes(job.render))
    if job.old and job.old.release == job.release.release_id:
        # the proxy already sends traffic to this very release (a killed run switched it):
        # nothing to roll; finalize re-points `current` and retires the rest
        job.unchanged = True
    if job.unchanged:
        return f"already serving {current.get('id')} (unchanged)"
    if job.old:
        return f"serving {job.old.release} in {job.old.slot}; new slot {job.new_slot}"
    return "no release yet; new slot blue"


@action("check_ports")
def check_ports(job: HostJob) -> str:
    """The model's ports are free, or held by this model's own proxy and slots."""
    ports = job.ports
    mine = {ports.grpc, ports.rest, ports.admin,
            *(p for pair in ports.slots.values() for p in pair)}
    listening = set()
    for line in job.must(commands.listening_ports(), "check_ports").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].rsplit(":", 1)[-1].isdigit():
            listening.add(int(fields[3].rsplit(":", 1)[-1]))
    ours = {ports.grpc, ports.rest, ports.admin} if job.state.proxy_running else set()
    for slot, pair in ports.slots.items():
        if any(c.running for c in job.state.in_slot(slot)):
            ours |= set(pair)
    foreign = sorted((mine & listening) - ours)
    if foreign:
        raise GateFailed("check_ports", f"ports {sorted(mine)} free or held by "
                         f"{job.release.model.name}'s own proxy and slots",
                         f"something else listens on {foreign} (another model without a "
                         "port_offset, or another service)")
    return f"{len(mine)} ports free or ours"


@action("check_disk")
def check_disk(job: HostJob, reserve_mib: int = 512) -> str:
    """Room for the model version (when not staged yet) plus a reserve."""
    line = job.must(commands.free_disk_mib(job.paths.root), "check_disk").split()
    free = int(line[3])
    need = reserve_mib + _tree_mib(job.release.source_dir)
    if free < need:
        raise GateFailed("check_disk", f">= {need} MiB free under {job.paths.root}",
                         f"{free} MiB free")
    return f"{free} MiB free, need {need}"


def _tree_mib(path: str) -> int:
    total = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return total // (1024 * 1024) + 1


@action("check_gpu")
def check_gpu(job: HostJob) -> str:
    """Free GPU memory for the new release's fraction beside the old release."""
    gpu = job.render.gpu
    if gpu is None or job.unchanged:
        return "no GPU" if gpu is None else "unchanged"
    if any(c.release == job.release.release_id and c.running for c in job.state.containers):
        return "the release's container already runs"
    rows = job.must(commands.gpu_memory(), "check_gpu").strip().splitlines()
    need = gpu.fraction * gpu.gpu_memory_mib
    # a drained old release still running in the slot we take is replaced, freeing its share
    reclaim = need if any(c.running for c in job.state.in_slot(job.new_slot)
                          if c != job.old) else 0.0
    for row in rows:
        index, total, used = (int(float(x)) for x in row.split(","))
        free = total - used + int(reclaim)
        if free < need:
            raise GateFailed(
                "check_gpu", f"{need:.0f} MiB free on GPU {index} for the new release "
                f"(fraction {gpu.fraction:.3f} x {total} MiB) beside the live one",
                f"{free} MiB free ({used} of {total} MiB used); "
                f"plan: {gpu.arithmetic()}")
    return f"{len(rows)} GPU(s), need {need:.0f} MiB free each"


@action("pull_image")
def pull_image(job: HostJob) -> str:
    """The serving and proxy images are on the host before any host changes."""
    if job.target_running and job.state.proxy_running:
        return "the release and the proxy run: their images are here"
    pulled = []
    for image in (job.release.image, job.host.vars.proxy_image):
        if not job.runner.run(commands.image_id(image)).ok:
            job.must(commands.docker_pull(image), "pull_image", timeout=1800)
            pulled.append(image)
    return f"pulled {', '.join(pulled)}" if pulled else "images present"


# -- stage --------------------------------------------------------------------------------

@action("stage_model")
def stage_model(job: HostJob) -> str:
    """Upload the version atomically: temp dir, checksums verified, then one rename."""
    final = job.paths.version_dir(job.release.version)
    if job.target_running:
        return f"version {job.release.version} is in use by the running release"
    if job.runner.run(["test", "-f", f"{final}/saved_model.pb"]).ok:
        return f"version {job.release.version} already staged"
    if not Path(job.release.source_dir, "saved_model.pb").is_file():
        raise GateFailed("stage_model", f"version {job.release.version} on the host or in "
                         f"the model's source ({job.release.source_dir})", "neither has it")
    archive = _version_archive(job.release)
    staging = f"{job.paths.model_dir}/.staging-{job.release.version}-{job.release.release_id}"
    job.must(commands.mkdir(job.paths.model_dir), "stage_model")
    job.runner.put_file(archive, f"{staging}.tar")
    job.must(commands.extract_tar(f"{staging}.tar", staging), "stage_model", timeout=600)
    outcome = job.must(commands.verify_and_publish(staging, final), "stage_model").strip()
    size = os.path.getsize(archive) // (1024 * 1024)
    return f"{outcome} {final} ({size} MiB, sha256 verified)"


def _version_archive(release: Release) -> str:
    """A tar of the version directory with a SHA256SUMS file, made once per deploy."""
    with release.stage_lock:
        if release.archive:
            return release.archive
        source = Path(release.source_dir)
        fd, path = tempfile.mkstemp(prefix="tfsdeploy-", suffix=".tar")
        os.close(fd)
        sums = []
        with tarfile.open(path, "w") as tar:
            for file in sorted(p for p in source.rglob("*") if p.is_file()):
                relative = file.relative_to(source).as_posix()
                sums.append(f"{hashlib.sha256(file.read_bytes()).hexdigest()}  {relative}")
                tar.add(file, arcname=relative)
            data = ("\n".join(sums) + "\n").encode()
            info = tarfile.TarInfo("SHA256SUMS")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        release.archive = path
        return path


# -- roll one host ------------------------------------------------------------------------

@action("upload_release")
def upload_release(job: HostJob) -> str:
    """Write the release's rendered files and its manifest into a new release directory."""
    directory = job.paths.release_dir(job.release.release_id)
    job.must(commands.mkdir(directory), "upload_release")
    for rendered in job.render.files:
        job.runner.put_bytes(rendered.text.encode(), f"{directory}/{rendered.name}")
    job.runner.put_bytes(json.dumps(manifest(job, "starting"), indent=2).encode(),
                         f"{directory}/manifest.json")
    job.audit("upload_release", directory=directory)
    return directory


def manifest(job: HostJob, status: str) -> dict[str, Any]:
    """The release record kept on the host."""
    gpu = job.render.gpu
    return {"id": job.release.release_id, "model": job.release.model.name,
            "version": job.release.version, "image": job.release.image, "slot": job.new_slot,
            "container": job.container, "flags": flag_lines(job.render),
            "files": file_hashes(job.render),
            "gpu_fraction": gpu.fraction if gpu else None, "status": status,
            "previous": job.old.release if job.old else None, "deployed_by": job.release.who,
            "updated_at": _now(), "gates": job.gates, "steps": job.steps}


@action("start_slot")
def start_slot(job: HostJob) -> str:
    """Start the new release in the free slot beside the old one."""
    _run_in_free_slot(job, "start_slot")
    job.audit("start_slot", slot=job.new_slot, container=job.container)
    return f"{job.container} in {job.new_slot} (:{job.ports.slot_grpc(job.new_slot)})"


def _run_in_free_slot(job: HostJob, step: str) -> None:
    """Clear the free slot (a leftover of an interrupted run is never the serving one) and
    start the release's container there."""
    if job.old and job.old.name == job.container:
        raise GateFailed(step, "the serving container to stay untouched",
                         f"{job.container} serves traffic and would be replaced")
    for container in job.state.in_slot(job.new_slot):
        if container.running:
            job.must(commands.remove(container.name), step)
    job.runner.run(commands.remove(job.container))
    argv = commands.run_slot(model=job.release.model.name, release_id=job.release.release_id,
                             slot=job.new_slot, version=job.release.version,
                             image=job.release.image, paths=job.paths, ports=job.ports,
                             flags=flag_lines(job.render), gpus=job.host.vars.docker_gpus)
    job.started = True
    job.must(argv, step)


@action("resume_release")
def resume_release(job: HostJob) -> str:
    """Bring a retained release back in the free slot: already running (warm), started
    again (stopped, same slot), or re-created from its record (its files are on the host)."""
    name = job.container
    retained = [c for c in job.state.containers if c.release == job.release.release_id]
    if retained and retained[0].slot == job.new_slot:
        if retained[0].running:
            job.warm = True
            return f"{name} still running in {job.new_slot}: warm, no model load"
        job.must(commands.start(name), "resume_release")
        job.resumed = True
        job.audit("resume_release", container=name, how="start")
        return f"{name} started again in {job.new_slot}"
    _run_in_free_slot(job, "resume_release")
    job.audit("resume_release", container=name, how="re-created from its record")
    return f"{name} re-created from its record in {job.new_slot}"


def _container_problem(job: HostJob) -> str | None:
    result = job.runner.run(commands.inspect_state(job.container))
    if not result.ok:
        return "container is gone"
    status, restarts, exit_code = result.stdout.split()
    if status != "running":
        return f"container {status} (exit code {exit_code})"
    if int(restarts) > 0:
        return f"container restarted {restarts} time(s)"
    return None


def _gate(job: HostJob, name: str, started: float, ok: bool, detail: str) -> None:
    job.gates.append({"gate": name, "ok": ok, "seconds": round(time.monotonic() - started, 3),
                      "detail": detail})


@contextlib.contextmanager
def _gate_errors(job: HostJob, gate: str, started: float, *, step: str, expected: str,
                 logs: bool = True) -> Iterator[None]:
    """Record a gate that failed and raise it as GateFailed: a GateFailed as it is, any other
    error (a refused or timed-out request) as ``expected`` not met; with the container's log
    tail when ``logs``. A host that stopped answering SSH stays HostUnreachable."""
    try:
        yield
    except HostUnreachable:
        raise  # not the release's fault: the host is reported unreachable
    except GateFailed as error:
        _gate(job, gate, started, False, error.seen)
        tail = job.log_tail() if logs else error.log_tail
        raise GateFailed(error.step, error.expected, error.seen, tail) from None
    except Exception as exc:
        _gate(job, gate, started, False, str(exc))
        raise GateFailed(step, expected, f"{type(exc).__name__}: {exc}",
                         job.log_tail() if logs else "") from None


@action("gate_available")
def gate_available(job: HostJob, timeout_s: float | None = None) -> str:
    """The exact new version is AVAILABLE (GetModelStatus), the container running throughout."""
    started = time.monotonic()
    deadline = timeout_s or job.release.model.rollout.load_timeout_s
    client = slot_client(job)
    version = job.release.version

    def check() -> Verdict:
        problem = _container_problem(job)
        if problem:
            return Verdict.fail(problem)
        try:
            statuses = client.status(timeout=3)
        except Exception as exc:  # ports open only after the initial load
            return Verdict.wait(f"not answering yet ({type(exc).__name__})")
        mine = [s for s in statuses if s.version == version]
        if not mine:
            return Verdict.wait(f"version {version} unknown yet")
        status = mine[0]
        if status.state == "AVAILABLE":
            return Verdict.ok("AVAILABLE")
        if status.state == "END":
            return Verdict.fail(f"END: {status.error_message or 'unloaded'}")
        return Verdict.wait(status.state)

    expected = f"version {version} AVAILABLE"
    try:
        with _gate_errors(job, "available", started, step="gate_available", expected=expected):
            verdict = poll(check, step="gate_available", expected=expected,
                           deadline_s=deadline, clock=job.release.clock)
    finally:
        client.close()
    _gate(job, "available", started, True, verdict.seen)
    return f"version {version} AVAILABLE"


@action("gate_signature")
def gate_signature(job: HostJob) -> str:
    """The served signature matches the catalog contract (names, dtypes, shapes)."""
    started = time.monotonic()
    contract = job.release.model.signature
    client = slot_client(job)
    try:
        served = client.signature(job.release.version, contract.name)
    finally:
        client.close()
    differences = signature_differences(contract, served)
    _gate(job, "signature", started, not differences, "; ".join(differences) or "matches")
    if differences:
        raise GateFailed("gate_signature", f"signature {contract.name!r} as in the catalog",
                         "; ".join(differences))
    return f"{contract.name}: {len(contract.inputs)} input(s), {len(contract.outputs)} output(s)"


def signature_differences(contract: Any, served: dict[str, Any]) -> list[str]:
    """How the served signature differs from the contract (empty when it matches)."""
    if not served:
        return [f"no signature {contract.name!r} served"]
    found = []
    for kind in ("inputs", "outputs"):
        want: dict[str, Any] = dict(getattr(contract, kind))
        have: dict[str, Any] = served.get(kind, {})
        if set(want) != set(have):
            found.append(f"{kind} {sorted(have)} != contract {sorted(want)}")
            continue
        for name, spec in want.items():
            dtype, shape = have[name]
            if dtype != spec.dtype:
                found.append(f"{kind} {name!r} dtype {dtype} != {spec.dtype}")
            if len(shape) != len(spec.shape) or any(
                    a != b and -1 not in (a, b) for a, b in zip(shape, spec.shape, strict=False)):
                found.append(f"{kind} {name!r} shape {list(shape)} != {list(spec.shape)}")
    return found


def _requests(job: HostJob) -> list[GoldenExample]:
    if not job.release.golden:
        raise GateFailed("gate_warmup", "golden requests for this version (Model.golden)",
                         "none: add golden examples for the version to the model's golden file")
    return job.release.golden


@action("gate_warmup")
def gate_warmup(job: HostJob, rounds: int = 20, skip_if_warm: bool = False) -> str:
    """Representative requests straight to the new slot until P99 is under the threshold."""
    if skip_if_warm and job.warm:
        return "skipped: the container was already running and warm"
    model = job.release.model
    threshold = (model.warmup.p99_ms or model.latency_slo_ms) / 1000
    examples = _requests(job)
    client = slot_client(job)
    started = time.monotonic()
    clock = job.release.clock
    end = clock.now() + model.warmup.timeout_s
    p99 = float("inf")
    try:
        with _gate_errors(job, "warmup", started, step="gate_warmup",
                          expected="warmup requests to succeed"):
            for _ in range(rounds):
                latencies = [client.predict(ex.inputs, version=job.release.version,
                                            signature=ex.signature)[1]
                             for ex in _cycle(examples, model.warmup.samples)]
                p99 = percentile(latencies, 99)
                if p99 <= threshold or clock.now() >= end:
                    break
    finally:
        client.close()
    ok = p99 <= threshold
    detail = f"P99 {p99 * 1000:.1f} ms over {model.warmup.samples} requests (<= " \
             f"{threshold * 1000:.0f} ms)"
    _gate(job, "warmup", started, ok, detail)
    if not ok:
        raise GateFailed("gate_warmup", f"P99 <= {threshold * 1000:.0f} ms",
                         f"P99 {p99 * 1000:.1f} ms after {model.warmup.timeout_s:g} s")
    return detail


def _cycle(examples: list[GoldenExample], count: int) -> list[GoldenExample]:
    return [examples[i % len(examples)] for i in range(max(1, count))]


@action("gate_health")
def gate_health(job: HostJob, min_healthy_s: float | None = None) -> str:
    """Golden requests give the expected outputs, with no error, for the minimum time."""
    model = job.release.model
    hold = model.rollout.min_healthy_s if min_healthy_s is None else min_healthy_s
    examples = _requests(job)
    client = slot_client(job)
    started = time.monotonic()
    clock = job.release.clock
    end = clock.now() + hold
    sent = 0
    try:
        with _gate_errors(job, "health", started, step="gate_health",
                          expected="golden requests to succeed"):
            while True:
                for example in examples:
                    outputs, _ = client.predict(example.inputs, version=job.release.version,
                                                signature=example.signature)
                    wrong = mismatch(example, outputs)
                    if wrong:
                        raise GateFailed("gate_health", "golden outputs", wrong)
                    sent += 1
                problem = _container_problem(job)
                if problem:
                    raise GateFailed("gate_health", "the container to keep running", problem)
                if clock.now() >= end:
                    break
                clock.sleep(0.2)
    finally:
        client.close()
    detail = f"{sent} golden request(s) correct over {hold:g} s"
    _gate(job, "health", started, True, detail)
    return detail


@action("switch_traffic")
def switch_traffic(job: HostJob) -> str:
    """Point the host's stable ports at the new slot (the proxy's runtime API, no reload)."""
    config = render_proxy_config(job.host, job.release.model, job.ports, job.new_slot)
    if not job.state.proxy_running:
        job.must(commands.mkdir(job.paths.proxy_dir), "switch_traffic")
    job.runner.put_bytes(config.encode(), f"{job.paths.proxy_dir}/haproxy.cfg")
    if not job.state.proxy_running:
        job.runner.run(commands.remove(proxy_name(job.release.model.name)))
        job.must(commands.run_proxy(model=job.release.model.name,
                                    image=job.host.vars.proxy_image, paths=job.paths),
                 "switch_traffic")
        _wait_proxy(job)
        job.state.proxy_running = True
        job.switched = True
        job.audit("switch_traffic", to=job.new_slot, proxy="started")
        return f"proxy started on :{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"
    old = job.old.slot if job.old else None
    ProxyAdmin(job.runner, job.ports.admin).send(proxy_switch_commands(job.new_slot, old))
    job.switched = True
    job.audit("switch_traffic", to=job.new_slot, previous=old)
    return f":{job.ports.grpc}/:{job.ports.rest} -> {job.new_slot}"


def _wait_proxy(job: HostJob) -> None:
    admin = ProxyAdmin(job.runner, job.ports.admin)

    def check() -> Verdict:
        try:
            admin.stat()
        except Exception as exc:
            return Verdict.wait(f"admin socket not answering ({type(exc).__name__})")
        return Verdict.ok()

    poll(check, step="switch_traffic", expected="the proxy's admin socket to answer",
         deadline_s=20, clock=job.release.clock, interval_s=0.2)


@action("gate_stable")
def gate_stable(job: HostJob) -> str:
    """A golden request through the host's stable port (the path clients use) is answered
    by the new release."""
    examples = _requests(job)
    stable = grpc_client(job, job.ports.grpc)
    started = time.monotonic()
    try:
        with _gate_errors(job, "stable", started, step="gate_stable", logs=False,
                          expected=f"an answer on the stable port {job.ports.grpc}"):
            example = examples[0]
            outputs, latency = stable.predict(example.inputs, signature=example.signature,
                                              timeout=30)
            wrong = mismatch(example, outputs)
    finally:
        stable.close()
    _gate(job, "stable", started, not wrong, wrong or "new release answers")
    if wrong:
        raise GateFailed("gate_stable", f"version {job.release.version}'s golden outputs on the "
                         f"stable port {job.ports.grpc}", wrong)
    return f":{job.ports.grpc} answers with version {job.release.version} " \
           f"({latency * 1000:.1f} ms)"


@action("drain_old")
def drain_old(job: HostJob, timeout_s: float | None = None) -> str:
    """Wait until the old slot has no request in flight, then put it in maintenance."""
    if not job.old:
        return "nothing to drain"
    slot = job.old.slot
    admin = ProxyAdmin(job.runner, job.ports.admin)
    started = time.monotonic()

    def check() -> Verdict:
        sessions = parse_sessions(admin.stat())
        in_flight = sum(v for (_, server), v in sessions.items() if server == slot)
        return Verdict.ok("0 in flight") if in_flight == 0 else Verdict.wait(
            f"{in_flight} in flight")

    poll(check, step="drain_old", expected=f"slot {slot} drained",
         deadline_s=timeout_s or job.release.model.rollout.drain_timeout_s,
         clock=job.release.clock, interval_s=0.1, max_interval_s=0.5)
    admin.send(maint_commands(slot))
    job.audit("drain_old", slot=slot)
    return f"{slot} drained in {time.monotonic() - started:.1f} s, in maintenance"


@action("record_release")
def record_release(job: HostJob) -> str:
    """Write the final manifest and point ``current`` at the new release."""
    directory = job.paths.release_dir(job.release.release_id)
    job.runner.put_bytes(json.dumps(manifest(job, "serving"), indent=2).encode(),
                         f"{directory}/manifest.json")
    rolled_back = (f"{job.paths.release_dir(job.old.release)}/manifest.json"
                   if job.release.rollback and job.old else "")
    job.must(commands.record_current(
        target=f"releases/{job.release.release_id}", link=job.paths.current,
        audit_log=job.paths.audit_log,
        audit_line=job.audit_line("record_release", version=job.release.version,
                                  slot=job.new_slot),
        rolled_back_manifest=rolled_back), "record_release")
    return f"current -> {job.release.release_id}"


# -- finalize -----------------------------------------------------------------------------

@action("retire_old")
def retire_old(job: HostJob) -> str:
    """Stop the drained releases outside the serving slot (kept for rollback) and prune
    releases beyond the limit.

    On a host that a killed run had already rolled (``unchanged`` now), the old release it
    never retired is found the same way: running, but not in the slot that serves.
    """
    serving_slot = job.old.slot if job.unchanged and job.old else job.new_slot
    leftovers = [c for c in job.state.containers
                 if c.running and c.slot != serving_slot and c.name != job.container]
    window = job.release.model.rollout.window_s
    notes = []
    for container in leftovers:
        if window > 0:
            notes.append(f"{container.name} kept running (drained) for the {window:g} s "
                         "rollback window; the next deploy stops it")
            continue
        job.must(commands.stop(container.name), "retire_old", timeout=120)
        job.audit("retire_old", container=container.name)
        notes.append(f"stopped {container.name}")
    serving = job.old.release if job.unchanged and job.old else None
    if serving and (job.state.current or {}).get("id") != serving:
        notes.append(_finish_interrupted_record(job, serving))
    notes.append(prune_releases(job))
    return "; ".join(n for n in notes if n)


def _finish_interrupted_record(job: HostJob, serving: str) -> str:
    """A killed run switched traffic but never recorded it: point ``current`` at the release
    that serves (the proxy's truth), which is this run's only when it is a rollback."""
    previous = (job.state.current or {}).get("id")
    rolled_back = (f"{job.paths.release_dir(previous)}/manifest.json"
                   if job.release.rollback and previous else "")
    job.must(commands.record_current(
        target=f"releases/{serving}", link=job.paths.current,
        audit_log=job.paths.audit_log,
        audit_line=job.audit_line("record_release", version=job.release.version,
                                  recovered=True),
        rolled_back_manifest=rolled_back,
        serving_manifest=f"{job.paths.release_dir(serving)}/manifest.json"), "retire_old")
    return f"current -> {serving} (recorded after an interrupted run)"


def prune_releases(job: HostJob) -> str:
    """Keep the newest ``keep_releases`` good releases (containers and directories).

    Only releases that served count: failed, reverted or interrupted attempts never push a
    rollback target out. Running releases and the one this run replaced are always kept.
    """
    keep = job.release.model.rollout.keep_releases
    containers = list_containers(job.runner, job.release.model.name)
    records = {str(m["id"]): m for m in read_releases(job.runner, job.paths) if m.get("id")}
    releases = sorted(set(records) | {c.release for c in containers})
    good = [r for r in releases if records.get(r, {}).get("status") in GOOD]
    kept = set(good[-keep:]) | {c.release for c in containers if c.running}
    kept |= {job.release.release_id} | ({job.old.release} if job.old else set())
    newest_good = good[-keep] if len(good) >= keep else ""
    # attempts newer than the oldest kept good release stay for post-mortems
    doomed = [r for r in releases if r not in kept and r < newest_good]
    for release_id in doomed:
        job.runner.run(commands.remove(container_name(job.release.model.name, release_id)))
        job.runner.run(commands.remove_tree(job.paths.release_dir(release_id)))
    if doomed:
        job.audit("prune", releases=doomed)
    return f"pruned {len(doomed)} old release(s)" if doomed else ""
