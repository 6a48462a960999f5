"""The fleet as an inventory declares it: hosts, their GPUs and groups, the vars a host
may set (``HostVars``), and a host as resolved (``ResolvedHost``: its groups and merged,
typed vars). Inventory files build ``Host``, ``Gpu`` and ``Group``; ``inventory`` checks
and resolves them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict

from tfsdeploy.core.artifact import prefix_problem, registry_problem, shown_registry
from tfsdeploy.core.inventory.catalog import CHECKED
from tfsdeploy.core.inventory.schema import (
    AbsoluteDir,
    Address,
    Flag,
    HostName,
    ImageReference,
    NonNegativeInt32,
    Port,
    Text,
    UrlPath,
    pattern_rule,
    rule,
)
from tfsdeploy.core.ssh.jump import jump_problem


@dataclass(frozen=True)
class Gpu:
    """One GPU of a host: its index (CUDA_VISIBLE_DEVICES), its memory as nvidia-smi reports
    it (``memory.total``) and the part of it the driver reserves (``memory.reserved``).

    What a process can allocate is CUDA's total, ``memory.total - memory.reserved``
    (``cuda_mib``): on an H200 (driver 580) nvidia-smi reports 143,771 MiB total and 616 MiB
    reserved, and cuMemGetInfo's total is 143,156 MiB. TensorFlow sizes
    ``per_process_gpu_memory_fraction`` against that CUDA total (gpu_device.cc,
    SingleVirtualDeviceMemoryLimit: ``total_memory * per_process_gpu_memory_fraction`` with
    ``total_memory`` from DeviceMemoryUsage, i.e. cuMemGetInfo)."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    index: Annotated[int, Strict(), Field(ge=0, le=1023)]
    memory_mib: Annotated[int, Strict(), Field(ge=1, le=1 << 20)]
    name: Annotated[str, Strict(), Field(min_length=1, max_length=128)] = "GPU"
    reserved_mib: Annotated[int, Strict(), Field(ge=0, le=1 << 16)] = 0

    @property
    def cuda_mib(self) -> int:
        """What CUDA can allocate on the GPU: nvidia-smi's total less the driver's reserve."""
        return self.memory_mib - self.reserved_mib


SLOT_NAMES = ("blue", "green")


def _slot_ports_problem(ports: Mapping[str, tuple[int, int]]) -> str | None:
    missing = [s for s in SLOT_NAMES if s not in ports]
    return f"defines no slot {' or '.join(missing)}" if missing else None


SlotName = Annotated[str, Strict(), rule(
    lambda v: None if v in SLOT_NAMES else "is not a slot", "name the slots blue and green")]
SlotPorts = Annotated[Mapping[SlotName, tuple[Port, Port]], rule(
    _slot_ports_problem, "give both slots their (gRPC, REST) ports: "
    "{'blue': (8510, 8511), 'green': (8520, 8521)}")]
# a POSIX account name; never starting with '-' (it would read as an ssh option)
SshUser = Annotated[str, Strict(), pattern_rule(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}", "a user name ([A-Za-z0-9_][A-Za-z0-9_.-]*)",
    "write the remote account name, e.g. deploy")]
TfsVersion = Annotated[str, Strict(), pattern_rule(
    r"[0-9]{1,4}(\.[0-9]{1,4}){1,2}(-[A-Za-z0-9_.]{1,32})?", "a TFServing release number",
    "write the release like '2.21.0'")]
# docker run --gpus: all, a count, or device=/capabilities= lists
DockerGpus = Annotated[str, Strict(), pattern_rule(
    r'all|[0-9]{1,3}|"?(device|capabilities)=[A-Za-z0-9_,:-]+"?', "a `docker run --gpus` value",
    "write 'all', a count, or 'device=0,1'")]
def _credentials_problem(value: str) -> str | None:
    # a whole sentence: the value (a password before its '@') is never shown; the other
    # rules are the ones fab publish applies (the OCI reference grammar, core.artifact)
    if "@" in value.partition("/")[0]:
        return (f"model_registry {shown_registry(value)!r} holds credentials before its "
                "registry (user:password@): they never go in the inventory")
    return None


