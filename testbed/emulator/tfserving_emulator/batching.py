"""Dynamic batching: a shared batch scheduler and BatchingSession queues of Session::Run calls.

Follows TensorFlow 2.21's SharedBatchScheduler (tensorflow/core/kernels/batching_util/
shared_batch_scheduler.h, in the tensorflow wheel's include/ tree) and TFServing's
BatchingSession (batching/batching_session.cc, batching_util.{h,cc},
servables/tensorflow/bundle_factory_util.{h,cc}):
- Create: ``num_batch_threads < 1`` is INVALID_ARGUMENT (the server fails to start);
- AddQueue (when a version loads): without splitting ``max_enqueued_batches: 0`` becomes 1;
  ``max_batch_size`` 0, a negative ``batch_timeout_micros``, ``max_enqueued_batches`` 0 with
  splitting, and ``max_execution_batch_size > max_batch_size`` with splitting are
  INVALID_ARGUMENT (a failed load); the last ``allowed_batch_sizes`` entry must equal
  ``max_batch_size`` (1000 when unset), nothing else is checked about the list;
- a queue per TensorSignature (the sets of fed and fetched tensor names) of each SignatureDef,
  and more queues created on demand for Run calls that match none (same options);
- Schedule: a task larger than ``max_batch_size`` is INVALID_ARGUMENT; a task that does not fit
  the open batch when ``max_enqueued_batches`` batches exist is UNAVAILABLE; with splitting a
  task is cut to fill the open batch and then ``max_execution_batch_size`` pieces;
- a batch runs when it is closed, full, or ``batch_timeout_micros`` after it opened; inputs are
  padded (``pad_variable_length_inputs``: every dimension after the 0th up to the batch's
  largest, with the tensor's first element) and the batch is padded to the next allowed size
  with the last task's first row; tasks past their RunOptions deadline are refused with
  RESOURCE_EXHAUSTED when the whole batch is late.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .metrics import Metrics
from .status import Code, ServingError, invalid_argument

DEFAULT_MAX_BATCH_SIZE = 1000  # SharedBatchScheduler QueueOptions.input_batch_size_limit
DEFAULT_MAX_ENQUEUED_BATCHES = 10
_SIZE_T = 2**64


def max_parallelism() -> int:
    """port::MaxParallelism(): the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """The effective BatchingParameters, as GetQueueOptions and CreateBatchScheduler read them.

    ``max_batch_size`` and ``max_enqueued_batches`` are size_t in TF: a negative value wraps to a
    huge limit.
    """

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = DEFAULT_MAX_ENQUEUED_BATCHES
    num_batch_threads: int = dataclasses.field(default_factory=max_parallelism)
    thread_pool_name: str = "batch_threads"
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    @property
    def execution_limit(self) -> int:
        """GetMaxExecutionBatchSize: the execution size with splitting, else max_batch_size."""
        return self.max_execution_batch_size if self.enable_large_batch_splitting \
            else self.max_batch_size


def _size_t(value: int) -> int:
    return value % _SIZE_T


def options_from_proto(params: Any) -> BatchingOptions:
    """BatchingParameters -> options (bundle_factory_util.h GetQueueOptions and
    CreateBatchScheduler): unset fields keep the TF defaults."""
    def has(name: str) -> bool:
        return bool(params.HasField(name))

    splitting = has("enable_large_batch_splitting") and params.enable_large_batch_splitting.value
    max_batch = _size_t(params.max_batch_size.value) if has("max_batch_size") \
        else DEFAULT_MAX_BATCH_SIZE
    if has("max_execution_batch_size"):
        execution = _size_t(params.max_execution_batch_size.value)
    else:
        # GetQueueOptions reads max_batch_size().value(), 0 when unset: see docs/emulator.md
        execution = max_batch
    return BatchingOptions(
        max_batch_size=max_batch,
        batch_timeout_micros=int(params.batch_timeout_micros.value),
        max_enqueued_batches=_size_t(params.max_enqueued_batches.value)
        if has("max_enqueued_batches") else DEFAULT_MAX_ENQUEUED_BATCHES,
        num_batch_threads=int(params.num_batch_threads.value) if has("num_batch_threads")
        else max_parallelism(),
        thread_pool_name=str(params.thread_pool_name.value) if has("thread_pool_name")
        else "batch_threads",
        allowed_batch_sizes=tuple(int(x) for x in params.allowed_batch_sizes),
        pad_variable_length_inputs=bool(params.pad_variable_length_inputs),
        enable_large_batch_splitting=bool(splitting),
        max_execution_batch_size=execution if splitting else max_batch)


