"""Exactly-once output: what an output directory already holds, checked, and repaired.

The committed shard files are the truth; `_manifest.ndjson` is an index of them (one line per shard:
its file name, ids and counts), appended and fsynced right after each shard's rename. Each writer
(one `--shard-index`) owns its own shard names and manifest (`output_prefix`), under the lock of
output/lock.py; readers take the union of every writer's manifest.

`inspect_output` reads the folder and changes nothing: a run first holds its lock and passes the
settings check (output/identity.py). Only then does `repair_output` act on what inspection found:
temp files from a killed run are removed; a torn last manifest line is dropped; a manifest entry
whose file is gone is dropped (its ids are redone); a shard renamed before its manifest line made
it is adopted; a shard that does not parse, lacks ids or disagrees with its manifest line is moved
aside to `<name>.bad` with a warning and its ids are redone; an unlisted copy of ids that are
already listed (an interrupted --retry-errors) is moved aside to `<name>.superseded`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchscribe.output.formats import OutputFormat
from batchscribe.output.verify import read_ids, verify_shard
from batchscribe.output.writers import SUMMARY_NAME, fsync_dir, write_atomic

log = logging.getLogger(__name__)


class OutputDirError(OSError):
    """The output directory cannot be used; the message names the path and the fix."""


class ResumeConflictError(ValueError):
    """A run would mix records made with different settings into one directory."""


@dataclass(frozen=True)
class ShardEntry:
    shard: str
    ids: tuple[str, ...]
    ok: int
    errors: int
    audio_seconds: float
    error_ids: tuple[str, ...] = ()  # which of `ids` are error records (--retry-errors redoes them)

    def to_json(self) -> str:
        return json.dumps({"shard": self.shard, "ids": list(self.ids), "ok": self.ok,
                           "errors": self.errors, "audio_seconds": self.audio_seconds,
                           "error_ids": list(self.error_ids)}, ensure_ascii=False)  # fmt: skip

    @classmethod
    def from_records(cls, shard: str, records: Iterable[dict[str, Any]]) -> ShardEntry:
        ids: list[str] = []
        error_ids: list[str] = []
        seconds = 0.0
        for r in records:
            ids.append(str(r["id"]))
            if r.get("error") is not None:
                error_ids.append(str(r["id"]))
            if isinstance(r.get("duration"), (int, float)):
                seconds += float(r["duration"])
        return cls(shard, tuple(ids), len(ids) - len(error_ids), len(error_ids), seconds, tuple(error_ids))


def output_prefix(num_shards: int = 1, shard_index: int = 0) -> str:
    """File prefix of one writer's shards; writers splitting one input never share a name."""
    if num_shards == 1:
        return "records"
    return f"records-part{shard_index:05d}of{num_shards:05d}"


def manifest_name(prefix: str) -> str:
    return "_manifest.ndjson" if prefix == "records" else f"_manifest-{prefix}.ndjson"


def summary_name(prefix: str) -> str:
    return SUMMARY_NAME if prefix == "records" else f"summary-{prefix}.json"


@dataclass
class OutputState:
    """The committed contents of one prefix in an output directory, kept current by `append`;
    after `inspect_output`, also what `repair_output` is to fix."""

    directory: Path
    prefix: str
    fmt: OutputFormat
    entries: list[ShardEntry] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    next_index: int = 0
    dirty: bool = False  # the manifest must be rewritten from `entries`
    bad: list[tuple[str, str]] = field(default_factory=list)  # (shard, why): moved aside, ids redone
    superseded: list[str] = field(default_factory=list)  # unlisted copies of listed ids

    @property
    def manifest_path(self) -> Path:
        return self.directory / manifest_name(self.prefix)

    def append(self, entry: ShardEntry) -> None:
        """Record a committed shard: one manifest line, flushed and fsynced."""
        with open(self.manifest_path, "a", encoding="utf-8") as f:
            f.write(entry.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.entries.append(entry)
        self.completed.update(entry.ids)

    def on_commit(self, shard: str, records: list[dict[str, Any]]) -> None:
        self.append(ShardEntry.from_records(shard, records))

    def rewrite_manifest(self) -> None:
        write_atomic(self.manifest_path, "".join(e.to_json() + "\n" for e in self.entries).encode("utf-8"))
        self.completed = {i for e in self.entries for i in e.ids}

    def totals(self) -> dict[str, float]:
        return {
            "items": sum(len(e.ids) for e in self.entries),
            "ok": sum(e.ok for e in self.entries),
            "errors": sum(e.errors for e in self.entries),
            "audio_seconds": sum(e.audio_seconds for e in self.entries),
            "shards": len(self.entries),
        }


def shard_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d{{5,}})\.(jsonl|parquet)$")


