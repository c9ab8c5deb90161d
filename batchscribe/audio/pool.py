"""Parallel audio decoding: SourceItems in, mono float32 16 kHz arrays out, in input order.

Worker processes decode while the caller (the engine) computes; at most `prefetch` items are in
flight, so memory stays bounded whatever the size of the input. A bad item is data, not an
exception: its DecodedItem carries `error` and the stream goes on. Even a decoder that kills its
process (a segfault in a native library, the OOM killer) costs only that item: the pool is
replaced and the items that were in flight are retried one at a time to find the culprit.
What a worker runs and how its samples come back: `worker`; the bookkeeping: `inflight`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchscribe.audio.inflight import ChunkSizer, InFlight
from batchscribe.audio.read_ahead import read_ahead
from batchscribe.audio.sources import SourceItem
from batchscribe.audio.worker import Decoder, Result, decode_many, decode_one, new_spill_dir, read_back
from batchscribe.process_context import process_pool
from batchscribe.stops import deferred

# Tasks: each a chunk of consecutive items and the future of their results, in order.
_Pending = deque[tuple[list[SourceItem], Future[list[Result]]]]
DEFAULT_MAX_BUFFERED_BYTES = 1 << 30  # ~4.6 h of decoded 16 kHz float32 audio
# Tasks handed to each worker ahead of their results: one running, one queued, so none idles.
IN_FLIGHT_PER_WORKER = 2
# Items per task sent to a worker process. Each task's round trip (pickling, two pipes, the
# executor's threads, the spill file) costs the main process time under the GIL, so short items
# travel in chunks, sized so decoded bytes in flight stay under half the budget.
MAX_CHUNK_ITEMS = 16
# Items per task for decode threads. Tasks of several items cost less bookkeeping, yet one item
# per task was faster beside a GPU engine (docs/GPU_NOTES.md): busy threads with work queued kept
# the GIL from the thread that hands their results on.
THREAD_CHUNK_ITEMS = 1


@dataclass(frozen=True)
class DecodedItem:
    """One item after decoding: `audio` ([n_samples] float32, 16 kHz) or `error`, never both."""

    id: str
    audio: np.ndarray | None  # [n_samples] float32 at 16 kHz; None when error is set
    error: str | None  # "<id>: <what went wrong and how to fix it>"
    text: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    source_path: str | None = None
    prompt: str | None = None  # the item's initial prompt (--prompt-column)


def default_workers() -> int:
    """One process per core, leaving one core for the main process (at least one worker)."""
    return max(1, (os.cpu_count() or 2) - 1)


def decode_threads_default() -> int:
    """Decode threads beside a GPU engine: three quarters of the cores, at most 12. Too many take
    the GIL from the thread that launches GPU work, too few leave the engine waiting on input
    (chosen by measurement: docs/GPU_NOTES.md)."""
    return max(1, min(12, (os.cpu_count() or 2) * 3 // 4))


def decode_stream(
    items: Iterable[SourceItem],
    workers: int | None = None,
    prefetch: int = 64,
    decoder: Decoder | None = None,
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
    threads: bool = False,
) -> Iterator[DecodedItem]:
    """Decode `items` in `workers` processes (None: `default_workers()`, or `decode_threads_default()`
    threads with `threads=True`; 0: inline, in this process).

    Worker processes take short items in chunks (up to MAX_CHUNK_ITEMS per task, once decoded
    sizes are known), leave each chunk's decoded samples in one file of a per-run folder (in
    /dev/shm where there is one) and send back only its path and offsets; the folder is removed
    when the stream ends.
    `threads=True` decodes in threads of this process instead: libsndfile and soxr release the GIL,
    so threads scale across cores with no copy at all and no process start-up (the GPU engine's
    choice). The price is isolation: a decoder that crashes takes the whole process with it.

    Results come out in input order. At most `prefetch` items are submitted and not yet yielded,
    and no new item is submitted while the buffered audio (encoded bytes in flight plus decoded
    results waiting for their turn) exceeds `max_buffered_bytes`, so a run of hours-long files
    cannot fill memory: the bound is that budget plus two tasks per worker, a task being one item
    or a chunk sized to a share of the budget (together at most half of it). `items` is
    pulled only as room frees up, so it may be an endless stream. `decoder` replaces
    `batchscribe.audio.decode.decode_audio` (a module-level function; for tests and plug-ins).
    """
    if prefetch < 1:
        raise ValueError(f"prefetch={prefetch} must be >= 1")
    if workers is None:
        workers = decode_threads_default() if threads else default_workers()
    if workers < 0:
        raise ValueError(f"workers={workers} must be >= 0 (0 decodes inline)")
    if workers == 0:
        for item in items:
            yield from _finish_chunk([item], [decode_one(item, decoder)])
        return
    yield from _decode_pooled(items, workers, prefetch, decoder, max_buffered_bytes, threads)


def _decode_pooled(
    items: Iterable[SourceItem], workers: int, prefetch: int, decoder: Decoder | None,
    max_buffered_bytes: int, threads: bool = False,
) -> Iterator[DecodedItem]:
    spill = None if threads else new_spill_dir()  # where worker processes leave decoded samples
    pool = _new_pool(workers, threads)
    pending = InFlight()
    in_flight = IN_FLIGHT_PER_WORKER * workers
    # Threads share memory: a task costs no copy to hand over, only its bookkeeping.
    sizer = ChunkSizer(max_buffered_bytes // (2 * in_flight), THREAD_CHUNK_ITEMS if threads else MAX_CHUNK_ITEMS)
    try:
        source = iter(items)
        exhausted = False
        while True:
            while not exhausted and pending.has_room(prefetch, in_flight, max_buffered_bytes):
                chunk = list(itertools.islice(source, min(sizer.items(), prefetch - pending.items)))
                if not chunk:
                    exhausted = True
                    break
                if not threads:
                    chunk = [_owned(item) for item in chunk]
                try:
                    with deferred():  # a stop inside submit() could leave a worker starting unseen by shutdown
                        pending.add(chunk, pool.submit(decode_many, chunk, decoder, spill))
                except BrokenProcessPool:  # the pool died since the last check; recover below
                    pending.add(chunk, _broken_future())
            if not pending:
                return
            chunk, future = pending.popleft()
            try:
                results = future.result()
            except BrokenProcessPool:
                pool.shutdown(wait=True, cancel_futures=True)
                yield from _isolate(deque([(chunk, future), *pending.drain()]), decoder, spill)
                pool = _new_pool(workers, threads)
                continue
            except Exception:  # e.g. an item that cannot be pickled to a worker: find which
                yield from _isolate(deque([(chunk, future)]), decoder, spill)
                continue
            sizer.observe(results)
            yield from _finish_chunk(chunk, results)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if spill is not None:  # also what a killed worker left half-written
            shutil.rmtree(spill, ignore_errors=True)


def _owned(item: SourceItem) -> SourceItem:
    """The item with its bytes copied out of a view of Arrow's buffer (Parquet sources), for a
    worker process: the copy is made once, here, and the view (which keeps Arrow's whole batch in
    memory) dies now instead of while the item waits in flight."""
    if isinstance(item.audio_bytes, memoryview):
        return dataclasses.replace(item, audio_bytes=bytes(item.audio_bytes))
    return item


def _isolate(pending: _Pending, decoder: Decoder | None, spill: str | None) -> Iterator[DecodedItem]:
    """After a worker died (or a task failed): keep finished results, retry the rest one item at a
    time, in order.

    One item per pool at a time means a second death can only be that item's fault, so the error
    lands on the right id and every other in-flight item still gets decoded.
    """
    pool = _new_pool(1)
    try:
        while pending:
            chunk, future = pending.popleft()
            if future.done() and not future.cancelled() and future.exception() is None:
                yield from _finish_chunk(chunk, future.result())
                continue
            for item in chunk:
                try:
                    with deferred():
                        future = pool.submit(decode_many, [item], decoder, spill)
                    results = future.result()
                except BrokenProcessPool:
                    pool.shutdown(wait=True)
                    _check_workers_start()  # not this item's fault if a worker cannot even start
                    pool = _new_pool(1)
                    results = [(None, (
                        "the decoder process died while decoding this item (a crash in a native "
                        "decoder, or out of memory); the audio is probably corrupt: re-encode it "
                        "(e.g. ffmpeg -i IN -ar 16000 -ac 1 OUT.flac) or drop it"
                    ))]
                except Exception as exc:  # e.g. an item that cannot be pickled to a worker
                    results = [(None, f"{type(exc).__name__}: {exc}")]
                yield from _finish_chunk([item], results)
    finally:
        pool.shutdown(wait=True)


class DecodeWorkersError(RuntimeError):
    """Decode worker processes die before decoding anything: no item's fault, so no item's error."""


def _check_workers_start() -> None:
    """Raise DecodeWorkersError if a new worker dies on a task that decodes nothing. Seen: a script
    that calls run() without a main guard, which multiprocessing runs again in every worker, where
    it stops; each item was blamed on its audio ("probably corrupt"), and the run ended "complete"
    with 0 ok."""
    pool = _new_pool(1)
    try:
        pool.submit(decode_many, [], None, None).result()
    except BrokenProcessPool:
        raise DecodeWorkersError(
            "decode worker processes exit as they start, before decoding anything (their error, if "
            "any, is printed above). Calling batchscribe.run.run() from a script? Python starts each "
            "worker by importing the script again: put the call under `if __name__ == \"__main__\":`. "
            "Otherwise decode in threads (RunOptions(decode_threads=True)) or inline (workers=0)"
        ) from None
    finally:
        pool.shutdown(wait=True)


def _new_pool(workers: int, threads: bool = False) -> Executor:
    if threads:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batchscribe-decode")
    # The server imports the decoders once, and workers fork from it ready to decode.
    return process_pool(workers, ["batchscribe.audio.worker"])


def _broken_future() -> Future[list[Result]]:
    future: Future[list[Result]] = Future()
    future.set_exception(BrokenProcessPool("the decoder pool was already broken"))
    return future


def _finish_chunk(chunk: list[SourceItem], results: list[Result]) -> Iterator[DecodedItem]:
    """A task's items as DecodedItems, their samples read back where spilled (`read_back`)."""
    for item, (audio, reason) in zip(chunk, read_back(results)):
        yield DecodedItem(
            id=item.id,
            audio=audio,
            error=None if reason is None else f"{item.id}: {reason}",
            text=item.text,
            extra=item.extra,
            source_path=item.path,
            prompt=item.prompt,
        )


__all__ = [
    "DEFAULT_MAX_BUFFERED_BYTES", "IN_FLIGHT_PER_WORKER", "MAX_CHUNK_ITEMS", "THREAD_CHUNK_ITEMS",
    "DecodedItem", "Decoder", "decode_stream", "decode_threads_default", "default_workers", "read_ahead",
]
