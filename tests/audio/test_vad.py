"""SpeechDetector's batched paths (sequence, the default, and stepwise: vad_model.py) against
silero-vad's own `get_speech_timestamps`, item by item, on real speech: long-form files and
LibriSpeech rows, each alone and batched with items of other lengths (padding after an item's
end, and the other rows, change nothing).

The tolerance, and why the spans are still compared exactly: a batched row goes through the
model's GEMMs and convolutions in other shapes than get_speech_timestamps' one chunk of one item,
so its probabilities may differ from the lone item's by float rounding (asserted < 1e-5 against
the model's own audio_forward on the item alone, which is get_speech_timestamps' arithmetic).
That can move a span only where a probability lies within the rounding of 0.5 or 0.35, and no
probability of these items does (asserted), so their spans must be identical.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from batchscribe.audio.vad import (MAX_CHUNK_SECONDS, MIN_SILENCE_MS, RULES, SPEECH_PAD_MS, THRESHOLD, length_groups,
                                   merge_spans)
from batchscribe.audio.vad_spans import speech_spans

pytestmark = pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None,
                                reason="needs pip install 'batchscribe[vad]'")  # fmt: skip

ROUNDING = 1e-5  # batched rows against lone items: see the module docstring


@pytest.fixture(scope="module")
def items(shared_data: Path, utterances: list) -> list[tuple[str, np.ndarray]]:
    """A 4.6 min LibriSpeech chapter, two 60 s earnings calls (24 kHz WAV), a 53 s reading (MP3)
    and twelve LibriSpeech test-other rows, decoded as `run` decodes them."""
    from batchscribe.audio.decode import decode_audio

    longform = shared_data / "longform"
    paths = [longform / "librispeech-concat" / "32-21631-longform.flac", *sorted((longform / "earnings22").glob("*.wav")),
             longform / "librivox-sonnets" / "p001.mp3"]  # fmt: skip
    return [(p.stem, decode_audio(str(p))) for p in paths] + list(utterances[:12])


def _silero(audio: np.ndarray) -> list[tuple[int, int]]:
    """silero-vad's get_speech_timestamps on one item with vad.py's settings, a fresh model."""
    import torch
    from silero_vad import get_speech_timestamps, load_silero_vad

    found = get_speech_timestamps(torch.from_numpy(audio), load_silero_vad(), threshold=THRESHOLD,
                                  sampling_rate=16000, min_silence_duration_ms=MIN_SILENCE_MS,
                                  speech_pad_ms=SPEECH_PAD_MS, max_speech_duration_s=MAX_CHUNK_SECONDS)  # fmt: skip
    return [(int(d["start"]), int(d["end"])) for d in found]


@pytest.fixture(scope="module")
def reference(items: list) -> dict[str, list[tuple[int, int]]]:
    return {item_id: _silero(audio) for item_id, audio in items}


@pytest.fixture(scope="module")
def detector():
    from batchscribe.audio.vad import SpeechDetector

    found = SpeechDetector()
    assert found._sequence is not None  # the installed silero-vad's parts are the ones it reads
    return found


@pytest.fixture(scope="module")
def stepwise_detector():
    from batchscribe.audio.vad import SpeechDetector

    return SpeechDetector(sequence=False)


def _as_before(found: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """What the per-item detector made of silero's spans: ends within the item, overlaps joined."""
    spans: list[tuple[int, int]] = []
    for s, e in found:
        e = min(e, n)
        if spans and s <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(e, spans[-1][1]))
        elif e > s:
            spans.append((s, e))
    return spans


def test_each_item_alone_gives_silero_spans(detector, items, reference) -> None:
    for item_id, audio in items:
        (probs,) = detector.probabilities([audio])
        assert probs.shape == (-(-len(audio) // 512),)
        assert speech_spans(probs, len(audio), RULES) == reference[item_id], item_id


@pytest.mark.parametrize(("path", "pick"), [("sequence", [0, 1, 4, 5, 6]), ("sequence", [2, 10, 3, 11, 12, 13, 14, 15]),
                                           ("stepwise", [2, 10, 3, 11, 12, 13, 14, 15])])  # fmt: skip
def test_batched_with_other_lengths_gives_silero_spans(detector, stepwise_detector, items, reference, path: str,
                                                       pick: list[int]) -> None:  # fmt: skip
    from batchscribe.audio.vad_model import stepwise

    batch = [items[k] for k in pick]
    lengths = {len(a) for _, a in batch}
    assert len(lengths) == len(batch) and max(lengths) > 4 * min(lengths)  # really padded
    from batchscribe.audio.vad import _item_speech  # what detect() makes of each row's probabilities

    scorer = detector if path == "sequence" else stepwise_detector
    probs = scorer.probabilities([a for _, a in batch])  # one pass over all of them, however long
    for (item_id, audio), p in zip(batch, probs):
        speech = _item_speech(p, len(audio))
        (alone,) = stepwise(stepwise_detector._model, [audio], "cpu")  # get_speech_timestamps' arithmetic
        assert np.abs(p - alone).max() < ROUNDING, item_id
        assert min(np.abs(alone - THRESHOLD).min(), np.abs(alone - RULES.neg_threshold).min()) > ROUNDING, item_id
        assert speech_spans(p, len(audio), RULES) == reference[item_id], item_id
        assert speech.error is None and list(speech.spans) == _as_before(reference[item_id], len(audio))
        assert list(speech.chunks) == merge_spans(list(speech.spans), int(MAX_CHUNK_SECONDS * 16000))
    assert sum(len(reference[i]) for i, _ in batch) > 20


def test_a_nan_item_is_an_error_and_leaves_the_rest_alone(detector, items, reference) -> None:
    (a_id, a), (b_id, b) = items[5], items[6]
    bad = np.full(16000 * 7, np.nan, dtype=np.float32)
    found = detector.detect([a, bad, b])
    assert found[1].error is not None and "NaN" in found[1].error and found[1].spans == ()
    assert list(found[0].spans) == _as_before(reference[a_id], len(a))
    assert list(found[2].spans) == _as_before(reference[b_id], len(b))
    alone = detector.detect([bad])[0]
    assert alone.error == found[1].error and alone.chunks == ()


def test_empty_and_short_items_are_silero_spans(detector, items, reference) -> None:
    item_id, audio = items[7]
    short = [np.zeros(0, dtype=np.float32), audio[:100].copy(), audio[:511].copy(), audio[:513].copy()]
    found = detector.detect([*short, audio])
    for x, speech in zip(short, found):
        assert speech.error is None and list(speech.spans) == _as_before(_silero(x), len(x))
    assert list(found[-1].spans) == _as_before(reference[item_id], len(audio))
    assert detector.detect([]) == []


def test_detect_scores_items_of_like_length_together_and_keeps_their_order(detector, items, reference) -> None:
    assert length_groups([10, 300, 160, 0, 149, 75, 80]) == [[1, 2], [4, 6, 5], [0], [3]]
    batch = [items[k] for k in (3, 8, 1, 9, 4)]  # 53 s and 60 s of long-form, three LibriSpeech rows
    for (item_id, audio), speech in zip(batch, detector.detect([a for _, a in batch])):
        assert speech.error is None and list(speech.spans) == _as_before(reference[item_id], len(audio)), item_id
