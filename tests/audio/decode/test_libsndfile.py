"""soundfile (libsndfile) against independent references: PyAV/FFmpeg + swresample, soundfile itself."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.decode import AudioDecodeError, decode_audio, read_audio
from tests.audio.decode.signals import RATE

# A core dependency, but the GPU machine's image lacks it: its modules skip there rather than fail to collect.
av = pytest.importorskip("av")

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
    assert rel_rms < 0.03  # two MP3 decoders and two resamplers
    # Bytes and path give the same samples (the Parquet path hands us bytes).
    np.testing.assert_array_equal(decode_audio(path.read_bytes()), samples)


def test_bytes_reach_libsndfile_as_a_file_and_leave_none_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-memory bytes are spilled to a temporary file (libsndfile then reads without calling back
    into Python); the file is gone afterwards whether the bytes decode or not, and with no
    writable temporary directory the bytes are still read, through Python."""
    from batchscribe.audio.decode import libsndfile

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(libsndfile, "RAM_DIR", str(spill))
    opened: list[object] = []
    real = libsndfile.read_soundfile
    monkeypatch.setattr(libsndfile, "read_soundfile", lambda source: opened.append(source) or real(source))
    buf = io.BytesIO()  # WAV: FLAC goes to dr_flac first (below)
    sf.write(buf, np.linspace(-0.5, 0.5, 16000, dtype=np.float32), 16000, format="WAV", subtype="PCM_16")
    audio = decode_audio(buf.getvalue())
    assert audio.shape == (16000,) and np.allclose(audio, np.linspace(-0.5, 0.5, 16000), atol=1e-4)
    assert [Path(str(s)).parent for s in opened] == [spill]
    with pytest.raises(AudioDecodeError, match="cannot be decoded"):
        decode_audio(b"not audio at all" * 100)
    assert list(spill.iterdir()) == []
    monkeypatch.setattr(libsndfile, "RAM_DIR", str(tmp_path / "missing"))
    opened.clear()
    assert np.array_equal(decode_audio(buf.getvalue()), audio)
    assert len(opened) == 1 and isinstance(opened[0], io.BytesIO)
