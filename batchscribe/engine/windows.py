"""Each item's walk through its 30 s windows: openai transcribe()'s seek loop and fallback.

An item is decoded one window at a time: the next window starts where the last complete timestamp
of the previous one ends. A window that fails the compression-ratio or log-probability test is
decoded again at the next temperature; a silent window is skipped whole. This module turns items
into `WindowRequest`s and folds each `FinishedWindow` back into its item; the scheduler decides
when windows run.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace

import numpy as np

from batchscribe.audio.vad import Speech, SpeechMap, join_speech
from batchscribe.config import ConfigError, DecodeOptions
from batchscribe.constants import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, TIME_PRECISION
from batchscribe.engine.alignment import Alignment, AlignWindow
from batchscribe.engine.logits import RuleSpec
from batchscribe.engine.requests import FinishedWindow, WindowRequest
from batchscribe.engine.step import StepSpec
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.segments import Segment, Transcript, WindowSplit, WindowStats, is_empty, revised, split_window
from batchscribe.words import WindowWords, WordTimings, attach_words, last_word_end, word_timings

FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # mel frames per second: where a seek lands
MAX_PROMPT_TOKENS = 448 // 2 - 1  # openai: prompt_tokens[-(n_ctx // 2 - 1):]

log = logging.getLogger(__name__)


def step_spec(tokenizer: Tokenizer, options: DecodeOptions, model_suppress: list[int], n_text_ctx: int) -> StepSpec:
    """What the decode step needs from the tokenizer and the options."""
    max_initial = None
    if options.max_initial_timestamp is not None:
        max_initial = round(options.max_initial_timestamp / TIME_PRECISION)
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
    return StepSpec(rules=rules, no_speech=tokenizer.no_speech, language_tokens=languages,
                    sample_len=options.sample_len or n_text_ctx // 2)  # fmt: skip


@dataclass
class ItemProgress:
    """Host-side progress of one item through its windows."""

    id: str
    audio: np.ndarray  # [n] float32, 16 kHz
    language_token: int | None  # forced, or detected on the first window
    seek: int = 0  # mel frames consumed
    temp_index: int = 0  # rung of the temperature ladder the next window decodes at
    segments: list[Segment] = field(default_factory=list)
    # What the next window is prompted with after <|startofprev|>: openai transcribe()'s
    # all_tokens[prompt_reset_since:], the initial prompt until a window is kept, then (conditioning
    # on previous text) the kept windows' tokens since the last reset; the last 223 are sent.
    context: tuple[int, ...] = ()
    # --vad: the speech chunks as (start, end) mel frames; no window crosses a chunk's end and the
    # frames between chunks are never decoded (openai's clip_timestamps). None: the whole item.
    clips: tuple[tuple[int, int], ...] | None = None
    speech: SpeechMap | None = None  # --vad: `audio` is the joined speech; this maps its times back
    original_samples: int = 0  # --vad: the item's own length
    last_speech: float = 0.0  # end of the last word so far (word timestamps; openai's last_speech_timestamp)

    @property
    def content_frames(self) -> int:
        return len(self.audio) // HOP_LENGTH

    @property
    def duration(self) -> float:
        return (self.original_samples or len(self.audio)) / SAMPLE_RATE

    @property
    def done(self) -> bool:
        return self.seek >= self.content_frames

    @property
    def clip_end(self) -> int:
        """Where the current window must end at the latest: its speech chunk's end, or the item's."""
        return self.content_frames if self.clips is None else self.clips[0][1]

    def enter_clip(self) -> None:
        """Past a chunk's end, jump to the next chunk's start; past the last, the item is done."""
        while self.clips is not None and self.seek >= self.clips[0][1]:
            self.clips = self.clips[1:]
            if not self.clips:
                self.seek = self.content_frames
                return
        if self.clips:
            self.seek = max(self.seek, self.clips[0][0])

    def window_audio(self) -> np.ndarray:
        """The samples of the window at the seek (up to 30 s, cut at the chunk's end)."""
        start = self.seek * HOP_LENGTH
        end = start + N_FRAMES * HOP_LENGTH  # the whole item: its last partial frame's samples too
        if self.clips is not None:
            end = min(end, self.clips[0][1] * HOP_LENGTH)
        return self.audio[start:end]


@dataclass(frozen=True)
class Judged:
    """A finished window's fate: decoded again (fallback), skipped as silence (no split), or split
    into segments; `window_frames`: its real audio."""

    fallback: bool = False
    window_frames: int = 0
    split: WindowSplit | None = None
    temperature: float = 0.0  # the decode's: above 0.5 it resets the conditioning context


def initial_prompt_tokens(tokenizer: Tokenizer, text: str | None) -> tuple[tuple[int, ...], int]:
    """openai's encoding of an initial prompt (" " + stripped text), its last 223 tokens: half the
    text context less <|startofprev|>, as DecodingTask trims it; and how many tokens it had."""
    if not text:
        return (), 0
    tokens = tokenizer.encode(" " + text.strip())
    return tuple(tokens[-MAX_PROMPT_TOKENS:]), len(tokens)


class PromptTrims:
    """Long --prompt-column prompts trimmed in one stream: the first named when it comes, the rest
    counted and reported once at the end (a column of 10,000 long prompts is two lines, not 10,000)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count, self.first = 0, ""

    def add(self, item_id: str, n_tokens: int) -> None:
        self.count += 1
        if self.count == 1:
            self.first = item_id
            log.warning("%s: the --prompt-column prompt is %d tokens; only its last %d are used (half the text "
                        "context, as openai-whisper trims it): shorten it to keep its start. Other items' long "
                        "prompts are trimmed alike and counted at the end", item_id, n_tokens, MAX_PROMPT_TOKENS)

    def report(self) -> None:
        """The stream's count, if more than the one named; then start counting afresh."""
        if self.count > 1:
            log.warning("%d items' --prompt-column prompts were longer than %d tokens and were trimmed to their "
                        "last %d (the first: %s)", self.count, MAX_PROMPT_TOKENS, MAX_PROMPT_TOKENS, self.first)
        self.reset()


class WindowPlanner:
    """Windows of items under one set of decoding options (openai transcribe() semantics)."""

    def __init__(self, tokenizer: Tokenizer, options: DecodeOptions):
        self.tokenizer, self.options = tokenizer, options
        self.forced_language: int | None = None
        if options.language is not None and tokenizer.is_multilingual:
            self.forced_language = tokenizer.language_tokens[tokenizer.language_code(options.language)]
        self._code_of_token = {tok: code for code, tok in tokenizer.language_tokens.items()}
        self.prompt_tokens, n_tokens = initial_prompt_tokens(tokenizer, options.initial_prompt)
        if n_tokens > MAX_PROMPT_TOKENS:
            log.warning("--initial-prompt is %d tokens; only its last %d are used (half the text context, as "
                        "openai-whisper trims it): shorten it to keep its start", n_tokens, MAX_PROMPT_TOKENS)
        self.trims = PromptTrims()

    def start(self, item_id: str, audio: np.ndarray, prompt: str | None = None,
              speech: Speech | None = None) -> ItemProgress:  # fmt: skip
        """An item's progress; `prompt`: its own initial prompt (--prompt-column), else the run's;
        `speech` (--vad): where its speech is, found ahead in batches (audio/vad_stream.py, which
        `Transcriber.transcribe_stream` puts in front of the scheduler)."""
        context = self.prompt_tokens
        if prompt:
            if self.tokenizer.is_multilingual and self.forced_language is None:
                raise ConfigError(f"{item_id}: a --prompt-column prompt with a multilingual model needs --language "
                                  "(e.g. --language en): the language is detected in the decode the prompt conditions")
            context, n_tokens = initial_prompt_tokens(self.tokenizer, prompt)
            if n_tokens > MAX_PROMPT_TOKENS:
                self.trims.add(item_id, n_tokens)
        item = ItemProgress(item_id, np.asarray(audio, dtype=np.float32), self.forced_language, context=context)
        if self.options.vad and speech is None:
            raise AssertionError(f"{item_id}: --vad, but no Speech was handed in (run the scheduler behind a SpeechStage)")
        if speech is not None:
            item.original_samples = len(item.audio)
            item.audio, chunks, item.speech = join_speech(item.audio, list(speech.spans), list(speech.chunks))
            frames = [(s // HOP_LENGTH, min(-(-e // HOP_LENGTH), item.content_frames)) for s, e in chunks]
            item.clips = tuple((s, e) for s, e in frames if e > s)
            item.seek = item.clips[0][0] if item.clips else item.content_frames  # no speech: no window
        return item

    def _prompt(self, item: ItemProgress) -> tuple[tuple[int, ...], bool]:
        tok, opt = self.tokenizer, self.options
        if not tok.is_multilingual:
            return tok.sot_sequence(None, opt.task, opt.without_timestamps), False
        detect = item.language_token is None
        task = tok.transcribe if opt.task == "transcribe" else tok.translate
        language = tok.sot if detect else item.language_token  # placeholder, replaced in the step
        prompt = (tok.sot, language, task)
        if opt.without_timestamps:
            prompt += (tok.no_timestamps,)
        return prompt, detect

    def request(self, key: int, item: ItemProgress) -> WindowRequest:
        """The item's next window, at its current temperature."""
        audio = item.window_audio()
        prompt, detect = self._prompt(item)
        sot_index = 0
        if item.context:
            # openai DecodingTask: <|startofprev|> prompt[-223:] <|startoftranscript|> ...
            prefix = (self.tokenizer.sot_prev, *item.context[-MAX_PROMPT_TOKENS:])
            prompt, sot_index = prefix + prompt, len(prefix)
        temperature = self.options.temperatures[item.temp_index]
        # Sampling depends only on (seed, item, window, attempt): resumable and batch-independent.
        digest = hashlib.blake2b(f"{self.options.seed}/{item.id}/{item.seek}/{item.temp_index}".encode(), digest_size=7)
        noise_key = int.from_bytes(digest.digest(), "little")
        return WindowRequest(key, audio, prompt, detect, temperature, noise_key, sot_index)

    def _needs_fallback(self, avg_logprob: float, ratio: float, no_speech_prob: float) -> bool:
        """openai decode_with_fallback's test."""
        opt = self.options
        too_repetitive = opt.compression_ratio_threshold is not None and ratio > opt.compression_ratio_threshold
        too_unlikely = opt.logprob_threshold is not None and avg_logprob < opt.logprob_threshold
        silent = opt.no_speech_threshold is not None and no_speech_prob > opt.no_speech_threshold
        return (too_repetitive or too_unlikely) and not (silent and too_unlikely)

    def fold(self, item: ItemProgress, res: FinishedWindow) -> bool:
        """Fold a window's result into its item; True when the item has no audio left. A window
        that falls back leaves the seek where it was and raises the temperature."""
        return self.settle(item, self.judge(item, res))

    def judge(self, item: ItemProgress, res: FinishedWindow) -> Judged:
        """What becomes of a finished window (fallback, silence, or segments), before any word is
        timed; records a detected language on the item."""
        opt = self.options
        if item.language_token is None and res.language_token is not None:
            item.language_token = res.language_token
        stats = WindowStats.from_decode(res.tokens, self.tokenizer, temperature=res.temperature,
                                        sum_logprob=res.sum_logprob, no_speech_prob=res.no_speech_prob)  # fmt: skip
        fallback = self._needs_fallback(stats.avg_logprob, stats.compression_ratio, res.no_speech_prob)
        if fallback and item.temp_index + 1 < len(opt.temperatures):
            return Judged(fallback=True)
        window_frames = min(N_FRAMES, item.content_frames - item.seek, item.clip_end - item.seek)
        skip = opt.no_speech_threshold is not None and res.no_speech_prob > opt.no_speech_threshold
        if opt.logprob_threshold is not None and stats.avg_logprob > opt.logprob_threshold:
            skip = False
        if skip:  # silence: openai transcribe() moves on by the whole window
            return Judged(window_frames=window_frames)
        # With word timestamps openai empties blank segments only after the words moved their times.
        split = split_window(res.tokens, self.tokenizer, time_offset=item.seek * HOP_LENGTH / SAMPLE_RATE,
                             window_frames=window_frames, seek=item.seek, stats=stats,
                             empty=not opt.word_timestamps)  # fmt: skip
        return Judged(window_frames=window_frames, split=split, temperature=res.temperature)

    def align_request(self, item: ItemProgress, judged: Judged, slot: int | None) -> AlignWindow | None:
        """The alignment pass's input for a window whose segments get words (None: nothing to time);
        `slot`: where its cross K/V still are."""
        if not self.options.word_timestamps or judged.split is None:
            return None
        eot = self.tokenizer.eot
        text = tuple(t for seg in judged.split.segments for t in seg.tokens if t < eot)
        if not text:
            return None
        prefix, _ = self._prompt(item)
        prefix = tuple(t for t in prefix if t != self.tokenizer.no_timestamps)
        if slot is None:
            raise AssertionError("a window to time words for was not read from a decoder slot")
        return AlignWindow(slot, prefix, text, judged.window_frames)

    def settle(self, item: ItemProgress, judged: Judged, alignment: Alignment | None = None) -> bool:
        """Apply a judged window to its item (`alignment`: its words' attention, when timed); True
        when the item has no audio left."""
        if judged.fallback:
            item.temp_index += 1
            return False
        item.temp_index = 0
        if judged.split is None:
            item.seek += judged.window_frames
            item.enter_clip()
            return item.done
        if self.options.word_timestamps:
            segments, item.seek = self._with_words(item, judged.split, alignment)
        else:
            segments, item.seek = list(judged.split.segments), judged.split.seek
        item.segments.extend(segments)
        self._condition(item, segments, judged.temperature)
        item.enter_clip()
        return item.done

    def _condition(self, item: ItemProgress, kept: list[Segment], temperature: float) -> None:
        """The next window's prompt once a window's segments are kept (openai transcribe()): without
        conditioning the prompt resets, so an initial prompt only reaches the first kept window; with
        it the kept tokens (timestamps included, blank segments emptied) are appended, unless the
        window needed a temperature above 0.5: text sampled that hot is no context to trust."""
        if not self.options.condition_on_previous_text or temperature > 0.5:
            item.context = ()
            return
        tokens = tuple(t for seg in kept for t in seg.tokens)
        # Only the last 223 are ever sent; keeping a few more bounds the item's memory.
        item.context = (item.context + tokens)[-2 * MAX_PROMPT_TOKENS :]

    def _with_words(self, item: ItemProgress, split: WindowSplit, alignment: Alignment | None) -> tuple[list[Segment], int]:
        """openai transcribe()'s word stage for one window: words into the segments, segment times
        moved by them, the next seek at the last word's end, then blank segments emptied."""
        tok, opt = self.tokenizer, self.options
        time_offset = item.seek * HOP_LENGTH / SAMPLE_RATE
        segs, eot = split.segments, tok.eot
        texts = [[t for t in s.tokens if t < eot] for s in segs]
        window = WindowWords([s.start for s in segs], [s.end for s in segs], [len(t) for t in texts])
        timings = WordTimings()
        if alignment is not None:
            language = self._code_of_token.get(item.language_token) if tok.is_multilingual else None
            text = [t for seg_text in texts for t in seg_text]
            timings = word_timings(alignment.path, text, alignment.token_probs, tok, language)
        attach_words(window, timings, time_offset, item.last_speech, opt.prepend_punctuations, opt.append_punctuations)
        seek, end = split.seek, last_word_end(window.words, window.ends)
        if not split.single_timestamp_ending and end is not None and end > time_offset:
            seek = round(end * FRAMES_PER_SECOND)
        if end is not None:
            item.last_speech = end
        out = []
        for seg, start, stop, words in zip(segs, window.starts, window.ends, window.words):
            if is_empty(start, stop, seg.text):
                out.append(revised(seg, start=start, end=stop, text="", tokens=(), words=()))
            else:
                out.append(revised(seg, start=start, end=stop, words=tuple(words)))
        return out, seek

    def transcript(self, item: ItemProgress) -> Transcript:
        code = self._code_of_token.get(item.language_token, "en") if item.language_token else "en"
        segments = item.segments if item.speech is None else [_on_original(s, item.speech) for s in item.segments]
        return Transcript(item.id, tuple(segments), code, item.duration, self.options.word_timestamps)


def _on_original(seg: Segment, speech: SpeechMap) -> Segment:
    """A segment decoded from joined speech (--vad), its times and its words' on the item's timeline."""
    words = seg.words
    if words is not None:
        words = tuple({**w, "start": round(speech.to_original(w["start"]), 2),
                       "end": round(speech.to_original(w["end"], is_end=True), 2)} for w in words)  # fmt: skip
    return replace(seg, start=speech.to_original(seg.start), end=speech.to_original(seg.end, is_end=True), words=words)
