"""FLAC through dr_flac (miniaudio) against libsndfile's samples, and its fallbacks to the chain."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from batchscribe.audio.decode import AudioDecodeError, decode_audio, read_audio
from tests.audio.decode.signals import RATE, flac_bytes, noisy_tones, soundfile_reference

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
    from batchscribe.audio.decode.dr_flac import dr_flac_api

    data = flac_bytes(noisy_tones(RATE, 1, seconds=3.0), RATE)
    data = data[: int(len(data) * cut)]
    with_dr_flac = failure_message(data)
    monkeypatch.setitem(sys.modules, "miniaudio", None)  # as if not installed
    dr_flac_api.cache_clear()
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
