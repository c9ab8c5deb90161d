"""Where a run's records go: counted, written to the shard writer, reported to a progress callback,
and checked against --max-errors; and the summary of what was counted. Thread-safe: the
transcriber may pull items from its own thread."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from batchscribe.audio.sources import SourceItem, SourceOptions, count_folder_items
from batchscribe.audio.sources.fingerprint import canonical_input
from batchscribe.output.resume import OutputState
from batchscribe.output.writers import ShardWriter, hostname, package_versions
from batchscribe.version import __version__


@dataclass(frozen=True)
class RunProgress:
    """Counts for this session; `total` is the expected item count when it is known cheaply."""

    done: int
    ok: int
    errors: int
    skipped: int  # already committed by an earlier run
    audio_seconds: float
    elapsed_s: float  # since the run started, start-up (model load; on CUDA the engine build) included
    total: int | None
    startup_s: float = 0.0  # of elapsed_s, the model load before the first item could run

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def rtfx_after_startup(self) -> float:
        """The transcription rate itself: on a short run start-up is most of the wall time."""
        working = self.elapsed_s - self.startup_s
        return self.audio_seconds / working if working > 0 else 0.0


ProgressCallback = Callable[[RunProgress], None]


def rtfx(audio_seconds: float, seconds: float) -> float | None:
    """Audio seconds per wall second for summary.json, or None (shown as "-") when no audio was
    timed: a run whose items all failed (e.g. --retry-errors on inputs still broken) has no rate,
    not a rate of 0."""
    return audio_seconds / seconds if audio_seconds > 0 and seconds > 0 else None


class CompletedFilter:
    """Passes over items whose ids already have committed records, and counts them. It can run
    before the sink exists (run() starts decoding while the model loads), on a decode thread, so
    the count lives here; `stop` (set by the sink past --max-errors) ends the items early."""

    def __init__(self, state: OutputState, skipped: int = 0):
        self.state = state  # read per item: --overwrite and --retry-errors replace state.completed
        self.skipped = skipped  # includes those first_pending passed over before the model loaded
        self.stop = False

    def __call__(self, items: Iterable[SourceItem]) -> Iterator[SourceItem]:
        for item in items:
            if self.stop:
                return
            if item.id in self.state.completed:
                self.skipped += 1
                continue
            yield item


class Sink:
    """Counts, writes and reports records; decides when --max-errors stops the run."""

    def __init__(self, writer: ShardWriter, state: OutputState, max_errors: int | None,
                 start: float, total: int | None, progress: ProgressCallback | None,
                 load_seconds: float = 0.0, retried: Sequence[dict[str, Any]] = (),
                 skip: CompletedFilter | None = None) -> None:  # fmt: skip
        self.writer, self.state, self.max_errors = writer, state, max_errors
        self.start, self.total, self.progress = start, total, progress
        self.load_seconds = load_seconds
        self.first_record_seconds: float | None = None  # after `start`, when the first record came
        # Error records taken back by --retry-errors whose items have no new record yet: `flush`
        # puts them back (see there).
        self.taken_back = {str(r["id"]): r for r in retried}
        self._taken = len(self.taken_back)
        self.prior_errors = int(state.totals()["errors"])
        self.done = self.ok = self.errors = 0
        self.skip = skip or CompletedFilter(state)
        self.audio_seconds = 0.0
        # Committed errors already past the limit: stop before doing more (a plain rerun keeps them).
        self.stop = max_errors is not None and self.prior_errors > max_errors
        self.skip.stop = self.skip.stop or self.stop
        self._lock = threading.Lock()

    @property
    def total_errors(self) -> int:
        return self.prior_errors + self.errors

    @property
    def skipped(self) -> int:
        return self.skip.skipped

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self.first_record_seconds is None:
                self.first_record_seconds = time.monotonic() - self.start
            self.writer.add(record)
            self.taken_back.pop(str(record["id"]), None)
            self.done += 1
            if record.get("error") is None:
                self.ok += 1
            else:
                self.errors += 1
                if self.max_errors is not None and self.total_errors > self.max_errors:
                    self.stop = self.skip.stop = True
            if isinstance(record.get("duration"), (int, float)):
                self.audio_seconds += float(record["duration"])
            snapshot = self.snapshot() if self.progress is not None else None
        if snapshot is not None:
            self.progress(snapshot)

    def flush(self) -> None:
        """Commit what is buffered, once no more records can come. Error records --retry-errors
        took out whose items this session never reached (past --limit, after a stop) go back first,
        as they were: each id keeps exactly one record, and a later --retry-errors redoes them."""
        with self._lock:
            for record in self.taken_back.values():
                self.writer.add(record)
            self.writer.flush()
            self._taken -= len(self.taken_back)
            self.taken_back = {}

    @property
    def retried(self) -> int:
        """Error records --retry-errors took back whose items have a new record (final after `flush`)."""
        return self._taken - len(self.taken_back)

    def snapshot(self) -> RunProgress:
        total = None if self.total is None else max(self.total - self.skipped, self.done)
        return RunProgress(self.done, self.ok, self.errors, self.skipped, self.audio_seconds,
                           time.monotonic() - self.start, total, self.load_seconds)  # fmt: skip


def estimate_total(inputs: Sequence[str], src: SourceOptions) -> int | None:
    """Item count from Parquet footers / manifest lines / folders where counting is cheap, when
    every input is such a file or folder."""
    count = 0
    for inp in inputs:
        paths = sorted(glob.glob(inp)) if any(c in inp for c in "*?[") else [inp]
        for p in map(Path, paths):
            if p.suffix == ".parquet" and p.is_file():
                import pyarrow.parquet as pq

                count += pq.ParquetFile(p).metadata.num_rows
            elif p.suffix == ".jsonl" and p.is_file():
                with open(p, "rb") as f:
                    count += sum(1 for line in f if line.strip())
            elif p.is_dir() and (in_folder := count_folder_items(p)) is not None:
                count += in_folder
            else:
                return src.limit
    if src.num_shards > 1:
        count = -(-count // src.num_shards)  # hash split: about an even share
    return count if src.limit is None else min(count, src.limit)


def _folder_fields(state: OutputState, status: str) -> dict[str, Any]:
    """The summary's head: the version, the status and the writer's records in the folder."""
    totals = state.totals()
    return {"batchscribe_version": __version__, "status": status, "items": int(totals["items"]),
            "ok": int(totals["ok"]), "errors": int(totals["errors"]),
            "audio_hours": totals["audio_seconds"] / 3600.0, "shards": int(totals["shards"])}  # fmt: skip


def run_summary(inputs: Sequence[str], opts: Any, state: OutputState, sink: Sink,
                described: dict[str, Any], start_time: str, status: str) -> dict[str, Any]:  # fmt: skip
    """summary.json of one writer: its records in the folder, this session, and how it ran
    (`opts`: the run's RunOptions)."""
    wall = time.monotonic() - sink.start
    session_seconds = sink.audio_seconds
    return {
        **_folder_fields(state, status),
        # This session only (a resumed run skips what earlier ones did; --retry-errors replaces
        # `retried_errors` error records, so `items` still counts each id once):
        "this_run": {"items": sink.done, "ok": sink.ok, "errors": sink.errors,
                     "skipped_completed": sink.skipped, "retried_errors": sink.retried,
                     "audio_hours": session_seconds / 3600.0},
        "wall_seconds": wall,
        "rtfx": rtfx(session_seconds, wall),
        # Start-up is a fixed cost: importing torch and the engine, loading the model (first-use
        # conversion), and on CUDA the engine build and graph capture. Without it, the steady rate.
        "model_load_seconds": sink.load_seconds,
        "rtfx_excluding_model_load": rtfx(session_seconds, wall - sink.load_seconds),
        # One measure of start-up for every path (plain, --gpus, --ray): model_load_seconds is the
        # load and capture in one process but the time to the first record under --ray.
        "first_record_seconds": sink.first_record_seconds,
        "start_time": start_time,
        "end_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {"name": opts.model, "info": described.get("model")},
        "engine": described.get("engine"),  # as resolved: device, dtype, kernels, slots, graphs
        "options": {
            "decode": dataclasses.asdict(opts.decode),
            "engine": dataclasses.asdict(opts.engine),  # as asked for
            "format": opts.format, "workers": opts.workers, "max_errors": opts.max_errors,
            "retry_errors": opts.retry_errors,
            "source": {**dataclasses.asdict(opts.source), "passthrough": list(opts.source.passthrough)},
        },
        "inputs": [canonical_input(i) for i in inputs],
        "hostname": hostname(),
        "packages": package_versions(),
    }


def first_pending(items: Iterator[SourceItem], completed: set[str]) -> tuple[int, Iterator[SourceItem] | None]:
    """Skip items whose ids have committed records, up to the first that has none: (how many were
    skipped, the items from that one on), or (skipped, None) when every item is done, so that a
    rerun with nothing left can say so without loading the model."""
    skipped = 0
    for item in items:
        if item.id not in completed:
            return skipped, itertools.chain([item], items)
        skipped += 1
    return skipped, None


def nothing_left_summary(state: OutputState, previous: dict[str, Any], skipped: int, start: float,
                         start_time: str) -> dict[str, Any]:  # fmt: skip
    """summary.json when every item already had a record: the folder's totals, this session's
    nothing, and how the records were made (from the `previous` summary, when there is one)."""
    return {
        **previous, **_folder_fields(state, "complete"),
        "this_run": {"items": 0, "ok": 0, "errors": 0, "skipped_completed": skipped, "retried_errors": 0,
                     "audio_hours": 0.0, "nothing_left": True},
        "wall_seconds": time.monotonic() - start, "rtfx": None, "model_load_seconds": 0.0,
        "rtfx_excluding_model_load": None, "first_record_seconds": None, "start_time": start_time,
        "end_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
