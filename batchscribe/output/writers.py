"""Record shards on disk: JSONL (default) or Parquet, each committed atomically, plus summary.json.

A shard is written to a hidden temp file (`.records-00003.jsonl.tmp`), flushed, fsynced, renamed
over its final name and the directory fsynced. A reader (or a resumed run) therefore sees either
the whole shard or nothing; a temp file left by a killed run matches no output glob and is removed
by the next run (see resume.py). File names come from counters only, never from item ids.
"""

from __future__ import annotations

import io
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import date, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np

OutputFormat = Literal["jsonl", "parquet"]
FORMATS: tuple[OutputFormat, ...] = ("jsonl", "parquet")
SUMMARY_NAME = "summary.json"

# Fields every record may carry; anything else in a record is a passthrough column.
CORE_FIELDS = ("id", "text", "language", "duration", "segments", "error", "reference")
SEGMENT_FIELDS = (
    "id", "seek", "start", "end", "text", "tokens",
    "temperature", "avg_logprob", "compression_ratio", "no_speech_prob",
)
# Optional core fields a Parquet row holds as null but a JSONL record simply omits.
_OMIT_WHEN_NULL = ("text", "language", "segments", "error", "reference")


def shard_name(prefix: str, index: int, fmt: OutputFormat) -> str:
    return f"{prefix}-{index:05d}.{fmt}"


def temp_name(final_name: str) -> str:
    # Leading dot and trailing .tmp: no `records-*.jsonl` or `*.parquet` glob ever matches it.
    return f".{final_name}.tmp"


# ---------------------------------------------------------------------------------------------
# Encoding


def _json_default(value: Any) -> Any:
    """Passthrough columns arrive from Parquet/datasets; make their numpy/date values JSON."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"value of type {type(value).__name__} is not JSON serialisable: {value!r:.80}")


def _finite(value: Any) -> Any:
    # json.dumps would write NaN/Infinity, which is not JSON; null keeps every line parseable.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def jsonl_line(record: dict[str, Any]) -> str:
    try:  # nearly every record is finite: no walk over its segments and tokens first (~40 us each)
        return json.dumps(record, ensure_ascii=False, default=_json_default, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere: written as null
        return json.dumps(_finite(record), ensure_ascii=False, default=_json_default, allow_nan=False)


def encode_jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    return join_jsonl([jsonl_line(r) for r in records])


def join_jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def _segment_type() -> Any:
    import pyarrow as pa

    return pa.struct([
        ("id", pa.int32()),
        ("seek", pa.int32()),
        ("start", pa.float64()),
        ("end", pa.float64()),
        ("text", pa.string()),
        ("tokens", pa.list_(pa.int32())),
        ("temperature", pa.float64()),
        ("avg_logprob", pa.float64()),
        ("compression_ratio", pa.float64()),
        ("no_speech_prob", pa.float64()),
    ])


def core_schema() -> Any:
    """The fixed Parquet schema of the core fields; passthrough columns follow them."""
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),
        ("text", pa.string()),
        ("language", pa.string()),
        ("duration", pa.float64()),
        ("segments", pa.list_(_segment_type())),
        ("error", pa.string()),
        ("reference", pa.string()),
    ])


def _has_null_type(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_null(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_null_type(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_null_type(f.type) for f in t)
    return False


def _has_empty_struct(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_empty_struct(t.value_type)
    if pa.types.is_struct(t):
        return t.num_fields == 0 or any(_has_empty_struct(f.type) for f in t)
    return False


def _passthrough_array(values: list[Any], known: Any | None) -> Any:
    import pyarrow as pa

    try:
        arr = pa.array(values)
        if _has_empty_struct(arr.type):
            # An empty dict ({}) infers a struct without fields, which Parquet cannot store.
            raise pa.ArrowNotImplementedError("struct without fields")
        if known is not None and arr.type != known and _has_null_type(arr.type):
            # An all-null (or all-empty-list) shard would otherwise get a null type that no
            # reader can unify with the other shards' real type.
            arr = pa.array(values, type=known)
        return arr
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
        # Mixed or exotic types: keep the values, as JSON text, rather than drop the column.
        return pa.array([None if v is None else json.dumps(v, default=_json_default) for v in values],
                        type=pa.string())


def encode_parquet(records: list[dict[str, Any]], known_types: dict[str, Any] | None = None) -> bytes:
    """One Parquet file: the fixed core schema, then passthrough columns with inferred types.

    `known_types` (updated in place) remembers each passthrough column's first concrete type so
    later shards whose values are all null still get that type.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = core_schema()
    columns: dict[str, Any] = {}
    for field in schema:
        values = [r.get(field.name) for r in records]
        if field.name == "segments":
            values = [None if s is None else [{k: seg.get(k) for k in SEGMENT_FIELDS} for seg in s]
                      for s in values]
        columns[field.name] = pa.array(values, type=field.type)
    extra_names: list[str] = []
    for r in records:
        extra_names.extend(k for k in r if k not in CORE_FIELDS and k not in extra_names)
    known = {} if known_types is None else known_types
    for name in extra_names:
        arr = _passthrough_array([r.get(name) for r in records], known.get(name))
        if name not in known and not _has_null_type(arr.type):
            known[name] = arr.type
        columns[name] = arr
    table = pa.table(columns)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def encode_shard(records: list[dict[str, Any]], fmt: OutputFormat,
                 known_types: dict[str, Any] | None = None) -> bytes:
    if fmt == "jsonl":
        return encode_jsonl(records)
    if fmt == "parquet":
        return encode_parquet(records, known_types)
    raise ValueError(f"format={fmt!r} is not supported; use one of {FORMATS}")


