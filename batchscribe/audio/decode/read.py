"""Encoded audio (bytes or a path) -> mono float32 samples: input checks and the decoder chain.

FLAC goes to dr_flac first; then soundfile, then PyAV. Each result is checked against the length
its header declares, so a truncated file is an error, not a short transcript.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from batchscribe.audio.decode.base import (
    Allocate, AudioDecodeError, AudioInput, DecodedAudio, DecoderFailed, DecoderName,
)
from batchscribe.audio.decode.dr_flac import read_dr_flac
from batchscribe.audio.decode.libsndfile import LIBSNDFILE_VERSION, read_soundfile_native, wav_header_frames
from batchscribe.audio.decode.mono import allocate_once, to_mono
from batchscribe.audio.decode.pyav import read_pyav
from batchscribe.constants import SAMPLE_RATE

# A decode that comes up this much short of the header's frame count is a truncated file. The
# slack absorbs MP3 length estimates (no Xing header), which may be off by a few frames.
_TRUNCATION_SLACK = 0.02  # fraction of the declared length
_TRUNCATION_MIN_S = 0.25  # seconds
_FLAC_MAGIC = b"fLaC"


def decode_audio(
    data: AudioInput, *, sample_rate: int = SAMPLE_RATE, allocate: Allocate | None = None
) -> np.ndarray:
    """Encoded bytes or a file path -> [n_samples] float32 mono at `sample_rate` (default 16 kHz).

    With `allocate`, the samples land in caller memory and the result may be a view of it: see
    `read_audio`.
    """
    return read_audio(data, sample_rate=sample_rate, allocate=allocate).samples


def audio_duration(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Seconds of audio in a 1-D sample array."""
    return samples.shape[-1] / sample_rate


def read_audio(
    data: AudioInput, *, sample_rate: int = SAMPLE_RATE, allocate: Allocate | None = None
) -> DecodedAudio:
    """Like `decode_audio`, also reporting the source rate, channel count and which decoder read it.

    `allocate(n_samples)` (optional) returns a writable, C-contiguous [n_samples] float32 array,
    e.g. a numpy view of pinned host memory, and the returned samples are then caller memory: that
    array itself. A mono FLAC at `sample_rate` is decoded straight into it, sized from the header;
    anything else is copied into it once, at the end. It is called once per decode, except for a
    corrupt mono FLAC that dr_flac decodes short: the fallback decoder's samples then reuse the
    array, or a leading slice of it when fewer, or (more samples) ask for a second array. On
    AudioDecodeError an array may have been allocated and left unused.
    """
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise ValueError(f"sample_rate={sample_rate!r} must be a positive integer number of Hz")
    label, opener, flac = _open_input(data)
    allocate = None if allocate is None else allocate_once(allocate)
    if flac is not None and (decoded := read_dr_flac(flac, label, sample_rate, allocate)) is not None:
        return decoded
    frames, rate, decoder = _decode_any(label, opener)  # frames: [n, channels] float32
    return to_mono(label, frames, rate, decoder, sample_rate, allocate)


def _open_input(data: AudioInput) -> tuple[str, Callable[[], object], bytes | memoryview | Path | None]:
    """Check the input -> (label for messages, zero-arg callable giving a fresh source, the bytes
    or path again when they hold FLAC, for dr_flac)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        # A flat byte view (Parquet's cells are views of Arrow's buffer) is read in place.
        flat = isinstance(data, memoryview) and data.format == "B" and data.ndim == 1 and data.c_contiguous
        raw: bytes | memoryview = data if isinstance(data, bytes) or flat else bytes(data)
        if not len(raw):
            raise AudioDecodeError(
                "empty audio: 0 bytes; the item has no audio data (check the audio column, "
                "or give a file path instead)"
            )
        head = bytes(raw[:8])
        flac = raw if head.startswith(_FLAC_MAGIC) else None
        return f"{len(raw)} bytes of audio (starting {head!r})", lambda: io.BytesIO(raw), flac
    if isinstance(data, (str, os.PathLike)):
        path = Path(os.fspath(data)).expanduser()
        label = f"audio file {str(path)!r}"
        if not path.exists():
            where = "" if path.is_absolute() else f" (relative to the current directory {os.getcwd()})"
            raise AudioDecodeError(f"{label} does not exist{where}; check the path")
        if path.is_dir():
            raise AudioDecodeError(f"{label} is a directory, not a file; give an audio file inside it")
        if not path.is_file():
            # NOTE: reading a FIFO would block this worker (and the run) forever.
            raise AudioDecodeError(f"{label} is not a regular file (a pipe, socket or device); "
                                   "give an audio file, or copy the stream to one first")
        try:
            with open(path, "rb") as handle:
                head = handle.read(len(_FLAC_MAGIC))
        except OSError as exc:
            raise AudioDecodeError(f"{label} cannot be read ({exc.strerror}); fix its permissions") from exc
        if not head:
            raise AudioDecodeError(f"{label} is empty (0 bytes); re-create or drop it")
        return label, lambda: str(path), path if head == _FLAC_MAGIC else None
    raise AudioDecodeError(
        f"audio of type {type(data).__name__} cannot be decoded; pass encoded bytes or a file path"
    )


def _decode_any(label: str, opener: Callable[[], object]) -> tuple[np.ndarray, int, DecoderName]:
    """Try soundfile, then PyAV; raise AudioDecodeError quoting both when neither reads it."""
    try:
        frames, rate, declared = read_soundfile_native(opener())
    except DecoderFailed as exc:
        sf_failure = exc
    else:
        # NOTE: libsndfile trims a WAV data chunk that runs past the end of the file to what is
        # there, so its frame count cannot reveal a cut-off WAV; the RIFF header still can.
        declared = max(declared, wav_header_frames(opener()) or 0)
        if _is_truncated(frames.shape[0], declared, rate):
            raise AudioDecodeError(
                f"{label} is truncated: its header declares {declared / rate:.2f} s but only "
                f"{frames.shape[0] / rate:.2f} s could be decoded; re-download or re-encode it"
            )
        return frames, rate, "soundfile"
    try:
        frames, rate, container_frames = read_pyav(opener())
    except DecoderFailed as exc:
        raise AudioDecodeError(
            f"{label} cannot be decoded: soundfile (libsndfile {LIBSNDFILE_VERSION}) said "
            f"{str(sf_failure)!r}; PyAV (FFmpeg) said {str(exc)!r}. The data is corrupt, truncated "
            "or not audio: re-encode it (e.g. ffmpeg -i IN -ac 1 -ar 16000 OUT.flac) or drop it"
        ) from None
    # FFmpeg skips over damaged data and stops early without an error: compare with the header
    # (libsndfile's, when it understood the header but failed mid-stream, else the container's).
    declared = sf_failure.declared_frames if sf_failure.declared_frames is not None else container_frames
    if declared is not None and _is_truncated(frames.shape[0], declared, rate):
        raise AudioDecodeError(
            f"{label} is truncated or corrupt: its header declares {declared / rate:.2f} s but "
            f"FFmpeg decoded only {frames.shape[0] / rate:.2f} s (libsndfile said "
            f"{str(sf_failure)!r}); re-download or re-encode it"
        )
    return frames, rate, "pyav"


def _is_truncated(decoded: int, declared: int, rate: int) -> bool:
    return declared - decoded > max(_TRUNCATION_SLACK * declared, _TRUNCATION_MIN_S * rate)
