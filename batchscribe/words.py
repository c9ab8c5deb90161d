"""Word timestamps from cross-attention: openai-whisper's method (`whisper/timing.py`), on the host.

The engine's alignment pass (engine/alignment.py) gives, for each finished window, a matrix of
the alignment heads' normalised, median-filtered cross-attention: one row per text token (plus the
<|notimestamps|> row before them), one column per 20 ms audio frame. This module turns it into words:

1. (`batchscribe.dtw`, beside the matrices): the cheapest monotonic path through -matrix, with
   openai's step rule and tie-breaking;
2. `word_timings`: the tokens grouped into words, each word starting where the path first reaches
   its first token, with the mean probability of its tokens;
3. `merge_punctuations`: leading quotes and brackets joined to the next word, trailing punctuation
   to the previous one (openai's rules and defaults);
4. `attach_words`: words shared out to the window's segments, with openai's clipping of words that
   run long at sentence and pause boundaries and its rules for moving segment starts and ends.

Pure numpy and Python: no torch.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from batchscribe.config import DecodeOptions

TOKENS_PER_SECOND = 50  # audio frames per second after the encoder's stride-2 convolution
PREPEND_PUNCTUATIONS = DecodeOptions.prepend_punctuations  # openai's defaults
APPEND_PUNCTUATIONS = DecodeOptions.append_punctuations
_SENTENCE_END = ".。!！?？"
# Scripts written without spaces: openai splits them at every complete character instead.
_UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


class _TokenizerLike(Protocol):
    eot: int

    def decode_with_timestamps(self, tokens: Sequence[int]) -> str: ...


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float  # seconds from the window's start
    end: float
    probability: float


@dataclass
class WindowWords:
    """One window's segments as the word stage sees and changes them (openai's segment dicts)."""

    starts: list[float]
    ends: list[float]
    tokens: list[list[int]]  # each segment's tokens, timestamps included
    words: list[list[dict[str, Any]]] = field(default_factory=list)  # per segment: word, start, end, probability


def split_subwords(tokens: Sequence[int], tokenizer: _TokenizerLike) -> tuple[list[str], list[list[int]]]:
    """Cut tokens into the shortest runs that decode to whole characters: a run ends once its text
    has no U+FFFD that the whole text lacks at that place (a multi-byte character split across
    tokens shows as U+FFFD until its last byte arrives)."""
    full = tokenizer.decode_with_timestamps(tokens)
    pieces: list[str] = []
    runs: list[list[int]] = []
    run: list[int] = []
    offset = 0
    for token in tokens:
        run.append(token)
        text = tokenizer.decode_with_timestamps(run)
        bad = text.find("\ufffd")
        if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":
            pieces.append(text)
            runs.append(run)
            offset += len(text)
            run = []
    return pieces, runs


def split_words(tokens: Sequence[int], tokenizer: _TokenizerLike,
                language: str | None = None) -> tuple[list[str], list[list[int]]]:  # fmt: skip
    """Tokens -> words: characters for unspaced scripts; elsewhere a word starts at a space, a
    special token or punctuation (openai's test: the stripped piece is in string.punctuation)."""
    pieces, runs = split_subwords(tokens, tokenizer)
    if language in _UNSPACED_LANGUAGES:
        return pieces, runs
    words: list[str] = []
    groups: list[list[int]] = []
    for piece, run in zip(pieces, runs):
        starts_word = run[0] >= tokenizer.eot or piece.startswith(" ") or piece.strip() in string.punctuation
        if starts_word or not words:
            words.append(piece)
            groups.append(list(run))
        else:
            words[-1] += piece
            groups[-1].extend(run)
    return words, groups


def word_timings(
    path: tuple[np.ndarray, np.ndarray],  # the DTW path through -matrix (batchscribe.dtw): rows, columns
    text_tokens: Sequence[int],
    token_probs: Sequence[float],  # P(each text token) under teacher forcing
    tokenizer: _TokenizerLike,
    language: str | None = None,
) -> list[WordTiming]:
    """Words of one window with start/end (seconds into the window) and mean token probability."""
    if not text_tokens:
        return []
    rows, cols = path
    words, groups = split_words([*text_tokens, tokenizer.eot], tokenizer, language)
    if len(groups) <= 1:  # only the end of text
        return []
    bounds = np.concatenate([[0], np.cumsum([len(g) for g in groups[:-1]])])
    # The time at which the path first reaches each row: the start of that token.
    first = np.concatenate([[True], np.diff(rows) != 0])
    times = cols[first] / TOKENS_PER_SECOND
    probs = np.asarray(token_probs, dtype=np.float64)
    return [WordTiming(w, g, float(times[a]), float(times[b]), float(np.mean(probs[a:b])))
            for w, g, a, b in zip(words, groups, bounds[:-1], bounds[1:])]  # fmt: skip


def merge_punctuations(words: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:  # fmt: skip
    """In place: a lone opening mark (" ``"``, " (") joins the word after it, scanning from the end;
    then a closing mark (".", ",", ")") joins the word before it, scanning from the start. A word
    emptied this way keeps its place with no text and no tokens."""
    target = len(words) - 1
    for k in range(len(words) - 2, -1, -1):
        mark = words[k]
        if mark.word.startswith(" ") and mark.word.strip() in prepended:
            words[target].word = mark.word + words[target].word
            words[target].tokens = mark.tokens + words[target].tokens
            mark.word, mark.tokens = "", []
        else:
            target = k
    target = 0
    for k in range(1, len(words)):
        mark = words[k]
        if not words[target].word.endswith(" ") and mark.word in appended:
            words[target].word += mark.word
            words[target].tokens = words[target].tokens + mark.tokens
            mark.word, mark.tokens = "", []
        else:
            target = k


def _clip_at_sentences(words: list[WordTiming]) -> tuple[float, float]:
    """(median word duration capped at 0.7 s, twice that); words longer than twice the median at a
    sentence end are cut to it (openai's heuristic, before punctuation is merged)."""
    durations = np.array([w.end - w.start for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for k in range(1, len(words)):
            if words[k].end - words[k].start > longest:
                if words[k].word in _SENTENCE_END:
                    words[k].end = words[k].start + longest
                elif words[k - 1].word in _SENTENCE_END:
                    words[k].start = words[k].end - longest
    return median, longest


def attach_words(
    window: WindowWords,
    timings: list[WordTiming],  # the window's words (word_timings), seconds into the window
    time_offset: float,  # the window's start in seconds
    eot: int,
    last_speech: float,  # the end of the item's last word so far (seconds)
    prepended: str = PREPEND_PUNCTUATIONS,
    appended: str = APPEND_PUNCTUATIONS,
) -> float:
    """Give each segment of `window` its words and move its start/end as openai's
    add_word_timestamps does; returns the new end of speech (`last_speech` when no words)."""
    median, longest = _clip_at_sentences(timings)
    merge_punctuations(timings, prepended, appended)
    window.words = []
    k = 0
    for s, tokens in enumerate(window.tokens):
        n_text = sum(1 for t in tokens if t < eot)
        taken, words = 0, []
        # A segment takes words until it has as many tokens as it holds text tokens (merged
        # punctuation carries its tokens along, emptied words none).
        while k < len(timings) and taken < n_text:
            t = timings[k]
            if t.word:
                words.append({"word": t.word, "start": round(time_offset + t.start, 2),
                              "end": round(time_offset + t.end, 2), "probability": t.probability})  # fmt: skip
            taken += len(t.tokens)
            k += 1
        if words:
            _fit_segment(window, s, words, last_speech, median, longest)
            last_speech = window.ends[s]
        window.words.append(words)
    return last_speech


def _fit_segment(window: WindowWords, s: int, words: list[dict[str, Any]], last_speech: float,
                 median: float, longest: float) -> None:  # fmt: skip
    """openai's boundary rules for one segment with words (in place)."""
    first = words[0]
    # After a pause, a first word (or first two) much longer than usual is mostly silence: cut it.
    long_first = first["end"] - first["start"] > longest or (
        len(words) > 1 and words[1]["end"] - first["start"] > longest * 2)
    if first["end"] - last_speech > median * 4 and long_first:
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - longest)
    start, end = window.starts[s], window.ends[s]
    # The segment's own timestamp wins over a first word that starts much earlier, else the word's.
    if start < first["end"] and start - 0.5 > first["start"]:
        first["start"] = max(0, min(first["end"] - median, start))
    else:
        window.starts[s] = first["start"]
    last = words[-1]
    if end > last["start"] and end + 0.5 < last["end"]:
        last["end"] = max(last["start"] + median, end)
    else:
        window.ends[s] = last["end"]


def last_word_end(words: list[list[dict[str, Any]]], ends: Sequence[float]) -> float | None:
    """openai's get_end: the end of the last word of the window, else its last segment's end."""
    for segment_words in reversed(words):
        if segment_words:
            return segment_words[-1]["end"]
    return ends[-1] if ends else None
