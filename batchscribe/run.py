"""The `run` pipeline: sources -> decode pool -> transcriber -> shard writers, exactly once.

A decode failure becomes an error record here and never reaches the model. Items whose ids an
earlier run into the same directory already committed are skipped before decoding, so a resumed
run redoes only what was in flight when the last one stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from batchscribe.audio.sources import SourceItem, iter_source
from batchscribe.audio.sources.fingerprint import canonical_input, fingerprint_of, inputs_listing
from batchscribe.config import ConfigError
from batchscribe.output.identity import ID_SCHEME, decode_identity
from batchscribe.output.lock import lock_output
from batchscribe.output.records import error_record, jsonable, merge_record, now_iso
from batchscribe.output.resume import output_prefix, summary_name
from batchscribe.output.writers import write_summary
from batchscribe.run_folder import Folder, checked_state, nothing_left, open_sink
from batchscribe.run_options import RunOptions, RunResult, TooManyErrors  # noqa: F401 (run's API)
from batchscribe.sink import CompletedFilter, ProgressCallback, Sink, estimate_total, first_pending, run_summary
from batchscribe.stops import Terminated, deferred, stop_signals  # noqa: F401 (Terminated: what run() raises)
from batchscribe.version import __version__

if TYPE_CHECKING:
    from batchscribe.model_check import ModelFiles

log = logging.getLogger(__name__)


class TranscriberLike(Protocol):
    """What `run` needs of a transcriber (api.Transcriber; a stand-in in plumbing tests)."""

    n_slots: int  # windows decoded together: sizes the decode queue on a GPU

    def describe(self) -> dict[str, Any]:
        """{"model": ..., "engine": ..., "identity": what changes records (the resume check)}"""
        ...

    def host_allocator(self, arena: Any = None) -> Callable[[int], np.ndarray] | None:
        """Pinned memory for decode threads to decode into, or None; `arena`: a PinnedArena that
        decode threads already fill (made before the model loaded), for the engine to take."""
        ...

    def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]: ...


TranscriberFactory = Callable[[RunOptions], TranscriberLike]


def default_transcriber(opts: RunOptions, files: ModelFiles | None = None) -> TranscriberLike:
    """The Transcriber for `opts`; `files`: the model as `check_model` found it (else resolved now)."""
    from batchscribe.api import Transcriber

    return Transcriber(model=files or check_model(opts), decode=opts.decode, engine=opts.engine)


def check_model(opts: RunOptions, prewarm: bool = False) -> ModelFiles:
    """The model's files, read and checked without its weights: an unknown model, a language or task
    it cannot do, an engine option or --prompt-column it does not fit are usage errors now.
    `prewarm`: in the process that will load the model, start the GPU libraries' loading
    (engine/prewarm.py) as soon as the model's shape is known, before the slower checks."""
    from batchscribe.model_check import ModelFiles

    files = ModelFiles.resolve(opts.model, opts.cache_dir)
    if prewarm:
        from batchscribe.engine import prewarm as gpu_libraries

        gpu_libraries.start(opts.engine, files.dims)
    files.check(opts.decode, opts.engine)
    check_item_prompts(opts, files.dims.is_multilingual)
    return files


def check_item_prompts(opts: RunOptions, multilingual: bool | None = None) -> None:
    """--prompt-column on a multilingual model needs --language: a usage error before the weights
    load (the engine would otherwise refuse the first prompted item mid-run). `multilingual`: the
    model's, if known (else read from its config)."""
    if opts.source.prompt_column is None or opts.decode.language is not None:
        return
    if multilingual is None:
        from batchscribe.model.dims import ModelDims
        from batchscribe.weights import resolve_model

        folder = resolve_model(opts.model, cache_dir=opts.cache_dir)
        multilingual = ModelDims.from_hf_config(json.loads((folder / "config.json").read_text())).is_multilingual
    if multilingual:
        raise ConfigError(f"--prompt-column {opts.source.prompt_column} with the multilingual model {opts.model!r} "
                          "needs --language (e.g. --language en): the language is detected in the same decode "
                          "the prompt conditions")


