"""Dynamic batching: one shared batch scheduler, one queue per (servable, signature).

Follows TF's SharedBatchScheduler (core/kernels/batching_util/shared_batch_scheduler.h) and
TFServing's BatchingSession (batching/batching_session.cc):
- a task larger than max_batch_size fails with INVALID_ARGUMENT;
- a task that does not fit the open batch starts a new batch, unless the queue already holds
  max_enqueued_batches batches: then UNAVAILABLE "The batch scheduling queue to which this
  task was submitted is full";
- a batch is processed when full, or when batch_timeout_micros have passed since it opened
  (0: as soon as a batch thread is free), by one of num_batch_threads threads shared by all
  queues;
- inputs are concatenated along dimension 0, padded to the next allowed_batch_sizes entry
  (by repeating the first row), run once, and the outputs split back per task.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .metrics import Metrics
from .status import Code, ServingError, invalid_argument

DEFAULT_MAX_BATCH_SIZE = 1000  # SharedBatchScheduler QueueOptions.input_batch_size_limit
DEFAULT_MAX_ENQUEUED_BATCHES = 10


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """The effective BatchingParameters (defaults filled in like TFServing does)."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = DEFAULT_MAX_ENQUEUED_BATCHES
    num_batch_threads: int = os.cpu_count() or 1
    thread_pool_name: str = "batch_threads"
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    @property
    def execution_limit(self) -> int:
        """Largest batch that runs at once (max_execution_batch_size only with splitting)."""
        return self.max_execution_batch_size if self.enable_large_batch_splitting \
            else self.max_batch_size


