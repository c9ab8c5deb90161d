"""What a run's inputs are, for the resume check: the inputs resolved, and a fingerprint of what
they list.

A relative path or glob is resolved against the current directory, so the same command run from
another directory is a different input. The fingerprint is a sha256 over every file an input
lists: its path, size, and for Parquet its footer (schema, row counts, statistics: the content's
summary, unchanged by a copy), for other files their mtime. A folder's files are walked as `run`
reads them, without the excluded output folder. A hub dataset id is only its name.

The listing (each file's path and a digest of its description) is kept beside a run's records, so
that a rerun can tell files added since (their items are simply new) from files changed or removed
(whose records no longer say what the input holds).
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from batchscribe.audio.sources.detect import excluded

_GLOB_CHARS = "*?["


def canonical_input(inp: str) -> str:
    """An input as an absolute path (file, folder, glob), or as given (a hub dataset id)."""
    path = Path(inp).expanduser()
    if path.exists():
        return str(path.resolve())
    if any(ch in inp for ch in _GLOB_CHARS):
        return os.path.abspath(path)
    return inp


def inputs_listing(inputs: Sequence[str], exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file the inputs list -> a digest of what it is (size and mtime, or Parquet footer)."""
    return {os.path.abspath(path): hashlib.sha256(_describe(path)).hexdigest()[:32]
            for inp in inputs for path in _listed(inp, exclude)}  # fmt: skip


def fingerprint_of(inputs: Sequence[str], listing: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for inp in inputs:
        digest.update(f"input\0{canonical_input(inp)}\n".encode())
    for path in sorted(listing):
        digest.update(f"{path}\0{listing[path]}\n".encode())
    return digest.hexdigest()


def inputs_fingerprint(inputs: Sequence[str], exclude: tuple[str, ...] = ()) -> str:
    return fingerprint_of(inputs, inputs_listing(inputs, exclude))


def listing_changes(before: dict[str, str], now: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(added, changed, removed) file paths between two listings, sorted."""
    added = sorted(p for p in now if p not in before)
    changed = sorted(p for p in now if p in before and before[p] != now[p])
    removed = sorted(p for p in before if p not in now)
    return added, changed, removed


def _listed(inp: str, exclude: tuple[str, ...]) -> Iterator[Path]:
    path = Path(inp).expanduser()
    if not path.exists() and any(ch in inp for ch in _GLOB_CHARS):
        for match in sorted(glob.glob(str(path), recursive=True)):
            if not excluded(Path(match), exclude):
                yield from _listed(match, exclude)
    elif path.is_file():
        yield path
    elif path.is_dir():
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not excluded(Path(root) / d, exclude))
            yield from (Path(root) / name for name in sorted(files))


def _describe(path: Path) -> bytes:
    try:
        stat = path.stat()
    except OSError:  # a dangling link: its name is what it lists
        return f"{path}\0missing\n".encode()
    if path.suffix == ".parquet" and stat.st_size >= 12:
        return f"{path}\0{stat.st_size}\0".encode() + _parquet_footer(path) + b"\n"
    return f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()


def _parquet_footer(path: Path) -> bytes:
    """The footer's bytes: a 4-byte little-endian length and b"PAR1" end every Parquet file."""
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length + 8 > path.stat().st_size:
            return tail  # not Parquet after all: its tail still changes with it
        f.seek(-8 - length, os.SEEK_END)
        return f.read(length)
