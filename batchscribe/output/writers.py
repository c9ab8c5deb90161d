"""Committing record shards to disk, atomically, and writing summary.json.

A shard is written to a hidden temp file (`.records-00003.jsonl.tmp`), flushed, fsynced, renamed
over its final name and the directory fsynced. A reader (or a resumed run) therefore sees either
the whole shard or nothing; a temp file left by a killed run matches no output glob and is removed
by the next run (see resume.py). File names come from counters only, never from item ids.
The shard encodings themselves live in formats.py.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

# CORE_FIELDS and read_shard are re-exported: callers import the shard API from writers.
from batchscribe.output.formats import (
    CORE_FIELDS,
    FORMATS,
    OutputFormat,
    encode_shard,
    join_jsonl,
    json_document,
    jsonl_bytes,
    read_shard,
)

__all__ = ["CORE_FIELDS", "FORMATS", "SUMMARY_NAME", "OutputFormat", "ShardWriteError", "ShardWriter", "encode_shard",
           "fsync_dir", "hostname", "package_versions", "read_shard", "write_atomic", "write_json_atomic",
           "write_summary"]

SUMMARY_NAME = "summary.json"


def shard_name(prefix: str, index: int, fmt: OutputFormat) -> str:
    return f"{prefix}-{index:05d}.{fmt}"


def temp_name(final_name: str) -> str:
    # Leading dot and trailing .tmp: no `records-*.jsonl` or `*.parquet` glob ever matches it.
    return f".{final_name}.tmp"


# ---------------------------------------------------------------------------------------------
# Atomic commit


def fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is; not all platforms allow this.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, sync_dir: bool = True) -> None:
    """Write `data` to `path` so that a crash at any point leaves the old file or the new one.
    sync_dir=False: the caller syncs the folder once after many files (the rename is durable then)."""
    path = Path(path)
    tmp = path.with_name(temp_name(path.name))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk mid-write: nothing half-written may keep a readable name
        if exc.filename is not None:
            raise
        # write() and fsync() name no file ("[Errno 28] No space left on device"): name it.
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)  # a kill mid-write: the same
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json_document(obj))


# ---------------------------------------------------------------------------------------------
# Shard writer

CommitCallback = Callable[[str, list[dict[str, Any]]], None]
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class ShardWriteError(OSError):
    """A shard could not be committed (a full disk, a quota, permissions): the message names the
    shard and its folder, says that the shards committed before are kept, and how to go on."""

    def __str__(self) -> str:
        return str(self.strerror)  # the whole message, without "[Errno 28]" before it


def _commit_error(exc: OSError, what: str, directory: Path, committed: int) -> ShardWriteError:
    fix = (f"free space on the disk that holds {directory} (or raise its quota)" if exc.errno in _DISK_FULL
           else "fix the cause")  # fmt: skip
    return ShardWriteError(
        exc.errno, f"cannot {what}: {exc.strerror or exc}. The {committed} shard(s) this run committed to "
        f"{directory}, and any earlier run's, are kept; {fix}, then rerun the same command: it resumes after the "
        "committed records and transcribes the rest again")  # fmt: skip


class ShardWriter:
    """Buffers records and commits them as numbered shards.

    A shard is committed when it holds `shard_size` records or its first record has waited
    `commit_seconds` (so a slow run still makes progress durable). `on_commit(name, records)` runs
    after each rename; resume.py uses it to append the manifest. Thread-safe: the transcriber may
    pull inputs (and so emit decode-error records) from another thread than the one writing results.

    JSONL records are encoded as they arrive, not when the shard commits: on a GPU run the records
    come from the engine's thread between launches, while the device still has steps queued, and
    encoding a whole shard at once stalled the run (measured, docs/GPU_NOTES.md).
    """

    def __init__(
        self,
        directory: Path,
        fmt: OutputFormat = "jsonl",
        prefix: str = "records",
        first_index: int = 0,
        shard_size: int = 1000,
        commit_seconds: float = 60.0,
        on_commit: CommitCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        words: bool = False,  # word timestamps: Parquet shards carry the words columns
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"format={fmt!r} is not supported; use one of {FORMATS}")
        if shard_size < 1:
            raise ValueError(f"shard_size={shard_size} must be >= 1")
        self.directory = Path(directory)
        self.fmt: OutputFormat = fmt
        self.prefix = prefix
        self.next_index = first_index
        self.shard_size = shard_size
        self.commit_seconds = commit_seconds
        self.on_commit = on_commit
        self._clock = clock
        self.words = words
        self._buffer: list[dict[str, Any]] = []
        self._lines: list[bytes] = []  # JSONL: each buffered record, encoded
        self._first_at = 0.0
        self._lock = threading.Lock()
        self._types: dict[str, Any] = {}  # Parquet passthrough column types seen so far
        self.committed: list[str] = []

    def add(self, record: dict[str, Any]) -> None:
        if "id" not in record:
            raise ValueError(f"record without an 'id' cannot be written: {record!r:.120}")
        line = jsonl_bytes(record) if self.fmt == "jsonl" else None  # outside the lock: may raise
        with self._lock:
            if not self._buffer:
                self._first_at = self._clock()
            self._buffer.append(record)
            if line is not None:
                self._lines.append(line)
            if self._due():
                self._commit_locked()

    def _due(self) -> bool:
        if len(self._buffer) >= self.shard_size:
            return True
        return self._clock() - self._first_at >= self.commit_seconds

    def flush(self) -> None:
        """Commit whatever is buffered (used at the end of a run and before an early stop)."""
        with self._lock:
            self._commit_locked()

    def _commit_locked(self) -> None:
        if not self._buffer:
            return
        records, self._buffer = self._buffer, []
        lines, self._lines = self._lines, []
        name = shard_name(self.prefix, self.next_index, self.fmt)
        try:
            data = join_jsonl(lines) if self.fmt == "jsonl" else encode_shard(records, self.fmt, self._types, self.words)
            write_atomic(self.directory / name, data)
        except BaseException as exc:
            self._buffer = records + self._buffer  # not committed: keep them for a retry
            self._lines = lines + self._lines
            if isinstance(exc, OSError) and not isinstance(exc, ShardWriteError):
                raise _commit_error(exc, f"write {len(records)} record(s) to {self.directory / name}", self.directory,
                                    len(self.committed)) from exc  # fmt: skip
            raise
        self.next_index += 1
        self.committed.append(name)
        if self.on_commit is not None:
            try:
                self.on_commit(name, records)
            except OSError as exc:  # the shard is whole on disk: a rerun adopts it without its manifest line
                raise _commit_error(exc, f"list {name} in the folder's manifest", self.directory,
                                    len(self.committed)) from exc  # fmt: skip

    @property
    def pending(self) -> int:
        return len(self._buffer)


# ---------------------------------------------------------------------------------------------
# summary.json

_VERSIONED = ("batchscribe", "torch", "numpy", "safetensors", "tokenizers", "pyarrow", "datasets",
              "soundfile", "soxr", "av", "huggingface_hub", "flashinfer-python")


def package_versions(names: tuple[str, ...] = _VERSIONED) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hostname() -> str:
    return socket.gethostname()


def write_summary(directory: Path, summary: dict[str, Any], name: str = SUMMARY_NAME) -> Path:
    path = Path(directory) / name
    write_json_atomic(path, summary)
    return path
