"""Exactly-once output: what an output directory already holds, and whether a run may continue it.

The committed shard files are the truth; `_manifest.ndjson` is an index of them (one line per shard:
its file name, ids and counts), appended and fsynced right after each shard's rename. A crash
between the rename and the manifest line leaves a committed shard the manifest lacks; `open_output`
reads its ids back and repairs the manifest, so no record is written twice. A torn last manifest
line, a manifest entry whose file is gone, and temp files from a killed run are all repaired or
removed before the run starts. `run_config.json` pins what makes records comparable (model,
decoding options, inputs, format); a different run into a directory with records is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchscribe.output.formats import OutputFormat, read_shard
from batchscribe.output.writers import SUMMARY_NAME, fsync_dir, write_atomic, write_json_atomic

RUN_CONFIG_NAME = "run_config.json"
# Keys of run_config.json that must match for a run to continue a directory. Device, batch size,
# workers and limit may change between runs: they do not change what a record says.
IDENTITY_KEYS = ("model", "decode_options", "format", "inputs", "source_options", "num_shards")
ENGINE_KEY = "engine"  # the resolved engine's identity (engine/setup.EngineConfig.identity)


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

    def to_json(self) -> str:
        return json.dumps({"shard": self.shard, "ids": list(self.ids), "ok": self.ok,
                           "errors": self.errors, "audio_seconds": self.audio_seconds},
                          ensure_ascii=False)

    @classmethod
    def from_records(cls, shard: str, records: Iterable[dict[str, Any]]) -> ShardEntry:
        ids: list[str] = []
        ok = errors = 0
        seconds = 0.0
        for r in records:
            ids.append(str(r["id"]))
            if r.get("error") is None:
                ok += 1
            else:
                errors += 1
            if isinstance(r.get("duration"), (int, float)):
                seconds += float(r["duration"])
        return cls(shard, tuple(ids), ok, errors, seconds)


def output_prefix(num_shards: int = 1, shard_index: int = 0) -> str:
    """File prefix of one machine's shards; machines splitting one input never share a name."""
    if num_shards == 1:
        return "records"
    return f"records-part{shard_index:05d}of{num_shards:05d}"


def manifest_name(prefix: str) -> str:
    return "_manifest.ndjson" if prefix == "records" else f"_manifest-{prefix}.ndjson"


def summary_name(prefix: str) -> str:
    return SUMMARY_NAME if prefix == "records" else f"summary-{prefix}.json"


@dataclass
class OutputState:
    """The committed contents of one prefix in an output directory, kept current by `append`."""

    directory: Path
    prefix: str
    fmt: OutputFormat
    entries: list[ShardEntry] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    next_index: int = 0

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

    def totals(self) -> dict[str, float]:
        return {
            "items": sum(len(e.ids) for e in self.entries),
            "ok": sum(e.ok for e in self.entries),
            "errors": sum(e.errors for e in self.entries),
            "audio_seconds": sum(e.audio_seconds for e in self.entries),
            "shards": len(self.entries),
        }


def _shard_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d{{5,}})\.(jsonl|parquet)$")


def _our_files(directory: Path) -> list[Path]:
    # Only names a run writes: anything else in the directory is the user's and survives --overwrite.
    names = re.compile(r"^(records(-part\d+of\d+)?-\d{5,}\.(jsonl|parquet)|_manifest(-.*)?\.ndjson"
                       r"|run_config\.json|summary(-.*)?\.json|\..*\.tmp)$")
    return [p for p in directory.iterdir() if p.is_file() and names.match(p.name)]


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # pid in the name: machines sharing the directory never remove each other's probe.
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
            entries.append(ShardEntry(d["shard"], tuple(d["ids"]), int(d["ok"]), int(d["errors"]),
                                      float(d["audio_seconds"])))
        except (ValueError, KeyError, TypeError):
            dirty = True  # a line torn by a crash mid-append; its shard is recovered from disk
    return entries, dirty or (bool(raw) and not raw.endswith(b"\n"))


