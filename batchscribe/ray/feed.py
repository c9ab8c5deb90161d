"""One engine stream per actor, fed by every call that is running on it.

Ray Data hands an actor one batch per call. Transcribing each batch as its own stream drains the
engine at the end of every call: its last windows run on a few slots while the rest stand empty,
and the next batch waits for the slowest item of this one. Here the actor's engine runs one
stream for the actor's whole life on its own thread; each call adds its rows and waits for their
records, so with several calls running at once (the driver asks Ray for that: driver.py's
`calls_per_actor`) the later batches' rows fill the slots while this batch's last windows finish.

The stream's source is this object. It returns None ("nothing ready yet", which the scheduler
answers by stepping what it has) while rows it handed out are unfinished, and blocks only when
the engine holds nothing of it: a record is resolved on the engine's own thread before it next
asks for a row, so that count is exact when it asks.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np

# (id, float32 mono 16 kHz samples), or with the item's initial prompt (--prompt-column) third
Row = tuple[str, np.ndarray] | tuple[str, np.ndarray, str]


class Feed:
    """`submit(rows)` -> one future per row, resolved with its record (or the engine's error)."""

    def __init__(self, transcriber: Any) -> None:
        self.transcriber = transcriber
        self._cond = threading.Condition()
        self._rows: deque[Row] = deque()  # submitted, not yet handed to the engine
        self._waiting: dict[str, Future[dict[str, Any]]] = {}  # id -> its record's future
        self._outstanding = 0  # handed to the engine, record not yet back
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, rows: list[Row]) -> list[Future[dict[str, Any]]]:
        with self._cond:
            if self._failed is not None:
                raise RuntimeError(f"this actor's engine failed earlier ({self._failed!r})") from self._failed
            twice = [row[0] for row in rows if row[0] in self._waiting]
            if twice or len({row[0] for row in rows}) < len(rows):
                raise ValueError(f"ids already being transcribed by this actor: {twice[:5] or 'within this batch'}; "
                                 "each id must reach an actor once at a time")  # fmt: skip
            futures: list[Future[dict[str, Any]]] = []
            for row in rows:
                future: Future[dict[str, Any]] = Future()
                self._waiting[row[0]] = future
                self._rows.append(row)
                futures.append(future)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batchscribe-actor-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return futures

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Row | None:
        with self._cond:
            while not self._rows:
                if self._outstanding:
                    return None  # the engine has rows of ours in flight: it steps them meanwhile
                self._cond.wait()
            self._outstanding += 1
            return self._rows.popleft()

    def _run(self) -> None:
        try:
            for record in self.transcriber.transcribe_stream(self):
                with self._cond:
                    self._outstanding -= 1
                    future = self._waiting.pop(str(record["id"]))
                future.set_result(record)
            raise RuntimeError("the engine's stream ended")  # it never should: this source never ends
        except BaseException as exc:  # every waiting call gets it; later calls are refused
            with self._cond:
                self._failed = exc
                pending = list(self._waiting.values())
                self._waiting.clear()
                self._rows.clear()
            for future in pending:
                future.set_exception(exc)
