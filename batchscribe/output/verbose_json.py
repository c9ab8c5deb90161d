"""Sampled tokens -> segments -> one OpenAI `verbose_json` record per item.

`split_window` is the per-window part of openai/whisper `transcribe()`: how a window's tokens split
into segments at timestamp pairs, and where the next window starts (the seek advance). The record
shape and field meanings are the OpenAI API's `TranscriptionVerbose` / `TranscriptionSegment`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from batchscribe.constants import HOP_LENGTH, N_AUDIO_CTX, N_FRAMES, SAMPLE_RATE
from batchscribe.model.languages import language_code, language_name

# Mel frames per timestamp step (2) and seconds per step (0.02), derived as openai derives them so
# the float arithmetic, hence every start/end, is bit-for-bit openai's.
INPUT_STRIDE = N_FRAMES // N_AUDIO_CTX
TIME_PRECISION = INPUT_STRIDE * HOP_LENGTH / SAMPLE_RATE

_RECORD_KEYS = ("id", "text", "language", "duration", "segments")


class _TokenizerLike(Protocol):
    eot: int
    timestamp_begin: int

    def decode(self, tokens: Sequence[int]) -> str: ...

    def decode_with_timestamps(self, tokens: Sequence[int]) -> str: ...


def compression_ratio(text: str) -> float:
    """UTF-8 bytes over zlib-compressed bytes (openai `compression_ratio`); high means repetitive."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


@dataclass(frozen=True)
class WindowStats:
    """One decode of a window, shared by all of its segments (openai DecodingResult fields)."""

    temperature: float = 0.0
    avg_logprob: float = 0.0  # sum of sampled-token logprobs / (n_tokens + 1), eot included
    compression_ratio: float = 0.0  # of the window's decoded text, stripped
    no_speech_prob: float = 0.0  # P(<|nospeech|>) at the start-of-transcript position

    @classmethod
    def from_decode(
        cls,
        tokens: Sequence[int],
        tokenizer: _TokenizerLike,
        *,
        temperature: float,
        sum_logprob: float,
        no_speech_prob: float,
    ) -> WindowStats:
        """The fields as openai DecodingTask.run computes them from a window's sampled tokens.

        `tokens` exclude the prompt and eot; `sum_logprob` includes eot's log-probability, hence
        the +1. The ratio is of the stripped text with only timestamps dropped (openai's
        `Tokenizer.decode`: a sampled special token such as <|en|> stays in the text).
        """
        text = tokenizer.decode_with_timestamps([t for t in tokens if t < tokenizer.timestamp_begin])
        return cls(
            temperature=temperature,
            avg_logprob=sum_logprob / (len(tokens) + 1),
            compression_ratio=compression_ratio(text.strip()),
            no_speech_prob=no_speech_prob,
        )


