"""The two record shard formats, JSONL (default) and Parquet: records -> bytes, and a shard back.

JSONL is strict JSON, one record a line (NaN and infinity become null). Parquet has a fixed schema
for the core fields, so every shard of a run reads as one table; passthrough columns follow with
their types inferred, and fall back to JSON text when Arrow cannot type them.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

OutputFormat = Literal["jsonl", "parquet"]
FORMATS: tuple[OutputFormat, ...] = ("jsonl", "parquet")

# Fields every record may carry; anything else in a record is a passthrough column.
CORE_FIELDS = ("id", "text", "language", "duration", "segments", "words", "error", "reference")
SEGMENT_FIELDS = (
    "id", "seek", "start", "end", "text", "tokens",
    "temperature", "avg_logprob", "compression_ratio", "no_speech_prob",
)
# Optional core fields a Parquet row holds as null but a JSONL record simply omits.
_OMIT_WHEN_NULL = ("text", "language", "segments", "words", "error", "reference")


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
    """`jsonl_bytes` as text (Ray's record column)."""
    return jsonl_bytes(record).decode("utf-8")


def jsonl_bytes(record: dict[str, Any]) -> bytes:
    """One record as a line of strict JSON (no newline; NaN and infinity as null), UTF-8.

    orjson writes a record with word timestamps ~10x faster than json.dumps (its floats were most
    of the engine thread's cost per record; docs/GPU_NOTES.md). Anything orjson refuses (a
    dict with non-string keys, an integer past 64 bits, a value `_json_default` rejects) goes
    the json module's way, which writes the same values or raises the same error."""
    try:
        return orjson.dumps(record, default=_json_default, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        pass
    try:
        text = json.dumps(record, ensure_ascii=False, default=_json_default, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere: written as null
        text = json.dumps(_finite(record), ensure_ascii=False, default=_json_default, allow_nan=False)
    return text.encode("utf-8")


# Dates, times and dataclasses go to `_json_default` as they did with the json module: the same
# isoformat for a date or datetime; a time or a dataclass refused, which orjson would write.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def encode_jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    return join_jsonl([jsonl_bytes(r) for r in records])


def join_jsonl(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n" if lines else b""


def json_document(obj: Any) -> bytes:
    """A small JSON file (summary.json, run_config.json): indented, NaN/inf as null."""
    text = json.dumps(_finite(obj), indent=2, ensure_ascii=False, default=_json_default)
    return (text + "\n").encode("utf-8")


def _word_type(probability: bool) -> Any:
    import pyarrow as pa

    fields = [("word", pa.string()), ("start", pa.float64()), ("end", pa.float64())]
    return pa.struct(fields + [("probability", pa.float64())] if probability else fields)


def _segment_type(words: bool = False) -> Any:
    import pyarrow as pa

    # Fields in SEGMENT_FIELDS order (then `words`): encode_parquet fills them by those names.
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
    ] + ([("words", pa.list_(_word_type(True)))] if words else []))


def core_schema(words: bool = False) -> Any:
    """The fixed Parquet schema of the core fields; passthrough columns follow them. `words`: a
    run with word timestamps (per-segment words with probability, top-level words without), so
    every shard of such a run has the columns, even one holding only error records."""
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),
        ("text", pa.string()),
        ("language", pa.string()),
        ("duration", pa.float64()),
        ("segments", pa.list_(_segment_type(words))),
    ] + ([("words", pa.list_(_word_type(False)))] if words else []) + [
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


def encode_parquet(records: list[dict[str, Any]], known_types: dict[str, Any] | None = None,
                   words: bool = False) -> bytes:
    """One Parquet file: the fixed core schema, then passthrough columns with inferred types.

    `known_types` (updated in place) remembers each passthrough column's first concrete type so
    later shards whose values are all null still get that type.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = words or any("words" in r for r in records)
    schema = core_schema(words)
    seg_fields = SEGMENT_FIELDS + (("words",) if words else ())
    columns: dict[str, Any] = {}
    for field in schema:
        values = [r.get(field.name) for r in records]
        if field.name == "segments":
            values = [None if s is None else [{k: seg.get(k) for k in seg_fields} for seg in s]
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
                 known_types: dict[str, Any] | None = None, words: bool = False) -> bytes:
    if fmt == "jsonl":
        return encode_jsonl(records)
    if fmt == "parquet":
        return encode_parquet(records, known_types, words)
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

