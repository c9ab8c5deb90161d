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
from weakref import WeakKeyDictionary

import numpy as np

from batchscribe.config import DecodeOptions

TOKENS_PER_SECOND = 50  # audio frames per second after the encoder's stride-2 convolution
PREPEND_PUNCTUATIONS = DecodeOptions.prepend_punctuations  # openai's defaults
APPEND_PUNCTUATIONS = DecodeOptions.append_punctuations
_SENTENCE_END = ".。!！?？"
# Scripts written without spaces: openai splits them at every complete character instead.
_UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
# round(x, 2) of word times, x -> rounded: a pure function (x is never -0.0: offsets are >= +0.0)
# over sums that recur from window to window (most windows start at 0 s), and a dict lookup costs a
# fraction of a correctly rounded decimal rounding. Cleared when full.
_ROUNDED: dict[float, float] = {}
_ROUNDED_MAX = 1 << 16
_TOKEN_PIECES: WeakKeyDictionary[Any, dict[int, tuple[str, bool | None]]] = WeakKeyDictionary()


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
    full: str | None = None  # the whole text, decoded only when a U+FFFD needs placing
    pieces: list[str] = []
    runs: list[list[int]] = []
    run: list[int] = []
    offset = 0
    for token, (text, opens) in zip(tokens, _token_pieces(tokens, tokenizer)):
        if not run and opens is not None:  # a token of whole characters: a run of its own
            pieces.append(text)
            runs.append([token])
            offset += len(text)
            continue
        run.append(token)
        text = tokenizer.decode_with_timestamps(run)
        bad = text.find("\ufffd")
        if bad >= 0 and full is None:
            full = tokenizer.decode_with_timestamps(tokens)
        if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":  # type: ignore[index]
            pieces.append(text)
            runs.append(run)
            offset += len(text)
            run = []
    return pieces, runs


def split_words(tokens: Sequence[int], tokenizer: _TokenizerLike,
                language: str | None = None) -> tuple[list[str], list[list[int]]]:  # fmt: skip
    """Tokens -> words: characters for unspaced scripts; elsewhere a word starts at a space, a
    special token or punctuation (openai's test: the stripped piece is in string.punctuation)."""
    if language in _UNSPACED_LANGUAGES:
        return split_subwords(tokens, tokenizer)
    words: list[str] = []
    groups: list[list[int]] = []
    # Where every token is whole characters (most windows), each is a piece of its own and the
    # pieces' texts and word starts come from the per-token cache.
    for token, (text, opens) in zip(tokens, _token_pieces(tokens, tokenizer)):
        if opens is None:
            break
        if opens or not words:
            words.append(text)
            groups.append([token])
        else:
            words[-1] += text
            groups[-1].append(token)
    else:
        return words, groups
    words, groups = [], []
    eot = tokenizer.eot
    for piece, run in zip(*split_subwords(tokens, tokenizer)):
        if run[0] >= eot or _opens_word(piece) or not words:
            words.append(piece)
            groups.append(run)  # split_subwords' own list, not returned: no copy needed
        else:
            words[-1] += piece
            groups[-1].extend(run)
    return words, groups


def _opens_word(piece: str) -> bool:
    return piece.startswith(" ") or piece.strip() in string.punctuation


def _token_pieces(tokens: Sequence[int], tokenizer: _TokenizerLike) -> list[tuple[str, bool | None]]:
    """Each token's own text (decode_with_timestamps) and whether that piece opens a word; None
    where the text holds a U+FFFD (part of a character). Cached per tokenizer: a decode per token
    per window cost more than the rest of the word rules."""
    cache = _TOKEN_PIECES.get(tokenizer)
    if cache is None:
        cache = _TOKEN_PIECES[tokenizer] = {}
    out = []
    for token in tokens:
        entry = cache.get(token)
        if entry is None:
            text = tokenizer.decode_with_timestamps([token])
            whole = "\ufffd" not in text
            entry = cache[token] = (text, (token >= tokenizer.eot or _opens_word(text)) if whole else None)
        out.append(entry)
    return out


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
    # The time at which the path first reaches each row: the start of that token.
    first = np.empty(len(rows), dtype=bool)
    first[:1] = True
    np.not_equal(rows[1:], rows[:-1], out=first[1:])
    times = (cols[first] / TOKENS_PER_SECOND).tolist()
    probs = np.asarray(token_probs, dtype=np.float64).tolist()  # Python floats for `_mean`
    out = []
    a = 0
    for word, group in zip(words[:-1], groups):  # the last word (the end of text) is not timed
        b = a + len(group)
        # One token (most words): np.mean's value is that probability added to 0.0.
        probability = 0.0 + probs[a] if b == a + 1 else _mean(probs[a:b])
        out.append(WordTiming(word, group, times[a], times[b], probability))
        a = b
    return out


