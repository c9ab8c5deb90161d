"""--vad before the scheduler: items' speech found in batches on worker threads, so the thread
that launches the engine's work only joins the speech it is handed.

Two daemon threads: one reads the source (decoded items, which may block on decoding) into
`pending`; the other takes a batch from `pending` (bounded by `VadBatching`), scores it at once
(`SpeechDetector.detect`) and appends the items with their `Speech` to `ready`, in input order.
On CUDA the model runs on the engine's device, on the CPU with torch's threads. A batch is
computed once `pending` holds a full one, the source has ended, the consumer holds nothing and
has nothing ready (it waits: nothing waits for a batch to fill then), or the oldest pending item
has waited `wait_seconds`. A consumer that steps items meanwhile would otherwise empty `ready` at
every ask and get the speech of one or two items per call, each call a fixed cost on a GPU. Memory
stays bounded: `pending` holds at most a batch, `ready` at most `ready_items` items or
`ready_seconds` of audio (past one batch), enough to fill a GPU engine's slots.

The consumer (the scheduler, through `__next__`) takes from `ready`; with nothing ready it gets
None ("nothing ready yet": it steps the items it holds) while items it was handed are unfinished,
and blocks only when it holds none, the protocol of ray/feed.py. `finished(id)` tells the stage an
item's transcript came back (and returns its VAD error, if any: such an item is handed on with no
speech, so it finishes at once and the caller writes an error record for it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from batchscribe.audio.vad import Speech
from batchscribe.constants import SAMPLE_RATE

JOIN_SECONDS = 10.0  # how long close() waits for each thread (a batch, or a decode), then leaves it
IDLE_SECONDS = 0.005  # between asks of a live source that had nothing ready (ray/feed.py)


@dataclass(frozen=True)
class VadBatching:
    """How many items the stage hands the detector at once: at most `max_items`, and at most
    `max_seconds` of audio (the detector cuts them into calls of similar lengths)."""

    max_items: int = 64
    max_seconds: float = 1800.0
    wait_seconds: float = 0.02  # the longest a pending item waits for its batch to fill
    ready_items: int = 256  # scored items waiting for the consumer: a GPU engine's slots' worth
    ready_seconds: float = 3600.0  # ... and at most this much audio (long files), past one batch

    def full(self, lengths: list[int]) -> bool:
        """True when items of these sample counts are a whole batch."""
        return len(lengths) >= self.max_items or sum(lengths) >= self.max_seconds * SAMPLE_RATE

    def ready_full(self, lengths: list[int]) -> bool:
        """True when scored items of these sample counts are as many as the consumer may have waiting."""
        return len(lengths) >= max(self.ready_items, 1) or sum(lengths) >= self.ready_seconds * SAMPLE_RATE

    def take(self, lengths: list[int]) -> int:
        """How many of the leading items form the next batch (at least one)."""
        n, total = 1, lengths[0] if lengths else 0
        while n < min(len(lengths), self.max_items) and total + lengths[n] <= self.max_seconds * SAMPLE_RATE:
            total += lengths[n]
            n += 1
        return n


class Detector(Protocol):
    def detect(self, audios: list[np.ndarray]) -> list[Speech]: ...


def _failed(exc: BaseException) -> Speech:
    return Speech((), (), f"voice activity detection (--vad) failed: {type(exc).__name__}: {exc}")


class SpeechStage:
    """(id, audio[, prompt]) entries in -> (id, audio, prompt or None, Speech) out, input order kept."""

    def __init__(self, source: Iterator[tuple | None], detector: Detector, batching: VadBatching = VadBatching()):
        self._source, self._detector, self.batching = source, detector, batching
        self._cond = threading.Condition()
        self._pending: deque[tuple] = deque()  # read, not yet scored
        self._arrived: deque[float] = deque()  # when each pending entry was read (monotonic)
        self._ready: deque[tuple] = deque()  # scored, not yet handed on
        self._read_all = self._scored_all = self._closed = False
        self._source_error: BaseException | None = None  # raised once what came before it is handed on
        self._crash: BaseException | None = None  # the scoring thread's own failure: raised at once
        self._held = 0  # handed to the consumer, transcript not yet back
        self._errors: dict[str, str] = {}
        self._threads = [threading.Thread(target=self._read, name="batchscribe-vad-read", daemon=True),
                         threading.Thread(target=self._score, name="batchscribe-vad", daemon=True)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def __iter__(self) -> SpeechStage:
        return self

    def __next__(self) -> tuple | None:
        with self._cond:
            while True:
                if self._ready:
                    self._held += 1
                    self._cond.notify_all()
                    return self._ready.popleft()
                if self._crash is not None:
                    raise self._crash
                if self._scored_all:
                    if self._source_error is not None:
                        raise self._source_error
                    raise StopIteration
                if self._held:
                    return None  # the consumer steps what it holds and asks again
                self._cond.wait(timeout=0.1)  # timed: a stop signal is handled promptly

    def finished(self, item_id: str) -> str | None:
        """An item's transcript came back; its VAD error (for its error record), or None."""
        with self._cond:
            self._held -= 1
            self._cond.notify_all()  # holding nothing, the consumer may be owed a partial batch
            return self._errors.pop(item_id, None)

    def close(self) -> None:
        """Stop both threads and wait for them (at most JOIN_SECONDS each): the reader closes the
        source on its own thread, so the source's clean-up (a decode pool's shutdown) is done."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=JOIN_SECONDS)

    def __enter__(self) -> SpeechStage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _lengths(self, entries: deque[tuple]) -> list[int]:
        return [len(entry[1]) for entry in entries]

    def _read(self) -> None:
        try:
            for entry in self._source:
                if entry is None:  # a live source with nothing ready yet
                    time.sleep(IDLE_SECONDS)
                elif not self._put(entry):
                    return
                if self._closed:
                    return
        except BaseException as exc:  # handed to the consumer after what was read before it
            self._source_error = exc
        finally:
            with self._cond:
                self._read_all = True
                self._cond.notify_all()
            close = getattr(self._source, "close", None)
            if close is not None:
                close()  # e.g. the pipeline's feed, on the thread that ran it

    def _put(self, entry: tuple) -> bool:
        with self._cond:
            while not self._closed and self.batching.full(self._lengths(self._pending)):
                self._cond.wait()
            if self._closed:
                return False
            self._pending.append(entry)
            self._arrived.append(time.monotonic())
            self._cond.notify_all()
            return True

    def _batch(self) -> list[tuple] | None:
        """The next batch to score, waiting until one is due; None: nothing is left, or closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if not self._pending and self._read_all:
                    self._scored_all = True
                    self._cond.notify_all()
                    return None
                timeout = None
                if self._pending and not self.batching.ready_full(self._lengths(self._ready)):
                    left = self.batching.wait_seconds - (time.monotonic() - self._arrived[0])
                    starving = not self._ready and not self._held
                    if self.batching.full(self._lengths(self._pending)) or self._read_all or starving or left <= 0:
                        n = self.batching.take(self._lengths(self._pending))
                        batch = [self._pending.popleft() for _ in range(n)]
                        for _ in range(n):
                            self._arrived.popleft()
                        self._cond.notify_all()  # room in pending for the reader
                        return batch
                    timeout = left
                self._cond.wait(timeout)

    def _score(self) -> None:
        try:
            while (batch := self._batch()) is not None:
                found = self._detect(batch)
                with self._cond:
                    for (item_id, audio, *prompt), speech in zip(batch, found):
                        if speech.error is not None:
                            self._errors[item_id] = f"{item_id}: {speech.error}"
                        self._ready.append((item_id, audio, prompt[0] if prompt else None, speech))
                    self._cond.notify_all()
        except BaseException as exc:  # a bug, not an item's failure (those are caught per item)
            with self._cond:
                self._crash = exc
                self._cond.notify_all()

    def _detect(self, batch: list[tuple]) -> list[Speech]:
        """The batch's Speech; when the batched call fails, each item alone, so only the item that
        fails gets an error (as the decode pool isolates a crashing item)."""
        try:
            found = self._detector.detect([entry[1] for entry in batch])
            if len(found) != len(batch):  # never drop an item silently
                raise RuntimeError(f"the detector returned {len(found)} results for {len(batch)} items")
        except Exception as exc:
            if len(batch) == 1:
                return [_failed(exc)]
            return [self._detect([entry])[0] for entry in batch]
        return found
