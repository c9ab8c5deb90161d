"""`batchscribe export`: a run folder's committed records as one subtitle or text file per item.

Only what a run committed is exported: every writer's shards, read through `inspect_output` (the
reader resume uses), so a shard that does not verify is skipped and named, never half-trusted.
Error records have no transcript and are counted, not written.

Each file is written to a temp name and renamed, so a crash or a full disk leaves every file whole
(old or new) and no partial file under a final name; a file whose bytes are already right is left
alone, so a rerun is idempotent.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscribe.output.formats import read_shard
from batchscribe.output.resume import OutputDirError, inspect_output, writer_prefixes
from batchscribe.output.subtitles import SUBTITLE_FORMATS, render
from batchscribe.output.writers import fsync_dir, write_atomic

log = logging.getLogger(__name__)

# An id is used as the file name as it is only when it is plainly portable: no path separators,
# no leading dot (hidden, "..") and not ending like the hash suffix below (which keeps the mapping
# one-to-one: a hashed name can never equal a plain one).
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=,@-]{0,119}$")
_HASHED = re.compile(r"-[0-9a-f]{12}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=,@-]+")
# Windows device names: a file called CON.srt cannot be created or opened there.
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


class ExportError(OutputDirError):
    """The run folder cannot be exported; the message names the folder and the fix."""


@dataclass(frozen=True)
class ExportResult:
    written: int  # files created or changed
    unchanged: int  # files that already held the same bytes
    errors: int  # error records skipped (no transcript)
    bad_shards: tuple[str, ...]  # shards that did not verify, skipped
    directory: Path
    fmt: str

    def summary(self) -> str:
        total = self.written + self.unchanged
        line = (f"exported {total} {self.fmt} file{'s' if total != 1 else ''} to {self.directory} "
                f"({self.written} written, {self.unchanged} unchanged")
        if self.errors:
            line += f"; {self.errors} error record{'s' if self.errors != 1 else ''} skipped"
        if self.bad_shards:
            line += f"; {len(self.bad_shards)} damaged shard(s) skipped: rerun the run to redo their items"
        return line + ")"


def _hashed_stem(item_id: str) -> str:
    # The readable part keeps what is safe of the id; the hash of the whole id makes it unique.
    readable = _UNSAFE.sub("_", item_id).strip("._")[:80] or "item"
    return f"{readable}-{hashlib.sha256(item_id.encode('utf-8')).hexdigest()[:12]}"


def file_stem(item_id: str) -> str:
    """A safe file name for an id, the same on every run: the id itself when it is plainly
    portable, else its safe characters plus a hash of the whole id (one-to-one either way)."""
    plain = (_PLAIN.match(item_id) and not _HASHED.search(item_id) and not item_id.endswith(".")
             and item_id.split(".")[0].lower() not in _RESERVED)  # fmt: skip
    return item_id if plain else _hashed_stem(item_id)


def file_stems(ids: list[str]) -> dict[str, str]:
    """id -> stem; ids that differ only in case ("A", "a") would share a file on a case-insensitive
    file system (macOS, Windows), so those take the hashed form."""
    stems = {i: file_stem(i) for i in ids}
    folded: dict[str, list[str]] = {}
    for i, stem in stems.items():
        folded.setdefault(stem.casefold(), []).append(i)
    for group in folded.values():
        if len(group) > 1:
            stems.update({i: _hashed_stem(i) for i in group})
    return stems


def committed_records(directory: Path) -> tuple[Iterator[dict[str, Any]], tuple[str, ...]]:
    """Every writer's committed records in `directory`, and the shards skipped as damaged."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExportError(f"{directory}: no such folder; give the --output folder of a `batchscribe run`")
    states = [inspect_output(directory, "jsonl", prefix) for prefix in writer_prefixes(directory)]
    if not any(s.entries for s in states):
        raise ExportError(f"{directory}: holds no committed records; give the --output folder of a "
                          f"`batchscribe run` that has committed at least one shard")
    bad = tuple(name for s in states for name, _ in s.bad)
    for s in states:
        for name, why in s.bad:
            log.warning("%s: %s; skipped (rerun the `batchscribe run` command to redo its items)",
                        directory / name, why)

    def records() -> Iterator[dict[str, Any]]:
        for s in states:
            for entry in s.entries:
                yield from read_shard(directory / entry.shard)

    return records(), bad


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Atomically make `path` hold `data`; False when it already did (nothing is touched). The
    folder is synced once, after the last file (export_run)."""
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    write_atomic(path, data, sync_dir=False)
    return True


def export_run(run_dir: Path, fmt: str, out_dir: Path) -> ExportResult:
    """Write one `fmt` file per ok record committed in `run_dir` into `out_dir`."""
    if fmt not in SUBTITLE_FORMATS:
        raise ExportError(f"format {fmt!r} is not supported; use one of {', '.join(SUBTITLE_FORMATS)}")
    records, bad = committed_records(Path(run_dir))
    ok: list[dict[str, Any]] = []
    errors = 0
    for r in records:
        if r.get("error") is not None:
            errors += 1
        else:
            ok.append(r)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {out_dir} ({exc.strerror or exc}); choose another -o folder") from exc
    stems = file_stems([str(r["id"]) for r in ok])
    written = 0
    for r in ok:
        data = render(r, fmt).encode("utf-8")
        written += _write_if_changed(out_dir / f"{stems[str(r['id'])]}.{fmt}", data)
    fsync_dir(out_dir)
    return ExportResult(written, len(ok) - written, errors, bad, out_dir, fmt)
