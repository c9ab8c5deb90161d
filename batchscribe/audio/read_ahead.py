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


def read_ahead(items: Iterable[Any], depth: int) -> Iterator[Any]:
    """Iterate `items` on a background thread, at most `depth` ahead; its errors re-raise here.

    The GPU engine's thread should only admit and step: reading Parquet and handing items to the
    decode workers inside its `next()` left the GPU idle (docs/GPU_NOTES.md).
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
