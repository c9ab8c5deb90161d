"""Audio decoding against independent references: PyAV/FFmpeg + swresample, soundfile, analytic signals."""

from __future__ import annotations

import io
import os
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import soxr

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
    buf = io.BytesIO()  # WAV: FLAC goes to dr_flac first (below)
    sf.write(buf, np.linspace(-0.5, 0.5, 16000, dtype=np.float32), 16000, format="WAV", subtype="PCM_16")
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


# --- FLAC through dr_flac (miniaudio), and the output-buffer hook ---


@pytest.fixture
def dr_flac() -> Iterator[None]:
    """miniaudio with the ma_dr_flac_* API, and a fresh import probe before and after the test."""
    pytest.importorskip("miniaudio", minversion="1.70")
    from batchscribe.audio import decode

    decode._dr_flac_api.cache_clear()
    yield
    decode._dr_flac_api.cache_clear()


@pytest.fixture
def no_miniaudio(monkeypatch: pytest.MonkeyPatch, dr_flac: None) -> None:
    """`import miniaudio` raises ImportError, as when it is not installed."""
    monkeypatch.setitem(sys.modules, "miniaudio", None)


def flac_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="FLAC", subtype=subtype)
    return buf.getvalue()


def noisy_tones(rate: int, channels: int, seconds: float = 1.3) -> np.ndarray:
    """[frames, channels] float32: a different tone per channel plus noise, so every bit varies."""
    rng = np.random.default_rng(rate + channels)
    tones = [sine(rate, seconds, freq=220.0 * (c + 1), amp=0.4) for c in range(channels)]
    noise = 0.2 * rng.standard_normal((tones[0].size, channels))
    return np.clip(np.stack(tones, axis=1) + noise, -1.0, 1.0).astype(np.float32)


def soundfile_reference(data: bytes) -> np.ndarray:
    """libsndfile's float32 samples, channels averaged in float32, soxr HQ to 16 kHz."""
    frames, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0]
    if rate != RATE:
        mono = soxr.resample(np.ascontiguousarray(mono), rate, RATE, quality="HQ").astype(np.float32)
    return mono