def _mean(values: list[float]) -> float:
    """float(np.mean(values)), bit for bit, without numpy's per-call cost: below 8 values numpy's
    pairwise sum adds them left to right from 0.0, as this loop does (not builtins.sum, which
    compensates from Python 3.12); longer (rare) runs go to numpy."""
    if not 0 < len(values) < 8:
        return float(np.mean(np.asarray(values, dtype=np.float64)))
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def merge_punctuations(words: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:  # fmt: skip
    """In place: a lone opening mark (" ``"``, " (") joins the word after it, scanning from the end;
    then a closing mark (".", ",", ")") joins the word before it, scanning from the start. A word
    emptied this way keeps its place with no text and no tokens.

    openai's scans visit every word; these visit only the marks. A word that is no mark becomes
    the target when visited, so a mark's target is its neighbour on the scanned side unless that
    neighbour is a mark too (the target then carries over). Whether a word is a mark never changes
    before its visit: only words already passed are written to."""
    texts = [w.word for w in words]  # kept equal to the words' as they change
    last = len(words) - 1
    opening = [k for k in range(last - 1, -1, -1) if texts[k].strip() in prepended and texts[k].startswith(" ")]
    target = previous = last
    for k in opening:
        if k + 1 < previous:
            target = k + 1
        mark, into = words[k], words[target]
        into.word = texts[target] = texts[k] + texts[target]
        into.tokens = mark.tokens + into.tokens
        mark.word = texts[k] = ""
        mark.tokens = []
        previous = k
    closing = [k for k in range(1, len(words)) if texts[k] in appended]
    target = previous = 0
    for k in closing:
        if k - 1 > previous:
            target = k - 1
        if not texts[target].endswith(" "):
            mark, into = words[k], words[target]
            into.word = texts[target] = texts[target] + texts[k]
            into.tokens = into.tokens + mark.tokens
            mark.word = texts[k] = ""
            mark.tokens = []
        else:
            target = k
        previous = k


def _clip_at_sentences(words: list[WordTiming]) -> tuple[float, float]:
    """(median word duration capped at 0.7 s, twice that); words longer than twice the median at a
    sentence end are cut to it (openai's heuristic, before punctuation is merged)."""
    lengths = [w.end - w.start for w in words]  # each word's is read before the word is cut
    durations = [d for d in lengths if d]  # openai: durations[durations.nonzero()]
    median = min(0.7, _median(durations)) if durations else 0.0
    longest = median * 2
    if durations:
        for k in [k for k in range(1, len(words)) if lengths[k] > longest]:
            if words[k].word in _SENTENCE_END:
                words[k].end = words[k].start + longest
            elif words[k - 1].word in _SENTENCE_END:
                words[k].start = words[k].end - longest
    return median, longest


def _median(values: list[float]) -> float:
    """float(np.median(values)) for a non-empty list without NaN: the middle value, or the mean of
    the middle two (numpy's mean of two values is their sum over 2)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    return (ordered[half - 1] + ordered[half]) / 2


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
    k, n = 0, len(timings)
    if len(_ROUNDED) > _ROUNDED_MAX:
        _ROUNDED.clear()
    rounded = _ROUNDED
    end_raw, end = None, 0.0
    for s, tokens in enumerate(window.tokens):
        n_text = len([t for t in tokens if t < eot])
        taken, words = 0, []
        # A segment takes words until it has as many tokens as it holds text tokens (merged
        # punctuation carries its tokens along, emptied words none).
        while k < n and taken < n_text:
            t = timings[k]
            if t.word:
                if t.start == end_raw:  # a word usually starts where the one before it ends
                    start = end
                else:
                    x = time_offset + t.start
                    start = rounded.get(x)
                    if start is None:
                        start = rounded[x] = round(x, 2)
                end_raw, x = t.end, time_offset + t.end
                end = rounded.get(x)
                if end is None:
                    end = rounded[x] = round(x, 2)
                words.append({"word": t.word, "start": start, "end": end, "probability": t.probability})
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
