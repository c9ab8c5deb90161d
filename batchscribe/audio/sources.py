"""Input sources: turn what users point `batchscribe run` at into a stream of undecoded items.

Supported inputs (detected per input string, in this order):

- a glob (`*`, `?`, `[` and no such path): every match, sorted, is read as its own input;
- a `.parquet` file, read with pyarrow batch by batch (only the needed columns);
- a `.jsonl` / `.csv` / `.tsv` manifest (an audio path per row, optional id and text);
- an audio file (one item);
- a folder holding `dataset_info.json` or `state.json` (one split) or `dataset_dict.json`:
  a `datasets` `save_to_disk` folder, read with `load_from_disk`;
- a folder with a `README.md` and Parquet files or a `data/` folder: a hub-style dataset, read with
  `datasets.load_dataset(folder)`;
- any other folder with Parquet files: every `*.parquet` below it, sorted by relative path;
- a folder with `metadata.jsonl` / `metadata.csv` (the `audiofolder` convention): that manifest;
- a folder of audio files, recursive (depth first, names sorted in each folder); other files
  are skipped;
- anything else that looks like `name` or `owner/name`: a Hugging Face hub dataset id.

Audio is never decoded here: an item carries the encoded bytes or a path, so a broken file becomes
an error record later (`pool.decode_stream`) instead of stopping the run. Problems with the input
as a whole (missing path, missing column, nothing to read) raise `SourceError`.

Memory stays flat: every reader is a generator that holds at most one small Parquet batch or one
dataset row; the only state that grows is the set of ids seen (for the duplicate rule below).
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchscribe.config import ConfigError

AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".ogg", ".oga", ".mp3", ".m4a", ".mp4", ".opus", ".webm", ".aac", ".wma",
     ".aif", ".aiff"}
)
MANIFEST_EXTENSIONS = frozenset({".jsonl", ".csv", ".tsv"})
# Columns a manifest may name its audio path with, after the configured audio column.
MANIFEST_PATH_COLUMNS = ("path", "file_name", "file")
_PARQUET_BATCH_ROWS = 16  # rows of encoded audio held at once per Parquet reader (~a few MB)
_PARQUET_BUFFER_BYTES = 1 << 20
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class SourceError(ValueError):
    """The input cannot be read as a whole; the message names the input, the problem and the fix."""


@dataclass(frozen=True)
class SourceOptions:
    """How inputs are read. Column names default to the Hugging Face datasets convention."""

    audio_column: str = "audio"
    id_column: str | None = None  # None: "id" when that column exists, else a derived id
    text_column: str | None = None  # None: "text" when that column exists, else no reference
    passthrough: tuple[str, ...] = ()  # columns copied into SourceItem.extra
    config: str | None = None  # datasets config name (hub ids and hub-style folders)
    split: str | None = None  # datasets split; needed only when a dataset has several
    streaming: bool = True  # datasets: stream rows instead of downloading/preparing first
    num_shards: int = 1
    shard_index: int = 0
    limit: int | None = None  # items of this shard, counted after sharding
    # Parquet audio bytes as views of Arrow's buffers instead of copies: for decoding in threads of
    # this process (GPU runs), where each copy held the GIL. Copies cost decode processes less
    # memory (views keep whole Arrow batches alive until the pool copies them anyway).
    audio_views: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "passthrough", tuple(self.passthrough))
        if self.num_shards < 1:
            raise ConfigError(f"num_shards={self.num_shards} must be >= 1")
        if not 0 <= self.shard_index < self.num_shards:
            raise ConfigError(
                f"shard_index={self.shard_index} is outside 0..{self.num_shards - 1}; "
                f"give --shard-index between 0 and --num-shards - 1"
            )
        if self.limit is not None and self.limit < 0:
            raise ConfigError(f"limit={self.limit} is negative; use a count >= 0")
        if not self.audio_column:
            raise ConfigError("audio_column is empty; name the column holding the audio")


@dataclass(frozen=True)
class SourceItem:
    """One input item, audio still encoded.

    `audio_bytes` is the encoded file when the source stores bytes; otherwise `path` is where the
    audio lives (resolved against the Parquet file's or manifest's folder). When both are set,
    `path` is only the original file name recorded next to the bytes. Parquet's bytes are a
    read-only view of Arrow's buffer, not a copy (pickled as bytes).
    """

    id: str
    audio_bytes: bytes | memoryview | None
    path: str | None
    text: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A memoryview cannot be pickled (to a decode process, or by Ray): send its bytes.
        data = bytes(self.audio_bytes) if isinstance(self.audio_bytes, memoryview) else self.audio_bytes
        return SourceItem, (self.id, data, self.path, self.text, self.extra)


def iter_source(inputs: Sequence[str], opts: SourceOptions) -> Iterator[SourceItem]:
    """Stream the items of `inputs` (in order) that belong to shard `opts.shard_index`.

    Ids: the id column's value (as str); without one, a derived id that is stable across runs:
    `<file stem>:<row>` for Parquet (row within the file), `<split>:<row>` for datasets, the
    path relative to the folder without its audio extension for audio folders (`a/b.flac` ->
    `a/b`), and the path as written in the manifest without its audio extension for manifests.

    Duplicate ids: the first occurrence keeps its id; the k-th occurrence (k >= 2) becomes
    `<id>#k` (k increased further if that is taken too). The rule is applied over all items
    before sharding, so every shard agrees with an unsharded run.

    Sharding: an item belongs to shard `blake2b(id) % num_shards` (its final id, 8-byte digest),
    so the shards are disjoint, their union is the whole input, and the split does not depend on
    input order. Every shard still reads the whole input. `limit` counts items of this shard.

    Paths and input kinds are checked here (missing path: `SourceError` at once); column problems
    and empty inputs raise `SourceError` when that input is reached during iteration.
    """
    if not inputs:
        raise SourceError("no input given; pass a Parquet file, folder, glob, manifest or dataset id")
    readers = [(inp, _plan(inp, opts)) for inp in inputs]
    return _select(_read_all(readers), opts)


def shard_of(item_id: str, num_shards: int) -> int:
    """The shard an id belongs to (stable across processes, machines and Python versions)."""
    digest = hashlib.blake2b(item_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def _read_all(readers: list[tuple[str, Callable[[], Iterator[SourceItem]]]]) -> Iterator[SourceItem]:
    for inp, reader in readers:
        count = 0
        for item in reader():
            count += 1
            yield item
        if count == 0:
            raise SourceError(f"input {inp!r} contains no items; check that it is the right path")


def _select(items: Iterable[SourceItem], opts: SourceOptions) -> Iterator[SourceItem]:
    seen: set[str] = set()
    next_suffix: dict[str, int] = {}  # duplicated id -> the k to try next (no O(k^2) rescans)
    taken = 0
    if opts.limit == 0:
        return
    for item in items:
        item_id = item.id
        if item_id in seen:
            k = next_suffix.get(item.id, 2)
            while f"{item.id}#{k}" in seen:
                k += 1
            next_suffix[item.id] = k + 1
            item_id = f"{item.id}#{k}"
            item = SourceItem(item_id, item.audio_bytes, item.path, item.text, item.extra)
        seen.add(item_id)
        if opts.num_shards > 1 and shard_of(item_id, opts.num_shards) != opts.shard_index:
            continue
        yield item
        taken += 1
        if opts.limit is not None and taken >= opts.limit:
            return


# ---------------------------------------------------------------------------------- detection


def _plan(inp: str, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    """Decide what `inp` is and return a reader for it (nothing is read yet)."""
    path = Path(inp).expanduser()
    if not path.exists() and any(ch in inp for ch in "*?["):
        matches = sorted(glob.glob(str(path), recursive=True))
        if not matches:
            raise SourceError(f"glob {inp!r} matches no files; check the pattern and quote it")
        plans = [_plan(m, opts) for m in matches]
        return lambda: (item for plan in plans for item in plan())
    if path.is_file():
        return _plan_file(path, opts)
    if path.is_dir():
        return _plan_dir(path, opts)
    looks_local = inp.startswith((".", "/", "~")) or path.suffix.lower() in (
        AUDIO_EXTENSIONS | MANIFEST_EXTENSIONS | {".parquet", ".arrow"}
    )
    if looks_local or not _HUB_ID.match(inp):
        raise SourceError(f"input {inp!r} does not exist; check the path (no file, folder or glob match)")
    return lambda: _read_dataset_hub(inp, opts)


def _plan_file(path: Path, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return lambda: _read_parquet(path, opts)
    if suffix == ".jsonl":
        return lambda: _read_manifest(path, _jsonl_rows(path), opts)
    if suffix in (".csv", ".tsv"):
        return lambda: _read_manifest(path, _csv_rows(path), opts)
    if suffix in AUDIO_EXTENSIONS:
        _no_passthrough(path, opts)
        return lambda: iter([_audio_file_item(path, path.stem)])
    raise SourceError(
        f"{path}: unsupported file type {suffix or '(none)'}; give a .parquet file, a .jsonl/.csv "
        f"manifest, an audio file ({', '.join(sorted(AUDIO_EXTENSIONS))}) or a folder"
    )


def _plan_dir(path: Path, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    if any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
        return lambda: _read_dataset_disk(path, opts)
    parquet = sorted(path.rglob("*.parquet"), key=lambda p: p.relative_to(path).as_posix())
    if (path / "README.md").is_file() and (parquet or (path / "data").is_dir()):
        return lambda: _read_dataset_hub(str(path), opts, base_dir=path)
    if parquet:
        return lambda: (item for f in parquet for item in _read_parquet(f, opts))
    for name in ("metadata.jsonl", "metadata.csv"):
        manifest = path / name
        if manifest.is_file():
            return _plan_file(manifest, opts)
    if next(_walk_audio(path), None) is None:
        n_files = sum(1 for p in path.rglob("*") if p.is_file())
        raise SourceError(
            f"{path}: no Parquet files, dataset or audio files found ({n_files} other files); "
            f"audio extensions read are {', '.join(sorted(AUDIO_EXTENSIONS))}"
        )
    _no_passthrough(path, opts)
    return lambda: _read_audio_folder(path)


def _no_passthrough(where: Path, opts: SourceOptions) -> None:
    if opts.passthrough:
        raise SourceError(
            f"{where}: audio files have no columns to pass through ({', '.join(opts.passthrough)}); "
            f"drop --passthrough or use a manifest/Parquet input"
        )


# ------------------------------------------------------------------------------------ columns


@dataclass(frozen=True)
class _Columns:
    audio: str
    id: str | None
    text: str | None
    passthrough: tuple[str, ...]

    @property
    def needed(self) -> list[str]:
        names = [self.audio, self.id, self.text, *self.passthrough]
        return list(dict.fromkeys(n for n in names if n is not None))


def _resolve_columns(
    available: Sequence[str], opts: SourceOptions, where: str, audio_column: str | None = None
) -> _Columns:
    """Pick the columns to read; a missing one raises with the available names and the flag."""
    audio_column = audio_column or opts.audio_column

    def missing(what: str, name: str, flag: str) -> SourceError:
        return SourceError(
            f"{where}: no {what} column {name!r}; available columns: {', '.join(available)}; "
            f"choose one with {flag} NAME"
        )

    if audio_column not in available:
        raise missing("audio", audio_column, "--audio-column")
    for name, flag in ((opts.id_column, "--id-column"), (opts.text_column, "--text-column")):
        if name is not None and name not in available:
            raise missing(flag[2:].replace("-column", ""), name, flag)
    for name in opts.passthrough:
        if name not in available:
            raise missing("passthrough", name, "--passthrough")
    id_col = opts.id_column or ("id" if "id" in available else None)
    text_col = opts.text_column or ("text" if "text" in available else None)
    return _Columns(audio_column, id_col, text_col, opts.passthrough)


def _audio_value(value: Any, base_dir: Path | None) -> tuple[bytes | None, str | None]:
    """An audio cell (`{bytes, path}` struct, path string or raw bytes) -> (bytes, path)."""
    if isinstance(value, dict):
        data, where = value.get("bytes"), value.get("path")
        if data:
            return (data if isinstance(data, memoryview) else bytes(data)), where
        return None, _resolve_path(where, base_dir) if where else None
    if isinstance(value, memoryview):
        return value, None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), None
    if isinstance(value, str) and value:
        return None, _resolve_path(value, base_dir)
    return None, None  # null or empty cell: the pool reports it as an item error


def _resolve_path(where: str, base_dir: Path | None) -> str:
    if "://" in where or base_dir is None or Path(where).is_absolute():
        return where
    return str(base_dir / where)


def _make_item(row: dict[str, Any], cols: _Columns, derived_id: str, base_dir: Path | None) -> SourceItem:
    data, where = _audio_value(row[cols.audio], base_dir)
    raw_id = row[cols.id] if cols.id is not None else None
    raw_text = row[cols.text] if cols.text is not None else None
    return SourceItem(
        id=str(raw_id) if raw_id is not None and raw_id != "" else derived_id,
        audio_bytes=data,
        path=where,
        text=str(raw_text) if raw_text is not None else None,
        extra={name: row[name] for name in cols.passthrough},
    )


# ------------------------------------------------------------------------------------ readers


def _read_parquet(path: Path, opts: SourceOptions) -> Iterator[SourceItem]:
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
    cols = _resolve_columns(pfile.schema_arrow.names, opts, str(path))
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
                yield _make_item(cells, cols, f"{path.stem}:{row}", path.parent)
                row += 1
        # NOTE: Arrow's allocator (mimalloc) keeps freed pages; over many files that retention
        # grew peak RSS by ~20% (838 vs 100 rows). Handing them back keeps it flat. Once per row
        # group, not per batch: each call holds the GIL ~1.7 ms, which the GPU engine's thread
        # (and every decode thread) then waits for (~100 us per LibriSpeech row).
        pa.default_memory_pool().release_unused()


def _cells(column: Any) -> list[Any]:
    """An audio column's cells as Python values, with encoded bytes as zero-copy views of Arrow's
    buffer: `to_pylist` copies each file into a new bytes object while holding the GIL, which the
    GPU engine's thread then waits for (~85 us per LibriSpeech row)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _binary_views(column)
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        names = [kind.field(i).name for i in range(kind.num_fields)]
        children = dict(zip(names, column.flatten()))  # flatten applies the struct's offset and nulls
        data = children["bytes"]
        if pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type):
            views = _binary_views(data)
            others = {name: child.to_pylist() for name, child in children.items() if name != "bytes"}
            valid = column.is_valid().to_pylist()
            return [
                {"bytes": views[i], **{name: values[i] for name, values in others.items()}} if valid[i] else None
                for i in range(len(column))
            ]
    return column.to_pylist()