def run_config(inputs: Sequence[str], opts: RunOptions, listing: dict[str, str]) -> dict[str, Any]:
    """What pins a directory's records; see identity.IDENTITY_KEYS for the keys that must match.
    listing: fingerprint.inputs_listing of the inputs."""
    src = opts.source
    return {
        "model": opts.model,
        "decode_options": decode_identity(opts.decode),
        "format": opts.format,
        "inputs": [canonical_input(i) for i in inputs],
        "inputs_fingerprint": fingerprint_of(inputs, listing),
        "id_scheme": ID_SCHEME,
        "source_options": {"audio_column": src.audio_column, "id_column": src.id_column,
                           "text_column": src.text_column, "passthrough": list(src.passthrough),
                           "config": src.config, "split": src.split, **src.prompt_identity()},
        "num_shards": src.num_shards,
        "batchscribe_version": __version__,
    }


@dataclass(frozen=True)
class _DecodePlan:
    """How audio reaches the model, decided once before the model loads: on CUDA, decode threads
    (no copy between processes; a read-ahead thread keeps the engine's thread free to launch) into
    pinned memory (`arena`), on the CPU processes (a crashing decoder costs one item)."""

    on_cuda: bool
    threads: bool
    arena: bool = False  # decode threads decode into a PinnedArena the engine copies from by DMA

    @classmethod
    def for_run(cls, opts: RunOptions) -> _DecodePlan:
        from batchscribe.engine.setup import resolve_device

        on_cuda = resolve_device(opts.engine.device).type == "cuda"
        threads = on_cuda if opts.decode_threads is None else opts.decode_threads
        return cls(on_cuda, threads, on_cuda and threads and opts.pinned_arena is not False)

    def slots_hint(self, opts: RunOptions) -> int:
        """The decoder slots to feed before the engine has sized them (at most this many)."""
        from batchscribe.engine.sizing import CPU_SLOTS, CUDA_SLOT_CAP

        return opts.engine.batch_size or (CUDA_SLOT_CAP if self.on_cuda else CPU_SLOTS)

    def new_arena(self) -> Any:
        """The pinned arena decode threads fill: the process's shared one, made beside the model
        load if it is new (engine/pinned.shared_arena), or None."""
        if not self.arena:
            return None
        from batchscribe.engine.pinned import shared_arena

        return shared_arena()


def run(
    inputs: Sequence[str],
    output_dir: Path | str,
    opts: RunOptions = RunOptions(),
    transcriber_factory: TranscriberFactory | None = None,
    progress: ProgressCallback | None = None,
) -> RunResult:
    """Transcribe `inputs` into `output_dir`, resuming what an earlier run there left undone.

    Raises OutputInUseError / SourceError / ConfigError / ResumeConflictError / model errors
    before anything in the folder is changed when the run cannot start, TooManyErrors (after
    committing) past `max_errors`, and KeyboardInterrupt / Terminated (after committing and
    writing the summary) on SIGINT / SIGTERM (batchscribe.stops).
    """
    output_dir = Path(output_dir)
    start_wall, start_time = time.monotonic(), now_iso()
    prefix = output_prefix(opts.source.num_shards, opts.source.shard_index)
    with stop_signals():
        with deferred():  # imports torch and Triton: start-up, which the summary counts with the model load
            plan = _DecodePlan.for_run(opts)
        startup_seconds = time.monotonic() - start_wall
        # Zero-copy views of Arrow's buffers pay off only within one process (decode threads).
        source = dataclasses.replace(opts.source, audio_views=plan.threads, exclude=(os.path.realpath(output_dir),))
        listing = inputs_listing(inputs, source.exclude)
        config = run_config(inputs, opts, listing)
        # Input and column errors before the output folder is made (and before the model loads),
        # then the model's and the options' (lock files, once made, stay: output/lock.py).
        items = _peeked(iter_source(inputs, source))
        if transcriber_factory is None:
            checking = time.monotonic()
            transcriber_factory = functools.partial(default_transcriber, files=check_model(opts, prewarm=True))
            startup_seconds += time.monotonic() - checking  # reading the model's files: start-up too
        with lock_output(output_dir, prefix) as lock:
            state = checked_state(output_dir, prefix, config, opts, lock, listing)
            skipped = 0
            plain = not (opts.overwrite or opts.retry_errors)
            if plain:
                skipped, pending = first_pending(items, state.completed)
                if pending is None:
                    return nothing_left(state, opts, skipped, start_wall, start_time)
                items = pending
            skip = CompletedFilter(state, skipped)

            def open_(described: dict[str, Any], load_seconds: float) -> Sink:
                return open_sink(Folder(state, lock, config, listing), opts, described, start_wall,
                                 estimate_total(inputs, opts.source), progress, startup_seconds + load_seconds,
                                 skip)  # fmt: skip

            transcriber, described, sink, decoded = _start(skip(items), plain, opts, plan, transcriber_factory, open_)
            summary = _run_pipeline(decoded, transcriber, sink, lambda status: run_summary(
                inputs, opts, state, sink, described, start_time, status))
            write_summary(output_dir, summary, summary_name(prefix))
    if sink.stop:
        raise TooManyErrors(
            f"{sink.total_errors} item errors exceed --max-errors {opts.max_errors}; the run stopped "
            f"after committing {summary['items']} records to {output_dir}. Look at the 'error' "
            f"field of the failed records and fix those inputs, then rerun with --retry-errors to "
            f"transcribe them again (a plain rerun keeps committed error records and skips them)."
        )
    return RunResult(output_dir, summary, tuple(sink.writer.committed))


