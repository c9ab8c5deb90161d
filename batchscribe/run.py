"""The `run` pipeline: sources -> decode pool -> transcriber -> shard writers, exactly once.

A decode failure becomes an error record here and never reaches the model. Items whose ids an
earlier run into the same directory already committed are skipped before decoding, so a resumed
run redoes only what was in flight when the last one stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from batchscribe.audio.sources import SourceItem, SourceOptions, count_folder_items, iter_source
from batchscribe.config import ConfigError, DecodeOptions, EngineOptions
from batchscribe.output.formats import CORE_FIELDS, FORMATS, OutputFormat
from batchscribe.output.resume import (
    OutputState,
    check_engine_identity,
    check_run_config,
    open_output,
    output_prefix,
    summary_name,
    write_run_config,
)
from batchscribe.output.verbose_json import make_error_record
from batchscribe.output.writers import ShardWriter, hostname, package_versions, write_summary
from batchscribe.sink import ProgressCallback, Sink
from batchscribe.version import __version__


class TooManyErrors(RuntimeError):
    """More item errors than --max-errors; the records written so far are committed."""


class TranscriberLike(Protocol):
    """What `run` needs of a transcriber (api.Transcriber; a stand-in in plumbing tests)."""

    n_slots: int  # windows decoded together: sizes the decode queue on a GPU

    def describe(self) -> dict[str, Any]:
        """{"model": ..., "engine": ..., "identity": what changes records (the resume check)}"""
        ...

    def host_allocator(self) -> Callable[[int], np.ndarray] | None:
        """Pinned memory for decode threads to decode into, or None."""
        ...

    def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]: ...


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

    def __post_init__(self) -> None:
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


TranscriberFactory = Callable[[RunOptions], TranscriberLike]


def default_transcriber(opts: RunOptions) -> TranscriberLike:
    from batchscribe.api import Transcriber

    return Transcriber(model=opts.model, cache_dir=opts.cache_dir, decode=opts.decode, engine=opts.engine)


def run_config(inputs: Sequence[str], opts: RunOptions) -> dict[str, Any]:
    """What pins a directory's records; see resume.IDENTITY_KEYS for the keys that must match."""
    src = opts.source
    return {
        "model": opts.model,
        "decode_options": dataclasses.asdict(opts.decode),
        "format": opts.format,
        "inputs": [_canonical_input(i) for i in inputs],
        "source_options": {"audio_column": src.audio_column, "id_column": src.id_column,
                           "text_column": src.text_column, "passthrough": list(src.passthrough),
                           "config": src.config, "split": src.split},
        "num_shards": src.num_shards,
        "batchscribe_version": __version__,
    }


def _canonical_input(inp: str) -> str:
    path = Path(inp).expanduser()
    return str(path.resolve()) if path.exists() else inp


@dataclass(frozen=True)
class _DecodePlan:
    """How audio reaches the model, decided once before the model loads: on CUDA, decode threads
    (no copy between processes; a read-ahead thread keeps the engine's thread free to launch), on
    the CPU processes (a crashing decoder costs one item)."""

    on_cuda: bool
    threads: bool

    @classmethod
    def for_run(cls, opts: RunOptions) -> _DecodePlan:
        from batchscribe.engine.setup import resolve_device

        on_cuda = resolve_device(opts.engine.device).type == "cuda"
        return cls(on_cuda, on_cuda if opts.decode_threads is None else opts.decode_threads)