def _binary_views(array: Any) -> list[memoryview | None]:
    """Each cell of a (large) binary array as a view of its data buffer; None for nulls."""
    import numpy as np
    import pyarrow as pa

    _, offsets, data = array.buffers()
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    ends = np.frombuffer(offsets, dtype=width)[array.offset : array.offset + len(array) + 1].tolist()
    view = memoryview(data).cast("B") if data is not None else memoryview(b"")  # Arrow exports signed "b"
    valid = array.is_valid().to_pylist() if array.null_count else [True] * len(array)
    return [view[ends[i] : ends[i + 1]] if valid[i] else None for i in range(len(array))]


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a text manifest; a line that is not UTF-8 raises SourceError naming it."""
    with path.open("rb") as fh:  # decoded line by line, so the error names the right line
        for line_no, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SourceError(
                    f"{path}:{line_no}: not valid UTF-8 (byte {raw[exc.start:exc.start + 1]!r} at column "
                    f"{exc.start + 1}); re-save the manifest as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from exc
            # A byte-order mark (as spreadsheet exports write) is not part of the first field.
            yield line_no, line.removeprefix("\ufeff") if line_no == 1 else line


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, line in _utf8_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path}:{line_no}: not valid JSON ({exc}); fix or remove the line") from exc
        if not isinstance(row, dict):
            raise SourceError(f"{path}:{line_no}: expected a JSON object per line, got {type(row).__name__}")
        if "\\u" in line:  # only a \uXXXX escape can produce a lone surrogate
            row = _no_surrogates(row)
        yield line_no, row


def _no_surrogates(value: Any) -> Any:
    """Lone surrogates (a JSON "\\ud800" escape) as literal backslash text.

    They cannot be encoded as UTF-8, so an id or text holding one would make every record shard
    and manifest line unwritable; the replacement is deterministic, so resumes see the same id.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_no_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in value.items()}
    return value


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    lines = (line for _, line in _utf8_lines(path))
    reader = csv.DictReader(lines, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    for row in reader:
        yield reader.line_num, row


def _read_manifest(path: Path, rows: Iterator[tuple[int, dict[str, Any]]], opts: SourceOptions) -> Iterator[SourceItem]:
    base_dir = path.parent
    for line_no, row in rows:
        audio_col = next((c for c in (opts.audio_column, *MANIFEST_PATH_COLUMNS) if c in row), None)
        if audio_col is None:
            raise SourceError(
                f"{path}:{line_no}: no audio path column ({', '.join((opts.audio_column, *MANIFEST_PATH_COLUMNS))}); "
                f"available columns: {', '.join(row)}; choose one with --audio-column NAME"
            )
        cols = _resolve_columns(list(row), opts, f"{path}:{line_no}", audio_column=audio_col)
        value = row[audio_col]
        written = value.get("path") if isinstance(value, dict) else value
        derived = _strip_audio_ext(str(written)) if written else f"{path.stem}:{line_no}"
        yield _make_item(row, cols, derived, base_dir)


def _strip_audio_ext(name: str) -> str:
    stem, dot, ext = name.rpartition(".")
    return stem if dot and f".{ext.lower()}" in AUDIO_EXTENSIONS else name


def _walk_audio(folder: Path) -> Iterator[Path]:
    """Audio files below `folder`, depth first, each folder's entries sorted by name.

    A walk rather than one sorted listing, so a folder of millions of files costs memory for
    one directory's names at a time. Symlinked folders are not followed (no cycles).
    """
    with os.scandir(folder) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _walk_audio(Path(entry.path))
        elif Path(entry.name).suffix.lower() in AUDIO_EXTENSIONS and (entry.is_file() or entry.is_symlink()):
            # A dangling link is yielded too: it becomes an error record naming it, not a gap.
            yield Path(entry.path)


def _audio_file_item(path: Path, item_id: str) -> SourceItem:
    # A sidecar `<name>.txt` next to the audio holds its reference transcript when present.
    sidecar = path.with_suffix(".txt")
    text = sidecar.read_text(encoding="utf-8").strip() if sidecar.is_file() else None
    return SourceItem(id=item_id, audio_bytes=None, path=str(path), text=text, extra={})


def _read_audio_folder(folder: Path) -> Iterator[SourceItem]:
    for path in _walk_audio(folder):
        yield _audio_file_item(path, path.relative_to(folder).with_suffix("").as_posix())


# ----------------------------------------------------------------------------------- datasets


def _read_dataset_disk(path: Path, opts: SourceOptions) -> Iterator[SourceItem]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise SourceError(f"{path}: not a readable save_to_disk folder ({exc})") from exc
    split, dataset = _pick_split(loaded, opts, str(path))
    yield from _read_dataset_rows(dataset, opts, str(path), split, path)


def _read_dataset_hub(name: str, opts: SourceOptions, base_dir: Path | None = None) -> Iterator[SourceItem]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, opts.config, split=opts.split, streaming=opts.streaming)
    except Exception as exc:  # datasets raises many types (hub, network, config, builder errors)
        local = "" if base_dir is not None else "; it is not a local path either"
        raise SourceError(
            f"could not load {name!r} as a Hugging Face dataset ({type(exc).__name__}: {exc}){local}; "
            f"check the name, --config and --split"
        ) from exc
    split, dataset = _pick_split(loaded, opts, name)
    yield from _read_dataset_rows(dataset, opts, name, split, base_dir)


