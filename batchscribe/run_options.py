"""What a `run` is given and gives back: its options (one frozen object, validated once), its
result, and the error it stops with past --max-errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchscribe.audio.sources import SourceOptions
from batchscribe.config import ConfigError, DecodeOptions, EngineOptions
from batchscribe.output.formats import CORE_FIELDS, FORMATS, OutputFormat


class TooManyErrors(RuntimeError):
    """More item errors than --max-errors; the records written so far are committed."""


@dataclass(frozen=True)
class RunOptions:
    model: str = "tiny.en"
    engine: EngineOptions = field(default_factory=EngineOptions)  # device, dtype, slots, kernels, graphs
    cache_dir: Path | None = None
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    source: SourceOptions = field(default_factory=SourceOptions)
    format: OutputFormat = "jsonl"
    workers: int | None = None  # decode processes; None: the pool's default
    prefetch: int | None = None  # decoded items queued ahead of the model; None: pool default
    # Decode in threads (fast: no copy between processes) or processes (a crashing decoder costs
    # one item). None: threads when the model runs on CUDA, processes on the CPU.
    decode_threads: bool | None = None
    # GPU runs with decode threads: decode into pinned memory the engine copies from by DMA, instead
    # of packing samples (engine/pinned.py; measured faster). None: on there.
    pinned_arena: bool | None = None
    max_errors: int | None = None  # stop (exit 1) once errors in the directory exceed this
    shard_size: int = 1000  # records per shard file
    commit_seconds: float = 60.0  # a partly filled shard is committed after this long
    overwrite: bool = False
    retry_errors: bool = False  # redo the items whose committed record is an error record

    def __post_init__(self) -> None:
        if self.overwrite and self.retry_errors:
            raise ConfigError("--overwrite deletes every record, so --retry-errors has nothing to retry; pass one")
        if self.format not in FORMATS:
            raise ConfigError(f"format={self.format!r} is not supported; use one of {', '.join(FORMATS)}")
        if self.max_errors is not None and self.max_errors < 0:
            raise ConfigError(f"max_errors={self.max_errors} is negative; use a count >= 0")
        if self.shard_size < 1:
            raise ConfigError(f"shard_size={self.shard_size} must be >= 1")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"workers={self.workers} is negative; use 0 (in-process) or more")
        clash = [c for c in self.source.passthrough if c in CORE_FIELDS]
        if clash:
            raise ConfigError(
                f"passthrough column(s) {', '.join(clash)} would overwrite record fields "
                f"({', '.join(CORE_FIELDS)}); pass other columns, or rename them in the source"
            )


@dataclass(frozen=True)
class RunResult:
    output_dir: Path
    summary: dict[str, Any]
    shards: tuple[str, ...]  # shard files committed by this session