def _start(todo: Iterator[SourceItem], plain: bool, opts: RunOptions, plan: _DecodePlan,
           factory: TranscriberFactory | None,
           open_: Callable[[dict[str, Any], float], Sink]) -> tuple[TranscriberLike, dict[str, Any], Sink, Iterator[Any]]:  # fmt: skip
    """The transcriber, its description, the sink (`open_`) and the decoded items' stream. With
    decode threads, a plain run decodes while the model loads, so the first admissions find their
    audio ready: only a plain run's completed ids are final before the load (--overwrite and
    --retry-errors change them in open_sink), and decode processes would compete with it."""
    decoded, arena = None, None
    if plain and plan.threads:
        arena = plan.new_arena()
        decoded = _decoded(todo, opts, plan, arena, plan.slots_hint(opts))
    try:
        transcriber, load_seconds = _load(opts, plan, factory, arena)
        described = jsonable(transcriber.describe())
        sink = open_(described, load_seconds)
    except BaseException:
        if decoded is not None:
            _close(decoded)  # a model that failed to load: the decode threads end too
        raise
    if decoded is None:
        allocate = transcriber.host_allocator() if plan.arena else None
        decoded = _decoded(todo, opts, plan, allocate, transcriber.n_slots)
    return transcriber, described, sink, decoded


def _load(opts: RunOptions, plan: _DecodePlan, factory: TranscriberFactory | None,
          arena: Any = None) -> tuple[TranscriberLike, float]:  # fmt: skip
    """The transcriber and the seconds its start took; a stop meanwhile waits until it is done.
    `arena`: the PendingArena decode threads already decode into, for the engine to take."""
    start = time.monotonic()
    with deferred():  # the model load and the CUDA graph captures
        transcriber = (factory or default_transcriber)(opts)
        if plan.arena:  # builds and captures the engine now: start-up counts it
            transcriber.host_allocator(arena=None if arena is None else arena.result())
    return transcriber, time.monotonic() - start


