"""Audio files, folders of them, and manifests that list them (.jsonl, .csv, .tsv)."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from batchscribe.audio.sources.columns import make_item, note_columns, resolve_columns
from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions

AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".ogg", ".oga", ".mp3", ".m4a", ".mp4", ".opus", ".webm", ".aac", ".wma",
     ".aif", ".aiff"}
)
MANIFEST_EXTENSIONS = frozenset({".jsonl", ".csv", ".tsv"})
# Columns a manifest may name its audio path with, after the configured audio column.
MANIFEST_PATH_COLUMNS = ("path", "file_name", "file")

log = logging.getLogger(__name__)


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


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
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


def _csv_reader(path: Path) -> csv.DictReader:
    lines = (line for _, line in _utf8_lines(path))
    return csv.DictReader(lines, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")


def csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = _csv_reader(path)
    for row in reader:
        yield reader.line_num, row


Rows = Callable[[Path], Iterator[tuple[int, dict[str, Any]]]]  # a manifest's numbered rows


@dataclasses.dataclass(frozen=True)
class ManifestFormat:
    """How a text manifest is read: its numbered rows, and its columns."""

    rows: Rows
    columns: Callable[[Path], list[str]]


def _header(path: Path) -> list[str]:
    """A CSV's columns: its header, read without a pass over the rows."""
    return list(_csv_reader(path).fieldnames or ())


def _every_key(path: Path) -> list[str]:
    """A JSONL's columns: every row's keys (a row may leave out a column others have: its cell is
    then null, as `datasets`' JSON loader reads it; a column no row has is refused). A pass of its own."""
    return list(dict.fromkeys(key for _, row in jsonl_rows(path) for key in row))


JSONL, CSV = ManifestFormat(jsonl_rows, _every_key), ManifestFormat(csv_rows, _header)


def read_manifest(path: Path, fmt: ManifestFormat, opts: SourceOptions,
                  audiofolder: bool = False) -> Iterator[SourceItem]:  # fmt: skip
    """The items of a text manifest read as `fmt` (JSONL or CSV, which covers TSV). Every
    line is checked before the first item comes out, so a bad line is a usage error before the
    model loads and anything is written: found mid-run, it stopped the run with part of it
    committed, and fixing the line then changed the input the output folder was pinned to.
    `audiofolder`: the manifest is the `metadata.*` of a folder given as the input, whose audio
    files it does not list are not transcribed: a warning counts them."""
    available = fmt.columns(path)
    listed: set[str] = set()
    for item in _manifest_items(path, fmt.rows(path), opts, available, note=False):
        if audiofolder and item.path:
            listed.add(os.path.realpath(item.path))
    if audiofolder:
        _warn_unlisted(path, listed, opts.exclude)
    yield from _manifest_items(path, fmt.rows(path), opts, available)


_UNLISTED_AT_MOST = 100_000  # audio files walked to find unlisted ones: past that, the walk costs seconds


def _warn_unlisted(manifest: Path, listed: set[str], exclude: tuple[str, ...]) -> None:
    unlisted: list[str] = []
    for n, found in enumerate(walk_audio(manifest.parent, exclude)):
        if n >= _UNLISTED_AT_MOST:
            break
        if os.path.realpath(found) not in listed:
            unlisted.append(found.relative_to(manifest.parent).as_posix())
    if unlisted:
        log.warning("%s: %d audio file%s in its folder %s not listed in it and %s not transcribed (e.g. %s); add "
                    "them to %s to transcribe them", manifest, len(unlisted), "s" if len(unlisted) > 1 else "",
                    "are" if len(unlisted) > 1 else "is", "are" if len(unlisted) > 1 else "is",
                    ", ".join(unlisted[:3]), manifest.name)  # fmt: skip


def _manifest_items(path: Path, rows: Iterator[tuple[int, dict[str, Any]]], opts: SourceOptions,
                    available: list[str], note: bool = True) -> Iterator[SourceItem]:  # fmt: skip
    base_dir = path.parent
    candidates = (opts.audio_column, *MANIFEST_PATH_COLUMNS)
    first = True
    for line_no, row in rows:
        audio_col = next((c for c in candidates if c in row), None)
        if audio_col is None:
            raise SourceError(
                f"{path}:{line_no}: no audio path column ({', '.join(candidates)}); "
                f"available columns: {', '.join(row)}; choose one with --audio-column NAME"
            )
        cols = resolve_columns(available, opts, f"{path}:{line_no}", audio_column=audio_col)
        if first and note:
            note_columns(cols, opts)
        first = False
        value = row[audio_col]
        written = value.get("path") if isinstance(value, dict) else value
        derived = _strip_audio_ext(str(written)) if written else f"{path.stem}:{line_no}"
        yield make_item(row, cols, derived, base_dir, str(written) if written else f"{path.name}:{line_no}")


def _strip_audio_ext(name: str) -> str:
    stem, dot, ext = name.rpartition(".")
    return stem if dot and f".{ext.lower()}" in AUDIO_EXTENSIONS else name


def walk_audio(folder: Path, exclude: tuple[str, ...] = ()) -> Iterator[Path]:
    """Audio files below `folder`, depth first, each folder's entries sorted by name."""
    return (path for path, _ in _walk(folder, frozenset(exclude)))


def _walk(folder: Path, exclude: frozenset[str]) -> Iterator[tuple[Path, bool]]:
    """(audio file, whether another audio file in its folder has the same stem), depth first.

    A walk rather than one sorted listing, so a folder of millions of files costs memory for
    one directory's names at a time. Symlinked folders and `exclude`d ones are not entered.
    """
    with os.scandir(folder) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    audio = [e for e in entries if not e.is_dir(follow_symlinks=False)
             and Path(e.name).suffix.lower() in AUDIO_EXTENSIONS and (e.is_file() or e.is_symlink())]  # fmt: skip
    names = {e.name for e in audio}
    stems = Counter(Path(name).stem for name in names)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if os.path.realpath(entry.path) not in exclude:
                yield from _walk(Path(entry.path), exclude)
        elif entry.name in names:
            # A dangling link is yielded too: it becomes an error record naming it, not a gap.
            yield Path(entry.path), stems[Path(entry.name).stem] > 1


def audio_file_item(path: Path, item_id: str) -> SourceItem:
    # A sidecar `<name>.txt` next to the audio holds its reference transcript when present.
    return SourceItem(id=item_id, audio_bytes=None, path=str(path), text=_sidecar_text(path), extra={})


def _sidecar_text(path: Path) -> str | None:
    """The reference in `<name>.txt` beside the audio, or None. One that is not UTF-8 (or cannot be
    read) costs its item the reference, with a warning naming it, not the run its other items."""
    sidecar = path.with_suffix(".txt")
    if not sidecar.is_file():
        return None
    try:
        return sidecar.read_text(encoding="utf-8").strip()
    except (UnicodeDecodeError, OSError) as exc:
        log.warning("%s: reference transcript not read (%s); the audio is transcribed without it. Save it "
                    "as UTF-8 text (e.g. iconv -f latin1 -t utf-8) to score it", sidecar, exc)
        return None


def read_audio_folder(folder: Path, exclude: tuple[str, ...] = ()) -> Iterator[SourceItem]:
    """Ids: the path relative to `folder` without its extension; with it where files in one folder
    share a stem (`a.flac`, `a.wav`), so neither id depends on which is listed first."""
    for path, shared_stem in _walk(folder, frozenset(exclude)):
        relative = path.relative_to(folder).as_posix()
        item = audio_file_item(path, relative if shared_stem else path.relative_to(folder).with_suffix("").as_posix())
        yield dataclasses.replace(item, origin=relative)
