"""Log-mel features against transformers' WhisperFeatureExtractor and openai-whisper's audio code."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscribe.audio.features import LogMel, mel_filter_bank, pad_batch, pad_or_trim
from batchscribe.constants import N_FRAMES, N_SAMPLES, SAMPLE_RATE
from tests.marks import needs_cuda

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def whisper():
    """openai-whisper, for the tests that compare with it (the GPU machine lacks it)."""
    return pytest.importorskip("whisper")

ATOL = 1e-4  # the contract with transformers, on the (x + 4) / 4 log-mel scale


def reference(batch: list[np.ndarray], n_mels: int) -> np.ndarray:
    """transformers' features for a list of variable-length arrays: [B, n_mels, 3000]."""
    extractor = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    return extractor(batch, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features


def ours(batch: list[np.ndarray], n_mels: int) -> np.ndarray:
    return LogMel(n_mels)(pad_batch([pad_or_trim(x) for x in batch])).numpy()


@pytest.fixture(scope="module")
def speech(shared_data: Path) -> list[np.ndarray]:
    """The four test-clean utterances (FLAC bytes in the Parquet), read directly with soundfile."""
    import pyarrow.parquet as pq

    path = shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet"
    if not path.is_file():  # e.g. a partial copy of the data on the GPU machine
        pytest.skip(f"shared data lacks {path}")
    table = pq.read_table(path)
    clips = []
    for cell in table.column("audio").to_pylist():
        samples, rate = sf.read(io.BytesIO(cell["bytes"]), dtype="float32")
        assert rate == SAMPLE_RATE
        clips.append(samples)
    return clips


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_whisper_and_transformers(whisper, n_mels: int) -> None:
    filters = mel_filter_bank(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == np.float32
    openai_filters = whisper.audio.mel_filters("cpu", n_mels).numpy()  # librosa's Slaney bank
    hf_filters = transformers.WhisperFeatureExtractor(feature_size=n_mels).mel_filters.T
    np.testing.assert_allclose(filters, openai_filters, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(filters, hf_filters, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mixed_batch_equals_transformers_and_whisper(whisper, speech: list[np.ndarray], n_mels: int) -> None:
    rng = np.random.default_rng(0)
    tiled = np.tile(np.concatenate(speech), 2)
    batch = [
        *speech,  # real speech, 3-10 s each, zero-padded
        tiled[:N_SAMPLES],  # exactly 30 s
        tiled[: N_SAMPLES + 80_000],  # 35 s: trimmed to the window
        rng.standard_normal(N_SAMPLES).astype(np.float32) * 0.3,  # white noise, full window
        rng.standard_normal(12_345).astype(np.float32) * 1e-3,  # quiet noise, odd length
        np.zeros(N_SAMPLES, dtype=np.float32),  # pure silence
        np.zeros(1, dtype=np.float32),
    ]
    got = ours(batch, n_mels)
    assert got.shape == (len(batch), n_mels, N_FRAMES) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(batch, n_mels), rtol=0, atol=ATOL)
    for row, audio in enumerate(batch):
        openai = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), n_mels=n_mels)
        np.testing.assert_allclose(got[row], openai.numpy(), rtol=0, atol=1e-5)
    # Silence sits at the clamp: log10(1e-10) = -10 -> (-10 + 4) / 4 everywhere.
    np.testing.assert_array_equal(got[-2], np.full((n_mels, N_FRAMES), -1.5, dtype=np.float32))


def test_rows_are_independent_of_the_batch(speech: list[np.ndarray]) -> None:
    """A quiet row next to a loud one keeps its own floor (max - 8 over its own window)."""
    rng = np.random.default_rng(1)
    quiet = rng.standard_normal(40_000).astype(np.float32) * 1e-4
    loud = speech[0] * 20.0
    batch = [loud, quiet, np.zeros(10, dtype=np.float32), speech[1]]
    together = ours(batch, 80)
    for row, audio in enumerate(batch):
        alone = ours([audio], 80)[0]
        np.testing.assert_allclose(together[row], alone, rtol=0, atol=1e-6)
    # The quiet row's floor is its own max - 8, far below the loud row's floor.
    assert together[1].min() < together[0].min() - 1.0


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=N_SAMPLES), min_size=1, max_size=3),
    log_gain=st.floats(min_value=-5.0, max_value=1.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_random_batches_equal_transformers(lengths: list[int], log_gain: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = [(rng.standard_normal(n) * 10.0**log_gain).astype(np.float32) for n in lengths]
    np.testing.assert_allclose(ours(batch, 80), reference(batch, 80), rtol=0, atol=ATOL)


def test_whole_recording_equals_openai_log_mel(whisper, speech: list[np.ndarray]) -> None:
    audio = np.concatenate(speech * 2)  # ~42 s: longer than one window
    got = LogMel(80).whole(audio, padding=N_SAMPLES)
    expected = whisper.log_mel_spectrogram(torch.from_numpy(audio), n_mels=80, padding=N_SAMPLES)
    assert got.shape == expected.shape == (80, (audio.shape[0] + N_SAMPLES) // 160)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("length", [1, 1000, N_SAMPLES, N_SAMPLES + 7])
def test_pad_or_trim_numpy_and_torch_equal_whisper(whisper, length: int) -> None:
    rng = np.random.default_rng(length)
    for shape in [(length,), (2, length)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for target in [N_SAMPLES, 1000]:
            expected = whisper.pad_or_trim(x, target)
            got_np = pad_or_trim(x, target)
            got_torch = pad_or_trim(torch.from_numpy(x), target)
            assert isinstance(got_np, np.ndarray) and isinstance(got_torch, torch.Tensor)
            np.testing.assert_array_equal(got_np, expected)
            np.testing.assert_array_equal(got_torch.numpy(), expected)


def test_pad_batch_zero_pads_and_rejects_bad_items() -> None:
    items = [np.ones(3, dtype=np.float32), np.arange(5, dtype=np.float64)]
    batch = pad_batch(items, length=6)
    assert batch.dtype == torch.float32 and batch.shape == (2, 6)
    np.testing.assert_array_equal(batch.numpy(), [[1, 1, 1, 0, 0, 0], [0, 1, 2, 3, 4, 0]])
    with pytest.raises(ValueError, match="more than 6"):
        pad_batch([np.zeros(7, dtype=np.float32)], length=6)
    with pytest.raises(ValueError, match="mono 1-D"):
        pad_batch([np.zeros((2, 3), dtype=np.float32)], length=6)


def test_log_mel_rejects_wrong_shapes_and_sizes() -> None:
    with pytest.raises(ValueError, match="n_mels=81"):
        LogMel(81)
    with pytest.raises(ValueError, match=r"\[B, 480000\]"):
        LogMel(80)(torch.zeros(2, 1000))
    with pytest.raises(ValueError, match=r"\[B, 480000\]"):
        LogMel(80)(torch.zeros(N_SAMPLES))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n_mels", [80, 128])
def test_cuda_equals_transformers(speech: list[np.ndarray], n_mels: int) -> None:
    batch = [*speech, np.zeros(N_SAMPLES, dtype=np.float32)]
    features = LogMel(n_mels, "cuda")(pad_batch(batch))  # host batch in, moved by LogMel
    assert features.device.type == "cuda"
    np.testing.assert_allclose(features.cpu().numpy(), reference(batch, n_mels), rtol=0, atol=ATOL)


@pytest.mark.gpu
@needs_cuda
def test_features_on_gpu_equal_cpu(utterances) -> None:
    batch = pad_batch([a for _, a in utterances[:8]])
    cpu = LogMel(80, "cpu")(batch)
    gpu = LogMel(80, "cuda")(batch.cuda()).cpu()
    assert (cpu - gpu).abs().max() < 1e-4
