"""Decoding end to end (input checks, the decoder chain, truncation) against soundfile and the files' headers."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.decode import AudioDecodeError, audio_duration, decode_audio
from batchscribe.audio.decode.libsndfile import LIBSNDFILE_VERSION
from tests.audio.decode.signals import RATE, encode_with_pyav, sine, wav_bytes

def test_librispeech_flac_bytes_equal_soundfile_exactly(shared_data: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet")
    for cell, duration in zip(table.column("audio").to_pylist(), table.column("duration_s").to_pylist()):
        expected, rate = sf.read(io.BytesIO(cell["bytes"]), dtype="float32")
        assert rate == RATE
        got = decode_audio(cell["bytes"])
        np.testing.assert_array_equal(got, expected)
        assert audio_duration(got) == pytest.approx(duration, abs=1e-3)


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


@pytest.mark.parametrize("name", ["page.mp3", "page.wav", "page"])
def test_a_file_that_is_not_audio_is_not_said_to_be_missing(tmp_path: Path, name: str) -> None:
    """libsndfile answers 'File does not exist or is not a regular file' for a file whose data it
    cannot recognise; quoted as it was, the error said an existing file was missing."""
    path = tmp_path / name
    path.write_bytes(b"<html><body>404 Not Found</body></html>")
    with pytest.raises(AudioDecodeError) as info:
        decode_audio(str(path))
    message = str(info.value)
    said = "'the data is in no format it recognises'" if name.endswith(".mp3") else "'Format not recognised.'"
    assert "does not exist" not in message and f"soundfile (libsndfile {LIBSNDFILE_VERSION}) said {said}" in message
    assert f"audio file {str(path)!r} cannot be decoded" in message and "re-encode" in message


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
