"""ServerCore: model config, version life cycle, labels, and servable lookup.

Mirrors model_servers/server_core.cc (ReloadConfig and its validation order, label rules,
waiting for models), core/aspired_versions_manager.cc + core/availability_preserving_policy.cc
(new versions load before old ones unload; a failed new version leaves the old one serving),
core/loader_harness.cc (retries, log lines) and core/servable_state_monitor.cc (states are
remembered, END included, newest version first).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import threading
import time
from collections.abc import Callable

from tensorflow.core.protobuf import config_pb2
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.config.model_server_config_pb2 import ModelConfig, ModelServerConfig

from . import log
from .batching import SharedBatchScheduler
from .metrics import Metrics
from .model import LoadedModel
from .servable import Servable, ServableOptions
from .simgpu import GpuReservation
from .status import Code, ServingError, failed_precondition, invalid_argument, not_found
from .versions import aspired_versions

TENSORFLOW_PLATFORM = "tensorflow"


class State(enum.IntEnum):
    """ModelVersionStatus.State values."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


_SEQ = itertools.count(1)


@dataclasses.dataclass(eq=False)
class VersionRecord:
    """What the state monitor knows about one version of one model."""

    name: str
    version: int
    path: str
    state: State = State.START
    error: ServingError | None = None
    aspired: bool = True
    started: bool = False
    servable: Servable | None = None
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    seq: int = dataclasses.field(default_factory=lambda: next(_SEQ))

    @property
    def id(self) -> str:
        """ServableId::DebugString()."""
        return f"{{name: {self.name} version: {self.version}}}"


@dataclasses.dataclass(frozen=True)
class CoreOptions:
    """ServerCore::Options subset that the emulator honours."""

    servable: ServableOptions
    file_system_poll_wait_seconds: int = 1
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    allow_version_labels_for_unavailable_models: bool = False
    num_load_threads: int = 0
    initial_load_threads: int = 4 * (os.cpu_count() or 1)
    session_config: config_pb2.ConfigProto | None = None


def _is_relative(uri: str) -> bool:
    """UriIsRelativePath: no scheme, no host, and not an absolute path."""
    return "://" not in uri and not uri.startswith("/")


def _platform(config: ModelConfig) -> str:
    """GetPlatform (server_core.cc), including the deprecated model_type field."""
    if config.model_type != 0:
        if config.model_platform:
            raise invalid_argument(
                "Illegal setting both ModelServerConfig::model_type (deprecated) and "
                f"ModelServerConfig::model_platform, model name is {config.name}")
        if config.model_type == 1:
            return TENSORFLOW_PLATFORM
        raise invalid_argument(
            f"ModelServerConfig::model_type choice {config.model_type} not supported.")
    if not config.model_platform:
        raise invalid_argument(
            "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
            f"ModelServerConfig::model_platform, model name is {config.name}")
    return str(config.model_platform)


def validate_config_list(configs: list[ModelConfig]) -> None:
    """ValidateModelConfigList: unique names, absolute base paths."""
    names: set[str] = set()
    for config in configs:
        if config.name in names:
            raise invalid_argument(
                f"Illegal to list model {config.name} multiple times in config list")
        names.add(config.name)
    for config in configs:
        if _is_relative(config.base_path):
            raise invalid_argument(
                f"Expected model {config.name} to have an absolute path or URI; got "
                f"base_path()={config.base_path}")