def read_shard(path: Path) -> list[dict[str, Any]]:
    """Records of one committed shard, in the same shape as they were given to the writer."""
    path = Path(path)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return [{k: v for k, v in row.items() if not (k in _OMIT_WHEN_NULL and v is None)}
                for row in rows]
    raise ValueError(f"{path} is not a .jsonl or .parquet shard")


def read_shard_ids(path: Path) -> list[str]:
    """Only the ids of a shard (a column read for Parquet), for rebuilding the manifest."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [str(v) for v in pq.read_table(path, columns=["id"]).column("id").to_pylist()]
    return [r["id"] for r in read_shard(path)]


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


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash at any point leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(temp_name(path.name))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk or a kill mid-write: nothing half-written may keep a readable name.
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    text = json.dumps(_finite(obj), indent=2, ensure_ascii=False, default=_json_default)
    write_atomic(path, (text + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Shard writer

CommitCallback = Callable[[str, list[dict[str, Any]]], None]


class ShardWriter:
    """Buffers records and commits them as numbered shards.

    A shard is committed when it holds `shard_size` records or its first record has waited
    `commit_seconds` (so a slow run still makes progress durable). `on_commit(name, records)` runs
    after each rename; resume.py uses it to append the manifest. Thread-safe: the transcriber may
    pull inputs (and so emit decode-error records) from another thread than the one writing results.

    JSONL records are encoded as they arrive, not when the shard commits: on a GPU run the records
    come from the engine's thread between launches, while the device still has steps queued, and a
    1,000-record shard encoded at once (~50-70 ms) stalled the end of every W1 run.
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
        self._buffer: list[dict[str, Any]] = []
        self._lines: list[str] = []  # JSONL: each buffered record, encoded
        self._first_at = 0.0
        self._lock = threading.Lock()
        self._types: dict[str, Any] = {}  # Parquet passthrough column types seen so far
        self.committed: list[str] = []

    def add(self, record: dict[str, Any]) -> None:
        if "id" not in record:
            raise ValueError(f"record without an 'id' cannot be written: {record!r:.120}")
        line = jsonl_line(record) if self.fmt == "jsonl" else None  # outside the lock: may raise
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
            data = join_jsonl(lines) if self.fmt == "jsonl" else encode_shard(records, self.fmt, self._types)
            write_atomic(self.directory / name, data)
        except BaseException:
            self._buffer = records + self._buffer  # not committed: keep them for a retry
            self._lines = lines + self._lines
            raise
        self.next_index += 1
        self.committed.append(name)
        if self.on_commit is not None:
            self.on_commit(name, records)

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