ModelRegistry = Annotated[str, Strict(), Field(max_length=255), rule(
    _credentials_problem, "remove them: the deploy machine pushes with its own `docker login`, "
    "each host pulls with its own login or the one pull_logins names"), rule(
    prefix_problem, "write host[:port]/repository, e.g. 'registry:5000/tfsdeploy-models'")]
# pull_logins: a registry host[:port] (docker.io for Docker Hub) -> where the deploy machine
# reads the hosts' pull-only credential for it (hosts.logins); never the credential itself
def _registry_host_problem(value: str) -> str | None:
    problem = registry_problem(value)
    if problem is None:
        return None
    if "@" in value:  # a whole sentence: the key itself (a password before '@') is not shown
        return "a pull_logins key holds credentials before its registry: they never go there"
    return "is not a registry host[:port]: it " + problem


RegistryHost = Annotated[str, Strict(), Field(max_length=255), rule(
    _registry_host_problem,
    "name the registry as in image references, e.g. 'registry.internal:5000'")]
_REFERENCE = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]{0,127}|file:/[^\x00-\x1f\x7f]{1,4095}")
# a whole sentence: a value that is no reference may be the credential itself, never shown
LoginReference = Annotated[str, Strict(), rule(
    lambda v: None if _REFERENCE.fullmatch(v) else "a pull_logins value is not a reference "
    "(env:NAME or file:/absolute/path); it is not shown, in case it is the credential itself",
    "name where the pull-only USER:PASSWORD is: env:NAME (an environment variable of the "
    "deploy machine) or file:/path (a file only its owner reads); never the credential")]
ProxyJump = Annotated[str, Strict(), Field(max_length=300), rule(
    jump_problem, "write the jump host as OpenSSH's ProxyJump does: [user@]host[:port], "
    "e.g. 'root@bastion.example:22'")]
# OpenSSH's defaults (sshd_config(5)): MaxStartups 10:30:100 drops new connections at random
# once 10 are unauthenticated; MaxSessions 10 refuses an 11th session channel on a connection
OPENSSH_MAX_STARTUPS = 10
OPENSSH_MAX_SESSIONS = 10
GpuMargin = Annotated[float, Strict(), Field(le=10.0, allow_inf_nan=False), rule(
    lambda v: "is below 1: the reservation would be smaller than the model's footprint"
    if v < 1.0 else None, "set gpu_safety_margin between 1.2 and 1.5 (the measured need "
    "times 1.2-1.5)")]


