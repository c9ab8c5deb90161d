"""Parquet files, read with pyarrow one row group at a time, in small batches of the needed columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchscribe.audio.sources.columns import make_item, note_columns, resolve_columns
from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions

_PARQUET_BATCH_ROWS = 16  # rows of encoded audio held at once per Parquet reader (~a few MB)
_PARQUET_BUFFER_BYTES = 1 << 20
_RELEASE_BYTES = 64 << 20  # Parquet data read between two returns of Arrow's free pages


def read_parquet(path: Path, opts: SourceOptions) -> Iterator[SourceItem]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # NOTE: pre_buffer (whole column chunks read ahead) and reader threads each keep memory
        # that grows with the number of files read; a 1 MiB buffered stream on this thread keeps
        # peak RSS flat (benchmarks/memory_streaming.py). Audio bytes barely compress, so the
        # single thread costs little.
        pfile = pq.ParquetFile(path, pre_buffer=False, buffer_size=_PARQUET_BUFFER_BYTES)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({exc}); check or re-write the file") from exc
    cols = resolve_columns(pfile.schema_arrow.names, opts, str(path))
    note_columns(cols, opts)
    audio_type = pfile.schema_arrow.field(cols.audio).type
    # A null-typed column (every cell null, e.g. one shard of a dataset whose audio is missing
    # there) is read too: each row becomes an error record naming its id, not a stopped run.
    if not (pa.types.is_null(audio_type) or pa.types.is_struct(audio_type) or pa.types.is_string(audio_type)
            or pa.types.is_large_string(audio_type) or pa.types.is_binary(audio_type)
            or pa.types.is_large_binary(audio_type)):
        raise SourceError(
            f"{path}: column {cols.audio!r} has type {audio_type}, not audio (a {{bytes, path}} struct, "
            f"a path string or bytes); choose the audio column with --audio-column NAME"
        )
    row = 0
    # One row group at a time, handed out in small batches, so memory is bounded by one row
    # group's selected columns, whatever the file size.
    for group in range(pfile.num_row_groups):
        batches = pfile.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group], columns=cols.needed,
                                     use_threads=False)  # fmt: skip
        for batch in batches:
            columns = {name: _cells(batch.column(name)) if name == cols.audio and opts.audio_views
                       else batch.column(name).to_pylist() for name in cols.needed}  # fmt: skip
            n_rows = batch.num_rows
            del batch
            for i in range(n_rows):
                cells = {name: values[i] for name, values in columns.items()}
                yield make_item(cells, cols, f"{path.stem}:{row}", path.parent, f"{path.name}:{row}")
                row += 1
        # NOTE: Arrow's allocator (mimalloc) keeps freed pages, and over many files that retention
        # grows peak RSS; handing them back keeps it flat. Each call holds the GIL for milliseconds
        # (which the GPU engine's thread and every decode thread wait for): once per
        # _RELEASE_BYTES read in this process, not per batch or row group (64-row groups are
        # common), nor per file (small files are too).
        _read_bytes(pfile.metadata.row_group(group).total_byte_size)


_unreleased = 0  # bytes read since Arrow's free pages were last handed back (any reader, any file)


def _read_bytes(n: int) -> None:
    """Count `n` bytes read; hand Arrow's free pages back once _RELEASE_BYTES have been. Readers on
    two threads may race on the count: a release comes a little early or late, nothing worse."""
    global _unreleased
    import pyarrow as pa

    _unreleased += n
    if _unreleased >= _RELEASE_BYTES:
        _unreleased = 0
        pa.default_memory_pool().release_unused()


def _cells(column: Any) -> list[Any]:
    """An audio column's cells as Python values, with encoded bytes as zero-copy views of Arrow's
    buffer: `to_pylist` copies each file into a new bytes object while holding the GIL, which the
    GPU engine's thread then waits for."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return binary_views(column)
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        names = [kind.field(i).name for i in range(kind.num_fields)]
        children = dict(zip(names, column.flatten()))  # flatten applies the struct's offset and nulls
        data = children["bytes"]
        if pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type):
            views = binary_views(data)
            others = {name: child.to_pylist() for name, child in children.items() if name != "bytes"}
            valid = column.is_valid().to_pylist()
            return [
                {"bytes": views[i], **{name: values[i] for name, values in others.items()}} if valid[i] else None
                for i in range(len(column))
            ]
    return column.to_pylist()


def binary_views(array: Any) -> list[memoryview | None]:
    """Each cell of a (large) binary array as a view of its data buffer; None for nulls."""
    import numpy as np
    import pyarrow as pa

    _, offsets, data = array.buffers()
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    ends = np.frombuffer(offsets, dtype=width)[array.offset : array.offset + len(array) + 1].tolist()
    view = memoryview(data).cast("B") if data is not None else memoryview(b"")  # Arrow exports signed "b"
    valid = array.is_valid().to_pylist() if array.null_count else [True] * len(array)
    return [view[ends[i] : ends[i + 1]] if valid[i] else None for i in range(len(array))]
