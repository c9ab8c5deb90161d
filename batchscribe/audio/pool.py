"""Parallel audio decoding: SourceItems in, mono float32 16 kHz arrays out, in input order.

Worker processes decode while the caller (the engine) computes; at most `prefetch` items are in
flight, so memory stays bounded whatever the size of the input. A bad item is data, not an
exception: its DecodedItem carries `error` and the stream goes on. Even a decoder that kills its
process (a segfault in a native library, the OOM killer) costs only that item: the pool is
replaced and the items that were in flight are retried one at a time to find the culprit.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchscribe.audio.decode import RAM_DIR
from batchscribe.audio.sources import SourceItem

# A decoder takes encoded bytes or a path and returns float32 mono 16 kHz samples. It must be a
# module-level function so worker processes can unpickle it.
Decoder = Callable[[bytes | str], np.ndarray]


@dataclass(frozen=True)
class _Spilled:
    """Decoded audio a worker process left in a file of the run's spill folder (RAM-backed where
    possible): only the path crosses the pipe, not the samples."""

    path: str
    n_samples: int

    @property
    def nbytes(self) -> int:
        return 4 * self.n_samples


# (audio [n_samples] float32 or where a worker spilled it, None) or (None, reason)
_Result = tuple[np.ndarray | _Spilled | None, str | None]
_Pending = deque[tuple[SourceItem, Future[_Result]]]
DEFAULT_MAX_BUFFERED_BYTES = 1 << 30  # ~4.6 h of decoded 16 kHz float32 audio
# Items handed to each worker ahead of their results: one running, one queued, so none idles.
IN_FLIGHT_PER_WORKER = 2
_SPILL_PREFIX = "batchscribe-decoded-"  # then the owning process id


@dataclass(frozen=True)
class DecodedItem:
    """One item after decoding: `audio` ([n_samples] float32, 16 kHz) or `error`, never both."""

    id: str
    audio: np.ndarray | None  # [n_samples] float32 at 16 kHz; None when error is set
    error: str | None  # "<id>: <what went wrong and how to fix it>"
    text: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    source_path: str | None = None


def default_workers() -> int:
    """One process per core, leaving one core for the main process (at least one worker)."""
    return max(1, (os.cpu_count() or 2) - 1)


def decode_threads_default() -> int:
    """Decode threads beside a GPU engine: half the cores, at most 8. More threads decode faster
    but take the GIL from the thread that launches GPU work: on the H200's 16 cores W1 ran at
    RTFx 6,364 with 8 threads, 5,196 with 15 and 5,402 with 4 (docs/GPU_NOTES.md)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


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

    Worker processes leave each decoded array in a file of a per-run folder (in /dev/shm where
    there is one) and send back only its path; the folder is removed when the stream ends.
    `threads=True` decodes in threads of this process instead: libsndfile and soxr release the GIL,
    so threads scale across cores with no copy at all and no process start-up (the GPU engine's
    choice). The price is isolation: a decoder that crashes takes the whole process with it.

    Results come out in input order. At most `prefetch` items are submitted and not yet yielded,
    and no new item is submitted while the buffered audio (encoded bytes in flight plus decoded
    results waiting for their turn) exceeds `max_buffered_bytes`, so a run of hours-long files
    cannot fill memory: the bound is that budget plus two items per worker. `items` is
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
            yield _finish(item, _decode_one(item, decoder))
        return
    yield from _decode_pooled(items, workers, prefetch, decoder, max_buffered_bytes, threads)


