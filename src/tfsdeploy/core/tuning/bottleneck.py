"""`fab diagnose`: which stage of TFServing's request path limits a live instance (pure).

A request crosses four pools (TFServing's model_servers/server.cc, batching/batching_session.cc,
TensorFlow's direct_session.cc): a gRPC thread of the sync server's quota
(``--grpc_max_threads``, which holds quota - 1 requests at once: one thread always polls), the
batch scheduler's queue and its ``num_batch_threads``, then Session::Run on the intra-op pool
(one op's parallel work: ``--tensorflow_intra_op_parallelism``) and the inter-op pool (the ops
that run at once, across concurrent batches: ``--tensorflow_inter_op_parallelism``). The
evidence is what the server and its proxy report over a window (``core/tuning/stages.py``): request
latency against queueing and run latency, batch fill against max_batch_size, the queue's
refusals, requests in flight against the gRPC quota, the serving process's CPU time, and the
host's CPU time (``/proc/stat``): a pool cannot be judged by the cores its process used when
other processes held the host's CPUs. The first rule that holds names the limit; each limit
has its own rule and fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tfsdeploy.core.inventory.catalog import Batching, Threads
from tfsdeploy.core.render.files import BATCHING_CONFIG, FLAGS
from tfsdeploy.core.render.flags import parse_flags_file
from tfsdeploy.core.render.validate import DEFAULT_MAX_BATCH_SIZE, parse_text_proto
from tfsdeploy.core.tfserving import configs as tfproto
from tfsdeploy.core.tuning.stages import StageWindow

GRPC_DEFAULT_PER_CPU = 4  # TFServing's --grpc_max_threads default: 4 x the CPUs (main.cc)
QUEUE_BOUND = 0.5  # batch queueing above half the latency: the scheduler limits
RUN_BOUND = 0.6  # Session::Run above 60% of the latency: the pools inside TensorFlow limit
# a pool of N threads using >= 0.75 N cores is full. Measured: resnet50 with an intra-op
# pool of 1 at one request in flight (Session::Run 99 % of the latency, busy 95 % of the
# time: 8.7 requests/s x 109 ms) used 1.05 cores on a quiet 2-core host and 0.79 on one
# whose other core ran other work
POOL_FULL = 0.75
CPU_FULL = 0.85  # the process uses 85% of the host's CPUs: the host is the limit
OTHERS_MIN = 0.25  # other processes using a quarter of the host's CPUs or more
LOW_FILL = 0.5  # batches below half of max_batch_size close on the timeout


@dataclass(frozen=True)
class Evidence:
    """One live instance over a window."""

    host: str
    window_s: float
    stages: StageWindow
    batching: Batching
    threads: Threads
    slo_ms: float
    host_cpus: int
    cpu_user_s: float | None = None  # the serving process's CPU time in the window
    cpu_system_s: float | None = None
    max_in_flight: int | None = None  # requests in flight at the instance (its proxy's view)
    host_busy: float | None = None  # share of all the host's CPU time that was busy

    @property
    def others_cores(self) -> float | None:
        """Cores the host's other processes used on average (this one's taken off)."""
        if self.host_busy is None or self.cores is None:
            return None
        return max(0.0, self.host_busy * self.host_cpus - self.cores)

    @property
    def cores(self) -> float | None:
        """CPU cores the process used on average."""
        if self.cpu_user_s is None or self.cpu_system_s is None or self.window_s <= 0:
            return None
        return (self.cpu_user_s + self.cpu_system_s) / self.window_s

    @property
    def grpc_quota(self) -> int:
        """The gRPC thread quota (TFServing's default when the flag is not set)."""
        return self.threads.grpc_max_threads or GRPC_DEFAULT_PER_CPU * max(1, self.host_cpus)


@dataclass(frozen=True)
class Finding:
    """The limiting stage, the figures that show it, and the fix."""

    stage: str  # grpc_threads | batch_queue | batch_timeout | batch_threads | host_cpu |
    # intra_op | inter_op | instances | none | no_traffic
    summary: str
    figures: tuple[str, ...] = ()
    fix: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict[str, object]:
        """The finding in `fab diagnose --json`."""
        return {"stage": self.stage, "summary": self.summary, "figures": list(self.figures),
                "fix": self.fix, "notes": list(self.notes)}


def figures(e: Evidence) -> tuple[str, ...]:
    """The window's figures, as the finding shows them."""
    s = e.stages
    shown = [f"{s.requests_ok / e.window_s:.1f} requests/s answered over {e.window_s:g} s"]
    if s.request_ms is not None:
        shown.append(f"request latency {s.request_ms:.2f} ms mean (SLO P99 {e.slo_ms:g} ms)")
    if s.queue_ms is not None:
        share = s.queue_share or 0.0
        shown.append(f"batch queueing {s.queue_ms:.2f} ms mean ({share:.0%} of the latency)")
    if s.runtime_ms is not None:
        shown.append(f"Session::Run {s.runtime_ms:.2f} ms mean")
    if s.mean_batch is not None:
        shown.append(f"batches of {s.mean_batch:.1f} on average, max_batch_size "
                     f"{e.batching.max_batch_size}")
    if s.queue_full:
        shown.append(f"{s.queue_full:.0f} requests refused with the batch queue full")
    if e.max_in_flight is not None:
        shown.append(f"{e.max_in_flight} requests in flight at most, the gRPC quota "
                     f"{e.grpc_quota} holds {e.grpc_quota - 1}")
    if e.cores is not None and e.cpu_user_s is not None and e.cpu_system_s is not None:
        shown.append(f"CPU {e.cores:.2f} of {e.host_cpus} cores (user {e.cpu_user_s:.1f} s, "
                     f"sys {e.cpu_system_s:.1f} s)")
    if e.host_busy is not None and e.others_cores is not None:
        shown.append(f"host CPUs {e.host_busy:.0%} busy: other processes "
                     f"{e.others_cores:.2f} cores")
    return tuple(shown)


def diagnose(e: Evidence) -> Finding:
    """The limiting stage of the instance (see the module docstring)."""
    shown = figures(e)
    notes = _notes(e)
    for rule in (_no_traffic, _grpc_threads, _queue_full, _batch_timeout, _batch_threads,
                 _intra_op, _inter_op, _others_busy, _instances):
        found = rule(e)
        if found is not None:
            return Finding(found[0], found[1], shown, found[2], notes)
    spare = "has CPU to spare" if e.host_busy is None else \
        f"has CPU to spare (the host's CPUs {e.host_busy:.0%} busy)"
    return Finding("none", f"no stage limits this instance: it answers within its pools and "
                   f"{spare}", shown, "nothing to change; `fab tune` measures what more it "
                   "could take", notes)


Rule = tuple[str, str, str]


def _no_traffic(e: Evidence) -> Rule | None:
    if e.stages.requests_ok > 0 or e.stages.queue_full > 0:
        return None
    return ("no_traffic", f"no request was answered in the {e.window_s:g} s window",
            "diagnose while the instance takes traffic (a longer --for, or `fab bench`)")


def _grpc_threads(e: Evidence) -> Rule | None:
    held = e.grpc_quota - 1
    if e.max_in_flight is None or e.max_in_flight < held:
        return None
    return ("grpc_threads",
            f"gRPC threads: {e.max_in_flight} requests in flight reached the {held} the quota "
            f"of {e.grpc_quota} holds (one thread always polls); more are refused "
            "RESOURCE_EXHAUSTED before TFServing sees them",
            f"raise grpc_max_threads to at least {max(2 * e.grpc_quota, e.max_in_flight + 2)}, "
            "or 0 for TFServing's default (4 x the host's CPUs)")


def _queue_full(e: Evidence) -> Rule | None:
    if not e.stages.queue_full:
        return None
    b = e.batching
    return ("batch_queue",
            f"batch scheduler: its queue of {b.max_enqueued_batches} batches was full "
            f"{e.stages.queue_full:.0f} times (UNAVAILABLE)",
            f"raise num_batch_threads (now {b.num_batch_threads}) if the CPUs have room, else "
            f"add instances; raising max_enqueued_batches only lengthens the wait")


def _batch_timeout(e: Evidence) -> Rule | None:
    share, fill = e.stages.queue_share, e.stages.mean_batch
    b = e.batching
    if not b.enabled or share is None or share < QUEUE_BOUND or fill is None:
        return None
    if fill >= LOW_FILL * b.max_batch_size or b.batch_timeout_micros == 0:
        return None
    wait_ms = b.batch_timeout_micros / 1000
    return ("batch_timeout",
            f"batch scheduler: batches close on the {wait_ms:g} ms timeout half-empty "
            f"({fill:.1f} of {b.max_batch_size}), so requests wait in the queue "
            f"({share:.0%} of the latency)",
            f"lower batch_timeout_micros (now {b.batch_timeout_micros}) towards the run "
            f"latency, e.g. {max(0, b.batch_timeout_micros // 4)}, or lower max_batch_size to "
            "what the traffic fills")


def _batch_threads(e: Evidence) -> Rule | None:
    share, fill = e.stages.queue_share, e.stages.mean_batch
    b = e.batching
    if not b.enabled or share is None or share < QUEUE_BOUND:
        return None
    if _cpu_full(e):
        return None  # the instances rule names it: more threads would only share the CPUs
    full = fill is not None and fill >= LOW_FILL * b.max_batch_size
    return ("batch_threads",
            f"batch scheduler: full batches ({fill or 0:.1f} of {b.max_batch_size}) wait for "
            f"one of {b.num_batch_threads} batch thread(s) ({share:.0%} of the latency in the "
            "queue) while the CPUs have room" if full else
            f"batch scheduler: requests wait in the queue ({share:.0%} of the latency) for one "
            f"of {b.num_batch_threads} batch thread(s) while the CPUs have room",
            f"raise num_batch_threads (now {b.num_batch_threads}) towards the host's "
            f"{e.host_cpus} CPUs")


def _run_bound(e: Evidence) -> bool:
    s = e.stages
    return s.runtime_ms is not None and bool(s.request_ms) and \
        s.runtime_ms >= RUN_BOUND * (s.request_ms or 0)


def _others_busy(e: Evidence) -> Rule | None:
    """The host's CPUs full while other processes held a quarter of them or more, and no pool
    showed full: the instance's own use says nothing of its pools (it got what was left). A
    pool that did show full (``_intra_op``, ``_inter_op``) is named first: it is a limit
    whatever else runs."""
    others, cores = e.others_cores, e.cores
    if others is None or cores is None or e.host_busy is None or e.host_busy < CPU_FULL \
            or others < OTHERS_MIN * e.host_cpus or not _run_bound(e):
        return None
    return ("host_cpu",
            f"other processes: the host's CPUs were {e.host_busy:.0%} busy, {others:.2f} of "
            f"its {e.host_cpus} cores used by other processes and {cores:.2f} by this "
            "instance; its pools cannot be judged while they run",
            "move the other work off the host (or another instance's pools down), then "
            "diagnose again")


def _intra_op(e: Evidence) -> Rule | None:
    pool = e.threads.intra_op
    cores = e.cores
    if not pool or pool >= e.host_cpus or cores is None or not _run_bound(e):
        return None
    if cores < POOL_FULL * pool or cores >= CPU_FULL * e.host_cpus:
        return None
    return ("intra_op",
            f"intra-op pool: Session::Run takes most of the latency and the process uses "
            f"{cores:.2f} cores, what an intra-op pool of {pool} can run, of {e.host_cpus}",
            f"raise threads.intra_op (now {pool}) towards {e.host_cpus}, or 0 for "
            "TensorFlow's default (the CPUs)")


def _inter_op(e: Evidence) -> Rule | None:
    pool = e.threads.inter_op
    cores = e.cores
    batch_threads = e.batching.num_batch_threads if e.batching.enabled else 1
    if not pool or cores is None or not _run_bound(e) or _cpu_full(e):
        return None
    if pool >= batch_threads and pool >= e.host_cpus:
        return None
    return ("inter_op",
            f"inter-op pool: Session::Run takes most of the latency with {cores:.2f} of "
            f"{e.host_cpus} cores busy: {pool} inter-op thread(s) run the ops of the "
            f"{batch_threads} concurrent batch(es) in turn",
            f"raise threads.inter_op (now {pool}) to at least num_batch_threads "
            f"({batch_threads}), or 0 for TensorFlow's default (the CPUs)")


def _cpu_full(e: Evidence) -> bool:
    return e.cores is not None and e.cores >= CPU_FULL * e.host_cpus


def _instances(e: Evidence) -> Rule | None:
    if not _cpu_full(e):
        return None
    assert e.cores is not None
    return ("instances",
            f"too few instances: the process uses {e.cores:.2f} of the host's {e.host_cpus} "
            "cores; no pool setting gives it more",
            "add instances (hosts): `fab plan-capacity --tune-report ...` counts them")


def _notes(e: Evidence) -> tuple[str, ...]:
    notes = []
    if e.cpu_user_s is not None and e.cpu_system_s is not None:
        total = e.cpu_user_s + e.cpu_system_s
        if total > 0 and e.cpu_system_s / total > 0.4:
            notes.append(f"{e.cpu_system_s / total:.0%} of the CPU time is the kernel's "
                         "(system calls, network): many small requests; batching on the "
                         "client side or REST -> gRPC helps")
    return tuple(notes)


def release_config(files: Mapping[str, str]) -> tuple[Batching, Threads]:
    """The batching and thread settings a live release runs with, from its rendered files
    (tfserving.flags and batching.config as the host keeps them): what the server was given,
    whatever the catalog says now."""
    flags = {f.name: f.value for f in parse_flags_file(files.get(FLAGS, ""))[0]}

    def flag(name: str) -> int:
        value = flags.get(name, "0")
        return int(value) if value.isascii() and value.isdigit() else 0

    threads = Threads(intra_op=flag("tensorflow_intra_op_parallelism"),
                      inter_op=flag("tensorflow_inter_op_parallelism"),
                      session=flag("tensorflow_session_parallelism"),
                      grpc_max_threads=flag("grpc_max_threads"),
                      rest_api_num_threads=flag("rest_api_num_threads"))
    if flags.get("enable_batching") != "true" or BATCHING_CONFIG not in files:
        return Batching(enabled=False), threads
    params, problem = parse_text_proto(files[BATCHING_CONFIG], tfproto.BatchingParameters,
                                       "", BATCHING_CONFIG)
    if problem is not None:
        return Batching(enabled=False), threads

    def wrapped(name: str, default: int) -> int:
        return int(getattr(params, name).value) if params.HasField(name) else default

    return Batching(max_batch_size=wrapped("max_batch_size", DEFAULT_MAX_BATCH_SIZE),
                    batch_timeout_micros=wrapped("batch_timeout_micros", 0),
                    max_enqueued_batches=wrapped("max_enqueued_batches", 1),
                    num_batch_threads=wrapped("num_batch_threads", 1),
                    allowed_batch_sizes=tuple(params.allowed_batch_sizes)), threads
