"""Where a run's records go: counted, written to the shard writer, reported to a progress callback,
and checked against --max-errors. Thread-safe: the transcriber may pull items from its own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from batchscribe.audio.sources import SourceItem
from batchscribe.output.resume import OutputState
from batchscribe.output.writers import ShardWriter


@dataclass(frozen=True)
class RunProgress:
    """Counts for this session; `total` is the expected item count when it is known cheaply."""

    done: int
    ok: int
    errors: int
    skipped: int  # already committed by an earlier run
    audio_seconds: float
    elapsed_s: float
    total: int | None

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[RunProgress], None]


class Sink:
    """Counts, writes and reports records; decides when --max-errors stops the run."""

    def __init__(self, writer: ShardWriter, state: OutputState, max_errors: int | None,
                 start: float, total: int | None, progress: ProgressCallback | None,
                 load_seconds: float = 0.0) -> None:  # fmt: skip
        self.writer, self.state, self.max_errors = writer, state, max_errors
        self.start, self.total, self.progress = start, total, progress
        self.load_seconds = load_seconds
        self.prior_errors = int(state.totals()["errors"])
        self.done = self.ok = self.errors = self.skipped = 0
        self.audio_seconds = 0.0
        self.stop = False
        self._lock = threading.Lock()

    @property
    def total_errors(self) -> int:
        return self.prior_errors + self.errors

    def skip_completed(self, items: Iterable[SourceItem]) -> Iterator[SourceItem]:
        completed = self.state.completed
        for item in items:
            if self.stop:
                return
            if item.id in completed:
                self.skipped += 1
                continue
            yield item

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.writer.add(record)
            self.done += 1
            if record.get("error") is None:
                self.ok += 1
            else:
                self.errors += 1
                if self.max_errors is not None and self.total_errors > self.max_errors:
                    self.stop = True
            if isinstance(record.get("duration"), (int, float)):
                self.audio_seconds += float(record["duration"])
            snapshot = self.snapshot() if self.progress is not None else None
        if snapshot is not None:
            self.progress(snapshot)

    def snapshot(self) -> RunProgress:
        total = None if self.total is None else max(self.total - self.skipped, self.done)
        return RunProgress(self.done, self.ok, self.errors, self.skipped, self.audio_seconds,
                           time.monotonic() - self.start, total)  # fmt: skip