RECORD_FILES = re.compile(r"^records(-part\d+of\d+)?-\d{5,}\.(jsonl|parquet)$")
_OUR_FILES = re.compile(r"^(records(-part\d+of\d+)?-\d{5,}\.(jsonl|parquet)|_manifest(-.*)?\.ndjson"
                        r"|run_config(-.*)?\.json|run_inputs(-.*)?\.json|summary(-.*)?\.json|\..*\.tmp)$")


def our_files(directory: Path) -> list[Path]:
    # Only names a run writes: anything else in the directory is the user's and survives --overwrite.
    return [p for p in directory.iterdir() if p.is_file() and _OUR_FILES.match(p.name)]


def _load_manifest(path: Path) -> tuple[list[ShardEntry], bool]:
    """Entries of a manifest, and whether it needs rewriting (a torn or bad line was dropped)."""
    if not path.exists():
        return [], False
    entries: list[ShardEntry] = []
    dirty = False
    raw = path.read_bytes()
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            entries.append(ShardEntry(d["shard"], tuple(map(str, d["ids"])), int(d["ok"]), int(d["errors"]),
                                      float(d["audio_seconds"]), tuple(d.get("error_ids", ()))))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            dirty = True  # a line torn by a crash mid-append; its shard is recovered from disk
    return entries, dirty or (bool(raw) and not raw.endswith(b"\n"))


def inspect_output(directory: Path, fmt: OutputFormat, prefix: str = "records") -> OutputState:
    """What `prefix` holds in `directory`, every shard verified; reads only, changes nothing."""
    directory = Path(directory)
    state = OutputState(directory, prefix, fmt)
    if not directory.is_dir():
        return state
    entries, state.dirty = _load_manifest(state.manifest_path)
    pattern = shard_pattern(prefix)
    on_disk = {p.name for p in directory.iterdir() if pattern.match(p.name)}
    listed: set[str] = set()
    seen: set[str] = set()  # shards with a manifest line so far
    for e in entries:
        if e.shard not in on_disk or e.shard in seen:
            state.dirty = True  # a vanished shard's ids are simply redone; a repeated line dropped
            continue
        seen.add(e.shard)
        why = verify_shard(directory / e.shard, e.ids)
        if why is not None:
            state.bad.append((e.shard, why))
            state.dirty = True
            continue
        state.entries.append(e)
        listed.update(e.ids)
    for name in sorted(on_disk - {e.shard for e in entries}):
        # Renamed but the manifest line never made it (crash between the two): adopt it.
        records, why = read_ids(directory / name)
        if why is not None:
            state.bad.append((name, why))
        elif listed & {str(r["id"]) for r in records}:
            state.superseded.append(name)
        else:
            entry = ShardEntry.from_records(name, records)
            state.entries.append(entry)
            listed.update(entry.ids)
        state.dirty = True
    state.completed = listed
    # Numbering continues after the highest shard on disk, so no committed name is ever reused.
    indices = [int(m.group(1)) for name in on_disk if (m := pattern.match(name))]
    state.next_index = max(indices, default=-1) + 1
    return state