def unknown_length(flac: bytes) -> bytes:
    """The FLAC with STREAMINFO's 36-bit total-samples field zeroed ("unknown", as streaming encoders leave it)."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO, at bytes 8..41
    data[21] &= 0xF0  # the low nibble of byte 21 and bytes 22..25 hold the total
    data[22:26] = bytes(4)
    return bytes(data)


def failure_message(data: bytes) -> str:
    with pytest.raises(AudioDecodeError) as info:
        decode_audio(data)
    return str(info.value)


def test_librispeech_flac_dr_flac_equals_libsndfile_exactly(shared_data: Path, dr_flac: None) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet")
    cells = table.column("audio").to_pylist()
    assert len(cells) == 100
    for cell in cells:
        expected, rate = sf.read(io.BytesIO(cell["bytes"]), dtype="float32")
        got = read_audio(cell["bytes"])
        assert (got.decoder, got.source_rate, got.channels, rate) == ("dr_flac", RATE, 1, RATE)
        np.testing.assert_array_equal(got.samples, expected)


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_S8"])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("rate", [RATE, 44_100])
def test_generated_flac_dr_flac_equals_soundfile_path(
    tmp_path: Path, dr_flac: None, subtype: str, channels: int, rate: int
) -> None:
    data = flac_bytes(noisy_tones(rate, channels), rate, subtype)
    expected = soundfile_reference(data)
    path = tmp_path / "x.flac"
    path.write_bytes(data)
    for source in (data, bytearray(data), memoryview(data), path, str(path)):
        got = read_audio(source)
        assert (got.decoder, got.source_rate, got.channels) == ("dr_flac", rate, channels)
        assert got.samples.dtype == np.float32 and got.samples.flags.c_contiguous
        np.testing.assert_array_equal(got.samples, expected)


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_truncated_flac_raises_the_soundfile_paths_error(
    monkeypatch: pytest.MonkeyPatch, dr_flac: None, cut: float
) -> None:
    """dr_flac decodes short, so the file goes on to libsndfile and FFmpeg: the same message as without dr_flac."""
    from batchscribe.audio import decode

    data = flac_bytes(noisy_tones(RATE, 1, seconds=3.0), RATE)
    data = data[: int(len(data) * cut)]
    with_dr_flac = failure_message(data)
    monkeypatch.setitem(sys.modules, "miniaudio", None)  # as if not installed
    decode._dr_flac_api.cache_clear()
    assert failure_message(data) == with_dr_flac
    assert "cannot be decoded" in with_dr_flac and "flac decoder lost sync" in with_dr_flac


def test_corrupt_flac_frame_falls_back_to_ffmpeg(dr_flac: None) -> None:
    """A bit flip mid-stream fails dr_flac's frame CRC: FFmpeg decodes it, as it did without dr_flac."""
    clean = flac_bytes(noisy_tones(RATE, 1, seconds=3.0), RATE)
    data = bytearray(clean)
    data[len(data) // 2] ^= 0xFF
    got = read_audio(bytes(data))
    assert (got.decoder, got.samples.size) == ("pyav", 3 * RATE)
    expected = soundfile_reference(clean)
    damaged = got.samples != expected
    assert 0 < damaged.sum() < RATE // 2  # one block (<= 4096 frames) concealed, the rest exact


@pytest.mark.parametrize("channels", [1, 2])
def test_flac_of_unknown_length_decodes_through_the_fallback(dr_flac: None, channels: int) -> None:
    from miniaudio import ffi, lib

    clean = flac_bytes(noisy_tones(RATE, channels), RATE, "PCM_24")
    data = unknown_length(clean)
    handle = lib.ma_dr_flac_open_memory(data, len(data), ffi.NULL)
    assert handle != ffi.NULL and handle.totalPCMFrameCount == 0
    lib.ma_dr_flac_close(handle)
    got = read_audio(data)
    assert (got.decoder, got.channels) == ("pyav", channels)  # libsndfile cannot size the read either
    np.testing.assert_array_equal(got.samples, soundfile_reference(clean))


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


def test_flac_without_miniaudio_goes_to_soundfile(no_miniaudio: None) -> None:
    data = flac_bytes(noisy_tones(44_100, 2), 44_100)
    got = read_audio(data)
    assert (got.decoder, got.channels, got.source_rate) == ("soundfile", 2, 44_100)
    np.testing.assert_array_equal(got.samples, soundfile_reference(data))
    allocated: list[np.ndarray] = []
    samples = decode_audio(data, allocate=lambda n: allocated.append(np.empty(n, np.float32)) or allocated[-1])
    assert len(allocated) == 1 and samples is allocated[0]
    np.testing.assert_array_equal(samples, got.samples)


def test_flac_with_old_miniaudio_goes_to_soundfile(monkeypatch: pytest.MonkeyPatch, dr_flac: None) -> None:
    """miniaudio < 1.70 names the API drflac_*: it is not used."""
    old = types.SimpleNamespace(ffi=object(), lib=types.SimpleNamespace(drflac_open_memory=None))
    monkeypatch.setitem(sys.modules, "miniaudio", old)
    data = flac_bytes(noisy_tones(RATE, 1), RATE)
    got = read_audio(data)
    assert got.decoder == "soundfile"
    np.testing.assert_array_equal(got.samples, soundfile_reference(data))


def test_flac_declaring_an_implausible_length_is_not_sized_from_its_header(dr_flac: None) -> None:
    """A corrupt header claiming ~2^36 frames in a few KB: allocate is never asked for that many."""
    data = bytearray(flac_bytes(noisy_tones(RATE, 1, seconds=0.2), RATE))
    data[21] |= 0x0F
    data[22:26] = b"\xff" * 4
    calls: list[int] = []
    try:
        decode_audio(bytes(data), allocate=lambda n: calls.append(n) or np.empty(n, np.float32))
    except AudioDecodeError:
        pass
    assert all(n < 10 * RATE for n in calls)