def _decode_pooled(
    items: Iterable[SourceItem], workers: int, prefetch: int, decoder: Decoder | None,
    max_buffered_bytes: int, threads: bool = False,
) -> Iterator[DecodedItem]:
    # Worker processes hand decoded audio back through files here instead of pickling it through
    # a pipe (the main process then only reads it back: no unpickling while holding the GIL).
    spill = None
    if not threads:
        _sweep_spills(RAM_DIR or tempfile.gettempdir())
        spill = tempfile.mkdtemp(prefix=f"{_SPILL_PREFIX}{os.getpid()}-", dir=RAM_DIR)
    pool = _new_pool(workers, threads)
    pending: _Pending = deque()
    in_flight = IN_FLIGHT_PER_WORKER * workers
    try:
        source = iter(items)
        exhausted = False
        while True:
            while not exhausted and _has_room(pending, prefetch, in_flight, max_buffered_bytes):
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                try:
                    pending.append((item, pool.submit(_decode_one, item, decoder, spill)))
                except BrokenProcessPool:  # the pool died since the last check; recover below
                    pending.append((item, _broken_future()))
            if not pending:
                return
            item, future = pending.popleft()
            try:
                result = future.result()
            except BrokenProcessPool:
                pending.appendleft((item, future))
                pool.shutdown(wait=True, cancel_futures=True)
                yield from _isolate(pending, decoder, spill)
                pool = _new_pool(workers, threads)
                continue
            except Exception as exc:  # e.g. an item that cannot be pickled to a worker
                result = (None, f"{type(exc).__name__}: {exc}")
            yield _finish(item, result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if spill is not None:  # also what a killed worker left half-written
            shutil.rmtree(spill, ignore_errors=True)


def _sweep_spills(parent: str) -> None:
    """Remove spill folders whose run was killed (SIGKILL, the OOM killer) before it could: in
    /dev/shm they would hold their decoded audio in memory until the machine restarts."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(_SPILL_PREFIX):
            continue
        pid = name[len(_SPILL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: alive
        pass
    return True


def _has_room(pending: _Pending, prefetch: int, max_undone: int, max_buffered_bytes: int) -> bool:
    """May one more item be submitted? Count, work queued for the workers, and bytes all allow it.

    Decoded sizes are unknown until decoded, so only `max_undone` items (IN_FLIGHT_PER_WORKER per
    worker) are handed out ahead of their results; finished results
    then wait in order until their bytes reach the budget.
    """
    if not pending:
        return True
    if len(pending) >= prefetch:
        return False
    undone = 0
    buffered = 0
    for item, future in pending:
        buffered += len(item.audio_bytes or b"")
        if not future.done():
            undone += 1
        elif not future.cancelled() and future.exception() is None:
            audio = future.result()[0]
            buffered += 0 if audio is None else audio.nbytes
    return undone < max_undone and buffered < max_buffered_bytes


def _isolate(pending: _Pending, decoder: Decoder | None, spill: str | None) -> Iterator[DecodedItem]:
    """After a worker died: keep finished results, retry the rest one at a time, in order.

    One item per pool at a time means a second death can only be that item's fault, so the error
    lands on the right id and every other in-flight item still gets decoded.
    """
    pool = _new_pool(1)
    try:
        while pending:
            item, future = pending.popleft()
            if future.done() and not future.cancelled() and future.exception() is None:
                yield _finish(item, future.result())
                continue
            try:
                result = pool.submit(_decode_one, item, decoder, spill).result()
            except BrokenProcessPool:
                pool.shutdown(wait=True)
                pool = _new_pool(1)
                result = (None, (
                    "the decoder process died while decoding this item (a crash in a native "
                    "decoder, or out of memory); the audio is probably corrupt: re-encode it "
                    "(e.g. ffmpeg -i IN -ar 16000 -ac 1 OUT.flac) or drop it"
                ))
            except Exception as exc:  # e.g. an item that cannot be pickled to a worker
                result = (None, f"{type(exc).__name__}: {exc}")
            yield _finish(item, result)
    finally:
        pool.shutdown(wait=True)


def _context() -> multiprocessing.context.BaseContext:
    # NOTE: never fork: the parent may hold CUDA state or threads (torch, datasets) that a forked
    # child would inherit half-locked. forkserver (Linux) and spawn start clean interpreters.
    method = "forkserver" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # The server imports the decoders once, and workers fork from it ready to decode (the first
        # item came 0.33 -> 0.22-0.26 s after the start on the CI machine).
        context.set_forkserver_preload(["batchscribe.audio.decode"])
    return context


def _new_pool(workers: int, threads: bool = False) -> Executor:
    if threads:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batchscribe-decode")
    return ProcessPoolExecutor(max_workers=workers, mp_context=_context())


def _broken_future() -> Future[_Result]:
    future: Future[_Result] = Future()
    future.set_exception(BrokenProcessPool("the decoder pool was already broken"))
    return future


def _decode_one(item: SourceItem, decoder: Decoder | None, spill: str | None = None) -> _Result:
    """Runs in a worker: (audio [n_samples] float32, None) or (None, reason). With `spill` (a
    folder), the audio is written there and (_Spilled, None) returned instead."""
    if decoder is None:
        from batchscribe.audio.decode import decode_audio

        decoder = decode_audio
    data: bytes | str | None = item.audio_bytes if item.audio_bytes is not None else item.path
    if data is None:
        return None, "no audio: the audio cell is empty (no bytes and no path); fix or drop the row"
    try:
        audio = decoder(data)
    except Exception as exc:  # a bad item must never stop the stream, whatever the decoder raises
        return None, _reason(exc)
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if spill is not None:
        try:
            fd, path = tempfile.mkstemp(suffix=".f32", dir=spill)
            with os.fdopen(fd, "wb") as handle:
                handle.write(memoryview(audio).cast("B"))
            return _Spilled(path, audio.size), None
        except OSError:  # the spill storage is full or gone: send the samples through the pipe
            with contextlib.suppress(UnboundLocalError, OSError):
                os.unlink(path)
    return audio, None


def _unspill(audio: np.ndarray | _Spilled | None) -> np.ndarray | None:
    """In the main process: a spilled result's samples, read back; its file is removed."""
    if not isinstance(audio, _Spilled):
        return audio
    try:
        samples = np.fromfile(audio.path, dtype=np.float32)
    finally:
        os.unlink(audio.path)
    if samples.size != audio.n_samples:
        raise OSError(f"{audio.path}: read {samples.size} samples back, the worker wrote {audio.n_samples}")
    return samples


def _reason(exc: Exception) -> str:
    try:
        from batchscribe.audio.decode import AudioDecodeError
    except ImportError:  # a custom decoder without the package's decode module
        return f"{type(exc).__name__}: {exc}"
    # AudioDecodeError's message already names the problem and the fix; anything else is
    # unexpected, so keep its type for the bug report.
    return str(exc) if isinstance(exc, AudioDecodeError) else f"{type(exc).__name__}: {exc}"


def _finish(item: SourceItem, result: _Result) -> DecodedItem:
    audio, reason = result
    try:
        audio = _unspill(audio)
    except OSError as exc:  # e.g. something emptied /dev/shm under the run
        audio, reason = None, (f"the decoded audio could not be read back from the decoder process "
                               f"({exc}); run again to retry this item")  # fmt: skip
    return DecodedItem(
        id=item.id,
        audio=audio,
        error=None if reason is None else f"{item.id}: {reason}",
        text=item.text,
        extra=item.extra,
        source_path=item.path,
    )


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


_DONE = object()


def read_ahead(items: Iterable[Any], depth: int) -> Iterator[Any]:
    """Iterate `items` on a background thread, at most `depth` ahead; its errors re-raise here.

    The GPU engine's thread should only admit and step: reading Parquet and handing items to the
    decode workers inside its `next()` left the GPU idle (1.3 s of a 2.8 s W1 run on the H200).
    """
    if depth < 1:
        raise ValueError(f"depth={depth} must be >= 1")
    out: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for value in source:
                if not put(value):
                    break
            else:
                put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_Raised(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # e.g. decode_stream's pool shutdown, on this thread that ran it

    thread = threading.Thread(target=produce, name="batchscribe-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            value = out.get()
            if value is _DONE:
                return
            if isinstance(value, _Raised):
                raise value.exc
            yield value
    finally:
        stop.set()
        thread.join(timeout=30)