def repair_output(state: OutputState) -> None:
    """Act on what `inspect_output` found; called once the lock is held and the settings match."""
    directory, prefix = state.directory, state.prefix
    leftovers = [*directory.glob(f".{prefix}-*.tmp"),  # a killed run's half-written shard
                 directory / f".{manifest_name(prefix)}.tmp", directory / f".{summary_name(prefix)}.tmp"]
    for tmp in leftovers:
        tmp.unlink(missing_ok=True)  # never output: only a completed rename publishes a file
    for name, why in state.bad:
        aside = _move_aside(directory / name, ".bad")
        log.warning("%s: %s; moved aside to %s, and its items are transcribed again", directory / name, why,
                    aside.name)
    for name in state.superseded:
        # Its ids are in a listed shard: a copy left by an interrupted --retry-errors.
        _move_aside(directory / name, ".superseded")
    if state.dirty:
        state.rewrite_manifest()
    fsync_dir(directory)
    state.dirty, state.bad, state.superseded = False, [], []


def _move_aside(path: Path, suffix: str) -> Path:
    target, k = path.with_name(path.name + suffix), 1
    while target.exists():  # never over an earlier one: it may be all that is left of some records
        target, k = path.with_name(f"{path.name}{suffix}.{k}"), k + 1
    os.replace(path, target)
    return target


def remove_records(directory: Path, prefix: str | None = None) -> None:
    """--overwrite: delete every writer's records (the caller holds the folder lock exclusively):
    the folder holds one run's records, so other parts' go too, and `prefix`'s writer says so."""
    files = our_files(directory)
    if prefix is not None:
        part = prefix.removeprefix("records-") if prefix != "records" else None
        others = sorted(p.name for p in files if (part not in p.name if part else "part" in p.name))
        if others:
            log.warning("--overwrite: deleting the records of the other --shard-index parts in %s too (%d files, "
                        "e.g. %s): a folder holds one run's records", directory, len(others), others[0])
    for path in files:
        path.unlink()
    fsync_dir(directory)


def open_output(directory: Path, fmt: OutputFormat, prefix: str = "records", overwrite: bool = False) -> OutputState:
    """Inspect and repair in one step, for callers that hold the folder alone (tests, tools)."""
    directory = Path(directory)
    check_writable(directory)
    if overwrite:
        remove_records(directory)
    state = inspect_output(directory, fmt, prefix)
    repair_output(state)
    return state


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # pid in the name: writers sharing the directory never remove each other's probe.
        probe = directory / f".batchscribe-write-probe-{os.getpid()}.tmp"
        with open(probe, "wb") as f:
            f.write(b"x")
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(
            f"output directory {directory} is not writable ({exc.strerror or exc}); "
            "choose another --output or fix its permissions / free space"
        ) from exc


def writer_prefixes(directory: Path) -> list[str]:
    """Every writer's prefix ("records", "records-part00000of00004", ...) seen in a shard or manifest name."""
    names = [p.name for p in Path(directory).iterdir()]
    found = {"records" + (m.group(1) or "") for n in names if (m := RECORD_FILES.match(n))}
    found |= {n[len("_manifest-"):-len(".ndjson")] for n in names if n.startswith("_manifest-") and n.endswith(".ndjson")}
    if "_manifest.ndjson" in names:
        found.add("records")
    return sorted(found)


def has_records(directory: Path, prefix: str | None = None) -> bool:
    """Whether any writer (or `prefix`'s) has committed records or a manifest in `directory`."""
    directory = Path(directory)
    if not directory.is_dir():
        return False
    if prefix is not None:
        pattern = shard_pattern(prefix)
        return (directory / manifest_name(prefix)).exists() or any(pattern.match(p.name) for p in directory.iterdir())
    return any(p.name.startswith("_manifest") or RECORD_FILES.match(p.name) for p in directory.iterdir())
