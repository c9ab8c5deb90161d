"""Mixing to mono, scaling, resampling and the checks on the result; the caller's `allocate` hook."""

from __future__ import annotations

import numpy as np
import pytest

from batchscribe.audio.decode import AudioDecodeError, decode_audio, read_audio
from tests.audio.decode.signals import RATE, flac_bytes, noisy_tones, sine, soundfile_reference, wav_bytes

def test_integer_pcm_is_scaled_and_channels_averaged() -> None:
    pcm = np.array([[-32768, 16384], [16384, 0], [32767, -32768]], dtype=np.int16)  # [frames, 2]
    got = decode_audio(wav_bytes(pcm, RATE, "PCM_16"))
    np.testing.assert_array_equal(got, [(-1.0 + 0.5) / 2, 0.25, (32767 / 32768 - 1.0) / 2])
    # 8 kHz stereo (tone left, silence right) -> 16 kHz mono tone at half amplitude.
    left = sine(8_000, 1.0, freq=300.0, amp=0.8)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    decoded = read_audio(wav_bytes(stereo, 8_000, "PCM_24"))
    assert (decoded.source_rate, decoded.channels) == (8_000, 2)
    assert decoded.samples.size == RATE
    expected = sine(RATE, 1.0, freq=300.0, amp=0.4)
    np.testing.assert_allclose(decoded.samples[200:-200], expected[200:-200], atol=2e-3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_rejected(bad: float) -> None:
    samples = np.array([0.1, bad, 0.2, 0.3], dtype=np.float32)
    with pytest.raises(AudioDecodeError, match="1 of 4 samples are NaN or Inf"):
        decode_audio(wav_bytes(samples, RATE, "FLOAT"))


@pytest.mark.parametrize(("channels", "rate"), [(2, RATE), (1, 22_050)])
def test_finite_samples_that_overflow_when_mixed_or_resampled_are_rejected(channels: int, rate: int) -> None:
    """A float file of finite but huge values (3e38, near float32's largest): averaging two
    channels, or resampling, overflows to Inf, which the model must never see."""
    samples = np.full((rate // 10, channels), 3e38, np.float32)
    with pytest.raises(AudioDecodeError, match="overflow to NaN/Inf when mixed to mono or resampled"):
        decode_audio(wav_bytes(samples, rate, "FLOAT"))


def test_huge_finite_samples_pass_when_nothing_mixes_or_resamples_them() -> None:
    """Untouched (mono, 16 kHz), the same samples stay finite, and their overflowing sum of squares
    is not mistaken for NaN or Inf."""
    samples = np.full((1_600, 1), 3e38, np.float32)
    np.testing.assert_array_equal(decode_audio(wav_bytes(samples, RATE, "FLOAT")), samples[:, 0])


def test_zero_duration_results() -> None:
    with pytest.raises(AudioDecodeError, match="decoded 0 samples"):
        decode_audio(wav_bytes(np.zeros((0, 1), np.float32), RATE, "PCM_16"))
    with pytest.raises(AudioDecodeError, match="shorter than one sample at 16000 Hz"):
        decode_audio(wav_bytes(np.zeros((1, 1), np.float32), 48_000, "PCM_16"))


@pytest.mark.parametrize(
    ("name", "data", "decoder"),
    [
        ("mono 16 kHz FLAC (decoded in place)", flac_bytes(noisy_tones(RATE, 1), RATE), "dr_flac"),
        ("stereo 44.1 kHz FLAC (copied)", flac_bytes(noisy_tones(44_100, 2), 44_100, "PCM_24"), "dr_flac"),
        ("mono 16 kHz WAV (copied)", wav_bytes(noisy_tones(RATE, 1), RATE, "PCM_16"), "soundfile"),
        ("stereo 22.05 kHz WAV (copied)", wav_bytes(noisy_tones(22_050, 2), 22_050, "FLOAT"), "soundfile"),
    ],
)
def test_allocate_receives_the_samples(dr_flac: None, name: str, data: bytes, decoder: str) -> None:
    expected = soundfile_reference(data)
    arena = np.full(expected.size + 64, np.nan, np.float32)  # guard NaNs around the caller's slot
    calls: list[int] = []

    def allocate(n_samples: int) -> np.ndarray:
        calls.append(n_samples)
        return arena[32 : 32 + n_samples]

    got = read_audio(data, allocate=allocate)
    assert got.decoder == decoder and calls == [expected.size]
    assert np.shares_memory(got.samples, arena) and got.samples.ctypes.data == arena[32:].ctypes.data
    np.testing.assert_array_equal(got.samples, expected)
    np.testing.assert_array_equal(got.samples, decode_audio(data))
    assert np.isnan(arena[:32]).all() and np.isnan(arena[32 + expected.size :]).all()  # nothing written outside


def test_allocate_once_when_the_flac_falls_back(dr_flac: None) -> None:
    """dr_flac sized the caller's array from the header and decoded short: FFmpeg's samples reuse it."""
    data = bytearray(flac_bytes(noisy_tones(RATE, 1, seconds=3.0), RATE))
    data[len(data) // 2] ^= 0xFF
    given: list[np.ndarray] = []
    got = read_audio(bytes(data), allocate=lambda n: given.append(np.empty(n, np.float32)) or given[-1])
    assert got.decoder == "pyav" and len(given) == 1 and got.samples is given[0]


def test_allocate_must_return_a_writable_float32_vector(dr_flac: None) -> None:
    data = flac_bytes(noisy_tones(RATE, 1), RATE)
    for bad in (lambda n: np.empty(n, np.float64), lambda n: np.empty(n + 1, np.float32),
                lambda n: np.empty(2 * n, np.float32)[::2], lambda n: np.frombuffer(bytes(4 * n), np.float32)):
        with pytest.raises(ValueError, match="must return a writable, C-contiguous float32 numpy array"):
            decode_audio(data, allocate=bad)
