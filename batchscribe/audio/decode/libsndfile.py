"""soundfile (libsndfile: wav, flac, ogg vorbis, mp3, aiff, ...): fast and exact, tried first."""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import soundfile as sf

from batchscribe.audio.decode.base import DecoderFailed, short_message
from batchscribe.audio.ram_dir import RAM_DIR

# libsndfile's frame count when the header does not state the length (SF_COUNT_MAX).
_SF_UNKNOWN_FRAMES = 2**63 - 1
LIBSNDFILE_VERSION = sf.__libsndfile_version__


def read_soundfile_native(source: object) -> tuple[np.ndarray, int, int]:
    """`read_soundfile`, with in-memory bytes first written to a file in RAM-backed storage.

    Given a file-like object, libsndfile calls back into Python for every read, holding the GIL
    that the engine's main thread needs to launch GPU work. Read from a path, it never enters
    Python (measured faster on both counts: docs/GPU_NOTES.md).
    """
    if not isinstance(source, io.BytesIO):
        return read_soundfile(source)
    try:
        fd, path = tempfile.mkstemp(prefix="batchscribe-", suffix=".audio", dir=RAM_DIR)
    except OSError:
        return read_soundfile(source)  # no writable temporary directory: read through Python
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(source.getbuffer())
        return read_soundfile(path)
    except OSError:
        return read_soundfile(source)  # the temporary storage is full
    finally:
        os.unlink(path)


# What libsndfile says of a file it cannot recognise, though the file exists.
_MISLEADING = "File does not exist or is not a regular file"


def read_soundfile(source: object) -> tuple[np.ndarray, int, int]:
    """-> ([n, channels] float32, rate, frames the header declares); DecoderFailed on errors."""
    try:
        handle = sf.SoundFile(source)
    except Exception as exc:  # libsndfile raises LibsndfileError/RuntimeError/TypeError by format
        message = short_message(exc)
        if _MISLEADING in message and (not isinstance(source, (str, os.PathLike)) or os.path.isfile(source)):
            # NOTE: libsndfile says this of any data it cannot recognise (text named .wav, an MP3
            # it cannot sync to); the caller checked that the file exists.
            message = "the data is in no format it recognises"
        raise DecoderFailed(message) from exc
    with handle:
        if (handle.format, handle.subtype) == ("OGG", "OPUS"):
            # NOTE: libsndfile 1.2.2 ignores the Opus pre-skip, so its output starts late; FFmpeg
            # trims it as RFC 7845 says.
            raise DecoderFailed("Ogg Opus is left to FFmpeg (libsndfile ignores the Opus pre-skip)")
        declared, rate = handle.frames, handle.samplerate
        if declared == _SF_UNKNOWN_FRAMES:
            # NOTE: soundfile sizes its read from the header and seeks after it, so a stream of
            # unknown length (a FLAC whose encoder could not seek back to fill in STREAMINFO)
            # fails to read; FFmpeg reads it, and no declared length may flag it as truncated.
            raise DecoderFailed("the header does not state the length; left to FFmpeg")
        try:
            frames = handle.read(dtype="float32", always_2d=True)  # ints scaled to [-1, 1)
        except Exception as exc:
            raise DecoderFailed(short_message(exc), declared_frames=declared) from exc
    return frames, rate, declared


def wav_header_frames(source: object) -> int | None:
    """Frames the `data` chunk of a RIFF/WAVE header declares; None if not WAVE or size unknown."""
    try:
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                head = f.read(1 << 16)
        else:
            head = source.read(1 << 16)  # type: ignore[attr-defined]
    except OSError:
        return None
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None  # RF64 / streamed WAVs state no usable 32-bit size
    pos, block_align = 12, 0
    while pos + 8 <= len(head):
        chunk, size = head[pos:pos + 4], int.from_bytes(head[pos + 4:pos + 8], "little")
        if chunk == b"fmt " and pos + 22 <= len(head):
            block_align = int.from_bytes(head[pos + 20:pos + 22], "little")
        elif chunk == b"data":
            # 0 and 0xFFFFFFFF are what writers that cannot seek back leave: unknown length.
            if block_align == 0 or size in (0, 0xFFFFFFFF):
                return None
            return size // block_align
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    return None
