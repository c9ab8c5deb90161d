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
from itertools import accumulate
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


@dataclass(slots=True)
class WordTimings:
    """One window's words as parallel lists, openai's WordTiming fields (an object per word cost
    more than the rules applied to it): word k is words[k], its tokens tokens[k], ..."""

    words: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # seconds from the window's start
    ends: list[float] = field(default_factory=list)
    probabilities: list[float] = field(default_factory=list)


@dataclass
class WindowWords:
    """One window's segments as the word stage sees and changes them (openai's segment dicts)."""

    starts: list[float]
    ends: list[float]
    text_counts: list[int]  # each segment's text tokens (below <|endoftext|>)
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
    out = list(map(cache.get, tokens))
    if None in out:  # tokens not seen before
        for k, (token, entry) in enumerate(zip(tokens, out)):
            if entry is None:
                text = tokenizer.decode_with_timestamps([token])
                whole = "\ufffd" not in text
                out[k] = cache[token] = (text, (token >= tokenizer.eot or _opens_word(text)) if whole else None)
    return out


def word_timings(
    path: tuple[np.ndarray, np.ndarray],  # the DTW path through -matrix (batchscribe.dtw): rows, columns
    text_tokens: Sequence[int],
    token_probs: Sequence[float],  # P(each text token) under teacher forcing
    tokenizer: _TokenizerLike,
    language: str | None = None,
) -> WordTimings:
    """Words of one window with start/end (seconds into the window) and mean token probability."""
    if not text_tokens:
        return WordTimings()
    rows, cols = path
    words, groups = split_words([*text_tokens, tokenizer.eot], tokenizer, language)
    n = len(groups) - 1  # the last word (the end of text) is not timed
    del words[n:], groups[n:]
    if not n:
        return WordTimings()
    # The time at which the path first reaches each row: the start of that token.
    first = np.empty(len(rows), dtype=bool)
    first[:1] = True
    np.not_equal(rows[1:], rows[:-1], out=first[1:])
    times = (cols[first] / TOKENS_PER_SECOND).tolist()
    probs = np.asarray(token_probs, dtype=np.float64).tolist()  # Python floats for `_mean`
    # np.mean of one value is that value added to 0.0.
    if n == len(probs):  # every word one token (most windows)
        return WordTimings(words, groups, times[:n], times[1 : n + 1], [0.0 + p for p in probs])
    bounds = [0, *accumulate(map(len, groups))]  # each word's first token, then the end
    at = [times[a] for a in bounds]
    probabilities = [0.0 + probs[a] if b == a + 1 else _mean(probs[a:b]) for a, b in zip(bounds, bounds[1:])]
    starts, ends = at[:-1], at[1:]
    return WordTimings(words, groups, starts, ends, probabilities)


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


def merge_punctuations(texts: list[str], tokens: list[list[int]], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:  # fmt: skip
    """In place, on each word's text and tokens: a lone opening mark (" ``"``, " (") joins the
    word after it, scanning from the end; then a closing mark (".", ",", ")") joins the word before
    it, scanning from the start. A word emptied this way keeps its place with no text and no tokens.

    openai's scans visit every word; these visit only the marks. A word that is no mark becomes
    the target when visited, so a mark's target is its neighbour on the scanned side unless that
    neighbour is a mark too (the target then carries over). Whether a word is a mark never changes
    before its visit: only words already passed are written to."""
    last = len(texts) - 1
    opening = [k for k in range(last - 1, -1, -1) if texts[k].strip() in prepended and texts[k].startswith(" ")]
    target = previous = last
    for k in opening:
        if k + 1 < previous:
            target = k + 1
        texts[target] = texts[k] + texts[target]
        tokens[target] = tokens[k] + tokens[target]
        texts[k] = ""
        tokens[k] = []
        previous = k
    closing = [k for k in range(1, len(texts)) if texts[k] in appended]
    target = previous = 0
    for k in closing:
        if k - 1 > previous:
            target = k - 1
        if not texts[target].endswith(" "):
            texts[target] = texts[target] + texts[k]
            tokens[target] = tokens[target] + tokens[k]
            texts[k] = ""
            tokens[k] = []
        else:
            target = k
        previous = k


def _clip_at_sentences(timings: WordTimings) -> tuple[float, float]:
    """(median word duration capped at 0.7 s, twice that); words longer than twice the median at a
    sentence end are cut to it (openai's heuristic, before punctuation is merged)."""
    words, starts, ends = timings.words, timings.starts, timings.ends
    lengths = [e - s for s, e in zip(starts, ends)]  # each word's is read before the word is cut
    durations = [d for d in lengths if d]  # openai: durations[durations.nonzero()]
    median = min(0.7, _median(durations)) if durations else 0.0
    longest = median * 2
    if durations:
        for k in [k for k in range(1, len(words)) if lengths[k] > longest]:
            if words[k] in _SENTENCE_END:
                ends[k] = starts[k] + longest
            elif words[k - 1] in _SENTENCE_END:
                starts[k] = ends[k] - longest
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
    timings: WordTimings,  # the window's words (word_timings), seconds into the window; changed
    time_offset: float,  # the window's start in seconds
    last_speech: float,  # the end of the item's last word so far (seconds)
    prepended: str = PREPEND_PUNCTUATIONS,
    appended: str = APPEND_PUNCTUATIONS,
) -> float:
    """Give each segment of `window` its words and move its start/end as openai's
    add_word_timestamps does; returns the new end of speech (`last_speech` when no words)."""
    median, longest = _clip_at_sentences(timings)
    texts, groups, starts, ends = timings.words, timings.tokens, timings.starts, timings.ends
    probs = timings.probabilities
    merge_punctuations(texts, groups, prepended, appended)
    window.words = []
    k, n = 0, len(texts)
    if len(_ROUNDED) > _ROUNDED_MAX:
        _ROUNDED.clear()
    rounded = _ROUNDED
    end_raw, end = None, 0.0
    for s, n_text in enumerate(window.text_counts):
        taken, words = 0, []
        # A segment takes words until it has as many tokens as it holds text tokens (merged
        # punctuation carries its tokens along, emptied words none).
        while k < n and taken < n_text:
            word = texts[k]
            if word:
                x = starts[k]
                if x == end_raw:  # a word usually starts where the one before it ends
                    start = end
                else:
                    x += time_offset
                    start = rounded.get(x)
                    if start is None:
                        start = rounded[x] = round(x, 2)
                end_raw = ends[k]
                x = time_offset + end_raw
                end = rounded.get(x)
                if end is None:
                    end = rounded[x] = round(x, 2)
                words.append({"word": word, "start": start, "end": end, "probability": probs[k]})
            taken += len(groups[k])
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
