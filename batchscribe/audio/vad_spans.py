"""Silero's speech probabilities -> speech spans, by the rules of silero-vad's
`get_speech_timestamps` (v5/v6, its default `use_max_poss_sil_at_max_speech`), on the host.

The rules walk the 512-sample chunks in order with hysteresis: speech starts at a chunk at or above
`threshold`; once in speech, a chunk below `neg_threshold` opens a silence that ends the speech
when it lasts `min_silence` samples (a chunk at or above `threshold` closes it first, and a silence
longer than `min_silence_at_max` is remembered). Speech longer than `max_speech` is cut at the
longest remembered silence, else at the chunk that overran. Spans shorter than `min_speech` are
dropped when a silence ends them. Then each span is padded by `pad` samples, or by half the gap
when two spans are closer than two pads.

The walk visits only the chunks where one of those rules can fire (found with `searchsorted` on
the speech and silence chunk indices), so a long item costs Python time per state change, not per
chunk: the other chunks change nothing, by the rules above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHUNK = 512  # samples per probability at 16 kHz: Silero's window


@dataclass(frozen=True)
class SpanRules:
    """get_speech_timestamps' settings in samples (16 kHz)."""

    threshold: float
    neg_threshold: float
    min_speech: float
    max_speech: float  # the longest span before it is cut, as silero computes it
    min_silence: float
    min_silence_at_max: float  # a silence this long is a place to cut an overlong span
    pad: int

    @classmethod
    def silero(cls, threshold: float = 0.5, min_speech_ms: int = 250, max_speech_s: float = float("inf"),
               min_silence_ms: int = 100, speech_pad_ms: int = 30, min_silence_at_max_ms: int = 98,
               rate: int = 16000) -> SpanRules:  # fmt: skip
        """From get_speech_timestamps' keyword arguments and defaults (neg_threshold: its default)."""
        pad = rate * speech_pad_ms / 1000
        if pad != int(pad):
            raise ValueError(f"speech_pad_ms={speech_pad_ms} is not a whole number of samples at {rate} Hz")
        return cls(threshold=threshold, neg_threshold=max(threshold - 0.15, 0.01),
                   min_speech=rate * min_speech_ms / 1000,
                   max_speech=rate * max_speech_s - CHUNK - 2 * pad,
                   min_silence=rate * min_silence_ms / 1000,
                   min_silence_at_max=rate * min_silence_at_max_ms / 1000, pad=int(pad))  # fmt: skip


class _Walk:
    """The rules' state while walking one item's chunks; `spans` collects unpadded spans."""

    def __init__(self, probs: np.ndarray, rules: SpanRules):
        self.probs, self.rules = probs, rules
        self.loud = np.flatnonzero(probs >= rules.threshold)  # chunk indices that start or resume speech
        self.quiet = np.flatnonzero(probs < rules.neg_threshold)  # chunk indices that open a silence
        self.triggered = False
        self.start = 0  # samples: the open span's start
        self.silence = 0  # samples: where the open silence began; 0: none (chunk 0 never opens one)
        self.gaps: list[tuple[int, int]] = []  # (silence start, length): places to cut an overlong span
        self.spans: list[tuple[int, int]] = []

    def _after(self, indices: np.ndarray, i: int) -> int:
        """The first of `indices` at or after chunk i (len(probs) when none)."""
        k = int(np.searchsorted(indices, i))
        return int(indices[k]) if k < len(indices) else len(self.probs)

    def _overrun(self) -> int:
        """The first chunk whose start lies more than max_speech past the open span's start."""
        if math.isinf(self.rules.max_speech):
            return len(self.probs)
        return int((self.start + self.rules.max_speech) // CHUNK) + 1

    def next_event(self, i: int) -> int:
        """The first chunk at or after i where a rule can fire; every chunk before it is a no-op."""
        if not self.triggered:
            return self._after(self.loud, i)  # only speech starts a span
        overrun = max(i, self._overrun())
        if not self.silence:
            return min(self._after(self.quiet, i), overrun)  # a silence opens, or the span overruns
        ends = max(i, -int(-(self.silence + self.rules.min_silence) // CHUNK))  # the silence long enough
        return min(self._after(self.loud, i), self._after(self.quiet, ends), overrun)

    def visit(self, i: int) -> None:
        """Every rule, in silero's order, at chunk i."""
        r, cur, p = self.rules, i * CHUNK, float(self.probs[i])
        if p >= r.threshold and self.silence:  # speech resumes: the silence was a place to cut
            if cur - self.silence > r.min_silence_at_max:
                self.gaps.append((self.silence, cur - self.silence))
            self.silence = 0
        if p >= r.threshold and not self.triggered:
            self.triggered, self.start = True, cur
            return
        if self.triggered and cur - self.start > r.max_speech:
            if not self.gaps:  # no silence to cut at: cut here, and the next speech chunk starts anew
                self.spans.append((self.start, cur))
                self.triggered, self.silence = False, 0
                return
            cut, length = max(self.gaps, key=lambda g: g[1])  # the longest; the first of equals
            self.spans.append((self.start, cut))
            self.start, self.silence, self.gaps = cut + length, 0, []  # speech went on after that silence
        if p < r.neg_threshold and self.triggered:
            self.silence = self.silence or cur
            if cur - self.silence >= r.min_silence:
                if self.silence - self.start > r.min_speech:
                    self.spans.append((self.start, self.silence))
                self.triggered, self.silence, self.gaps = False, 0, []


def raw_spans(probs: np.ndarray, n_samples: int, rules: SpanRules) -> list[tuple[int, int]]:
    """probs ([ceil(n_samples / 512)] float, finite) -> unpadded (start, end) sample spans."""
    walk = _Walk(np.asarray(probs), rules)
    i = walk.next_event(0)
    while i < len(walk.probs):
        walk.visit(i)
        i = walk.next_event(i + 1)
    if walk.triggered and n_samples - walk.start > rules.min_speech:  # speech runs to the item's end
        walk.spans.append((walk.start, n_samples))
    return walk.spans


def padded(spans: list[tuple[int, int]], n_samples: int, pad: int) -> list[tuple[int, int]]:
    """Each span widened by `pad` samples, within [0, n_samples]; two spans closer than two pads
    share the gap between them, half each (silero's padding)."""
    out = [list(s) for s in spans]
    for k, span in enumerate(out):
        if k == 0:
            span[0] = max(0, span[0] - pad)
        if k + 1 == len(out):
            span[1] = min(n_samples, span[1] + pad)
            continue
        after = out[k + 1]
        gap = after[0] - span[1]
        if gap < 2 * pad:  # close spans: half the gap each
            span[1] += gap // 2
            after[0] = max(0, after[0] - gap // 2)
        else:
            span[1] = min(n_samples, span[1] + pad)
            after[0] = max(0, after[0] - pad)
    return [(int(s), int(e)) for s, e in out]


def speech_spans(probs: np.ndarray, n_samples: int, rules: SpanRules) -> list[tuple[int, int]]:
    """An item's speech as get_speech_timestamps returns it: padded (start, end) sample spans."""
    return padded(raw_spans(probs, n_samples, rules), n_samples, rules.pad)
