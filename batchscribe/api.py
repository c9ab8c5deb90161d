"""The Python entry point: `Transcriber` turns audio arrays into verbose_json records.

    from batchscribe import Transcriber
    t = Transcriber("tiny.en")
    record = t.transcribe("clip.flac")                    # a path or encoded bytes
    records = t.transcribe([("utt1", audio1), ("utt2", audio2)], sample_rate=sr)  # mono float arrays
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchscribe.audio.arrays import (AudioLike, check_array, check_finite, check_rate, is_audio, item_label,
                                      mapping_hint, prepare_audio)
from batchscribe.audio.decode.base import AudioDecodeError
from batchscribe.audio.vad import SpeechDetector
from batchscribe.audio.vad_stream import SpeechStage, VadBatching
from batchscribe.config import ConfigError, DecodeOptions, EngineOptions
from batchscribe.constants import SAMPLE_RATE
from batchscribe.engine import prewarm
from batchscribe.engine.engine import build_engine
from batchscribe.engine.pinned import PinnedArena
from batchscribe.engine.scheduler import SchedulePolicy, Scheduler
from batchscribe.engine.setup import EngineConfig
from batchscribe.engine.windows import WindowPlanner, step_spec
from batchscribe.heap import stream_collector
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper
from batchscribe.model_check import ModelFiles, check_language_and_task
from batchscribe.output.verbose_json import make_error_record, transcript_record
from batchscribe.weights import load_state_dict
from batchscribe.weights.digest import weights_sha256


def _samples(items: Iterable[tuple | None], sample_rate: int | None, failed: deque[dict]) -> Iterator[tuple | None]:
    """(id, audio[, prompt]) -> (id, float32 mono 16 kHz samples[, prompt]). The pipeline's arrays
    pass through after an O(1) check (the engine's path is not slowed); anything else is decoded or
    resampled. A third element is the item's own initial prompt (`--prompt-column`). A file that
    cannot be decoded becomes an error record in `failed`, as in `batchscribe run`, not an
    exception that loses the other items."""
    for entry in items:
        if entry is None:  # a live source's "nothing ready yet" (ray/feed.py), for the scheduler
            yield None
            continue
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            # NOTE: unpacking a bare path would split it into characters: id '/', audio 'w', ...
            raise TypeError(
                f"transcribe_stream() takes (id, audio) pairs, not {_describe_entry(entry)}; "
                "pass e.g. [(path, path)] or [('utt1', samples)], or call transcribe() for bare items"
            )
        item_id, audio, *prompt = entry
        try:
            if isinstance(audio, np.ndarray) and audio.dtype == np.float32 and sample_rate == SAMPLE_RATE:
                check_array(item_id, audio)
                check_finite(item_id, audio)  # one BLAS pass (docs/GPU_NOTES.md): the pipeline's arrays too
            else:
                audio = prepare_audio(item_id, audio, sample_rate)
        except AudioDecodeError as exc:
            failed.append(make_error_record(item_id, str(exc)))
            continue
        yield (item_id, audio, *prompt)


def _describe_entry(entry: object) -> str:
    if isinstance(entry, (tuple, list)):
        return f"a {type(entry).__name__} of {len(entry)} elements"
    if isinstance(entry, (str, os.PathLike)):
        return f"the bare path {os.fspath(entry)!r}"
    return f"a {type(entry).__name__}"


def _drain(failed: deque[dict]) -> Iterator[dict]:
    while failed:
        yield failed.popleft()


@dataclass(frozen=True)
class ModelInfo:
    name: str  # as the user gave it
    path: str  # the resolved Hugging Face folder
    dims: ModelDims
    device: str
    dtype: str
    attention: str = "sdpa/sdpa/float32"  # self-attention kernel / cross-attention kernel / cross K/V dtype


def _engine_options(engine: EngineOptions | None, **given: Any) -> EngineOptions:
    """`engine=EngineOptions(...)`, or the same fields as keywords; not both."""
    if engine is None:
        return EngineOptions(**given)
    defaults = EngineOptions()
    changed = [k for k, v in given.items() if v != getattr(defaults, k)]
    if changed:
        raise ConfigError(f"pass either engine=EngineOptions(...) or {', '.join(changed)}=..., not both")
    return engine


class Transcriber:
    """Loads a Whisper model once and transcribes files, bytes, arrays or streams of (id, audio) items.

    Engine settings come as `engine=EngineOptions(...)` or as the keywords device, dtype, batch_size,
    cuda_graphs, attention, cross_kv, encoder_precision and batch_invariant; decoding options as
    `decode=DecodeOptions(...)` or as DecodeOptions' field names. Each set of decoding options gets
    its own engine (slots, caches, graphs), built on first use. `model`: a name (alias, folder or hub
    id, resolved in `cache_dir`), or a ModelFiles already resolved (`cache_dir` is then its own).
    """

    def __init__(
        self,
        model: str | ModelFiles = "tiny.en",
        device: str = "auto",
        dtype: str | None = None,
        batch_size: int | None = None,
        cache_dir: str | Path | None = None,
        cuda_graphs: bool = True,
        attention: str = "auto",
        cross_kv: str = "auto",
        encoder_precision: str = "auto",
        batch_invariant: bool | None = None,
        decode: DecodeOptions | None = None,
        engine: EngineOptions | None = None,
        **decode_options: Any,
    ):
        known = {f.name for f in fields(DecodeOptions)}
        unknown = set(decode_options) - known
        if unknown:
            raise ConfigError(f"unknown decoding option(s) {sorted(unknown)}; known: {sorted(known)}")
        if decode is not None and decode_options:
            raise ConfigError("pass either decode=DecodeOptions(...) or keyword options, not both")
        self.options = decode or DecodeOptions(**decode_options)
        self.engine_options = _engine_options(engine, device=device, dtype=dtype, batch_size=batch_size,
                                              cuda_graphs=cuda_graphs, attention=attention, cross_kv=cross_kv,
                                              encoder_precision=encoder_precision,
                                              batch_invariant=batch_invariant)  # fmt: skip
        # Usage errors (model, language, task, engine options) before the weights load.
        files = model if isinstance(model, ModelFiles) else ModelFiles.resolve(model, cache_dir)
        self._prewarm = prewarm.start(self.engine_options, files.dims)  # the GPU libraries load while the rest does
        resolved = files.check(self.options, self.engine_options)
        self.tokenizer, self._files = files.tokenizer, files
        dims, folder, config, generation = files.dims, files.folder, files.config, files.generation
        self.alignment_heads = files.alignment_heads() if self.options.word_timestamps else None
        self.weights_sha256 = weights_sha256(folder, files.cache)  # pins a run's records to these weights
        with torch.device("meta"):  # no random init to overwrite: every tensor comes from the checkpoint
            self.model = Whisper(dims).eval()
        self.model.load_hf_state_dict(load_state_dict(folder), assign=True)
        self.model.to(device=resolved.device, dtype=resolved.dtype)
        self.model_suppress = list(generation.get("suppress_tokens") or config.get("suppress_tokens") or [])
        self.config: EngineConfig = resolved.with_slots(dims)  # free memory is read after the weights
        self.model_info = ModelInfo(files.name, str(folder), dims, str(self.config.device), self.config.dtype_name,
                                    self.config.attention.describe(self.config.dtype))  # fmt: skip
        self._schedulers: dict[DecodeOptions, Scheduler] = {}
        self._speech_detector: SpeechDetector | None = None
        # --vad: items scored at once (tests and benchmarks vary it); under batch invariance the
        # detector scores them at fixed shapes (audio/vad_model.py)
        self.vad_batching = VadBatching()
        if self.options.vad:
            self.speech_detector()  # loaded with the model: inside run()'s deferred stops, as the weights are

    @property
    def n_slots(self) -> int:
        """Decoder slots per engine, as configured (an engine may hold fewer after running out of memory)."""
        assert self.config.n_slots is not None
        return self.config.n_slots

    def build_scheduler(self, options: DecodeOptions | None = None, config: EngineConfig | None = None) -> Scheduler:
        """A new engine and its scheduler for `options` (default: this transcriber's), on `config`
        (default: this transcriber's; e.g. `dataclasses.replace(t.config, cuda_graphs=False)`)."""
        options = options or self.options
        check_language_and_task(self.tokenizer, options)  # options given per call are checked too
        self.tokenizer.build_decode_tables()  # host work, done while the Prewarm thread waits on the GPU
        self._prewarm.join()
        spec = step_spec(self.tokenizer, options, self.model_suppress, self.model.dims.n_text_ctx)
        heads = None
        if options.word_timestamps:
            heads = self.alignment_heads = self.alignment_heads or self._files.alignment_heads()
        engine = build_engine(self.model, spec, config or self.config, heads)
        return Scheduler(engine, WindowPlanner(self.tokenizer, options))

    def scheduler(self, options: DecodeOptions | None = None) -> Scheduler:
        """The scheduler (and engine) for `options`, built once: engines hold the static caches and
        captured graphs."""
        options = options or self.options
        if options not in self._schedulers:
            self._schedulers[options] = self.build_scheduler(options)
        return self._schedulers[options]

    def release(self) -> None:
        """Drop every engine (its caches, graphs and pinned buffers) built so far; the next call builds anew."""
        self._schedulers.clear()

    def host_allocator(self, options: DecodeOptions | None = None, *,
                       arena: PinnedArena | None = None) -> Callable[[int], np.ndarray] | None:  # fmt: skip
        """For decode threads feeding `transcribe_stream` on a GPU: `allocate(n_samples)` gives pinned
        host memory to decode into (`decode_audio(allocate=...)`), which admission copies to the
        device without packing it first. None on the CPU. Builds the engine (and its arena) first;
        with `arena` (one the caller made, e.g. so that decoding starts while the model loads), the
        engine takes that one."""
        if not self.config.on_cuda:
            return None
        taken = self.scheduler(options).engine.enable_arena(arena=arena)
        return None if taken is None else taken.allocate

    def transcribe_stream(
        self, items: Iterable[tuple[str, AudioLike]], options: DecodeOptions | None = None,
        *, sample_rate: int = SAMPLE_RATE, policy: SchedulePolicy | None = None,
    ) -> Iterator[dict]:
        """Records as items finish (not input order). Audio: arrays at `sample_rate` (default 16 kHz,
        what the pipeline's decoder gives), file paths or encoded bytes. With --vad the speech is
        found ahead of the scheduler, in batches on worker threads (`SpeechStage`); an item whose
        detection fails gets an error record. `policy`: the scheduler's, if not its default
        (benchmarks vary it)."""
        check_rate(sample_rate)  # a usage error: before any item is taken
        options, failed = options or self.options, deque()
        scheduler, source = self.scheduler(options), _samples(items, sample_rate, failed)
        with stream_collector():  # the model, its graphs and the imports are no garbage while this runs
            if not options.vad:
                for transcript in scheduler.run(source, policy):
                    yield from _drain(failed)
                    yield transcript_record(transcript)
                yield from _drain(failed)
                return
            # Closed however the stream ends (a stop, an error, the caller's close): its threads end.
            with SpeechStage(source, self.speech_detector(), self.vad_batching) as stage:
                for transcript in scheduler.run(stage, policy):
                    yield from _drain(failed)
                    error = stage.finished(transcript.id)
                    yield transcript_record(transcript) if error is None else make_error_record(transcript.id, error)
            yield from _drain(failed)

    def speech_detector(self) -> SpeechDetector:
        """--vad's Silero model, loaded once, on the engine's device."""
        if self._speech_detector is None:
            self._speech_detector = SpeechDetector(self.config.device, invariant=self.config.batch_invariant)
        return self._speech_detector

    def transcribe(
        self, audio: AudioLike | Sequence[AudioLike] | Sequence[tuple[str, AudioLike]],
        options: DecodeOptions | None = None, *, sample_rate: int | None = None,
    ) -> list[dict] | dict:
        """One item -> one record; a list of items or (id, item) pairs -> records in input order.

        An item is a file path, encoded bytes (decoded as `batchscribe run` decodes them) or a 1-D
        float array of samples at `sample_rate` Hz (resampled to 16 kHz). Ids: the pair's, else a
        path as given, else the item's position in the list.
        """
        if isinstance(audio, Mapping):
            raise TypeError(f"transcribe() takes a path, bytes, an array or a list of them; its argument "
                            f"{mapping_hint(audio)}")
        single = is_audio(audio) and not isinstance(audio, (list, tuple))
        if not single and not isinstance(audio, Iterable):
            raise TypeError(f"transcribe() takes a path, bytes, an array or a list of them (or of (id, item) "
                            f"pairs), not a {type(audio).__name__}")
        if (isinstance(audio, tuple) and len(audio) == 2 and isinstance(audio[0], str)
                and isinstance(audio[1], (np.ndarray, bytes, bytearray, memoryview))):  # fmt: skip
            # NOTE: read as a list, ("utt1", samples) became a missing file 'utt1' and an item '1'
            raise TypeError(f"transcribe() got a tuple ({audio[0]!r}, {type(audio[1]).__name__}): for one item "
                            f"with its id pass a list of one pair, [({audio[0]!r}, audio)]; for two items pass "
                            "a list of them")  # fmt: skip
        batch = [audio] if single else list(audio)  # type: ignore[arg-type]
        items = [x if isinstance(x, tuple) else (item_label(x, i), x) for i, x in enumerate(batch)]
        order = {item_id: i for i, (item_id, _) in enumerate(items)}
        if len(order) != len(items):
            raise ConfigError("item ids must be unique within one transcribe() call")
        for item_id, x in items:  # usage errors first: cheap, and before any decoding or the engine
            if isinstance(x, np.ndarray):
                check_array(item_id, x)
                check_rate(sample_rate, item_id)
        # Items are decoded (arrays resampled) as the engine pulls them, so a list of paths never
        # sits in memory decoded; one that cannot be decoded, or an array with NaN samples, gets an
        # error record, as in `batchscribe run`.
        stream = self.transcribe_stream(items, options, sample_rate=sample_rate or SAMPLE_RATE)
        records = sorted(stream, key=lambda r: order[r["id"]])
        if single and "error" in records[0]:
            raise AudioDecodeError(records[0]["error"])  # one item: its error, as an exception
        return records[0] if single else records

    def describe(self) -> dict[str, Any]:
        """Model, resolved engine and decoding options: for run configs and summaries."""
        identity = {**self.config.identity(), "weights_sha256": self.weights_sha256}
        return {"model": asdict(self.model_info), "engine": self.config.describe(), "identity": identity,
                "decode": asdict(self.options)}  # fmt: skip
