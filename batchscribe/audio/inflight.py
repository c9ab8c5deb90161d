"""What the decode pool has in flight: tasks in order with running totals, and how big a task is."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from batchscribe.audio.sources import SourceItem
from batchscribe.audio.worker import Result


class ChunkSizer:
    """How many items the next task takes: 1 until results show the decoded size of an item, then
    as many as fit `chunk_bytes` (at most `most`)."""

    def __init__(self, chunk_bytes: int, most: int):
        self.chunk_bytes, self.most = chunk_bytes, most
        self.seen_items = self.seen_bytes = 0

    def items(self) -> int:
        if self.most == 1 or self.seen_items == 0:
            return 1
        per_item = max(1, self.seen_bytes // self.seen_items)
        return max(1, min(self.most, self.chunk_bytes // per_item))

    def observe(self, results: list[Result]) -> None:
        for audio, _ in results:
            if audio is not None:
                self.seen_items += 1
                self.seen_bytes += audio.nbytes


@dataclass(eq=False)
class _Task:
    # NOTE: no reference to its future: the future's done-callback holds the task, and a task
    # holding the future made a cycle that kept every decoded result (a GPU run's pinned samples)
    # alive until the garbage collector's next run.
    chunk: list[SourceItem]
    encoded: int  # bytes of the chunk's encoded audio
    done: bool = False
    decoded: int = 0  # bytes of its decoded audio, once done
    taken: bool = False  # popped: its completion no longer counts


class InFlight:
    """Tasks submitted and not yet yielded, in order, with their totals kept as they change.

    Running totals, because walking the queue to add them up costs O(prefetch) per item under the
    GIL, time the GPU engine's thread waits for. Completions arrive on the workers' (or the
    executor's) threads, hence the lock.
    """

    def __init__(self) -> None:
        self._tasks: deque[tuple[_Task, Future[list[Result]]]] = deque()
        self._lock = threading.Lock()
        self.items = 0  # items in the tasks
        self._bytes = 0  # encoded bytes of every task plus decoded bytes of the done ones
        self._undone = 0

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, chunk: list[SourceItem], future: Future[list[Result]]) -> None:
        task = _Task(chunk, sum(len(item.audio_bytes or b"") for item in chunk))
        with self._lock:
            self._tasks.append((task, future))
            self.items += len(chunk)
            self._bytes += task.encoded
            self._undone += 1
        future.add_done_callback(lambda future, task=task: self._completed(task, future))

    def _completed(self, task: _Task, future: Future[list[Result]]) -> None:
        size = 0
        if not future.cancelled() and future.exception() is None:
            size = sum(0 if audio is None else audio.nbytes for audio, _ in future.result())
        with self._lock:
            if task.taken:
                return
            task.done, task.decoded = True, size
            self._undone -= 1
            self._bytes += size

    def popleft(self) -> tuple[list[SourceItem], Future[list[Result]]]:
        with self._lock:
            task, future = self._tasks.popleft()
            task.taken = True
            self.items -= len(task.chunk)
            self._bytes -= task.encoded + task.decoded
            self._undone -= 0 if task.done else 1
        return task.chunk, future

    def drain(self) -> list[tuple[list[SourceItem], Future[list[Result]]]]:
        return [self.popleft() for _ in range(len(self._tasks))]

    def has_room(self, prefetch: int, max_undone: int, max_buffered_bytes: int) -> bool:
        """May one more task be submitted? Items, work queued for the workers, and bytes all allow it.

        Decoded sizes are unknown until decoded, so only `max_undone` tasks (IN_FLIGHT_PER_WORKER
        per worker) are handed out ahead of their results; finished results then wait in order
        until their bytes reach the budget.
        """
        if not self._tasks:
            return True
        return self.items < prefetch and self._undone < max_undone and self._bytes < max_buffered_bytes