def open_output(
    directory: Path,
    fmt: OutputFormat,
    prefix: str = "records",
    overwrite: bool = False,
) -> OutputState:
    """Prepare `directory` for a run: clean, repair and load what earlier runs committed."""
    directory = Path(directory)
    _check_writable(directory)
    if overwrite:
        for path in _our_files(directory):
            path.unlink()
        fsync_dir(directory)
    leftovers = [*directory.glob(f".{prefix}-*.tmp"),  # a killed run's half-written shard
                 directory / f".{manifest_name(prefix)}.tmp", directory / f".{summary_name(prefix)}.tmp"]
    for tmp in leftovers:
        tmp.unlink(missing_ok=True)  # never output: only a completed rename publishes a file

    state = OutputState(directory, prefix, fmt)
    entries, dirty = _load_manifest(state.manifest_path)
    pattern = _shard_pattern(prefix)
    on_disk = {p.name for p in directory.iterdir() if pattern.match(p.name)}
    kept = [e for e in entries if e.shard in on_disk]  # a vanished shard's ids are simply redone
    dirty = dirty or len(kept) != len(entries)
    listed = {e.shard for e in kept}
    for name in sorted(on_disk - listed):
        # Renamed but the manifest line never made it (crash between the two): adopt it.
        kept.append(ShardEntry.from_records(name, read_shard(directory / name)))
        dirty = True
    if dirty:
        body = "".join(e.to_json() + "\n" for e in kept).encode("utf-8")
        write_atomic(state.manifest_path, body)
    state.entries = kept
    for e in kept:
        state.completed.update(e.ids)
    # Numbering continues after the highest shard on disk, so no committed name is ever reused.
    indices = [int(m.group(1)) for name in on_disk if (m := pattern.match(name))]
    state.next_index = max(indices, default=-1) + 1
    return state


def has_records(directory: Path) -> bool:
    # A run_config.json without records (a run that committed nothing) does not pin the directory.
    return any(p.name.startswith("_manifest") or re.match(r"^records.*\.(jsonl|parquet)$", p.name)
               for p in Path(directory).iterdir())


def check_run_config(directory: Path, config: dict[str, Any]) -> None:
    """Refuse to continue a directory whose records were made with other settings."""
    previous = _previous_config(directory)
    if previous is None:
        return
    _refuse_differences(directory, [(key, previous.get(key), config.get(key)) for key in IDENTITY_KEYS])


def check_engine_identity(directory: Path, identity: Any) -> None:
    """The same for the engine's resolved identity (dtype and kernels change tokens), checked once
    the model is loaded. Directories written before the engine joined the identity lack the key."""
    previous = _previous_config(directory)
    if previous is None or ENGINE_KEY not in previous:
        return
    _refuse_differences(directory, [(ENGINE_KEY, previous[ENGINE_KEY], identity)])


def _previous_config(directory: Path) -> dict[str, Any] | None:
    """The run_config.json of an earlier run that committed records, or None."""
    path = Path(directory) / RUN_CONFIG_NAME
    if not path.exists() or not has_records(directory):
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ResumeConflictError(
            f"{path} is not valid JSON ({exc}); pass --overwrite to start this directory afresh"
        ) from exc


def _refuse_differences(directory: Path, pairs: list[tuple[str, Any, Any]]) -> None:
    diffs = [f"  {key}: before {json.dumps(before)}, now {json.dumps(now)}"
             for key, before, now in pairs if _canon(before) != _canon(now)]  # fmt: skip
    if diffs:
        raise ResumeConflictError(
            f"{directory} already holds records from a run with different settings:\n"
            + "\n".join(diffs)
            + "\nResuming would mix them. Use the same settings to resume, another --output, "
            "or --overwrite to delete the old records and start again."
        )


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def write_run_config(directory: Path, config: dict[str, Any]) -> None:
    write_json_atomic(Path(directory) / RUN_CONFIG_NAME, config)

