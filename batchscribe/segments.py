"""A window's sampled tokens -> segments, and the seek advance: openai/whisper transcribe()'s rules.

`split_window` is the per-window part of openai/whisper `transcribe()`: how a window's tokens split
into segments at timestamp pairs, and where the next window starts. `WindowStats` holds the decode
facts every segment of a window shares, computed as openai's DecodingTask computes them. A finished
item is a `Transcript`, which output/verbose_json turns into a record. Pure Python: no torch.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from batchscribe.constants import HOP_LENGTH, N_AUDIO_CTX, N_FRAMES, SAMPLE_RATE

# Mel frames per timestamp step (2) and seconds per step (0.02), derived as openai derives them so
# the float arithmetic, hence every start/end, is bit-for-bit openai's.
INPUT_STRIDE = N_FRAMES // N_AUDIO_CTX
TIME_PRECISION = INPUT_STRIDE * HOP_LENGTH / SAMPLE_RATE

class _TokenizerLike(Protocol):
    eot: int
    timestamp_begin: int

    def decode(self, tokens: Sequence[int]) -> str: ...  # drops ids >= eot (specials, timestamps)

    def decode_without_timestamps(self, tokens: Sequence[int]) -> str: ...  # specials stay, inline


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
        text = tokenizer.decode_without_timestamps(tokens)
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
    # With word timestamps: openai's per-segment words, each {word, start, end, probability}.
    words: tuple[dict[str, Any], ...] | None = field(default=None, hash=False)  # dicts do not hash

    def to_dict(self) -> dict[str, Any]:
        """The fields in declaration order, tokens as a list (TranscriptionSegment's JSON types)."""
        return self.as_dict(self.id, self.start, self.end)

    def as_dict(self, id: int, start: float, end: float) -> dict[str, Any]:
        """The record's dict of this segment with the given id and times (clamped by the caller)."""
        # One dict literal, not dataclasses.asdict (a deep copy) or a loop over the fields: the GPU
        # engine's one host thread builds every record between launches. The order is tested.
        out = {
            "id": id, "seek": self.seek, "start": start, "end": end, "text": self.text,
            "tokens": list(self.tokens), "temperature": self.temperature, "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio, "no_speech_prob": self.no_speech_prob,
        }  # fmt: skip
        if self.words is not None:
            # The segment's own word dicts, not copies (a quarter of a words record's cost): the
            # engine drops its Segments once their records are built and never changes the dicts.
            out["words"] = list(self.words)
        return out


@dataclass(frozen=True)
class WindowSplit:
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
    empty: bool = True,
) -> WindowSplit:
    """Split one window's sampled tokens into segments and advance the seek (openai transcribe()).

    `tokens`: what was sampled after the sot prefix, eot excluded. `window_frames`: mel frames of
    real audio in the window (3000, less for the last one). `seek`: the window's first frame;
    `time_offset`: its start in seconds (seek / 100 for plain items). `empty=False` keeps the text
    and tokens of instantaneous or blank segments: with word timestamps openai empties them only
    after the words have moved their times (`is_empty`).
    """
    tokens = list(tokens)
    tb = tokenizer.timestamp_begin
    stamps = [i for i, t in enumerate(tokens) if t >= tb]  # where the timestamp tokens are
    single_timestamp_ending = len(tokens) >= 2 and tokens[-1] >= tb and tokens[-2] < tb
    # Index of the second token of every timestamp pair: a segment boundary.
    boundaries = [j for i, j in zip(stamps, stamps[1:]) if j == i + 1]

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
        if stamps and tokens[stamps[-1]] != tb:
            duration = (tokens[stamps[-1]] - tb) * TIME_PRECISION
        pieces.append((time_offset, time_offset + duration, tokens))
        next_seek = seek + window_frames

    return WindowSplit(_segments(pieces, tokenizer, seek, stats, empty), next_seek, single_timestamp_ending)


def _segments(pieces: list[tuple[float, float, list[int]]], tokenizer: _TokenizerLike, seek: int,
              stats: WindowStats, empty: bool) -> tuple[Segment, ...]:  # fmt: skip
    segments = []
    for i, (start, end, piece) in enumerate(pieces):
        text = tokenizer.decode(piece)  # openai: decode([t for t in piece if t < eot])
        if empty and is_empty(start, end, text):
            # openai keeps instantaneous or blank segments but empties them.
            text, piece = "", []
        segments.append(_segment(i, seek, start, end, text, tuple(piece), stats))
    return tuple(segments)


def is_empty(start: float, end: float, text: str) -> bool:
    return start == end or not text.strip()


def _segment(
    id: int, seek: int, start: float, end: float, text: str, tokens: tuple[int, ...], stats: WindowStats
) -> Segment:
    """Segment(...) in half the time: a frozen dataclass's __init__ sets each of the ten fields
    through object.__setattr__; this fills the new instance's __dict__ at once (equal objects,
    tested). The GPU engine's one host thread builds every segment between launches."""
    seg = object.__new__(Segment)
    seg.__dict__.update({
        "id": id, "seek": seek, "start": start, "end": end, "text": text, "tokens": tokens,
        "temperature": stats.temperature, "avg_logprob": stats.avg_logprob,
        "compression_ratio": stats.compression_ratio, "no_speech_prob": stats.no_speech_prob, "words": None,
    })  # fmt: skip
    return seg


def revised(seg: Segment, **changes: Any) -> Segment:
    """dataclasses.replace(seg, **changes) without its __init__ (ten object.__setattr__ calls and
    a check of every field): the new instance's __dict__ is the old one's, updated (equal objects,
    tested). The word stage revises every segment of every window on the GPU engine's host thread."""
    unknown = changes.keys() - seg.__dict__.keys()
    if unknown:
        raise TypeError(f"Segment has no field(s) {sorted(unknown)}")
    new = object.__new__(Segment)
    new.__dict__.update(seg.__dict__, **changes)
    return new


def clamp_segments(segments: Sequence[Segment], duration: float) -> list[Segment]:
    """Renumber 0..n-1 and make times ordered, non-overlapping and within [0, duration].

    Rule, applied in the given (decoding) order: start = clamp(start, previous end, duration),
    end = clamp(end, start, duration). The model can place a timestamp past the end of the audio
    in the last, partly empty window, and a window's first timestamp may fall before the previous
    window's last end; both are moved, never dropped, so text and tokens stay intact.
    """
    times = clamped_times(segments, duration)
    return [replace(seg, id=i, start=start, end=end) for i, (seg, (start, end)) in enumerate(zip(segments, times))]


def clamped_times(segments: Sequence[Segment], duration: float) -> list[tuple[float, float]]:
    """clamp_segments' (start, end) of each segment, without building new segments."""
    times = []
    previous_end = 0.0
    for seg in segments:
        start = min(max(seg.start, previous_end), duration)
        previous_end = end = min(max(seg.end, start), duration)
        times.append((start, end))
    return times


@dataclass(frozen=True)
class Transcript:
    """One item's result: its segments in decoding order (times not yet clamped), as the engine
    yields it."""

    id: str
    segments: tuple[Segment, ...]
    language: str  # Whisper language code, e.g. "en"
    duration: float  # seconds of audio
    word_timestamps: bool = False  # segments carry words (the record then has top-level words too)