def run(
    inputs: Sequence[str],
    output_dir: Path | str,
    opts: RunOptions = RunOptions(),
    transcriber_factory: TranscriberFactory | None = None,
    progress: ProgressCallback | None = None,
) -> RunResult:
    """Transcribe `inputs` into `output_dir`, resuming what an earlier run there left undone.

    Raises SourceError / ConfigError / ResumeConflictError / model errors before any record is
    written when the run cannot start, and TooManyErrors (after committing) past `max_errors`.
    """
    output_dir = Path(output_dir)
    start_wall, start_time = time.monotonic(), _now()
    prefix = output_prefix(opts.source.num_shards, opts.source.shard_index)
    state = open_output(output_dir, opts.format, prefix, overwrite=opts.overwrite)
    config = run_config(inputs, opts)
    check_run_config(output_dir, config)
    plan = _DecodePlan.for_run(opts)
    # Zero-copy views of Arrow's buffers pay off only within one process (decode threads).
    source = dataclasses.replace(opts.source, audio_views=plan.threads)
    items = _peeked(iter_source(inputs, source))  # input and column errors before the model loads
    load_start = time.monotonic()
    transcriber = (transcriber_factory or default_transcriber)(opts)
    load_seconds = time.monotonic() - load_start
    described = _jsonable(transcriber.describe())
    check_engine_identity(output_dir, described.get("identity"))
    write_run_config(output_dir, {**config, "engine": described.get("identity"), "model_info": described.get("model")})
    writer = ShardWriter(output_dir, opts.format, prefix, state.next_index, opts.shard_size,
                         opts.commit_seconds, on_commit=state.on_commit)  # fmt: skip
    sink = Sink(writer, state, opts.max_errors, start_wall, _estimate_total(inputs, opts.source), progress,
                load_seconds)  # fmt: skip
    status = "interrupted"
    try:
        _pipeline(items, transcriber, sink, opts, plan)
        status = "stopped: too many errors" if sink.stop else "complete"
    finally:
        try:
            writer.flush()  # finished records are valid whatever stopped the run
        finally:
            summary = _summary(inputs, opts, state, sink, described, start_wall, start_time, status)
            write_summary(output_dir, summary, summary_name(prefix))
    if sink.stop:
        raise TooManyErrors(
            f"{sink.total_errors} item errors exceed --max-errors {opts.max_errors}; the run stopped "
            f"after committing {summary['items']} records to {output_dir}. Look at the 'error' "
            f"field of the failed records, fix the input, then rerun (completed ids are skipped)."
        )
    return RunResult(output_dir, summary, tuple(writer.committed))


def _peeked(items: Iterator[SourceItem]) -> Iterator[SourceItem]:
    """Read the first item now, so a missing path or column fails before a model is loaded."""
    first = next(items, None)
    if first is None:
        return iter(())
    return itertools.chain([first], items)


def _decoded(todo: Iterator[SourceItem], transcriber: TranscriberLike, opts: RunOptions,
             plan: _DecodePlan) -> Iterator[Any]:  # fmt: skip
    """The decode pool's stream of DecodedItems, set up for the plan."""
    from batchscribe.audio.pool import decode_stream, read_ahead

    pool_kwargs: dict[str, Any] = {"threads": plan.threads}
    if opts.workers is not None:
        pool_kwargs["workers"] = opts.workers
    if opts.prefetch is not None:
        pool_kwargs["prefetch"] = opts.prefetch
    elif plan.on_cuda:
        pool_kwargs["prefetch"] = max(64, 2 * transcriber.n_slots)  # keep every slot fed between admissions
    if opts.pinned_arena is not False and plan.on_cuda and plan.threads:
        allocate = transcriber.host_allocator()
        if allocate is not None:  # decode threads decode straight into pinned memory
            from batchscribe.audio.decode import decode_audio

            pool_kwargs["decoder"] = functools.partial(decode_audio, allocate=allocate)
    decoded: Iterator[Any] = decode_stream(todo, **pool_kwargs)
    if plan.on_cuda:
        decoded = read_ahead(decoded, depth=max(64, transcriber.n_slots))  # the engine thread only admits and steps
    return decoded


