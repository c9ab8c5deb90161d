"""PyAV (FFmpeg) for what libsndfile cannot read: decoded tones checked analytically."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from batchscribe.audio.decode import AudioDecodeError, audio_duration, decode_audio, read_audio
from tests.audio.decode.signals import ONSET_S, RATE, encode_with_pyav

def assert_tone_after_onset(samples: np.ndarray, seconds: float, onset_tolerance_s: float) -> None:
    """Duration, onset time, pitch and level of encode_with_pyav's signal after decoding."""
    assert samples.dtype == np.float32 and samples.ndim == 1
    # AAC files written by PyAV keep the encoder's 1024 priming samples (no edit-list skip).
    assert 0.0 <= audio_duration(samples) - seconds < 0.05
    onset = np.argmax(np.abs(samples) > 0.1) / RATE
    assert 0.0 <= onset - ONSET_S < onset_tolerance_s
    body = samples[int((onset + 0.1) * RATE) : -RATE // 10]  # skip codec transients
    spectrum = np.abs(np.fft.rfft(body * np.hanning(body.size)))
    assert abs(np.argmax(spectrum) * RATE / body.size - 440.0) < 2.0
    assert np.sqrt(np.mean(body**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.05)


@pytest.mark.parametrize(
    ("container_format", "codec", "rate", "onset_tolerance_s"),
    [
        ("ogg", "libopus", 48_000, 0.002),
        ("webm", "libopus", 48_000, 0.002),
        ("ipod", "aac", 44_100, 0.03),  # + 1024 priming samples, see assert_tone_after_onset
        ("mp4", "aac", 48_000, 0.03),
    ],
)
def test_opus_and_aac_go_through_pyav(container_format: str, codec: str, rate: int, onset_tolerance_s: float) -> None:
    data = encode_with_pyav(container_format, codec, rate)
    got = read_audio(data)
    assert (got.decoder, got.source_rate, got.channels) == ("pyav", rate, 2)
    assert_tone_after_onset(got.samples, 1.5, onset_tolerance_s)


def test_container_without_audio_stream() -> None:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    with pytest.raises(AudioDecodeError, match=r"no audio stream .*\['video'\]"):
        decode_audio(buf.getvalue())
