"""Audio decoding against independent references: PyAV/FFmpeg + swresample, soundfile, analytic signals."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.decode import AudioDecodeError, audio_duration, decode_audio, read_audio

RATE = 16_000
LONGFORM = [
    ("librivox-sonnets/p001.mp3", 44_100, 2),
    ("librivox-sonnets/p002.mp3", 44_100, 2),
    ("librivox-sonnets/p003.mp3", 44_100, 2),
    ("earnings22/earnings22_1_4482311_3_62.wav", 24_000, 1),
    ("earnings22/earnings22_3_4483589_261_321.wav", 24_000, 1),
]


def reference_decode(path: Path) -> np.ndarray:
    """FFmpeg's decoder (not libsndfile/mpg123) and FFmpeg's swresample (not soxr) -> mono 16 kHz."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        planes = np.concatenate([frame.to_ndarray() for frame in container.decode(stream)], axis=1)
        rate = stream.rate
    if planes.dtype == np.int16:  # packed s16 with one channel: [1, n]
        planes = planes.astype(np.float32) / 32768.0
    mono = planes.mean(axis=0).astype(np.float32)
    frame = av.AudioFrame.from_ndarray(mono[None], format="fltp", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=RATE)
    out = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([f.to_ndarray()[0] for f in out])


def sine(rate: int, seconds: float, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


ONSET_S = 0.5  # the test signal: silence, then a 440 Hz tone from 0.5 s to the end


def encode_with_pyav(container_format: str, codec: str, rate: int, seconds: float = 1.5) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        wave = sine(rate, seconds)
        wave[: int(ONSET_S * rate)] = 0.0
        frame = av.AudioFrame.from_ndarray(np.stack([wave, wave]), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


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


def wav_bytes(samples: np.ndarray, rate: int, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(("name", "rate", "channels"), LONGFORM)
def test_longform_files_match_reference_decode(shared_data: Path, name: str, rate: int, channels: int) -> None:
    path = shared_data / "longform" / name
    got = read_audio(path)
    assert (got.source_rate, got.channels, got.decoder, got.sample_rate) == (rate, channels, "soundfile", RATE)
    samples = got.samples
    assert samples.dtype == np.float32 and samples.ndim == 1 and samples.flags.c_contiguous
    ref = reference_decode(path)
    assert abs(samples.size - ref.size) <= 160  # within one 10 ms mel frame
    n = min(samples.size, ref.size)
    assert np.corrcoef(samples[:n], ref[:n])[0, 1] > 0.999
    rel_rms = np.sqrt(np.mean((samples[:n] - ref[:n]) ** 2) / np.mean(ref[:n] ** 2))
    assert rel_rms < 0.03  # two MP3 decoders and two resamplers; measured 0.01 (mp3), 5e-3 (wav)
    # Bytes and path give the same samples (the Parquet path hands us bytes).
    np.testing.assert_array_equal(decode_audio(path.read_bytes()), samples)


def test_librispeech_flac_bytes_equal_soundfile_exactly(shared_data: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet")
    for cell, duration in zip(table.column("audio").to_pylist(), table.column("duration_s").to_pylist()):
        expected, rate = sf.read(io.BytesIO(cell["bytes"]), dtype="float32")
        assert rate == RATE
        got = decode_audio(cell["bytes"])
        np.testing.assert_array_equal(got, expected)
        assert audio_duration(got) == pytest.approx(duration, abs=1e-3)


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


def test_custom_sample_rate() -> None:
    got = decode_audio(wav_bytes(sine(44_100, 2.0), 44_100, "FLOAT"), sample_rate=8_000)
    assert got.size == 16_000
    with pytest.raises(ValueError, match="sample_rate=0"):
        decode_audio(wav_bytes(sine(44_100, 0.1), 44_100, "FLOAT"), sample_rate=0)


def test_audio_duration() -> None:
    assert audio_duration(np.zeros(24_000, dtype=np.float32)) == 1.5
    assert audio_duration(np.zeros(0, dtype=np.float32)) == 0.0
    assert audio_duration(np.zeros(8_000, dtype=np.float32), sample_rate=8_000) == 1.0


# --- errors: each names the problem ---


@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")])
def test_empty_bytes(empty: bytes) -> None:
    with pytest.raises(AudioDecodeError, match="empty audio: 0 bytes"):
        decode_audio(empty)


def test_not_audio_bytes_name_both_decoders() -> None:
    with pytest.raises(AudioDecodeError) as info:
        decode_audio(b"<html><body>404 Not Found</body></html>")
    message = str(info.value)
    assert "cannot be decoded" in message and "b'<html><b'" in message
    assert "soundfile (libsndfile" in message and "PyAV (FFmpeg) said" in message
    assert "re-encode" in message


def test_truncated_flac_is_rejected(shared_data: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet")
    flac = table.column("audio")[0].as_py()["bytes"]
    for cut in (len(flac) // 2, 100):
        with pytest.raises(AudioDecodeError, match="corrupt, truncated or not audio"):
            decode_audio(flac[:cut])


def test_truncated_mp3_is_rejected(shared_data: Path) -> None:
    mp3 = (shared_data / "longform" / "librivox-sonnets" / "p001.mp3").read_bytes()
    with pytest.raises(AudioDecodeError, match=r"truncated: its header declares 53\.\d\d s but only 26\.\d\d s"):
        decode_audio(mp3[: len(mp3) // 2])


@pytest.mark.parametrize(
    ("container_format", "codec", "expected"),
    [("ipod", "aac", "cannot be decoded"), ("webm", "libopus", r"truncated or corrupt: .* declares 3\.01 s")],
)
def test_truncated_pyav_formats_are_rejected(container_format: str, codec: str, expected: str) -> None:
    data = encode_with_pyav(container_format, codec, 48_000, seconds=3.0)
    with pytest.raises(AudioDecodeError, match=expected):
        decode_audio(data[: len(data) // 2])


def test_corrupt_payload_is_rejected() -> None:
    data = bytearray(encode_with_pyav("webm", "libopus", 48_000, seconds=3.0))
    data[len(data) // 3 :] = os.urandom(len(data) - len(data) // 3)
    expected = r"truncated or corrupt: its header declares 3\.01 s but FFmpeg decoded only 1\.\d+ s"
    with pytest.raises(AudioDecodeError, match=expected):
        decode_audio(bytes(data))


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


def test_missing_directory_empty_and_unreadable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AudioDecodeError, match="does not exist; check the path"):
        decode_audio(tmp_path / "missing.flac")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AudioDecodeError, match="does not exist .relative to the current directory"):
        decode_audio("missing.flac")
    with pytest.raises(AudioDecodeError, match="is a directory"):
        decode_audio(tmp_path)
    empty = tmp_path / "empty.wav"
    empty.touch()
    with pytest.raises(AudioDecodeError, match=r"is empty \(0 bytes\)"):
        decode_audio(str(empty))
    locked = tmp_path / "locked.wav"
    locked.write_bytes(wav_bytes(sine(RATE, 0.1), RATE, "PCM_16"))
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root reads anything
        pytest.skip("running as root: permissions do not stop reads")
    with pytest.raises(AudioDecodeError, match="cannot be read .*fix its permissions"):
        decode_audio(locked)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_rejected(bad: float) -> None:
    samples = np.array([0.1, bad, 0.2, 0.3], dtype=np.float32)
    with pytest.raises(AudioDecodeError, match="1 of 4 samples are NaN or Inf"):
        decode_audio(wav_bytes(samples, RATE, "FLOAT"))


def test_zero_duration_results() -> None:
    with pytest.raises(AudioDecodeError, match="decoded 0 samples"):
        decode_audio(wav_bytes(np.zeros((0, 1), np.float32), RATE, "PCM_16"))
    with pytest.raises(AudioDecodeError, match="shorter than one sample at 16000 Hz"):
        decode_audio(wav_bytes(np.zeros((1, 1), np.float32), 48_000, "PCM_16"))


def test_unsupported_input_type() -> None:
    with pytest.raises(AudioDecodeError, match="type ndarray cannot be decoded; pass encoded bytes or a file path"):
        decode_audio(np.zeros(10))  # type: ignore[arg-type]


def test_errors_survive_pickling() -> None:
    """Decoding runs in worker processes: the error must cross the process boundary intact."""
    with pytest.raises(AudioDecodeError) as info:
        decode_audio(b"\x00" * 64)
    clone = pickle.loads(pickle.dumps(info.value))
    assert isinstance(clone, AudioDecodeError) and isinstance(clone, ValueError)
    assert str(clone) == str(info.value)


def test_bytes_reach_libsndfile_as_a_file_and_leave_none_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-memory bytes are spilled to a temporary file (libsndfile then reads without calling back
    into Python); the file is gone afterwards whether the bytes decode or not, and with no
    writable temporary directory the bytes are still read, through Python."""
    from batchscribe.audio import decode

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(decode, "RAM_DIR", str(spill))
    opened: list[object] = []
    real = decode._read_soundfile
    monkeypatch.setattr(decode, "_read_soundfile", lambda source: opened.append(source) or real(source))
    buf = io.BytesIO()
    sf.write(buf, np.linspace(-0.5, 0.5, 16000, dtype=np.float32), 16000, format="FLAC")
    audio = decode_audio(buf.getvalue())
    assert audio.shape == (16000,) and np.allclose(audio, np.linspace(-0.5, 0.5, 16000), atol=1e-4)
    assert [Path(str(s)).parent for s in opened] == [spill]
    with pytest.raises(AudioDecodeError, match="cannot be decoded"):
        decode_audio(b"not audio at all" * 100)
    assert list(spill.iterdir()) == []
    monkeypatch.setattr(decode, "RAM_DIR", str(tmp_path / "missing"))
    opened.clear()
    assert np.array_equal(decode_audio(buf.getvalue()), audio)
    assert len(opened) == 1 and isinstance(opened[0], io.BytesIO)