def _pipeline(items: Iterator[SourceItem], transcriber: TranscriberLike, sink: Sink, opts: RunOptions,
              plan: _DecodePlan) -> None:  # fmt: skip
    decoded = _decoded(sink.skip_completed(items), transcriber, opts, plan)
    pending: dict[str, tuple[str | None, dict[str, Any]]] = {}

    def feed() -> Iterator[tuple[str, np.ndarray]]:
        # NOTE: the transcriber may pull this generator from its own thread; sink is thread-safe.
        for d in decoded:
            if sink.stop:
                return
            if d.error is not None or d.audio is None:
                sink.add(_error_record(d.id, d.error or "no audio decoded", d.text, d.extra))
                continue
            pending[d.id] = (d.text, dict(d.extra))
            yield d.id, d.audio

    for rec in transcriber.transcribe_stream(feed()):
        item_id = str(rec.get("id"))
        if item_id not in pending:
            raise RuntimeError(f"transcriber returned a record for unknown or repeated id {item_id!r}")
        text, extra = pending.pop(item_id)
        sink.add(_merge(rec, text, extra))
    for item_id, (text, extra) in pending.items():
        # Never lose an id: a transcriber that drops one yields an error record, not a gap.
        sink.add(_error_record(item_id, "the transcriber returned no record for this item "
                                        "(internal error); please report it", text, extra))  # fmt: skip


def _merge(rec: dict[str, Any], text: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(rec["id"])}
    out.update((k, v) for k, v in rec.items() if k != "id")
    if text is not None:
        out["reference"] = text
    out.update(extra)
    return out


def _error_record(item_id: str, error: str, text: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    return _merge(make_error_record(item_id, error), text, extra)


def _estimate_total(inputs: Sequence[str], src: SourceOptions) -> int | None:
    """Item count from Parquet footers / manifest lines when every input is such a file."""
    import glob

    count = 0
    for inp in inputs:
        paths = sorted(glob.glob(inp)) if any(c in inp for c in "*?[") else [inp]
        for p in map(Path, paths):
            if p.suffix == ".parquet" and p.is_file():
                import pyarrow.parquet as pq

                count += pq.ParquetFile(p).metadata.num_rows
            elif p.suffix == ".jsonl" and p.is_file():
                with open(p, "rb") as f:
                    count += sum(1 for line in f if line.strip())
            elif p.is_dir() and (in_folder := count_folder_items(p)) is not None:
                count += in_folder
            else:
                return src.limit
    if src.num_shards > 1:
        count = -(-count // src.num_shards)  # hash split: about an even share
    return count if src.limit is None else min(count, src.limit)


def _summary(inputs: Sequence[str], opts: RunOptions, state: OutputState, sink: Sink,
             described: dict[str, Any], start_wall: float, start_time: str, status: str) -> dict[str, Any]:
    totals = state.totals()
    wall = time.monotonic() - start_wall
    session_seconds = sink.audio_seconds
    return {
        "batchscribe_version": __version__,
        "status": status,
        "items": int(totals["items"]),
        "ok": int(totals["ok"]),
        "errors": int(totals["errors"]),
        "audio_hours": totals["audio_seconds"] / 3600.0,
        "shards": int(totals["shards"]),
        # This session only (a resumed run skips what earlier ones did):
        "this_run": {"items": sink.done, "ok": sink.ok, "errors": sink.errors,
                     "skipped_completed": sink.skipped,
                     "audio_hours": session_seconds / 3600.0},
        "wall_seconds": wall,
        "rtfx": session_seconds / wall if wall > 0 else 0.0,
        # Model loading (and first-use conversion) is a fixed cost; without it, the steady rate.
        "model_load_seconds": sink.load_seconds,
        "rtfx_excluding_model_load": (session_seconds / (wall - sink.load_seconds)
                                      if wall > sink.load_seconds else 0.0),
        "start_time": start_time,
        "end_time": _now(),
        "model": {"name": opts.model, "info": described.get("model")},
        "engine": described.get("engine"),  # as resolved: device, dtype, kernels, slots, graphs
        "options": {
            "decode": dataclasses.asdict(opts.decode),
            "engine": dataclasses.asdict(opts.engine),  # as asked for
            "format": opts.format, "workers": opts.workers, "max_errors": opts.max_errors,
            "source": {**dataclasses.asdict(opts.source), "passthrough": list(opts.source.passthrough)},
        },
        "inputs": [_canonical_input(i) for i in inputs],
        "hostname": hostname(),
        "packages": package_versions(),
    }


def _jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