class _Slots:
    """A resizable counting semaphore for load threads."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.used = 0
        self.cv = threading.Condition()

    def resize(self, size: int) -> None:
        with self.cv:
            self.size = max(1, size)
            self.cv.notify_all()

    def __enter__(self) -> None:
        with self.cv:
            while self.used >= self.size:
                self.cv.wait()
            self.used += 1

    def __exit__(self, *exc: object) -> None:
        with self.cv:
            self.used -= 1
            self.cv.notify_all()


class ServerCore:
    """The model manager behind the gRPC and REST front ends."""

    def __init__(self, options: CoreOptions, metrics: Metrics,
                 scheduler: SharedBatchScheduler | None, gpu: GpuReservation | None) -> None:
        self.options = options
        self.metrics = metrics
        self.scheduler = scheduler
        self.gpu = gpu
        self._cv = threading.Condition(threading.RLock())
        self._reload_lock = threading.Lock()
        self._config: ModelServerConfig | None = None
        self._models: dict[str, ModelConfig] = {}
        self._states: dict[str, dict[int, VersionRecord]] = {}
        self._labels: dict[str, dict[str, int]] | None = None
        self._slots = _Slots(options.initial_load_threads)
        self._poller: threading.Thread | None = None
        self._poll_now = threading.Event()

    # ================================================================ config

    def reload_config(self, config: ModelServerConfig) -> None:
        """ServerCore::ReloadConfig; blocks until newly added models settle."""
        with self._reload_lock:
            self._reload_config_locked(config)

    def _reload_config_locked(self, config: ModelServerConfig) -> None:
        old_case = self._config.WhichOneof("config") if self._config else None
        new_case = config.WhichOneof("config")
        if old_case is not None and new_case is not None and not (
                old_case == new_case == "model_config_list"):
            raise failed_precondition(
                "Cannot transition to requested config. It is only legal to transition from "
                "one ModelConfigList to another.")
        if new_case is None:
            log.info("server_core.cc:500", "Taking no action for empty config.")
            return
        if new_case == "custom_model_config":
            log.error("server.cc:72", "ModelServer does not yet support custom model config.")
            os.abort()
        configs = list(config.model_config_list.config)
        validate_config_list(configs)
        self._validate_no_platform_change(configs)
        self._config = config
        self._update_labels(configs)
        log.info("server_core.cc:516", "Adding/updating models.")
        for model in configs:
            platform = _platform(model)
            if platform != TENSORFLOW_PLATFORM:
                raise invalid_argument(
                    f"Model {model.name} requests unsupported platform {platform}")
        first = old_case is None
        self._apply_models(configs, first=first)
        log.info("server_core.cc:537", "Finished adding/updating models")
        log.info("server_core.cc:545", "Finished reloading config")

    def _validate_no_platform_change(self, configs: list[ModelConfig]) -> None:
        for new in configs:
            old = self._models.get(new.name)
            if old is None:
                continue
            old_platform, new_platform = _platform(old), _platform(new)
            if old_platform != new_platform:
                raise invalid_argument(
                    f"Illegal to change a model's platform. For model {new.name} platform was "
                    f"{old_platform} and new platform requested is {new_platform}")

    def _update_labels(self, configs: list[ModelConfig]) -> None:
        """UpdateModelVersionLabelMap: labels must point at AVAILABLE versions."""
        new_map: dict[str, dict[str, int]] = {}
        with self._cv:
            for model in configs:
                for label, version in model.version_labels.items():
                    allowed = False
                    if self.options.allow_version_labels_for_unavailable_models:
                        existing = (self._labels or {}).get(model.name, {}).get(label)
                        allowed = existing is None or existing == version
                    record = self._states.get(model.name, {}).get(version)
                    if not allowed and (record is None or record.state != State.AVAILABLE):
                        raise failed_precondition(
                            f"Request to assign label to version {version} of model "
                            f"{model.name}, which is not currently available for inference")
                    new_map.setdefault(model.name, {})[label] = version
            self._labels = new_map

    def _apply_models(self, configs: list[ModelConfig], *, first: bool) -> None:
        start_seq = next(_SEQ)
        with self._cv:
            old_names = set(self._models)
            self._models = {c.name: c for c in configs}
            for name in old_names - set(self._models):
                log.info("server_core.cc", f"Unaspiring servable {name}")
                self._set_aspired(name, {})
            new_names = [c.name for c in configs if c.name not in old_names]
        for model in configs:
            log.info("server_core.cc:645", f" (Re-)adding model: {model.name}")
        if first:
            self._start_poller()
            self._wait_for(new_names, start_seq, "servable(s)")
            self._slots.resize(self.options.num_load_threads)
        else:
            self._wait_for(new_names, start_seq, "model(s)")

    def _wait_for(self, names: list[str], start_seq: int, noun: str) -> None:
        """Wait until the latest version of each model is AVAILABLE or END."""
        with self._cv:
            while True:
                latest = [self._latest_record(n, start_seq) for n in names]
                if all(r is not None and r.state in (State.AVAILABLE, State.END)
                       for r in latest):
                    break
                self._cv.wait(1.0)
        failed = [r for r in latest if r is not None and r.state != State.AVAILABLE]
        if failed:
            parts = "".join(
                f"{{{r.id}{' due to error: ' + str(r.error) if r.error else ''}}}, "
                for r in failed)
            raise ServingError(Code.UNKNOWN,
                               f"{len(failed)} {noun} did not become available: {{{parts}}}")

    def _latest_record(self, name: str, start_seq: int) -> VersionRecord | None:
        records = [r for r in self._states.get(name, {}).values() if r.seq >= start_seq]
        return max(records, key=lambda r: r.version) if records else None

    # ================================================================ polling

    def _start_poller(self) -> None:
        self._poller = threading.Thread(target=self._poll_loop, name="fs_poll", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        interval = self.options.file_system_poll_wait_seconds
        if interval < 0:
            return
        while True:
            self.poll_once()
            if interval == 0:
                return
            time.sleep(interval)

    def poll_once(self) -> None:
        """One file-system poll of every configured model; any listing error skips all."""
        with self._cv:
            configs = list(self._models.values())
        found: dict[str, dict[int, str]] = {}
        for config in configs:
            try:
                found[config.name] = aspired_versions(config)
            except ServingError as exc:
                log.error("file_system_storage_path_source.cc",
                          "FileSystemStoragePathSource encountered a filesystem access error: "
                          + exc.message)
                return
        with self._cv:
            for config in configs:
                current = self._models.get(config.name)
                if current is not None and current.base_path == config.base_path:
                    self._set_aspired(config.name, found[config.name])

    # ================================================================ versions

    def _set_aspired(self, name: str, versions: dict[int, str]) -> None:
        """Apply one aspired-versions update for ``name`` (caller holds the lock)."""
        records = self._states.setdefault(name, {})
        for version, record in list(records.items()):
            wanted = version in versions
            if record.state == State.END and wanted and not record.aspired:
                records[version] = VersionRecord(name, version, versions[version])
            else:
                record.aspired = wanted
        for version, path in versions.items():
            if version not in records:
                records[version] = VersionRecord(name, version, path)
        self._reconcile(name)
        self._cv.notify_all()

    def _reconcile(self, name: str) -> None:
        """AvailabilityPreservingPolicy, applied until no action is left."""
        records = list(self._states.get(name, {}).values())
        has_aspired = any(r.aspired for r in records)
        has_aspired_serving = any(r.aspired and r.state == State.AVAILABLE for r in records)
        unaspired_serving = sorted((r for r in records if not r.aspired
                                    and r.state == State.AVAILABLE), key=lambda r: r.version)
        for record in records:
            if not record.aspired and record.state in (State.START, State.LOADING):
                record.cancel.set()
                if not record.started:
                    record.state = State.END
        if not has_aspired or has_aspired_serving:
            doomed = unaspired_serving
        else:
            doomed = unaspired_serving[:-1]
        for record in doomed:
            self._begin_unload(record)
        for record in sorted(records, key=lambda r: -r.version):
            if record.aspired and record.state == State.START and not record.started:
                record.started = True
                threading.Thread(target=self._load, args=(record,), daemon=True,
                                 name=f"load_{name}_{record.version}").start()

    def _set_state(self, record: VersionRecord, state: State,
                   error: ServingError | None = None) -> None:
        with self._cv:
            record.state = state
            record.error = error
            self._cv.notify_all()

    def _load(self, record: VersionRecord) -> None:
        with self._slots:
            if record.cancel.is_set():
                self._finish_load(record, None, None)
                return
            log.info("loader_harness.cc:70", f"Approving load for servable version {record.id}")
            self._set_state(record, State.LOADING)
            log.info("loader_harness.cc:78", f"Loading servable version {record.id}")
            servable, error = self._load_with_retries(record)
            self._finish_load(record, servable, error)

    def _load_with_retries(self, record: VersionRecord
                           ) -> tuple[Servable | None, ServingError | None]:
        description = f"Loading servable: {record.id}"
        retries = max(0, self.options.max_num_load_retries)
        error: ServingError | None = None
        for attempt in range(retries + 1):
            if attempt:
                interval = self.options.load_retry_interval_micros
                if interval > 0:
                    record.cancel.wait(interval / 1e6)
                if record.cancel.is_set():
                    log.info("retrier.cc", f"Retrying of {description} was cancelled.")
                    break
                log.info("retrier.cc", f"Retrying of {description} retry: {attempt}")
            try:
                return self._load_once(record), None
            except ServingError as exc:
                error = exc
                log.error("retrier.cc", f"{description} failed: {exc}")
        if retries and error is not None and not record.cancel.is_set():
            log.info("retrier.cc",
                     f"Retrying of {description} exhausted max_num_retries: {retries}")
        return None, error

    def _load_once(self, record: VersionRecord) -> Servable:
        key = f"{record.name}/{record.version}/{record.seq}"
        options = self.options.servable
        servable: Servable | None = None
        try:
            if self.gpu is not None:
                self.gpu.charge(key, record.path)
            model = self._load_model(record.path, list(options.tags))
            servable = Servable(record.name, record.version, model, options, self.metrics)
            if self.scheduler is not None and options.batching is not None:
                servable.attach_batching(self.scheduler)
            if options.enable_warmup:
                servable.warmup()
            return servable
        except Exception as exc:
            if servable is not None:
                servable.detach_batching()
                servable.model.close()
            if self.gpu is not None:
                self.gpu.release(key)
            if isinstance(exc, ServingError):
                raise
            raise ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}") from exc

    def _load_model(self, path: str, tags: list[str]) -> LoadedModel:
        where = "external/org_tensorflow/tensorflow/cc/saved_model/loader.cc"
        log.info(f"{where}:83", f"Reading SavedModel from: {path}")
        start = time.monotonic()
        try:
            model = LoadedModel(path, tags, self.options.session_config)
        except ServingError as exc:
            self.metrics.load_attempt_count.add(path, "fail")
            log.info(f"{where}:462", f"SavedModel load for tags {{ {' '.join(tags)} }}; "
                     f"Status: fail: {exc}. Took {int((time.monotonic() - start) * 1e6)} "
                     "microseconds.")
            raise
        micros = int((time.monotonic() - start) * 1e6)
        self.metrics.load_attempt_count.add(path, "success")
        self.metrics.load_latency.add(path, amount=micros)
        log.info(f"{where}:462", f"SavedModel load for tags {{ {' '.join(tags)} }}; Status: "
                 f"success: OK. Took {micros} microseconds.")
        return model

    def _finish_load(self, record: VersionRecord, servable: Servable | None,
                     error: ServingError | None) -> None:
        with self._cv:
            if servable is not None and record.cancel.is_set():
                self._discard(servable, record)
                error = ServingError(Code.CANCELLED, "Loading of servable cancelled")
                servable = None
            if servable is not None:
                record.servable = servable
                record.state = State.AVAILABLE
                log.info("loader_harness.cc:108",
                         f"Successfully loaded servable version {record.id}")
            else:
                record.state = State.END
                record.error = error
                if error is not None:
                    log.info("loader_harness.cc:185",
                             f"Encountered an error for servable version {record.id}: {error}")
                    log.error("aspired_versions_manager.cc:420",
                              f"Servable {record.id} cannot be loaded: {error}")
            self._cv.notify_all()
            self._reconcile(record.name)

    def _discard(self, servable: Servable, record: VersionRecord) -> None:
        servable.detach_batching()
        servable.model.close()
        if self.gpu is not None:
            self.gpu.release(f"{record.name}/{record.version}/{record.seq}")

    def _begin_unload(self, record: VersionRecord) -> None:
        servable = record.servable
        record.servable = None
        record.state = State.UNLOADING
        self._cv.notify_all()
        threading.Thread(target=self._unload, args=(record, servable), daemon=True,
                         name=f"unload_{record.name}_{record.version}").start()

    def _unload(self, record: VersionRecord, servable: Servable | None) -> None:
        log.info("loader_harness.cc:168", f"Quiescing servable version {record.id}")
        if servable is not None:
            servable.wait_idle()
        log.info("loader_harness.cc:175", f"Done quiescing servable version {record.id}")
        log.info("loader_harness.cc:132", f"Unloading servable version {record.id}")
        if servable is not None:
            self._discard(servable, record)
        with self._cv:
            record.state = State.END
            record.error = None
            log.info("loader_harness.cc:140", f"Done unloading servable version {record.id}")
            self._cv.notify_all()
            self._reconcile(record.name)

    # ================================================================ lookups

    def version_for_label(self, name: str, label: str) -> int:
        """GetModelVersionForLabel."""
        with self._cv:
            if self._labels is None:
                raise ServingError(Code.UNAVAILABLE, f"Model labels does not init yet.{label}")
            version = self._labels.get(name, {}).get(label)
        if version is None:
            raise invalid_argument(f"Unrecognized servable version label: {label}")
        return version

    def acquire(self, spec: model_pb2.ModelSpec) -> Servable:
        """GetServableHandle: the servable a ModelSpec names, counted as in flight."""
        if not spec.name:
            raise invalid_argument("ModelSpec has no name specified.")
        choice = spec.WhichOneof("version_choice")
        version: int | None = None
        if choice == "version_label":
            version = self.version_for_label(spec.name, spec.version_label)
        elif choice == "version":
            version = spec.version.value
        with self._cv:
            available = {v: r.servable for v, r in self._states.get(spec.name, {}).items()
                         if r.state == State.AVAILABLE and r.servable is not None}
            if version is None:
                servable = available[max(available)] if available else None
                request = f"Latest({spec.name})"
            else:
                servable = available.get(version)
                request = f"Specific({spec.name}, {version})"
            if servable is None:
                raise not_found(f"Servable not found for request: {request}")
            servable.acquire()
            return servable

    def with_servable(self, spec: model_pb2.ModelSpec,
                      fn: Callable[[Servable], object]) -> object:
        """Run ``fn`` with the servable ``spec`` names, releasing it afterwards."""
        servable = self.acquire(spec)
        try:
            return fn(servable)
        finally:
            servable.release()

    def version_states(self, name: str, version: int | None
                       ) -> list[tuple[int, State, ServingError | None]]:
        """GetModelStatus data: (version, state, error), newest first."""
        with self._cv:
            records = dict(self._states.get(name, {}))
        if version is not None:
            record = records.get(version)
            if record is None:
                raise not_found(f"Could not find version {version} of model {name}")
            return [(version, record.state, record.error)]
        if not records:
            raise not_found(f"Could not find any versions of model {name}")
        return [(v, r.state, r.error) for v, r in sorted(records.items(), reverse=True)]
