"""What an input string is (glob, file, folder, hub id) -> its reader; `iter_source` streams them all."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from batchscribe.audio.sources.files import (
    AUDIO_EXTENSIONS, CSV, JSONL, MANIFEST_EXTENSIONS, audio_file_item, read_audio_folder,
    read_manifest, walk_audio,
)
from batchscribe.audio.sources.hf_datasets import read_dataset_disk, read_dataset_hub
from batchscribe.audio.sources.ids import select
from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions
from batchscribe.audio.sources.parquet import read_parquet

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def iter_source(inputs: Sequence[str], opts: SourceOptions) -> Iterator[SourceItem]:
    """Stream the items of `inputs` (in order) that belong to shard `opts.shard_index`.

    Ids: the id column's value (as str); without one, a derived id that is stable across runs:
    `<file stem>:<row>` for Parquet (row within the file), for datasets the audio path's file name
    without its extension (`<split>:<row>` when a row has no path or an earlier row took the name), the
    path relative to the folder without its audio extension for audio folders (`a/b.flac` ->
    `a/b`), and the path as written in the manifest without its audio extension for manifests.

    Duplicate ids: in an audio folder, files of one folder sharing a stem (`a.flac`, `a.wav`)
    keep their extension in the id. Otherwise the first occurrence keeps its id and a later one
    becomes `<id>#<origin>`: its own path with the extension, or `<file>:<row>` for Parquet rows
    (`#k` added only if that is taken too, e.g. by a real id). The name depends on the item, not on
    how many duplicates came before. The rule is applied over all items before sharding, so every
    shard agrees with an unsharded run. Folders in `opts.exclude` (the run's output) are skipped.

    Sharding: an item belongs to shard `blake2b(id) % num_shards` (its final id, 8-byte digest),
    so the shards are disjoint, their union is the whole input, and the split does not depend on
    input order. Every shard still reads the whole input. `limit` counts items of this shard.

    Paths and input kinds are checked here (missing path: `SourceError` at once); column problems
    and empty inputs raise `SourceError` when that input is reached during iteration.
    """
    if not inputs:
        raise SourceError("no input given; pass a Parquet file, folder, glob, manifest or dataset id")
    readers = [(inp, _plan(inp, opts)) for inp in inputs]
    return select(_read_all(readers), opts)


def _read_all(readers: list[tuple[str, Callable[[], Iterator[SourceItem]]]]) -> Iterator[SourceItem]:
    for inp, reader in readers:
        count = 0
        for item in reader():
            count += 1
            yield item
        if count == 0:
            raise SourceError(f"input {inp!r} contains no items; check that it is the right path")


def _plan(inp: str, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    """Decide what `inp` is and return a reader for it (nothing is read yet)."""
    path = Path(inp).expanduser()
    if not path.exists() and any(ch in inp for ch in "*?["):
        matches = [m for m in sorted(glob.glob(str(path), recursive=True)) if not excluded(Path(m), opts.exclude)]
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
    return lambda: read_dataset_hub(inp, opts)


def _plan_file(path: Path, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return lambda: read_parquet(path, opts)
    if suffix == ".jsonl":
        return lambda: read_manifest(path, JSONL, opts)
    if suffix in (".csv", ".tsv"):
        return lambda: read_manifest(path, CSV, opts)
    if suffix in AUDIO_EXTENSIONS:
        _no_passthrough(path, opts)
        return lambda: iter([audio_file_item(path, path.stem)])
    raise SourceError(
        f"{path}: unsupported file type {suffix or '(none)'}; give a .parquet file, a .jsonl/.csv "
        f"manifest, an audio file ({', '.join(sorted(AUDIO_EXTENSIONS))}) or a folder"
    )


def _plan_dir(path: Path, opts: SourceOptions) -> Callable[[], Iterator[SourceItem]]:
    if any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
        return lambda: read_dataset_disk(path, opts)
    parquet = sorted((p for p in path.rglob("*.parquet") if not excluded(p, opts.exclude)),
                     key=lambda p: p.relative_to(path).as_posix())
    if (path / "README.md").is_file() and (parquet or (path / "data").is_dir()):
        return lambda: read_dataset_hub(str(path), opts, base_dir=path)
    if parquet:
        return lambda: (item for f in parquet for item in read_parquet(f, opts))
    for name in ("metadata.jsonl", "metadata.csv"):
        manifest = path / name
        if manifest.is_file():  # the audiofolder convention: the manifest says what the folder holds
            fmt = JSONL if name.endswith(".jsonl") else CSV
            return lambda: read_manifest(manifest, fmt, opts, audiofolder=True)
    if next(walk_audio(path, opts.exclude), None) is None:
        n_files = sum(1 for p in path.rglob("*") if p.is_file())
        raise SourceError(
            f"{path}: no Parquet files, dataset or audio files found ({n_files} other files); "
            f"audio extensions read are {', '.join(sorted(AUDIO_EXTENSIONS))}"
        )
    _no_passthrough(path, opts)
    return lambda: read_audio_folder(path, opts.exclude)


def excluded(path: Path, exclude: tuple[str, ...]) -> bool:
    """Whether `path` lies in a folder that is never input (the run's own output)."""
    if not exclude:
        return False
    real = os.path.realpath(path)
    return any(real == e or real.startswith(e.rstrip(os.sep) + os.sep) for e in exclude)


def _no_passthrough(where: Path, opts: SourceOptions) -> None:
    if opts.passthrough:
        raise SourceError(
            f"{where}: audio files have no columns to pass through ({', '.join(opts.passthrough)}); "
            f"drop --passthrough or use a manifest/Parquet input"
        )


# Listing more audio files than this to size the progress bar is no longer cheap (a walk of a
# million files takes seconds before the first item): the bar then counts without a total.
_COUNT_AT_MOST = 100_000


def count_folder_items(path: Path) -> int | None:
    """How many items the folder `path` holds, where that is cheap to know: Parquet footers,
    audiofolder metadata lines, or up to _COUNT_AT_MOST audio files; None otherwise (datasets,
    hub-style folders, huge folders). An estimate for the progress bar, not a promise."""
    if any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
        return None
    parquet = list(path.rglob("*.parquet"))
    if (path / "README.md").is_file() and (parquet or (path / "data").is_dir()):
        return None
    if parquet:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(p).metadata.num_rows for p in parquet)
    for name in ("metadata.jsonl", "metadata.csv"):
        if (path / name).is_file():
            with open(path / name, "rb") as fh:
                lines = sum(1 for line in fh if line.strip())
            return lines - 1 if name.endswith(".csv") else lines  # the CSV header is no item
    count = 0
    for _ in walk_audio(path):
        count += 1
        if count > _COUNT_AT_MOST:
            return None
    return count
