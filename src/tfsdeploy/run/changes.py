"""Changes: what a step does to a host, as typed values.

An operation (``operations``) yields changes; the executor applies them to the host, or, under
``--check``, only lists them. A change says what it is in one line (``describe``), the same line
the plan prints and the audit log records when it is applied, so the plan of a check and the
record of the run that follows can be compared line by line. ``Check`` is the one kind that
changes nothing: a gate, whose work runs only in a real run.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from tfsdeploy.core.gpu.records import WindowReservation
from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.containers import ContainerSpec


@dataclass(frozen=True)
class Change:
    """Base of every change."""

    kind: ClassVar[str] = "change"
    audited: ClassVar[bool] = True  # recorded in the host's audit log when applied
    serving: ClassVar[bool] = False  # changes containers or the proxy: what serves
    # starts, stops or removes a serving process (the model's targets follow it)
    processes: ClassVar[bool] = False

    def describe(self) -> str:
        """One line: what this change does."""
        raise NotImplementedError


@dataclass(frozen=True)
class Command(Change):
    """A command on the host (argv, never a shell string from outside)."""

    kind: ClassVar[str] = "command"
    argv: tuple[str, ...]
    what: str
    timeout: float | None = None
    ok_codes: tuple[int, ...] = (0,)
    stdin: bytes | None = None

    def describe(self) -> str:
        return self.what

    @staticmethod
    def of(argv: Argv, what: str, *, timeout: float | None = None,
           ok_codes: tuple[int, ...] = (0,), stdin: bytes | None = None) -> Command:
        """A Command from a builder's argv."""
        return Command(tuple(argv), what, timeout, ok_codes, stdin)


@dataclass(frozen=True)
class LocalCommand(Change):
    """A command on the deploy machine (a playbook's own step), with the run's variables."""

    kind: ClassVar[str] = "local"
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout: float = 60.0
    ok_codes: tuple[int, ...] = (0,)

    def describe(self) -> str:
        return "run here: " + " ".join(self.argv)


@dataclass(frozen=True)
class WriteFile(Change):
    """A file written atomically (temporary name, then rename)."""

    kind: ClassVar[str] = "write"
    path: str
    data: bytes = field(repr=False)
    mode: int = 0o644

    def describe(self) -> str:
        return f"write {self.path}"  # its size can differ between a plan and the run


@dataclass(frozen=True)
class WriteTree(Change):
    """A new directory of files written in one command, atomically (a temporary directory
    beside it, then a rename): a release's rendered files and its record."""

    kind: ClassVar[str] = "write"
    path: str
    files: tuple[tuple[str, bytes], ...] = field(repr=False)  # (name, content), mode 0644

    def describe(self) -> str:
        return f"write {self.path}/{{{','.join(name for name, _ in self.files)}}}"

    def archive(self) -> bytes:
        """The files as a tar archive (what the host unpacks)."""
        stream = io.BytesIO()
        with tarfile.open(fileobj=stream, mode="w") as tar:
            for name, data in self.files:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        return stream.getvalue()


@dataclass(frozen=True)
class Upload(Change):
    """A local file uploaded (the version archive); ``source`` makes it when first needed."""

    kind: ClassVar[str] = "upload"
    source: Callable[[], str] = field(compare=False, repr=False)
    path: str = ""
    what: str = ""

    def describe(self) -> str:
        return f"upload {self.what} to {self.path}"


@dataclass(frozen=True)
class PullImage(Change):
    """An image pulled onto the host."""

    kind: ClassVar[str] = "pull"
    image: str
    if_missing: bool = False  # presence unknown from the facts: look first

    def describe(self) -> str:
        return f"pull {self.image}" + (" (if absent)" if self.if_missing else "")


@dataclass(frozen=True)
class PullModel(Change):
    """A model version's image pulled onto the host by digest (model_transfer pull), holding
    one of the run's pull slots (--max-pulls) for the pull."""

    kind: ClassVar[str] = "pull-model"
    reference: str  # registry/repository@sha256:...
    what: str = ""

    def describe(self) -> str:
        return f"pull {self.what} ({self.reference})"


@dataclass(frozen=True)
class Publish(Change):
    """The version published to the fleet's registry when it is not there yet (once per run
    and registry, whichever host needs it first); ``run`` says what it pushed."""

    kind: ClassVar[str] = "publish"
    what: str
    run: Callable[[], str] = field(compare=False, repr=False)
    # when it passes, a new serving process answers (its version AVAILABLE): the model's
    # targets add it
    process_ready: bool = False

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class RunContainer(Change):
    """A container created and started."""

    kind: ClassVar[str] = "run"
    serving: ClassVar[bool] = True
    processes: ClassVar[bool] = True
    spec: ContainerSpec
    where: str = ""

    def describe(self) -> str:
        return f"start {self.spec.describe()}{' ' + self.where if self.where else ''}"