def _run_pipeline(decoded: Iterator[Any], transcriber: TranscriberLike, sink: Sink,
                  summarize: Callable[[str], dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Run, then commit what is buffered and build the summary, whatever stopped the run; an
    interrupt's summary is written before the interrupt goes on."""
    status = "interrupted"
    try:
        _pipeline(decoded, transcriber, sink)
        sink.flush()  # the last shard: a commit that fails here is summarised as one mid-run is
        status = "stopped: too many errors" if sink.stop else "complete"
    except BaseException:
        try:
            sink.flush()  # finished records are valid whatever stopped the run
        finally:
            try:
                write_summary(sink.state.directory, summarize(status), summary_name(sink.state.prefix))
            except OSError as exc:  # e.g. the same full disk: the error that stopped the run is the one raised
                log.warning("the summary could not be written either: %s", exc)
        raise
    return summarize(status)


def _peeked(items: Iterator[SourceItem]) -> Iterator[SourceItem]:
    """Read the first item now, so a missing path or column fails before a model is loaded."""
    first = next(items, None)
    if first is None:
        return iter(())
    return itertools.chain([first], items)


def _decoded(todo: Iterator[SourceItem], opts: RunOptions, plan: _DecodePlan, arena: Any,
             n_slots: int) -> Iterator[Any]:  # fmt: skip
    """The decode pool's stream of DecodedItems, set up for the plan, feeding `n_slots` decoder
    slots. `arena`: a (Pending)PinnedArena or an `allocate`, for decode threads to decode into.
    With threads it runs ahead at once, on its own thread."""
    from batchscribe.audio.pool import DEFAULT_MAX_BUFFERED_BYTES, decode_stream, read_ahead

    pool_kwargs: dict[str, Any] = {"threads": plan.threads}
    if opts.workers is not None:
        pool_kwargs["workers"] = opts.workers
    if opts.prefetch is not None:
        pool_kwargs["prefetch"] = opts.prefetch
    elif plan.on_cuda:
        pool_kwargs["prefetch"] = max(64, 2 * n_slots)  # keep every slot fed between admissions
    allocate = getattr(arena, "allocate", arena)
    if allocate is not None:  # decode threads decode straight into pinned memory
        from batchscribe.audio.decode import decode_audio

        pool_kwargs["decoder"] = functools.partial(decode_audio, allocate=allocate)
    decoded: Iterator[Any] = decode_stream(todo, **pool_kwargs)
    if plan.threads or plan.on_cuda:
        # The engine thread only admits and steps. Bytes bound it too: 256 decoded hour-long files are 59 GB.
        decoded = read_ahead(decoded, depth=max(64, n_slots), max_bytes=DEFAULT_MAX_BUFFERED_BYTES, weigh=_audio_bytes)
    return decoded


def _audio_bytes(decoded: Any) -> int:
    return 0 if decoded.audio is None else decoded.audio.nbytes


def _close(stream: Iterator[Any]) -> None:
    """Close a stream now, whatever stopped the run, not when it is collected. The decode pool's:
    at exit multiprocessing's finalizers unlink the pool's semaphores first, and a worker still
    starting then died printing a traceback."""
    close = getattr(stream, "close", None)
    try:
        if close is not None:
            close()
    except ValueError:  # running on the transcriber's thread ("generator already executing"): it ends it
        pass


def _pipeline(decoded: Iterator[Any], transcriber: TranscriberLike, sink: Sink) -> None:
    pending: dict[str, tuple[str | None, dict[str, Any]]] = {}

    def feed() -> Iterator[tuple[str, np.ndarray]]:
        # NOTE: the transcriber may pull this generator from its own thread; sink is thread-safe.
        for d in decoded:
            if sink.stop:
                return
            if d.error is not None or d.audio is None:
                sink.add(error_record(d.id, d.error or "no audio decoded", d.text, d.extra))
                continue
            pending[d.id] = (d.text, dict(d.extra))
            yield (d.id, d.audio, d.prompt) if d.prompt else (d.id, d.audio)  # a prompt: --prompt-column

    records = transcriber.transcribe_stream(feed())
    try:
        for rec in records:
            item_id = str(rec.get("id"))
            if item_id not in pending:
                raise RuntimeError(f"transcriber returned a record for unknown or repeated id {item_id!r}")
            text, extra = pending.pop(item_id)
            sink.add(merge_record(rec, text, extra))
    finally:
        _close(records)  # first: threads of the transcriber's (--vad's stage) stop pulling feed()
        _close(decoded)
    for item_id, (text, extra) in pending.items():
        # Never lose an id: a transcriber that drops one yields an error record, not a gap.
        sink.add(error_record(item_id, "the transcriber returned no record for this item "
                                        "(internal error); please report it", text, extra))  # fmt: skip
