"""Iterate on a background thread, a bounded number of items ahead of the consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


_DONE = object()


class ReadAhead:
    """`items` iterated on a background thread, at most `depth` ahead; its errors re-raise here.

    The thread starts at once, not at the first `next()`: `run()` starts decoding while the model
    loads, so the first admissions find their audio ready. `close()` (also on a stream never
    iterated) stops the thread and closes `items` on it.
    """

    def __init__(self, items: Iterable[Any], depth: int):
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        self._out: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._produce, args=(items,), name="batchscribe-read-ahead",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _put(self, value: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._out.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, items: Iterable[Any]) -> None:
        source = iter(items)
        try:
            for value in source:
                if not self._put(value):
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
        value = self._out.get()
        if value is _DONE:
            self.close()
            raise StopIteration
        if isinstance(value, _Raised):
            self.close()
            raise value.exc
        return value

    def __del__(self) -> None:  # dropped unclosed: the thread still ends (a daemon; no join here)
        self._stop.set()

    def close(self) -> None:
        """Stop the thread (it closes the source) and wait for it; idempotent."""
        self._ended = True
        self._stop.set()
        self._thread.join(timeout=30)


def read_ahead(items: Iterable[Any], depth: int) -> Iterator[Any]:
    """Iterate `items` on a background thread, at most `depth` ahead (`ReadAhead`).

    The GPU engine's thread should only admit and step: reading Parquet and handing items to the
    decode workers inside its `next()` left the GPU idle (docs/GPU_NOTES.md).
    """
    return ReadAhead(items, depth)