@dataclass(frozen=True)
class StartContainer(Change):
    """A stopped container started again."""

    kind: ClassVar[str] = "start"
    serving: ClassVar[bool] = True
    processes: ClassVar[bool] = True
    name: str

    def describe(self) -> str:
        return f"start {self.name} again"


@dataclass(frozen=True)
class StopContainer(Change):
    """A container stopped (kept, for rollback)."""

    kind: ClassVar[str] = "stop"
    serving: ClassVar[bool] = True
    processes: ClassVar[bool] = True
    name: str

    def describe(self) -> str:
        return f"stop {self.name}"


@dataclass(frozen=True)
class RemoveContainer(Change):
    """A container removed."""

    kind: ClassVar[str] = "remove"
    serving: ClassVar[bool] = True
    processes: ClassVar[bool] = True
    name: str

    def describe(self) -> str:
        return f"remove container {self.name}"


@dataclass(frozen=True)
class ClearScratch(Change):
    """`fab tune`'s scratch instances of the model that a tune no longer running left,
    removed under the model's tune lock on the host (a running tune's are left to it). None
    of them serves: what serves is unchanged."""

    kind: ClassVar[str] = "scratch"
    model: str
    names: tuple[str, ...] = ()  # what the facts showed (the removal judges again)

    def describe(self) -> str:
        return (f"remove fab tune's scratch instance(s) of {self.model} a killed tune left"
                + (f" ({', '.join(self.names)})" if self.names else ""))


@dataclass(frozen=True)
class RemoveImage(Change):
    """An image removed, unless a container still uses it (never forced)."""

    kind: ClassVar[str] = "remove-image"
    image: str

    def describe(self) -> str:
        return f"remove image {self.image} (if no container uses it)"


@dataclass(frozen=True)
class GatewayState(Change):
    """A serving host's state for its model on every gateway host that routes it: ``drain``
    (no new request; the wait ends when none is in flight there, bounded by ``timeout_s``) or
    ``ready`` (back in rotation)."""

    kind: ClassVar[str] = "gateway"
    serving: ClassVar[bool] = True
    model: str
    host: str
    state: str  # drain | ready
    timeout_s: float = 30.0
    reason: str = ""  # why a drain is made, as its record on the gateway hosts says

    def describe(self) -> str:
        return (f"gateway: {self.host} drains for {self.model} (no new request routed to it)"
                if self.state == "drain" else
                f"gateway: {self.host} back in rotation for {self.model}")


@dataclass(frozen=True)
class ProxyCommands(Change):
    """Runtime commands on the proxy's admin socket (no reload)."""

    kind: ClassVar[str] = "proxy"
    serving: ClassVar[bool] = True
    commands: tuple[str, ...]
    what: str

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class ReloadProxy(Change):
    """The proxy reloaded seamlessly on the configuration written before it (HAProxy's
    master-worker reload: established connections finish on the old worker), then the runtime
    state of the servers it keeps applied again; ``servers`` are the ones it must then have."""

    kind: ClassVar[str] = "reload"
    serving: ClassVar[bool] = True
    container: str
    servers: frozenset[str]
    what: str

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class ReserveGpu(Change):
    """GPU memory reserved host-wide for a window's new process before it starts (refused,
    naming the other run, when earlier windows leave too little); ``reclaim``: the running
    containers the start removes first (their memory is freed)."""

    kind: ClassVar[str] = "reserve-gpu"
    record: WindowReservation
    reclaim: tuple[str, ...] = ()

    def describe(self) -> str:
        need = ", ".join(f"GPU {g}: {m} MiB" for g, m in sorted(self.record.need_mib.items()))
        return f"reserve GPU memory for the window, host-wide ({need})"


@dataclass(frozen=True)
class Check(Change):
    """A gate or a wait: changes nothing; ``run`` does its work and returns what it saw."""

    kind: ClassVar[str] = "check"
    audited: ClassVar[bool] = False
    what: str
    run: Callable[[], str] = field(compare=False, repr=False)
    # when it passes, a new serving process answers (its version AVAILABLE): the model's
    # targets add it
    process_ready: bool = False

    def describe(self) -> str:
        return self.what