@dataclass(frozen=True)
class Segment:
    id: int
    seek: int  # mel frame (100 per second) where the window that produced it starts
    start: float  # seconds from the item's start
    end: float
    text: str
    tokens: tuple[int, ...]  # timestamp tokens included, as openai keeps them
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float

    def to_dict(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: its deep copy was half of a record's host time,
        # which the GPU engine's thread spends between launches.
        return {name: getattr(self, name) for name in _SEGMENT_FIELDS} | {"tokens": list(self.tokens)}


_SEGMENT_FIELDS = tuple(f.name for f in fields(Segment))


@dataclass(frozen=True)
class WindowResult:
    segments: tuple[Segment, ...]
    seek: int  # where the next window starts, in mel frames
    single_timestamp_ending: bool  # the window ended on a lone timestamp: no speech after it


def split_window(
    tokens: Sequence[int],
    tokenizer: _TokenizerLike,
    *,
    time_offset: float,
    window_frames: int,
    seek: int,
    stats: WindowStats = WindowStats(),
) -> WindowResult:
    """Split one window's sampled tokens into segments and advance the seek (openai transcribe()).

    `tokens`: what was sampled after the sot prefix, eot excluded. `window_frames`: mel frames of
    real audio in the window (3000, less for the last one). `seek`: the window's first frame;
    `time_offset`: its start in seconds (seek / 100 for plain items).
    """
    tokens = list(tokens)
    tb = tokenizer.timestamp_begin
    is_ts = [t >= tb for t in tokens]
    single_timestamp_ending = is_ts[-2:] == [False, True]
    # Index of the second token of every timestamp pair: a segment boundary.
    boundaries = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]

    pieces: list[tuple[float, float, list[int]]] = []  # (start, end, tokens)
    if boundaries:
        if single_timestamp_ending:
            boundaries.append(len(tokens))
        last = 0
        for cut in boundaries:
            piece = tokens[last:cut]
            start = time_offset + (piece[0] - tb) * TIME_PRECISION
            end = time_offset + (piece[-1] - tb) * TIME_PRECISION
            pieces.append((start, end, piece))
            last = cut
        if single_timestamp_ending:
            next_seek = seek + window_frames  # nothing more was said in this window
        else:
            # The text after the last pair is unfinished: decode it again from that timestamp.
            next_seek = seek + (tokens[last - 1] - tb) * INPUT_STRIDE
            if next_seek == seek:
                # NOTE: last pair at <|0.00|>: openai would decode this window again forever.
                next_seek = seek + window_frames
    else:
        # No pair (e.g. without-timestamps mode): one segment for the whole window, ending at its
        # last timestamp when there is one other than <|0.00|>.
        duration = window_frames * HOP_LENGTH / SAMPLE_RATE
        timestamps = [t for t in tokens if t >= tb]
        if timestamps and timestamps[-1] != tb:
            duration = (timestamps[-1] - tb) * TIME_PRECISION
        pieces.append((time_offset, time_offset + duration, tokens))
        next_seek = seek + window_frames

    segments = []
    for i, (start, end, piece) in enumerate(pieces):
        text = tokenizer.decode([t for t in piece if t < tokenizer.eot])
        if start == end or not text.strip():
            # openai keeps instantaneous or blank segments but empties them.
            text, piece = "", []
        segments.append(
            Segment(i, seek, start, end, text, tuple(piece), stats.temperature, stats.avg_logprob,
                    stats.compression_ratio, stats.no_speech_prob)  # fmt: skip
        )
    return WindowResult(tuple(segments), next_seek, single_timestamp_ending)


def clamp_segments(segments: Sequence[Segment], duration: float) -> list[Segment]:
    """Renumber 0..n-1 and make times ordered, non-overlapping and within [0, duration].

    Rule, applied in the given (decoding) order: start = clamp(start, previous end, duration),
    end = clamp(end, start, duration). The model can place a timestamp past the end of the audio
    in the last, partly empty window, and a window's first timestamp may fall before the previous
    window's last end; both are moved, never dropped, so text and tokens stay intact.
    """
    out: list[Segment] = []
    previous_end = 0.0
    for i, seg in enumerate(segments):
        start = min(max(seg.start, previous_end), duration)
        end = min(max(seg.end, start), duration)
        out.append(replace(seg, id=i, start=start, end=end))
        previous_end = end
    return out


def make_record(
    item_id: str,
    segments: Sequence[Segment],
    language: str,
    duration: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verbose_json record of one item (OpenAI TranscriptionVerbose plus our `id`).

    `language`: a code ("en") or an English name; written as the lowercase name ("english"), as
    the OpenAI API writes it. `extra`: passthrough columns, which must not shadow record fields.
    """
    code = language_code(language)
    if code is None:
        raise ValueError(f"item {item_id!r}: unknown language {language!r}; pass a Whisper code such as 'en'")
    if duration < 0:
        raise ValueError(f"item {item_id!r}: duration {duration} is negative")
    segs = clamp_segments(segments, duration)
    record: dict[str, Any] = {
        "id": item_id,
        "text": "".join(s.text for s in segs),
        "language": language_name(code),
        "duration": duration,
        "segments": [s.to_dict() for s in segs],
    }
    return _with_extra(record, extra)


def make_error_record(item_id: str, error: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A failed item: its id, what went wrong and how to fix it, null duration, passthrough columns."""
    return _with_extra({"id": item_id, "error": error, "duration": None}, extra)


def _with_extra(record: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if not extra:
        return record
    clash = sorted(set(extra) & {*_RECORD_KEYS, "error"})
    if clash:
        raise ValueError(
            f"passthrough columns {clash} would overwrite record fields; rename or drop them"
        )
    return {**record, **extra}