@dataclass(frozen=True)
class HostVars:
    """Every var a host can have, with its built-in default and its allowed values."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    ssh_user: SshUser = "root"
    ssh_port: Port = 22
    ssh_key: Text | None = None
    ssh_known_hosts: Text | None = None
    # the jump host every connection to the host goes through (OpenSSH's ProxyJump): one
    # connection to it per deploy machine process, shared by every host behind it
    ssh_proxy_jump: ProxyJump | None = None
    # SSH handshakes (connection to login) in flight at once per hop: through the jump host
    # (its own and those it carries), or to the host without one; at most the sshd's
    # MaxStartups start, so that its random early drop never begins
    ssh_max_startups: Annotated[int, Strict(), Field(ge=1, le=1000)] = OPENSSH_MAX_STARTUPS
    # session channels (commands, Docker Engine calls, SFTP) open at once on the host's
    # connection: at most its sshd's MaxSessions. Three at least: a command beside a Docker
    # call beside an upload
    ssh_max_sessions: Annotated[int, Strict(), Field(ge=3, le=1000)] = OPENSSH_MAX_SESSIONS
    data_root: AbsoluteDir = "/srv/tfsdeploy"
    image: ImageReference = "tensorflow/serving:2.21.0-gpu"
    tfserving_version: TfsVersion = "2.21.0"
    proxy_image: ImageReference = "haproxy:2.6"
    grpc_port: Port = 8500
    rest_port: Port = 8501
    slot_ports: SlotPorts = field(
        default_factory=lambda: {"blue": (8510, 8511), "green": (8520, 8521)})
    gpu_safety_margin: GpuMargin = 1.2
    gpu_headroom: Annotated[float, Strict(), Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.1
    # GPU memory each TFServing process holds beside its allocator pool (CUDA context, cuDNN
    # and cuBLAS workspaces); gpu.py's window counts it once per process. Measured on an
    # NVIDIA H200 (driver 580, CUDA 13): a bare context 531-621 MiB, with cuBLAS 739, with
    # cuDNN about 940; TensorFlow's allocator (XLA/TSL BFC) 626 beside its pool at fractions
    # 0.20, 0.40 and two processes at 0.45. Published: 234 MiB for TFServing 2.2.0-gpu on a T4
    # (github.com/tensorflow/serving/issues/1668); 107-555 MiB for bare contexts on other
    # cards (github.com/ggml-org/llama.cpp/pull/23604). A TFServing process loads cuBLAS and
    # cuDNN, so the default is 1024: the largest figure measured (939) with 85 MiB to spare.
    # Every deploy measures what its processes hold beside their pools and the next plan uses
    # that where it is larger (hosts record it per card); a small card may set this lower.
    gpu_context_mib: Annotated[int, Strict(), Field(ge=0, le=65536)] = 1024
    monitoring_path: UrlPath = "/monitoring/prometheus/metrics"
    # TFServing: a negative value disables polling and start-up waits for a model forever
    file_system_poll_wait_seconds: Annotated[int, Strict(), Field(ge=0, le=86_400)] = 1
    grpc_max_connection_age_ms: NonNegativeInt32 = 0
    enable_model_warmup: Flag = True
    # TFServing retries a failed load 5 times a minute apart by default: a bad release would
    # hold its gate for 5 minutes. One quick retry covers transient file-system errors.
    max_num_load_retries: Annotated[int, Strict(), Field(ge=0, le=1000)] = 1
    load_retry_interval_micros: Annotated[int, Strict(), Field(ge=0, le=3_600_000_000)] = \
        5_000_000
    docker_gpus: DockerGpus | None = None
    # how stage_model brings a model version onto the host: "push" uploads it over the host's
    # SSH connection; "pull" publishes it once to model_registry and the host's engine pulls
    # it by digest (docs/distribution.md)
    model_transfer: Literal["push", "pull"] = "push"
    model_registry: ModelRegistry | None = None
    # the deploy machine speaks plain HTTP to model_registry (as an engine's
    # --insecure-registry); otherwise HTTPS
    model_registry_insecure: Flag = False
    # the login the host's engine pulls with, per registry: a pull-only credential named by
    # reference (hosts.logins); a registry not named here: the host's own docker login, else
    # none. Never the deploy machine's push login.
    pull_logins: Mapping[RegistryHost, LoginReference] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.slot_ports, Mapping):
            ports = {k: tuple(v) for k, v in dict(self.slot_ports).items()}
            object.__setattr__(self, "slot_ports", MappingProxyType(ports))
        if isinstance(self.pull_logins, Mapping):
            object.__setattr__(self, "pull_logins", MappingProxyType(dict(self.pull_logins)))


VAR_NAMES = frozenset(f.name for f in fields(HostVars))


@dataclass(frozen=True)
class Host:
    """A machine reachable over SSH with a Docker engine."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    name: HostName
    address: Address
    gpus: Annotated[Sequence[Gpu], Field(max_length=64)] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.gpus, (list, tuple)):
            object.__setattr__(self, "gpus", tuple(self.gpus))
        if isinstance(self.vars, Mapping):
            object.__setattr__(self, "vars", MappingProxyType(dict(self.vars)))


@dataclass(frozen=True)
class Group:
    """Named set of hosts with vars that apply to all of them."""

    __pydantic_config__: ClassVar[ConfigDict] = CHECKED
    hosts: Sequence[Annotated[str, Strict()]]
    vars: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.hosts, (list, tuple)):
            object.__setattr__(self, "hosts", tuple(self.hosts))
        if isinstance(self.vars, Mapping):
            object.__setattr__(self, "vars", MappingProxyType(dict(self.vars)))


@dataclass(frozen=True)
class ResolvedHost:
    """A host with its groups and its merged, typed vars."""

    name: str
    address: str
    gpus: tuple[Gpu, ...]
    groups: tuple[str, ...]
    vars: HostVars