def _pick_split(loaded: Any, opts: SourceOptions, where: str) -> tuple[str, Any]:
    """A DatasetDict -> the requested (or only) split; a single dataset is returned as is."""
    if not hasattr(loaded, "keys"):
        return str(opts.split or getattr(loaded, "split", None) or "train"), loaded
    splits = list(loaded.keys())
    if opts.split is not None:
        if opts.split not in splits:
            raise SourceError(f"{where}: no split {opts.split!r}; available splits: {', '.join(splits)}; use --split NAME")
        return opts.split, loaded[opts.split]
    if len(splits) != 1:
        raise SourceError(f"{where}: has splits {', '.join(splits)}; choose one with --split NAME")
    return splits[0], loaded[splits[0]]


def _read_dataset_rows(dataset: Any, opts: SourceOptions, where: str, split: str, base_dir: Path | None) -> Iterator[SourceItem]:
    from datasets import Audio

    features = dataset.features
    cols: _Columns | None = None
    if features is not None:
        cols = _resolve_columns(list(features), opts, where)
        dataset = dataset.select_columns(cols.needed)
        if isinstance(features[cols.audio], Audio):
            # Undecoded: {bytes, path}. We decode ourselves, in worker processes.
            dataset = dataset.cast_column(cols.audio, Audio(decode=False))
    for row_index, row in enumerate(dataset):
        if cols is None:  # a streamed dataset whose features are unknown: check the first row
            cols = _resolve_columns(list(row), opts, where)
        yield _make_item(row, cols, f"{split}:{row_index}", base_dir)
