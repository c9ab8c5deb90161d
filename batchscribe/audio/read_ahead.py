"""Iterate on a background thread, a bounded number of items ahead of the consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


_DONE = object()


class ReadAhead:
    """`items` iterated on a background thread, at most `depth` ahead; its errors re-raise here.
    With `max_bytes`, the items waiting also weigh at most that much together (`weigh(item)`
    bytes each), or are one item however heavy: a count alone lets hour-long files fill memory.

    The thread starts at once, not at the first `next()`: `run()` starts decoding while the model
    loads, so the first admissions find their audio ready. `close()` (also on a stream never
    iterated) stops the thread and closes `items` on it.
    """

    def __init__(self, items: Iterable[Any], depth: int, max_bytes: int | None = None,
                 weigh: Callable[[Any], int] | None = None):  # fmt: skip
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        if (max_bytes is None) != (weigh is None):
            raise ValueError("max_bytes and weigh go together")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes} must be >= 1")
        self._out: queue.Queue[tuple[Any, int]] = queue.Queue(maxsize=depth)  # (item, its weight)
        self._max_bytes, self._weigh = max_bytes, weigh
        self._held = 0  # the weight of the items queued
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._produce, args=(items,), name="batchscribe-read-ahead",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _put(self, value: Any, weight: int = 0) -> bool:
        if weight and not self._reserve(weight):
            return False
        while not self._stop.is_set():
            try:
                self._out.put((value, weight), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _reserve(self, weight: int) -> bool:
        """Wait until `weight` more fits under max_bytes (or nothing is queued); False on close."""
        assert self._max_bytes is not None
        with self._room:
            while self._held and self._held + weight > self._max_bytes:
                if self._stop.is_set():
                    return False
                self._room.wait(timeout=0.1)
            self._held += weight
        return True

    def _produce(self, items: Iterable[Any]) -> None:
        source = iter(items)
        try:
            for value in source:
                if not self._put(value, self._weigh(value) if self._weigh is not None else 0):
                    break
            else:
                self._put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(_Raised(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # e.g. decode_stream's pool shutdown, on this thread that ran it

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        value, weight = self._out.get()
        if weight:
            with self._room:
                self._held -= weight
                self._room.notify()
        if value is _DONE:
            self.close()
            raise StopIteration
        if isinstance(value, _Raised):
            self.close()
            raise value.exc
        return value

    def __del__(self) -> None:  # dropped unclosed: the thread still ends (a daemon; no join here)
        stop = getattr(self, "_stop", None)  # absent when __init__ refused its arguments
        if stop is not None:
            stop.set()

    def close(self) -> None:
        """Stop the thread (it closes the source) and wait for it; idempotent."""
        self._ended = True
        self._stop.set()
        self._thread.join(timeout=30)


def read_ahead(items: Iterable[Any], depth: int, max_bytes: int | None = None,
               weigh: Callable[[Any], int] | None = None) -> Iterator[Any]:  # fmt: skip
    """Iterate `items` on a background thread, at most `depth` (and `max_bytes`) ahead (`ReadAhead`).

    The GPU engine's thread should only admit and step: reading Parquet and handing items to the
    decode workers inside its `next()` left the GPU idle (docs/GPU_NOTES.md).
    """
    return ReadAhead(items, depth, max_bytes, weigh)