def check_scheduler(options: BatchingOptions) -> None:
    """SharedBatchScheduler::Create: checked when the server starts."""
    if options.num_batch_threads < 1:
        raise invalid_argument(
            f"num_batch_threads must be positive; was {options.num_batch_threads}")


def check_allowed_sizes(options: BatchingOptions) -> None:
    """WrapSessionForBatching: only the last allowed size is checked (at load)."""
    sizes = options.allowed_batch_sizes
    if sizes and sizes[-1] != options.max_batch_size:
        raise invalid_argument(
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{sizes[-1]}; expected {options.max_batch_size}")


def queue_options(options: BatchingOptions) -> BatchingOptions:
    """SharedBatchScheduler::AddQueue: the rewrite, then the checks (at load)."""
    if not options.enable_large_batch_splitting and options.max_enqueued_batches == 0:
        # kept for low-QPS models that rely on it, says shared_batch_scheduler.h
        options = dataclasses.replace(options, max_enqueued_batches=1)
    if options.max_batch_size == 0:
        raise invalid_argument("input_batch_size_limit must be positive; was 0")
    if options.batch_timeout_micros < 0:
        raise invalid_argument(
            f"batch_timeout_micros must be non-negative; was {options.batch_timeout_micros}")
    if options.max_enqueued_batches == 0:
        raise invalid_argument("max_enqueued_batches must be positive; was 0")
    if options.enable_large_batch_splitting and \
            options.max_batch_size < options.max_execution_batch_size:
        # errors::InvalidArgument concatenates the flag (1) and both sizes after the sentence
        raise invalid_argument(
            "When enable_large_batch_splitting is true, input_batch_size_limit must be "
            "greater than or equal to max_execution_batch_size.1"
            f"{options.max_batch_size}{options.max_execution_batch_size}")
    return options


Feeds = dict[str, np.ndarray]
RunFn = Callable[[Sequence[tuple[str, np.ndarray]], Sequence[str], int], list[np.ndarray]]


class Task:
    """One Session::Run (or a piece of one) waiting for its slice of a batch's outputs."""

    __slots__ = ("deadline", "done", "enqueued", "error", "fetches", "inputs", "on_done",
                 "outputs", "size")

    def __init__(self, inputs: Feeds, fetches: Sequence[str], size: int,
                 deadline: float | None, *, blocking: bool = True) -> None:
        self.inputs = inputs
        self.fetches = tuple(fetches)
        self.size = size
        self.deadline = deadline
        self.enqueued = time.monotonic()
        # only a blocking caller waits on an Event; event-loop callers get on_done
        self.done = threading.Event() if blocking else None
        self.outputs: list[np.ndarray] | None = None
        self.error: ServingError | None = None
        self.on_done: Callable[[], None] | None = None

    def finish(self) -> None:
        """Wake whoever waits for this task."""
        if self.done is not None:
            self.done.set()
        if self.on_done is not None:
            self.on_done()

    def result(self) -> list[np.ndarray]:
        """This task's outputs, or its error raised (once finished)."""
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs

    def wait(self) -> list[np.ndarray]:
        """Block until the batch ran; return this task's outputs or raise its error."""
        assert self.done is not None
        self.done.wait()
        return self.result()


class _Batch:
    __slots__ = ("closed", "opened", "size", "tasks")

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.size = 0
        self.opened = 0.0
        self.closed = False


class BatchQueue:
    """One TensorSignature's queue inside the shared scheduler."""

    def __init__(self, scheduler: SharedBatchScheduler, options: BatchingOptions,
                 inputs: Sequence[str], outputs: Sequence[str], run: RunFn) -> None:
        self.scheduler = scheduler
        self.options = options
        self.inputs = tuple(sorted(inputs))
        self.outputs = tuple(sorted(outputs))
        self.run = run
        self.batches: collections.deque[_Batch] = collections.deque([_Batch()])

    @property
    def _limit(self) -> int:
        return self.options.execution_limit

    def _check_capacity(self, task: Task) -> None:
        """Queue::ValidateBatchTaskQueueCapacity."""
        options, back = self.options, self.batches[-1]
        if task.size > options.max_batch_size:
            raise invalid_argument(f"Task size {task.size} is larger than maximum input batch "
                                   f"size {options.max_batch_size}")
        if options.enable_large_batch_splitting:
            capacity = (options.max_enqueued_batches - len(self.batches)) * self._limit \
                + self._limit - back.size
            if task.size > capacity:
                raise ServingError(
                    Code.UNAVAILABLE,
                    "The batch scheduling queue to which this task was submitted is full; task "
                    f"size is {task.size} but scheduling capacity is only {capacity} "
                    f"(num_enqueued_batches={len(self.batches)}, max_enqueued_batches="
                    f"{options.max_enqueued_batches}, open_batch_size={back.size}, "
                    f"max_execution_batch_size={self._limit})")
            return
        if back.size + task.size > options.max_batch_size and \
                len(self.batches) >= options.max_enqueued_batches:
            raise ServingError(
                Code.UNAVAILABLE,
                "The batch scheduling queue to which this task was submitted is full; currently "
                f"{len(self.batches)} batches enqueued and max_enqueued_batches is "
                f"{options.max_enqueued_batches}")

    def schedule(self, task: Task) -> list[Task]:
        """Enqueue ``task`` (scheduler lock held); returns the tasks actually queued: ``[task]``,
        or its pieces when large-batch splitting cuts it up."""
        self._check_capacity(task)
        room = self._limit - self.batches[-1].size
        if task.size <= room or not self.options.enable_large_batch_splitting:
            pieces = [task]
        else:
            pieces = _split(task, _piece_sizes(task.size, room, self._limit))
        for piece in pieces:
            if self.batches[-1].size + piece.size > self._limit:
                self.batches[-1].closed = True
                self.batches.append(_Batch())
            self._add(self.batches[-1], piece)
        return pieces

    def _add(self, batch: _Batch, task: Task) -> None:
        if not batch.tasks:
            batch.opened = time.monotonic()
        batch.tasks.append(task)
        batch.size += task.size

    def ready_batch(self, now: float) -> tuple[_Batch | None, float | None]:
        """Queue::ScheduleBatch: a closed batch, or the open one once full or timed out; else
        (None, seconds until the open batch times out)."""
        if len(self.batches) == 1:
            front = self.batches[0]
            if not front.tasks:
                return None, None
            timeout = self.options.batch_timeout_micros / 1e6
            if front.size < self._limit and now < front.opened + timeout:
                return None, front.opened + timeout - now
            front.closed = True
            self.batches.append(_Batch())
        return self.batches.popleft(), None


class SharedBatchScheduler:
    """num_batch_threads threads serving every queue, round robin."""

    def __init__(self, options: BatchingOptions, metrics: Metrics) -> None:
        check_scheduler(options)
        self.metrics = metrics
        self._cv = threading.Condition()
        self._queues: list[BatchQueue] = []
        self._next = 0
        for index in range(options.num_batch_threads):
            threading.Thread(target=self._work, name=f"{options.thread_pool_name}_{index}",
                             daemon=True).start()

    def add_queue(self, options: BatchingOptions, inputs: Sequence[str], outputs: Sequence[str],
                  run: RunFn) -> BatchQueue:
        """AddQueue: validate the options (INVALID_ARGUMENT) and register a queue."""
        queue = BatchQueue(self, queue_options(options), inputs, outputs, run)
        with self._cv:
            self._queues.append(queue)
        return queue

    def remove_queue(self, queue: BatchQueue) -> None:
        """Drop a queue; callers drain their requests first (unload waits for them)."""
        with self._cv:
            if queue in self._queues:
                self._queues.remove(queue)

    def _new_task(self, inputs: Feeds, fetches: Sequence[str], deadline: float | None, *,
                  blocking: bool = True) -> Task:
        size = input_size(inputs)
        for value in inputs.values():  # ComputeInputSize records every input tensor
            self.metrics.input_batch_size.observe(int(value.shape[0]))
        return Task(inputs, fetches, size, deadline, blocking=blocking)

    def submit(self, queue: BatchQueue, inputs: Feeds, fetches: Sequence[str],
               deadline: float | None) -> list[np.ndarray]:
        """Schedule one Session::Run on ``queue`` and wait for its outputs."""
        task = self._new_task(inputs, fetches, deadline)
        with self._cv:
            tasks = queue.schedule(task)
            self._cv.notify(len(tasks))
        return _gather(tasks)

    def submit_async(self, queue: BatchQueue, inputs: Feeds, fetches: Sequence[str],
                     deadline: float | None) -> asyncio.Future[list[np.ndarray]]:
        """Like submit, but returns a future of the running event loop instead of blocking."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[np.ndarray]] = loop.create_future()
        task = self._new_task(inputs, fetches, deadline, blocking=False)
        with self._cv:
            tasks = queue.schedule(task)
            remaining = [len(tasks)]
            count_lock = threading.Lock()

            def finish() -> None:
                if future.done():
                    return
                try:
                    future.set_result(_gather(tasks, wait=False))
                except ServingError as exc:
                    future.set_exception(exc)

            def piece_done() -> None:
                with count_lock:
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    loop.call_soon_threadsafe(finish)

            # set before any worker can take these tasks: workers need the lock we hold
            for piece in tasks:
                piece.on_done = piece_done
            self._cv.notify(len(tasks))
        return future

    def _take(self) -> tuple[BatchQueue, _Batch]:
        with self._cv:
            while True:
                now = time.monotonic()
                wait: float | None = None
                count = len(self._queues)
                for offset in range(count):
                    queue = self._queues[(self._next + offset) % count]
                    batch, delay = queue.ready_batch(now)
                    if batch is not None:
                        self._next = (self._next + offset + 1) % max(1, count)
                        return queue, batch
                    if delay is not None:
                        wait = delay if wait is None else min(wait, delay)
                self._cv.wait(wait)

    def _work(self) -> None:
        while True:
            queue, batch = self._take()
            _process_batch(queue, batch, self.metrics)


def input_size(inputs: Feeds) -> int:
    """ComputeTensorBatchSize (batching_util.h)."""
    if not inputs:
        raise invalid_argument("Batching Run() must have at least one input tensor")
    sizes = set()
    for value in inputs.values():
        if value.ndim == 0:
            raise invalid_argument("Batching Run() input tensors must have at least one "
                                   "dimension")
        sizes.add(int(value.shape[0]))
    if len(sizes) != 1:
        raise invalid_argument("Batching Run() input tensors must have equal 0th-dimension "
                               "size")
    return sizes.pop()


def _gather(tasks: list[Task], *, wait: bool = True) -> list[np.ndarray]:
    if len(tasks) == 1:
        return tasks[0].wait() if wait else tasks[0].result()
    parts = [t.wait() if wait else t.result() for t in tasks]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]


def _piece_sizes(total: int, room: int, limit: int) -> list[int]:
    """InputSplitMetadata: fill the open batch, then pieces of at most ``limit``."""
    sizes = [room] if room > 0 else []
    rest = total - max(room, 0)
    sizes += [min(limit, rest - start) for start in range(0, rest, limit)]
    return sizes


def _split(task: Task, sizes: list[int]) -> list[Task]:
    pieces = []
    offset = 0
    for size in sizes:
        piece = Task({k: v[offset:offset + size] for k, v in task.inputs.items()},
                     task.fetches, size, task.deadline, blocking=task.done is not None)
        piece.enqueued = task.enqueued
        pieces.append(piece)
        offset += size
    return pieces


def _padded_size(size: int, allowed: tuple[int, ...]) -> int:
    """RoundToLowestAllowedBatchSize: the first allowed size that holds the batch."""
    for candidate in allowed:
        if candidate >= size:
            return candidate
    return size


def _pad_dims(value: np.ndarray, target: Sequence[int]) -> np.ndarray:
    """batching_util.cc AddPadding: pad dimensions 1.. up to ``target`` with the first
    element of the tensor."""
    if tuple(value.shape[1:]) == tuple(target[1:]):
        return value
    if not 1 <= value.ndim <= 6:
        raise invalid_argument("Only tensors with rank from 1 to 6 can be padded.")
    if value.size < 1:
        raise invalid_argument("Got empty tensor in batch of non-empty tensors.")
    widths = [(0, 0)] + [(0, max(0, t - s)) for s, t in zip(value.shape[1:], target[1:],
                                                            strict=True)]
    return np.pad(value, widths, mode="constant", constant_values=value.flat[0])


def _merge(queue: BatchQueue, batch: _Batch) -> tuple[list[tuple[str, np.ndarray]], int]:
    """BatchingSession::MergeInputTensors."""
    options = queue.options
    padded = _padded_size(batch.size, options.allowed_batch_sizes)
    merged = []
    for name in queue.inputs:
        parts = [task.inputs[name] for task in batch.tasks]
        reference = parts[0]
        same = all(p.ndim == reference.ndim and p.shape[1:] == reference.shape[1:]
                   for p in parts[1:])
        if options.pad_variable_length_inputs and not same and \
                all(p.ndim == reference.ndim for p in parts):
            target = [max(p.shape[d] for p in parts) for d in range(reference.ndim)]
            parts = [_pad_dims(p, target) for p in parts]
        elif not same:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Tensors with name '{name}' from different tasks have different shapes and "
                "padding is turned off. Set pad_variable_length_inputs to true, or ensure that "
                "all tensors with the same name have equal dimensions starting with the first "
                "dim.")
        if padded > batch.size:
            parts.append(np.repeat(parts[-1][:1], padded - batch.size, axis=0))
        merged.append((name, parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)))
    return merged, padded


def _run_timeout_ms(batch: _Batch, now: float) -> int:
    """ProcessBatch: RESOURCE_EXHAUSTED if every task is late, else the latest deadline."""
    deadlines = [t.deadline for t in batch.tasks]
    if any(d is None for d in deadlines):
        return 0
    latest = max(d for d in deadlines if d is not None)
    if latest <= now:
        raise ServingError(Code.RESOURCE_EXHAUSTED,
                           "Run() timeout exceeded while waiting in batching queue")
    return max(1, int((latest - now) * 1000))


def _process_batch(queue: BatchQueue, batch: _Batch, metrics: Metrics) -> None:
    """BatchingSession::ProcessBatch: merge, run once, split the outputs back."""
    now = time.monotonic()
    for task in batch.tasks:
        # TFServing's model server wraps sessions with an empty thread pool name here
        metrics.queuing_latency.observe((now - task.enqueued) * 1e6, "")
    try:
        timeout_ms = _run_timeout_ms(batch, now)
        merged, padded = _merge(queue, batch)
        metrics.padding_size.observe(padded - batch.size, str(padded))
        metrics.processed_batch_size.observe(padded)
        try:
            outputs = queue.run(merged, queue.outputs, timeout_ms)
        finally:
            metrics.wrapped_run_count.add()
        by_name = _split_outputs(queue, outputs, batch, padded)
        offset = 0
        for task in batch.tasks:
            task.outputs = [by_name[name][offset:offset + task.size] for name in task.fetches]
            offset += task.size
    except ServingError as exc:
        for task in batch.tasks:
            task.error = exc
    except Exception as exc:
        for task in batch.tasks:
            task.error = ServingError(Code.INTERNAL, str(exc))
    for task in batch.tasks:
        task.finish()


def _split_outputs(queue: BatchQueue, outputs: Sequence[np.ndarray], batch: _Batch,
                   padded: int) -> dict[str, np.ndarray]:
    """BatchingSession::SplitOutputTensors' checks."""
    for value in outputs:
        if value.ndim == 0:
            raise ServingError(Code.FAILED_PRECONDITION,
                               "Batched output tensor has 0 dimensions")
        if value.shape[0] != padded:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                "Batched output tensor's 0th dimension does not equal the sum of the 0th "
                "dimension sizes of the input tensors")
    return dict(zip(queue.outputs, outputs, strict=True))
