"""get_speech_timestamps' rules on the host: the same spans as silero-vad's own
`get_speech_timestamps_from_probs` (the rules get_speech_timestamps applies to its probabilities)
on probability sequences built to hit every rule: hysteresis between the two thresholds, short
speech dropped, short silences bridged, overlong speech cut at its longest silence or, with none,
where it overran, and padding shared by close spans."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from batchscribe.audio.vad import RULES
from batchscribe.audio.vad_spans import CHUNK, SpanRules, raw_spans, speech_spans

pytestmark = pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None,
                                reason="the reference is silero-vad: pip install 'batchscribe[vad]'")  # fmt: skip

# Ours (SpanRules.silero) and get_speech_timestamps' names for the same settings.
SETTINGS = [
    ({"threshold": 0.5, "max_speech_s": 30.0, "min_silence_ms": 160, "speech_pad_ms": 400},  # vad.RULES
     {"threshold": 0.5, "max_speech_duration_s": 30.0, "min_silence_duration_ms": 160, "speech_pad_ms": 400}),
    ({}, {}),  # silero's defaults: no length limit
    ({"threshold": 0.6, "max_speech_s": 5.0, "min_silence_ms": 300, "speech_pad_ms": 30, "min_speech_ms": 100},
     {"threshold": 0.6, "max_speech_duration_s": 5.0, "min_silence_duration_ms": 300, "speech_pad_ms": 30,
      "min_speech_duration_ms": 100}),
]  # fmt: skip


def _reference(probs: np.ndarray, n_samples: int, settings: dict) -> list[tuple[int, int]]:
    from silero_vad import get_speech_timestamps_from_probs

    found = get_speech_timestamps_from_probs([float(p) for p in probs], audio_length_samples=n_samples, **settings)
    return [(d["start"], d["end"]) for d in found]


def _markov(rng: np.random.Generator, n: int, stay: float) -> np.ndarray:
    """Probabilities that dwell in silence (< 0.35), the band between the thresholds, or speech
    (>= 0.5), switching state with probability 1 - stay per chunk."""
    levels = np.array([0.05, 0.42, 0.9])
    switches = rng.random(n) > stay
    states = np.where(switches, rng.integers(0, 3, n), -1)
    states[0] = max(states[0], 0)
    filled = np.maximum.accumulate(np.where(states >= 0, np.arange(n), 0))  # carry each state forward
    return np.clip(levels[states[filled]] + rng.normal(0, 0.05, n), 0.0, 1.0).astype(np.float32)


@pytest.mark.parametrize(("ours", "theirs"), SETTINGS)
def test_random_sequences_give_silero_spans(ours: dict, theirs: dict) -> None:
    rng = np.random.default_rng(20)
    rules, spans = SpanRules.silero(**ours), 0
    for _ in range(150):
        n = int(rng.integers(1, 8000))  # up to ~4 min of chunks
        probs = _markov(rng, n, float(rng.choice([0.5, 0.9, 0.98, 0.995, 0.999])))
        n_samples = n * CHUNK - int(rng.integers(0, CHUNK))  # a partial last chunk
        want = _reference(probs, n_samples, theirs)
        assert speech_spans(probs, n_samples, rules) == want
        spans += len(want)
    assert spans > 1000


def _run(n_chunks: int, level: float) -> list[float]:
    return [level] * n_chunks


@pytest.mark.parametrize(("name", "probs"), [
    # 70 s of speech with pauses of 0.5 s at 20 s and 0.2 s at 45 s (a chunk below 0.35, then the
    # band between the thresholds: a silence that never lasts long enough to end the speech)
    ("cut at the longest silence", _run(20, 0.1) + _run(625, 0.9) + [0.1] + _run(15, 0.42) + _run(780, 0.9)
     + [0.1] + _run(5, 0.42) + _run(800, 0.9) + _run(40, 0.1)),
    # 70 s of unbroken speech: cut where it overran, then the next speech chunk starts a span
    ("cut where it overran", _run(10, 0.1) + _run(2200, 0.9) + _run(30, 0.1)),
    # a pause only in the band between the thresholds never opens a silence
    ("between the thresholds", _run(10, 0.1) + _run(100, 0.9) + _run(50, 0.42) + _run(100, 0.9) + _run(10, 0.1)),
    # a 0.1 s pause (3 chunks) is bridged; a 0.2 s one (7 chunks) splits; a 0.1 s blip is dropped
    ("bridged, split, dropped", _run(10, 0.1) + _run(60, 0.9) + _run(3, 0.1) + _run(60, 0.9) + _run(7, 0.1)
     + _run(60, 0.9) + _run(40, 0.1) + _run(3, 0.9) + _run(40, 0.1)),
    ("speech to the end", _run(10, 0.1) + _run(60, 0.9)),
    ("silence only", _run(100, 0.1)),
    ("nothing", []),
])  # fmt: skip
def test_each_rule_gives_silero_spans(name: str, probs: list[float]) -> None:
    p = np.array(probs, dtype=np.float32)
    for n_samples in (len(p) * CHUNK, max(len(p) * CHUNK - 300, 0)):
        assert speech_spans(p, n_samples, RULES) == _reference(p, n_samples, SETTINGS[0][1]), name
    if name.startswith("cut"):  # the spans really were cut to at most 30 s
        assert len(raw_spans(p, len(p) * CHUNK, RULES)) == 3


def test_speech_spans_refuses_a_pad_of_part_of_a_sample() -> None:
    with pytest.raises(ValueError, match="speech_pad_ms"):
        SpanRules.silero(speech_pad_ms=400, rate=8001)
