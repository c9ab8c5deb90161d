"""PyAV (FFmpeg) for what libsndfile cannot read: decoded tones checked analytically."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.decode import AudioDecodeError, audio_duration, decode_audio, read_audio
from tests.audio.decode.signals import ONSET_S, RATE, encode_with_pyav

# A core dependency, but the GPU machine's image lacks it: its modules skip there rather than fail to collect.
av = pytest.importorskip("av")

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


def test_more_than_eight_channels_come_back_in_order() -> None:
    """FFmpeg frames of more than 8 planes: PyAV's planar to_ndarray read past its 8 data pointers
    (a segfault); the packed form keeps every channel, in order, as soundfile wrote them."""
    from batchscribe.audio.decode.pyav import read_pyav

    t = np.arange(4000) / RATE
    written = np.stack([np.sin(2 * np.pi * (100 + 50 * c) * t) * 0.1 * (c + 1) / 12 for c in range(12)], axis=1)
    buf = io.BytesIO()
    sf.write(buf, written.astype(np.float32), RATE, format="WAV", subtype="FLOAT")
    samples, rate, _ = read_pyav(io.BytesIO(buf.getvalue()))
    assert rate == RATE and samples.shape == written.shape
    np.testing.assert_array_equal(samples, written.astype(np.float32))


def test_a_header_declaring_59_channels_is_an_error_not_a_crash() -> None:
    """A float WAV whose channel count was overwritten with 59 (found by tests/system/test_fuzz.py):
    libsndfile refuses it, FFmpeg decodes garbage frames of 59 channels; the item gets an error."""
    t = np.arange(int(0.2 * 22050)) / 22050
    buf = io.BytesIO()
    sf.write(buf, np.repeat((0.3 * np.sin(2 * np.pi * 440 * t))[:, None], 2, axis=1).astype(np.float32), 22050,
             format="WAV", subtype="FLOAT")  # fmt: skip
    data = bytearray(buf.getvalue())
    data[22:24] = (59).to_bytes(2, "little")  # the fmt chunk's channel count
    try:
        audio = decode_audio(bytes(data))
    except AudioDecodeError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
    else:
        assert audio.dtype == np.float32 and audio.ndim == 1 and np.isfinite(audio).all()
