"""vad_model.py's two ways of scoring: the sequence path (encoder over every chunk at once, LSTM
over whole sequences) equals the model's own audio_forward up to float rounding on real speech,
also when it cuts the encoder's chunks and the LSTM's time steps into slices; `SequenceScorer.fits`
refuses a model whose parts it cannot read or whose parts disagree with the model on its probe,
and the detector then scores with audio_forward. (Spans against silero's get_speech_timestamps:
tests/audio/test_vad.py.)"""

from __future__ import annotations

import importlib.util
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from tests.marks import gpu

pytestmark = pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None,
                                reason="needs pip install 'batchscribe[vad]'")  # fmt: skip

ROUNDING = 1e-5  # as tests/audio/test_vad.py


@pytest.fixture(scope="module")
def model():
    from silero_vad import load_silero_vad

    return load_silero_vad()


@pytest.fixture(scope="module")
def audios(utterances) -> list[np.ndarray]:
    """Eight LibriSpeech rows, one cut to a partial chunk, and an empty item."""
    rows = [a for _, a in utterances[:8]]
    return [*rows, rows[0][:1000].copy(), np.zeros(0, dtype=np.float32)]


def _stepwise_alone(model, audios) -> list[np.ndarray]:
    from batchscribe.audio.vad_model import stepwise

    return [stepwise(model, [a], "cpu")[0] for a in audios]


def test_sequence_equals_audio_forward_within_rounding(model, audios, monkeypatch) -> None:
    import torch

    from batchscribe.audio import vad_model

    assert vad_model.SequenceScorer.fits(model)
    scorer = vad_model.SequenceScorer(model, "cpu")
    want = _stepwise_alone(model, audios)
    with torch.inference_mode():
        whole = scorer(audios)
        monkeypatch.setattr(vad_model, "ENCODE_CHUNKS", 37)  # slices that end mid-item
        monkeypatch.setattr(vad_model, "LSTM_POSITIONS", 9 * 101)  # 9 rows: (h, c) carried across 101-step slices
        sliced = scorer(audios)
    for a, w, p, q in zip(audios, want, whole, sliced):
        assert p.shape == q.shape == w.shape == (-(-len(a) // 512),)
        assert p.size == 0 or (np.abs(p - w).max() < ROUNDING and np.abs(q - w).max() < ROUNDING)
    assert scorer([]) == [] and [len(p) for p in scorer([audios[-1]] * 2)] == [0, 0]


def test_a_model_whose_parts_are_not_the_expected_ones_is_refused(model) -> None:
    import torch
    from silero_vad import load_silero_vad

    from batchscribe.audio.vad_model import SequenceScorer

    assert not SequenceScorer.fits(SimpleNamespace(audio_forward=model.audio_forward))
    other = load_silero_vad()
    with torch.no_grad():
        next(other._model.encoder.parameters()).mul_(1.5)  # parts that disagree with audio_forward
    assert not SequenceScorer.fits(SimpleNamespace(_model=other._model, audio_forward=model.audio_forward))


def test_the_detector_falls_back_to_audio_forward(model, audios, monkeypatch, caplog) -> None:
    from batchscribe.audio import vad

    monkeypatch.setattr(vad.SequenceScorer, "fits", classmethod(lambda cls, m: False))
    with caplog.at_level(logging.WARNING, logger="batchscribe.audio.vad"):
        detector = vad.SpeechDetector()
    assert "audio_forward" in caplog.text and detector._sequence is None
    got = detector.probabilities(audios[:3])
    from batchscribe.audio.vad_model import stepwise

    want = stepwise(model, audios[:3], "cpu")
    assert all(np.array_equal(g, w) for g, w in zip(got, want))  # the same call: the same floats


def _batches(n: int) -> list[list[int]]:
    """Item orders and companions: alone, reversed, more items than a call takes, each with others."""
    return [list(range(n)), list(reversed(range(n))), [1, n - 1, 3], [n - 2, 0, 5, 2, 6, 4, 7]]


def _same_bits_in_any_batch(score, audios) -> list[np.ndarray]:
    """Each item's probabilities alone, after checking that every batch of `_batches` gives the same bits."""
    alone = [score([a])[0] for a in audios]
    for order in _batches(len(audios)):
        got = score([audios[k] for k in order])
        assert [k for k, g in zip(order, got) if not np.array_equal(g, alone[k])] == []
    return alone


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_fixed_shapes_give_an_item_the_same_bits_in_any_batch(model, audios, device, monkeypatch) -> None:
    """`rows=`: every call at one shape, so an item's probabilities do not depend on the items
    beside it (batched calls at their own shapes differ in the last bits: the kernels change with
    the row count), and they still equal audio_forward's within rounding. Small fixed slices make
    the encoder's, the head's and the LSTM's last slices end mid-item and be padded."""
    import torch

    from batchscribe.audio import vad_model

    monkeypatch.setattr(vad_model, "FIXED_ROWS", 97)
    monkeypatch.setattr(vad_model, "FIXED_STEPS", 23)
    scorer = vad_model.SequenceScorer(model.to(device), device, rows=4)
    with torch.inference_mode():
        alone = _same_bits_in_any_batch(scorer, audios)
    model.to("cpu")
    for a, w, p in zip(audios, _stepwise_alone(model, audios), alone):
        assert p.shape == w.shape == (-(-len(a) // 512),)
        # On CUDA cuDNN's convolutions run in TF32 by default: 1.3e-3 from the CPU's float32 was seen
        assert p.size == 0 or np.abs(p - w).max() < (ROUNDING if device == "cpu" else 5e-3)


def test_an_invariant_detector_scores_alike_in_any_batch(audios, monkeypatch) -> None:
    """SpeechDetector(invariant=True): the fixed-shape scorer, or, where it does not fit the model,
    audio_forward one item a call; either way the same bits in any batch."""
    from batchscribe.audio import vad

    detector = vad.SpeechDetector(invariant=True)
    assert detector._sequence.rows == vad.INVARIANT_ITEMS["cpu"]
    _same_bits_in_any_batch(detector.probabilities, audios)
    monkeypatch.setattr(vad.SequenceScorer, "fits", classmethod(lambda cls, m: False))
    fallback = vad.SpeechDetector(invariant=True)
    assert fallback._sequence is None
    _same_bits_in_any_batch(fallback.probabilities, audios)
