"""audio/arrays.py: what the API takes as audio, against numpy and soundfile (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.arrays import check_array, check_finite, item_label, prepare_audio
from batchscribe.audio.decode.base import AudioDecodeError

DEMO = Path(__file__).resolve().parents[2] / "batchscribe" / "demo"


def test_a_441_khz_array_is_resampled_keeping_its_pitch_and_length() -> None:
    rate, seconds, tone = 44100, 2.0, 440.0
    t = np.arange(int(rate * seconds)) / rate
    samples = prepare_audio("tone", (0.5 * np.sin(2 * np.pi * tone * t)).astype(np.float64), rate)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert samples.shape[0] == pytest.approx(16000 * seconds, abs=2)
    spectrum = np.abs(np.fft.rfft(samples))
    peak_hz = np.argmax(spectrum) * 16000 / samples.shape[0]
    assert peak_hz == pytest.approx(tone, abs=1.0)


def test_a_16_khz_float32_array_is_taken_as_is() -> None:
    audio = np.random.default_rng(0).uniform(-1, 1, 16000).astype(np.float32)
    assert np.array_equal(prepare_audio("x", audio, 16000), audio)


def test_paths_and_bytes_are_decoded_as_soundfile_reads_them() -> None:
    path = DEMO / "sense_and_sensibility_01_austen_64kb-0890.flac"  # 16 kHz mono
    expected, rate = sf.read(path, dtype="float32")
    assert rate == 16000
    np.testing.assert_allclose(prepare_audio("p", str(path), None), expected, atol=1e-6)
    np.testing.assert_allclose(prepare_audio("b", path.read_bytes(), None), expected, atol=1e-6)


def test_ids_for_items_without_one() -> None:
    assert item_label("clips/a.flac", 3) == "clips/a.flac"
    assert item_label(Path("b.wav"), 0) == "b.wav"
    assert item_label(np.zeros(3, np.float32), 7) == "7"


@pytest.mark.parametrize("audio, message", [
    (np.zeros((10, 1), np.float32), r"shape \(10, 1\).*mean\(axis=1\)"),
    (np.zeros((2, 3, 4), np.float32), r"shape \(2, 3, 4\).*1-D array"),
    (np.zeros(10, np.int32), r"dtype int32.*/ 2147483648"),
    (np.zeros(10, np.complex64), r"dtype complex64.*float32 samples"),
])
def test_check_array_names_shape_or_dtype_and_the_fix(audio: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_array("x", audio)


def test_objects_that_are_not_audio_are_refused_by_type() -> None:
    with pytest.raises(TypeError, match="is a list; pass a file path, encoded bytes or a numpy array"):
        prepare_audio("x", [0.0, 0.1], 16000)


def test_a_hugging_face_audio_cell_is_refused_naming_its_fields() -> None:
    cell = {"array": np.zeros(10, np.float32), "sampling_rate": 16000, "path": None}
    with pytest.raises(TypeError, match=r"'x' is a dict with 'array'.*transcribe\(audio\['array'\], sample_rate="):
        prepare_audio("x", cell, None)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_or_inf_anywhere_is_refused_and_loud_finite_audio_is_not(dtype) -> None:
    """check_finite's one-pass sum of squares against numpy's own isfinite, sample by sample: any
    NaN or Inf is found and counted; loud float16 audio, whose sum of squares overflows, passes."""
    rng = np.random.default_rng(1)
    audio = rng.uniform(-1, 1, 48000).astype(dtype)
    check_finite("x", audio)
    check_finite("x", np.full(48000, 0.99, dtype))  # float16: 48,000 x 0.98 overflows its 65,504
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, 12345, 47999):
            broken = audio.copy()
            broken[where] = bad
            assert not np.isfinite(broken).all()
            with pytest.raises(AudioDecodeError, match=r"audio for 'x' has 1 NaN or Inf samples.*nan_to_num"):
                check_finite("x", broken)