def options_from_proto(params: Any) -> BatchingOptions:
    """Build BatchingOptions from a BatchingParameters message (unset -> default)."""
    def wrapped(name: str, default: Any) -> Any:
        return getattr(params, name).value if params.HasField(name) else default

    max_batch_size = int(wrapped("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
    return BatchingOptions(
        max_batch_size=max_batch_size,
        batch_timeout_micros=int(wrapped("batch_timeout_micros", 0)),
        max_enqueued_batches=int(wrapped("max_enqueued_batches", DEFAULT_MAX_ENQUEUED_BATCHES)),
        num_batch_threads=int(wrapped("num_batch_threads", os.cpu_count() or 1)),
        thread_pool_name=str(wrapped("thread_pool_name", "batch_threads")),
        allowed_batch_sizes=tuple(int(x) for x in params.allowed_batch_sizes),
        pad_variable_length_inputs=bool(params.pad_variable_length_inputs),
        enable_large_batch_splitting=bool(wrapped("enable_large_batch_splitting", False)),
        # bundle_factory_util.h GetQueueOptions: falls back to max_batch_size
        max_execution_batch_size=int(wrapped("max_execution_batch_size", max_batch_size)),
    )


def validate_for_session(options: BatchingOptions) -> None:
    """Checks made when a version's session is wrapped (bundle_factory_util.cc,
    batching_session.cc); a failure here is a failed load of that version."""
    sizes = options.allowed_batch_sizes
    if sizes:
        if sizes[-1] != options.max_batch_size:
            raise invalid_argument(
                "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                f"{sizes[-1]}; expected {options.max_batch_size}")
        if any(b <= a for a, b in itertools.pairwise(sizes)):
            raise invalid_argument("allowed_batch_sizes entries must be monotonically "
                                   "increasing")


class Task:
    """One request's inputs waiting for its slice of a batch's outputs."""

    __slots__ = ("done", "enqueued", "error", "inputs", "on_done", "outputs", "size")

    def __init__(self, inputs: dict[str, np.ndarray], size: int) -> None:
        self.inputs = inputs
        self.size = size
        self.enqueued = time.monotonic()
        self.done = threading.Event()
        self.outputs: dict[str, np.ndarray] | None = None
        self.error: ServingError | None = None
        self.on_done: Callable[[], None] | None = None

    def wait(self) -> dict[str, np.ndarray]:
        """Block until the batch ran; return this task's outputs or raise its error."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs


class _Batch:
    __slots__ = ("closed", "opened", "size", "tasks")

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.size = 0
        self.opened = 0.0
        self.closed = False


RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class BatchQueue:
    """The queue of one servable version's signature inside the shared scheduler."""

    def __init__(self, scheduler: SharedBatchScheduler, options: BatchingOptions,
                 run: RunFn) -> None:
        self.scheduler = scheduler
        self.options = options
        self.run = run
        self.batches: collections.deque[_Batch] = collections.deque([_Batch()])

    def schedule(self, task: Task) -> list[Task]:
        """Enqueue ``task`` (called with the scheduler lock held); returns the tasks actually
        queued: ``[task]``, or its pieces when large-batch splitting cuts it up."""
        limit = self.options.execution_limit
        if task.size > self.options.max_batch_size:
            raise invalid_argument(f"Task size {task.size} is larger than maximum input batch "
                                   f"size {self.options.max_batch_size}")
        open_batch = self.batches[-1] if self.batches and not self.batches[-1].closed else None
        room = limit - open_batch.size if open_batch is not None else 0
        if task.size <= room:
            assert open_batch is not None
            self._add(open_batch, task)
            return [task]
        if not self.options.enable_large_batch_splitting:
            self._reserve_batches(1)
            batch = self._new_batch()
            self._add(batch, task)
            return [task]
        sizes = ([room] if room > 0 else []) + _chunks(task.size - max(room, 0), limit)
        self._reserve_batches(len(sizes) - (1 if room > 0 else 0))
        pieces = _split(task, sizes)
        for index, piece in enumerate(pieces):
            target = open_batch if index == 0 and room > 0 else None
            self._add(target or self._new_batch(), piece)
        return pieces

    def _reserve_batches(self, count: int) -> None:
        if len(self.batches) + count > self.options.max_enqueued_batches:
            raise ServingError(Code.UNAVAILABLE, "The batch scheduling queue to which this task "
                               "was submitted is full")

    def _new_batch(self) -> _Batch:
        if self.batches:
            self.batches[-1].closed = True
        batch = _Batch()
        self.batches.append(batch)
        return batch

    def _add(self, batch: _Batch, task: Task) -> None:
        if not batch.tasks:
            batch.opened = task.enqueued
        batch.tasks.append(task)
        batch.size += task.size
        if batch.size >= self.options.execution_limit:
            batch.closed = True

    def ready_batch(self, now: float) -> tuple[_Batch | None, float | None]:
        """The front batch if it may run now, else (None, seconds until it may)."""
        while self.batches and not self.batches[0].tasks and len(self.batches) > 1:
            self.batches.popleft()
        if not self.batches or not self.batches[0].tasks:
            return None, None
        front = self.batches[0]
        timeout = self.options.batch_timeout_micros / 1e6
        if front.closed or now - front.opened >= timeout:
            self.batches.popleft()
            if not self.batches:
                self.batches.append(_Batch())
            return front, None
        return None, front.opened + timeout - now


class SharedBatchScheduler:
    """num_batch_threads threads serving every queue, round robin."""

    def __init__(self, num_threads: int, pool_name: str, metrics: Metrics) -> None:
        self.pool_name = pool_name
        self.metrics = metrics
        self._cv = threading.Condition()
        self._queues: list[BatchQueue] = []
        self._next = 0
        for index in range(max(1, num_threads)):
            threading.Thread(target=self._work, name=f"{pool_name}_{index}",
                             daemon=True).start()

    def add_queue(self, options: BatchingOptions, run: RunFn) -> BatchQueue:
        """Register a queue; ``run`` executes one merged batch."""
        queue = BatchQueue(self, options, run)
        with self._cv:
            self._queues.append(queue)
        return queue

    def remove_queue(self, queue: BatchQueue) -> None:
        """Drop a queue; callers drain their requests first (unload waits for them)."""
        with self._cv:
            if queue in self._queues:
                self._queues.remove(queue)

    def submit(self, queue: BatchQueue, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Schedule one request's inputs on ``queue`` and wait for its outputs."""
        task = Task(inputs, _batch_size(inputs))
        with self._cv:
            tasks = queue.schedule(task)
            self._cv.notify(len(tasks))
        return _gather(tasks)

    def submit_async(self, queue: BatchQueue, inputs: dict[str, np.ndarray]
                     ) -> asyncio.Future[dict[str, np.ndarray]]:
        """Like submit, but returns a future of the running event loop instead of blocking."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        task = Task(inputs, _batch_size(inputs))
        with self._cv:
            tasks = queue.schedule(task)
            remaining = [len(tasks)]
            count_lock = threading.Lock()

            def finish() -> None:
                if future.done():
                    return
                try:
                    future.set_result(_gather(tasks))
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
            started = time.monotonic()
            for task in batch.tasks:
                self.metrics.queuing_latency.observe((started - task.enqueued) * 1e6,
                                                     self.pool_name)
            _run_batch(queue, batch, self.metrics)


def _batch_size(inputs: dict[str, np.ndarray]) -> int:
    sizes = set()
    for array in inputs.values():
        if array.ndim == 0:
            raise invalid_argument("Batching session Run() input tensors must have at least "
                                   "one dimension")
        sizes.add(int(array.shape[0]))
    if len(sizes) != 1:
        raise invalid_argument("Batching session Run() input tensors must have equal "
                               "0th-dimension size")
    return sizes.pop()


def _gather(tasks: list[Task]) -> dict[str, np.ndarray]:
    if len(tasks) == 1:
        return tasks[0].wait()
    parts = [t.wait() for t in tasks]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def _chunks(total: int, limit: int) -> list[int]:
    return [min(limit, total - start) for start in range(0, total, limit)]


def _split(task: Task, sizes: list[int]) -> list[Task]:
    pieces = []
    offset = 0
    for size in sizes:
        piece = Task({k: v[offset:offset + size] for k, v in task.inputs.items()}, size)
        piece.enqueued = task.enqueued
        pieces.append(piece)
        offset += size
    return pieces


def _padded_size(size: int, allowed: tuple[int, ...]) -> int:
    for candidate in allowed:
        if candidate >= size:
            return candidate
    return size


def _merge(batch: _Batch, options: BatchingOptions) -> tuple[dict[str, np.ndarray], int]:
    padded = _padded_size(batch.size, options.allowed_batch_sizes)
    merged = {}
    for name in batch.tasks[0].inputs:
        parts = [task.inputs[name] for task in batch.tasks]
        if len({p.shape[1:] for p in parts}) > 1:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Tensors with name '{name}' from different tasks have different shapes and "
                "padding is turned off. Set pad_variable_length_inputs to true, or ensure that "
                "all tensors with the same name have equal dimensions starting with the first "
                "dim.")
        if padded > batch.size:
            first = parts[0][:1]
            parts.append(np.repeat(first, padded - batch.size, axis=0))
        merged[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return merged, padded


def _run_batch(queue: BatchQueue, batch: _Batch, metrics: Metrics) -> None:
    try:
        merged, padded = _merge(batch, queue.options)
        metrics.input_batch_size.observe(batch.size)
        metrics.processed_batch_size.observe(padded)
        metrics.padding_size.observe(padded - batch.size, str(padded))
        metrics.wrapped_run_count.add()
        outputs = queue.run(merged)
        for value in outputs.values():
            if value.ndim == 0:
                raise ServingError(Code.FAILED_PRECONDITION,
                                   "Batched output tensor has 0 dimensions")
            if value.shape[0] != padded:
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    "Batched output tensor's 0th dimension does not equal the sum of the 0th "
                    "dimension sizes of the input tensors")
        offset = 0
        for task in batch.tasks:
            task.outputs = {k: v[offset:offset + task.size] for k, v in outputs.items()}
            offset += task.size
    except ServingError as exc:
        for task in batch.tasks:
            task.error = exc
    except Exception as exc:
        for task in batch.tasks:
            task.error = ServingError(Code.INTERNAL, str(exc))
    for task in batch.tasks:
        task.done.set()
        if task.on_done is not None:
            task.on_done()
