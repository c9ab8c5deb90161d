"""Items in, records out: the seek loop for long audio, temperature fallback and slot scheduling.

Every item is cut into 30 s windows one at a time (openai transcribe(): the next window starts where
the last complete timestamp of the previous one ends). Windows from many items share the decoder's
slots: as slots free up, new windows are admitted in groups so the encoder runs batched, and an item's
next window is queued as soon as its previous one finishes.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from batchscribe.config import DecodeOptions
from batchscribe.constants import HOP_LENGTH, N_FRAMES, SAMPLE_RATE
from batchscribe.engine.decoding import DecoderSpec, SlotDecoder, WindowRequest, WindowResult
from batchscribe.engine.graphs import EncoderGraphs, GraphRunner, default_buckets, default_kv_buckets, one_step_seconds
from batchscribe.engine.kernels import AttentionKinds
from batchscribe.engine.logits import RuleSpec
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.model.whisper import Whisper
from batchscribe.output.verbose_json import WindowStats, make_record, split_window

log = logging.getLogger(__name__)

# GPU seconds of steps the host launches between looks at the finished flags: enough queued work
# that the device stays busy while the host admits and collects (host turns take ~1 ms on the H200),
# and no more, since a finished row idles until its batch is read.
STEPS_AHEAD_SECONDS = 0.002
MAX_STEPS_PER_CHECK = 4


def steps_per_check(step_seconds: float) -> int:
    """tiny.en's 0.3 ms steps: 4 per look; large-v3's 25 ms steps: 1 (its finished rows would otherwise
    idle for 4-8 steps, ~5 % of W2's row-steps)."""
    return max(1, min(MAX_STEPS_PER_CHECK, math.ceil(STEPS_AHEAD_SECONDS / max(step_seconds, 1e-9))))


@dataclass
class _Item:
    """Host-side progress of one item through its windows."""

    id: str
    audio: np.ndarray  # [n] float32, 16 kHz
    language_token: int | None  # forced, or detected on the first window
    seek: int = 0  # mel frames consumed
    temp_index: int = 0
    segments: list = field(default_factory=list)

    @property
    def content_frames(self) -> int:
        return len(self.audio) // HOP_LENGTH

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def decoder_spec(tokenizer: Tokenizer, options: DecodeOptions, model_suppress: list[int], n_text_ctx: int) -> DecoderSpec:
    max_initial = None
    if options.max_initial_timestamp is not None:
        max_initial = round(options.max_initial_timestamp / 0.02)
    rules = RuleSpec(
        n_vocab=tokenizer.n_vocab,
        eot=tokenizer.eot,
        no_timestamps=tokenizer.no_timestamps,
        timestamp_begin=tokenizer.timestamp_begin,
        suppress=tokenizer.suppress_token_ids(options.suppress_tokens, model_suppress),
        blank=tokenizer.blank_tokens() if options.suppress_blank else (),
        timestamps=not options.without_timestamps,
        max_initial_timestamp_index=max_initial,
    )
    languages = tuple(tokenizer.language_tokens.values()) if tokenizer.is_multilingual else ()
    return DecoderSpec(
        rules=rules,
        no_speech=tokenizer.no_speech,
        language_tokens=languages,
        sample_len=options.sample_len or n_text_ctx // 2,
    )


class Engine:
    """Transcribes a stream of (id, audio) items with a SlotDecoder; yields records as items finish."""

    def __init__(
        self,
        model: Whisper,
        tokenizer: Tokenizer,
        options: DecodeOptions,
        model_suppress: list[int],
        device: torch.device,
        n_slots: int,
        cuda_graphs: bool = True,
        attention: AttentionKinds = AttentionKinds(),
    ):
        self.tokenizer, self.options = tokenizer, options
        self.attention = attention
        spec = decoder_spec(tokenizer, options, model_suppress, model.dims.n_text_ctx)
        # The host launches `check_every` steps, queues a snapshot of the slots, and then reads the
        # snapshot queued `lag` batches earlier: on the GPU, waiting for that one leaves the newest
        # steps queued, so the device never idles while the host admits and post-processes.
        # Finished rows idle for a few inert steps instead. On the CPU the look is free.
        self.check_every = MAX_STEPS_PER_CHECK if device.type == "cuda" else 1
        self.lag = 1 if device.type == "cuda" else 0
        self.graphs: GraphRunner | None = None
        self.encoder_graphs: EncoderGraphs | None = None
        self.decoder = self._build(model, spec, options, device, n_slots, cuda_graphs)
        self.forced_language: int | None = None
        if options.language is not None and tokenizer.is_multilingual:
            self.forced_language = tokenizer.language_tokens[tokenizer.language_code(options.language)]
        self._code_of_token = {tok: code for code, tok in tokenizer.language_tokens.items()}
        # Host seconds per stage (and counts), for benchmarks: where does the time go? And when
        # (perf_counter) the last stream started, got its first item, first and last admitted,
        # and yielded its last record.
        self.timings: defaultdict[str, float] = defaultdict(float)
        self.marks: dict[str, float] = {}
        # Admit when a quarter of the slots are free, so the encoder sees groups, not single windows.
        self.admit_min = max(1, self.decoder.n_slots // 4)
        self.admit_max = self.decoder.n_slots  # lowered when an admission runs out of memory
        # Looks queued just before an admission: the host then packs the group's audio (~6 ms for
        # 64 LibriSpeech windows on the H200 host) while the GPU steps the running rows, instead of
        # idling once the one look behind the lag is done (W1: 0/1/2 looks, RTFx 9.9k/10.3k/11.1k).
        self.looks_before_admission = 2 if self.graphs is not None else 0
        # Once nothing is left to admit, move running windows down into the holes finished ones
        # leave whenever that at least halves the rows each step covers (SlotDecoder.compact).
        self.compact_tail = True

    def _build(
        self,
        model: Whisper,
        spec: DecoderSpec,
        options: DecodeOptions,
        device: torch.device,
        n_slots: int,
        cuda_graphs: bool,
    ) -> SlotDecoder:
        """Allocate the slots (and capture their graphs); out of memory, halve the slots and retry."""
        kv_buckets = default_kv_buckets(model.dims.n_text_ctx) if device.type == "cuda" else ()
        if self.attention.self_attention in ("flashinfer", "triton"):
            kv_buckets = (model.dims.n_text_ctx,)  # ragged lengths are native: one graph per bucket
        while True:
            try:
                decoder = SlotDecoder(model, spec, n_slots, device, kv_buckets=kv_buckets, attention=self.attention)
                if device.type == "cuda":
                    decoder.warm_up_encoder()
                if device.type == "cuda" and cuda_graphs:
                    step = one_step_seconds(decoder, n_slots)
                    self.check_every = steps_per_check(step)
                    log.info("a %d-row step takes %.2f ms on the GPU: looking at finished rows every %d steps",
                             n_slots, step * 1e3, self.check_every)  # fmt: skip
                    self.graphs = GraphRunner(decoder, default_buckets(n_slots), steps=self.check_every)
                    self.graphs.capture(sample=False)
                    decoder.runner = self.graphs
                    self.encoder_graphs = EncoderGraphs(decoder)
                    self.encoder_graphs.capture()
                    decoder.encoder_runner = self.encoder_graphs
                return decoder
            except torch.OutOfMemoryError:
                if n_slots == 1:
                    raise
                log.warning("out of GPU memory with %d decoder slots; retrying with %d", n_slots, n_slots // 2)
            # Out of the except block, so its traceback no longer holds the failed attempt's caches;
            # the decoder and its graph runners reference each other, so only the collector frees them.
            decoder = self.graphs = self.encoder_graphs = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            n_slots //= 2

    # -- windows -------------------------------------------------------------------------------

    def _prompt(self, item: _Item) -> tuple[tuple[int, ...], bool]:
        tok = self.tokenizer
        if not tok.is_multilingual:
            return tok.sot_sequence(None, self.options.task, self.options.without_timestamps), False
        detect = item.language_token is None
        task = tok.transcribe if self.options.task == "transcribe" else tok.translate
        language = tok.sot if detect else item.language_token  # placeholder, replaced in the step
        prompt = (tok.sot, language, task)
        if self.options.without_timestamps:
            prompt += (tok.no_timestamps,)
        return prompt, detect

    def _window(self, key: int, item: _Item) -> WindowRequest:
        start = item.seek * HOP_LENGTH
        audio = item.audio[start : start + N_FRAMES * HOP_LENGTH]
        prompt, detect = self._prompt(item)
        temperature = self.options.temperatures[item.temp_index]
        # Sampling depends only on (seed, item, window, attempt): resumable and batch-independent.
        digest = hashlib.blake2b(f"{self.options.seed}/{item.id}/{item.seek}/{item.temp_index}".encode(), digest_size=7)
        noise_key = int.from_bytes(digest.digest(), "little")
        return WindowRequest(key, audio, prompt, detect, temperature, noise_key)

    # -- results -------------------------------------------------------------------------------

    def _needs_fallback(self, avg_logprob: float, ratio: float, no_speech_prob: float) -> bool:
        """openai decode_with_fallback's test."""
        opt = self.options
        too_repetitive = opt.compression_ratio_threshold is not None and ratio > opt.compression_ratio_threshold
        too_unlikely = opt.logprob_threshold is not None and avg_logprob < opt.logprob_threshold
        silent = opt.no_speech_threshold is not None and no_speech_prob > opt.no_speech_threshold
        return (too_repetitive or too_unlikely) and not (silent and too_unlikely)

    def _finish_window(self, item: _Item, res: WindowResult) -> bool:
        """Fold a window's result into its item; True when the item has no audio left."""
        opt = self.options
        if item.language_token is None and res.language_token is not None:
            item.language_token = res.language_token
        stats = WindowStats.from_decode(
            res.tokens,
            self.tokenizer,
            temperature=res.temperature,
            sum_logprob=res.sum_logprob,
            no_speech_prob=res.no_speech_prob,
        )
        avg_logprob = stats.avg_logprob
        if self._needs_fallback(avg_logprob, stats.compression_ratio, res.no_speech_prob) and item.temp_index + 1 < len(opt.temperatures):
            item.temp_index += 1
            return False
        item.temp_index = 0
        window_frames = min(N_FRAMES, item.content_frames - item.seek)
        skip = opt.no_speech_threshold is not None and res.no_speech_prob > opt.no_speech_threshold
        if opt.logprob_threshold is not None and avg_logprob > opt.logprob_threshold:
            skip = False
        if skip:  # silence: openai transcribe() moves on by the whole window
            item.seek += window_frames
        else:
            window = split_window(
                res.tokens,
                self.tokenizer,
                time_offset=item.seek * HOP_LENGTH / SAMPLE_RATE,
                window_frames=window_frames,
                seek=item.seek,
                stats=stats,
            )
            item.segments.extend(window.segments)
            item.seek = window.seek
        return item.seek >= item.content_frames

    def _record(self, item: _Item) -> dict:
        code = self._code_of_token.get(item.language_token, "en") if item.language_token else "en"
        return make_record(item.id, item.segments, code, item.duration)  # writes the code's name

    # -- the loop ------------------------------------------------------------------------------

    def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict]:
        source = iter(items)
        exhausted = False
        live: dict[int, _Item] = {}  # key -> item with a window queued or in a slot
        queue: deque[int] = deque()  # keys whose next window waits for a slot
        next_key = 0
        dec = self.decoder
        clock, marks = self.timings, self.marks
        marks.clear()
        marks["start"] = time.perf_counter()

        def advance(n_rows: int) -> None:
            """One look's steps over rows [0, n_rows), counted."""
            dec.advance(n_rows, self.check_every)
            clock["steps"] += self.check_every
            clock["row_steps"] += n_rows * self.check_every

        def collect(keep: int) -> Iterator[dict]:
            """Fold in the finished windows of every queued snapshot but the newest `keep`."""
            while dec.pending_snapshots() > keep:
                t0 = time.perf_counter()
                snap = dec.wait_snapshot()  # on the GPU: the batch before the newest is done
                t1 = time.perf_counter()
                finished = dec.finished(snap)
                t2 = time.perf_counter()
                clock["wait_snapshot"] += t1 - t0
                clock["collect"] += t2 - t1
                for res in finished:
                    item = live[res.key]
                    if self._finish_window(item, res):
                        del live[res.key]
                        record = self._record(item)
                        marks["last_record"] = time.perf_counter()
                        clock["finish"] += marks["last_record"] - t2
                        yield record
                        t2 = time.perf_counter()
                    else:
                        queue.append(res.key)
                clock["finish"] += time.perf_counter() - t2

        while True:
            free = dec.free_slots()
            # Pull at most one admission group ahead: the GPU starts on the first group while the
            # decode workers are still filling the next.
            while not exhausted and len(queue) < min(len(free), self.admit_min):
                t0 = time.perf_counter()
                try:
                    item_id, audio = next(source)
                except StopIteration:
                    exhausted = True
                    break
                finally:
                    t1 = time.perf_counter()
                    clock["wait_input"] += t1 - t0
                    marks.setdefault("first_input", t1)
                item = _Item(item_id, np.asarray(audio, dtype=np.float32), self.forced_language)
                if item.content_frames == 0:
                    yield self._record(item)
                    continue
                live[next_key] = item
                queue.append(next_key)
                next_key += 1
            n_rows = dec.rows_in_use()
            if queue and free and (len(free) >= self.admit_min or n_rows == 0 or exhausted):
                t0 = time.perf_counter()
                for _ in range(self.looks_before_admission if n_rows else 0):
                    advance(n_rows)
                group = [queue.popleft() for _ in range(min(len(free), len(queue), self.admit_max))]
                try:
                    dec.admit([self._window(k, live[k]) for k in group], free[: len(group)])
                except torch.OutOfMemoryError:
                    # The encoder's activations for this group did not fit: nothing was admitted
                    # (slots are claimed only after encoding), so requeue and admit smaller groups.
                    if len(group) == 1:
                        raise
                    queue.extendleft(reversed(group))
                    self.admit_max = max(1, len(group) // 2)
                    log.warning("out of memory admitting %d windows; admitting at most %d at a time",
                                len(group), self.admit_max)  # fmt: skip
                    if dec.device.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                n_rows = dec.rows_in_use()
                marks["last_admit"] = time.perf_counter()
                marks.setdefault("first_admit", t0)
                clock["admit"] += marks["last_admit"] - t0
                clock["windows"] += len(group)
            if n_rows == 0:
                # Every slot is free, so queued snapshots hold no finished window: drain them.
                yield from collect(0)
                if exhausted and not queue:
                    dec.release_staging()
                    return
                continue
            t0 = time.perf_counter()
            if self.compact_tail and exhausted and not queue and 2 * dec.slots_in_use() <= n_rows:
                n_rows = dec.compact()
                clock["compactions"] += 1
            advance(n_rows)
            clock["step_launch"] += time.perf_counter() - t0
            yield from collect(self.lag)
