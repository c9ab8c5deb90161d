"""FLAC through dr_flac (the optional `miniaudio` package): one C call, GIL released, straight into
the output buffer, bit-for-bit equal to libsndfile's float32 (faster: docs/GPU_NOTES.md).

Anything dr_flac does not decode cleanly is left to the soundfile -> PyAV chain (None).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from batchscribe.audio.decode.base import Allocate, DecodedAudio
from batchscribe.audio.decode.mono import to_mono

# miniaudio 1.70 (miniaudio.h 0.11.25) is the first release with these names; older ones: drflac_*.
_DR_FLAC_SYMBOLS = ("ma_dr_flac_open_memory", "ma_dr_flac_open_file", "ma_dr_flac_read_pcm_frames_f32",
                    "ma_dr_flac_close")
# Every FLAC frame takes at least ~10 bytes (frame header, CRC-8, a constant subframe, CRC-16) and
# holds at most the stream's max block size, so a header declaring more frames than this per byte
# is corrupt; such a file is left to libsndfile rather than sizing the caller's buffer from it.
_FLAC_MIN_FRAME_BYTES = 8


@functools.cache
def dr_flac_api() -> tuple[Any, Any] | None:
    """miniaudio's cffi (ffi, lib), or None when miniaudio is missing or predates ma_dr_flac_*.

    Imported on first use, once per process: miniaudio is optional, and FLAC then goes to libsndfile.
    """
    try:
        from miniaudio import ffi, lib
    except ImportError:
        return None
    if not all(hasattr(lib, name) for name in _DR_FLAC_SYMBOLS):
        return None
    return ffi, lib


def read_dr_flac(
    source: bytes | memoryview | Path, label: str, sample_rate: int, allocate: Allocate | None
) -> DecodedAudio | None:
    """A FLAC decoded by dr_flac in one C call (GIL released), or None to leave it to libsndfile.

    None when miniaudio is unavailable, dr_flac cannot open the data, the header states no (0) or
    an implausible length, or fewer frames decode than it declares (truncated or corrupt): the
    soundfile -> PyAV chain then decodes it or raises its usual error.
    """
    api = dr_flac_api()
    if api is None:
        return None
    ffi, lib = api
    if isinstance(source, Path):
        try:
            n_bytes = source.stat().st_size
        except OSError:
            return None  # gone since it was checked: libsndfile names the problem
        handle = lib.ma_dr_flac_open_file(os.fsencode(source), ffi.NULL)  # read by C stdio, not Python
    else:
        # NOTE: dr_flac reads this memory in place until closed; `source` outlives it.
        memory = ffi.from_buffer(source)
        n_bytes, handle = len(memory), lib.ma_dr_flac_open_memory(memory, len(memory), ffi.NULL)
    if handle == ffi.NULL:
        return None
    try:
        n, channels, rate = handle.totalPCMFrameCount, handle.channels, handle.sampleRate
        if not 0 < n <= (n_bytes // _FLAC_MIN_FRAME_BYTES + 1) * handle.maxBlockSizeInPCMFrames:
            return None
        # Mono at the target rate is already the result: decode into the caller's array directly.
        direct = channels == 1 and rate == sample_rate
        try:
            if direct:
                frames = np.empty(n, np.float32) if allocate is None else allocate(n)  # [n] float32
            else:
                frames = np.empty((n, channels), np.float32)  # [n, channels] float32
        except MemoryError:  # a huge declared length that still passed the plausibility bound
            return None
        out = ffi.from_buffer("float[]", frames, require_writable=True)
        decoded = lib.ma_dr_flac_read_pcm_frames_f32(handle, n, out)  # interleaved, ints * 2^-(bits-1)
    finally:
        lib.ma_dr_flac_close(handle)
    if decoded != n:
        return None
    if direct:
        # Integer PCM scaled to [-1, 1): finite, and n > 0, so to_mono's checks cannot fail.
        return DecodedAudio(frames, sample_rate, rate, 1, "dr_flac")
    return to_mono(label, frames, rate, "dr_flac", sample_rate, allocate)
