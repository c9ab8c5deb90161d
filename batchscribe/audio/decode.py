"""Encoded audio (bytes or a path) -> mono float32 samples at 16 kHz.

FLAC goes to dr_flac (the `miniaudio` package; without it, to libsndfile): one C call, GIL
released, straight into the output buffer, bit-for-bit equal to libsndfile's float32, and 1.5x the
input pipeline's throughput on LibriSpeech (H200 host, 8 threads: 17,900 vs 11,900 audio s/s).
soundfile (libsndfile: wav, flac, ogg vorbis, mp3, aiff, ...) is tried next because it is fast and
exact, and reads any FLAC dr_flac does not decode cleanly; PyAV (FFmpeg) reads the rest (ogg opus,
m4a/aac, webm, mp4, wma, ...).
Channels are averaged, integer formats scaled to [-1, 1], other rates resampled with soxr (HQ).

Pure functions: they run in decoder worker processes. Every failure is an `AudioDecodeError`
whose message names the problem and the fix; the caller turns it into an error record.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile as sf
import soxr

from batchscribe.constants import SAMPLE_RATE

AudioInput = bytes | bytearray | memoryview | str | os.PathLike
# n_samples -> a writable, C-contiguous [n_samples] float32 array for the samples (caller memory).
Allocate = Callable[[int], np.ndarray]
DecoderName = Literal["dr_flac", "soundfile", "pyav"]

# A decode that comes up this much short of the header's frame count is a truncated file. The
# slack absorbs MP3 length estimates (no Xing header), which may be off by a few frames.
_TRUNCATION_SLACK = 0.02  # fraction of the declared length
_TRUNCATION_MIN_S = 0.25  # seconds
# FFmpeg containers whose header states the duration; for others FFmpeg may only estimate it
# (e.g. ADTS AAC from the bitrate), which would make good files look truncated.
_EXACT_DURATION_FORMATS = frozenset({"matroska", "webm", "mov", "mp4"})
_FLAC_MAGIC = b"fLaC"
# miniaudio 1.70 (miniaudio.h 0.11.25) is the first release with these names; older ones: drflac_*.
_DR_FLAC_SYMBOLS = ("ma_dr_flac_open_memory", "ma_dr_flac_open_file", "ma_dr_flac_read_pcm_frames_f32",
                    "ma_dr_flac_close")
# Every FLAC frame takes at least ~10 bytes (frame header, CRC-8, a constant subframe, CRC-16) and
# holds at most the stream's max block size, so a header declaring more frames than this per byte
# is corrupt; such a file is left to libsndfile rather than sizing the caller's buffer from it.
_FLAC_MIN_FRAME_BYTES = 8
# libsndfile's frame count when the header does not state the length (SF_COUNT_MAX).
_SF_UNKNOWN_FRAMES = 2**63 - 1


class AudioDecodeError(ValueError):
    """Audio that cannot be turned into samples; the message names the problem and the fix."""


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # [n_samples] float32, mono, at sample_rate; caller memory with `allocate`
    sample_rate: int
    source_rate: int  # the file's own rate before resampling
    channels: int  # the file's channel count before averaging
    decoder: DecoderName


class _DecoderFailed(Exception):
    """One decoder could not read the input; `declared_frames` when the header was understood."""

    def __init__(self, message: str, declared_frames: int | None = None) -> None:
        super().__init__(message)
        self.declared_frames = declared_frames


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
    allocate = None if allocate is None else _allocate_once(allocate)
    if flac is not None and (decoded := _read_dr_flac(flac, label, sample_rate, allocate)) is not None:
        return decoded
    frames, rate, decoder = _decode_any(label, opener)  # frames: [n, channels] float32
    return _to_mono(label, frames, rate, decoder, sample_rate, allocate)


def _to_mono(
    label: str, frames: np.ndarray, rate: int, decoder: DecoderName, sample_rate: int,
    allocate: Allocate | None,
) -> DecodedAudio:
    """[n, channels] float32 at `rate` -> checked mono samples at `sample_rate`, in `allocate`'s array."""
    if frames.shape[0] == 0:
        raise AudioDecodeError(
            f"{label}: decoded 0 samples (the file is well formed but holds no audio); "
            "drop this item or fix its source"
        )
    finite = np.isfinite(frames)
    if not finite.all():
        bad = int(frames.size - np.count_nonzero(finite))
        raise AudioDecodeError(
            f"{label}: {bad} of {frames.size} samples are NaN or Inf (a float file with invalid "
            "values); re-export the source audio with valid samples"
        )
    channels = frames.shape[1]
    # Averaging before resampling is exact (both are linear) and resamples one channel, not all.
    mono = frames[:, 0] if channels == 1 else frames.mean(axis=1, dtype=np.float32)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ").astype(np.float32, copy=False)
    if not np.isfinite(mono).all():
        # Finite but huge float samples (a corrupt float file) overflow float32 when channels
        # are averaged or resampled; the model must never see NaN or Inf.
        peak = float(np.max(np.abs(frames)))
        raise AudioDecodeError(
            f"{label}: samples up to {peak:.3g} in magnitude overflow to NaN/Inf when mixed to mono "
            "or resampled (float audio should lie in [-1, 1]); re-export the source audio"
        )
    if mono.shape[0] == 0:
        raise AudioDecodeError(
            f"{label}: {frames.shape[0]} samples at {rate} Hz are shorter than one sample at "
            f"{sample_rate} Hz (zero duration); drop this item"
        )
    if allocate is not None:
        out = allocate(mono.shape[0])  # [n_samples] float32, caller memory
        np.copyto(out, mono)
        mono = out
    return DecodedAudio(mono, sample_rate, rate, channels, decoder)


def _allocate_once(allocate: Allocate) -> Allocate:
    """`allocate` with its arrays checked, asked at most once for any size it already gave.

    dr_flac sizes the caller's buffer from the FLAC header before decoding; when it then decodes
    short, the fallback decoder's samples (that length or less) reuse the buffer rather than
    taking a second one.
    """
    given: list[np.ndarray] = []  # the caller's array, once allocated

    def once(n_samples: int) -> np.ndarray:
        if given and given[0].shape[0] >= n_samples:
            return given[0] if given[0].shape[0] == n_samples else given[0][:n_samples]
        out = allocate(n_samples)
        if not (
            isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (n_samples,)
            and out.flags.c_contiguous and out.flags.writeable
        ):
            got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}"
            raise ValueError(
                f"allocate({n_samples}) returned {got.strip()}; it must return a writable, "
                f"C-contiguous float32 numpy array of shape ({n_samples},)"
            )
        given[:] = [out]
        return out

    return once


@functools.cache
def _dr_flac_api() -> tuple[Any, Any] | None:
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


def _read_dr_flac(
    source: bytes | memoryview | Path, label: str, sample_rate: int, allocate: Allocate | None
) -> DecodedAudio | None:
    """A FLAC decoded by dr_flac in one C call (GIL released), or None to leave it to libsndfile.

    None when miniaudio is unavailable, dr_flac cannot open the data, the header states no (0) or
    an implausible length, or fewer frames decode than it declares (truncated or corrupt): the
    soundfile -> PyAV chain then decodes it or raises its usual error.
    """
    api = _dr_flac_api()
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
        # Integer PCM scaled to [-1, 1): finite, and n > 0, so _to_mono's checks cannot fail.
        return DecodedAudio(frames, sample_rate, rate, 1, "dr_flac")
    return _to_mono(label, frames, rate, "dr_flac", sample_rate, allocate)


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
        frames, rate, declared = _read_soundfile_native(opener())
    except _DecoderFailed as exc:
        sf_failure = exc
    else:
        # NOTE: libsndfile trims a WAV data chunk that runs past the end of the file to what is
        # there, so its frame count cannot reveal a cut-off WAV; the RIFF header still can.
        declared = max(declared, _wav_header_frames(opener()) or 0)
        if _is_truncated(frames.shape[0], declared, rate):
            raise AudioDecodeError(
                f"{label} is truncated: its header declares {declared / rate:.2f} s but only "
                f"{frames.shape[0] / rate:.2f} s could be decoded; re-download or re-encode it"
            )
        return frames, rate, "soundfile"
    try:
        frames, rate, container_frames = _read_pyav(opener())
    except _DecoderFailed as exc:
        raise AudioDecodeError(
            f"{label} cannot be decoded: soundfile (libsndfile {sf.__libsndfile_version__}) said "
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


def _wav_header_frames(source: object) -> int | None:
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


# RAM-backed temporary storage where there is one (None: the system's temporary folder): encoded
# bytes on their way to libsndfile here, decoded audio on its way back from worker processes (pool).
RAM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _read_soundfile_native(source: object) -> tuple[np.ndarray, int, int]:
    """`_read_soundfile`, with in-memory bytes first written to a file in RAM-backed storage.

    Given a file-like object, libsndfile calls back into Python for every read, holding the GIL
    that the engine's main thread needs to launch GPU work. Read from a path, it never enters
    Python. Measured on 100 LibriSpeech FLACs (docs/GPU_NOTES.md): decoding 1.5x faster, and a
    small torch op beside three decoding threads 3x faster (7.6 vs 22.6 us).
    """
    if not isinstance(source, io.BytesIO):
        return _read_soundfile(source)
    try:
        fd, path = tempfile.mkstemp(prefix="batchscribe-", suffix=".audio", dir=RAM_DIR)
    except OSError:
        return _read_soundfile(source)  # no writable temporary directory: read through Python
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(source.getbuffer())
        return _read_soundfile(path)
    except OSError:
        return _read_soundfile(source)  # the temporary storage is full
    finally:
        os.unlink(path)


def _read_soundfile(source: object) -> tuple[np.ndarray, int, int]:
    """-> ([n, channels] float32, rate, frames the header declares); _DecoderFailed on errors."""
    try:
        handle = sf.SoundFile(source)
    except Exception as exc:  # libsndfile raises LibsndfileError/RuntimeError/TypeError by format
        raise _DecoderFailed(_short(exc)) from exc
    with handle:
        if (handle.format, handle.subtype) == ("OGG", "OPUS"):
            # NOTE: libsndfile 1.2.2 ignores Opus pre-skip, so its output starts 312 samples
            # (6.5 ms) late; FFmpeg trims it as RFC 7845 says.
            raise _DecoderFailed("Ogg Opus is left to FFmpeg (libsndfile ignores the Opus pre-skip)")
        declared, rate = handle.frames, handle.samplerate
        if declared == _SF_UNKNOWN_FRAMES:
            # NOTE: soundfile sizes its read from the header and seeks after it, so a stream of
            # unknown length (a FLAC whose encoder could not seek back to fill in STREAMINFO)
            # fails to read; FFmpeg reads it, and no declared length may flag it as truncated.
            raise _DecoderFailed("the header does not state the length; left to FFmpeg")
        try:
            frames = handle.read(dtype="float32", always_2d=True)  # ints scaled to [-1, 1)
        except Exception as exc:
            raise _DecoderFailed(_short(exc), declared_frames=declared) from exc
    return frames, rate, declared


def _read_pyav(source: object) -> tuple[np.ndarray, int, int | None]:
    """-> ([n, channels] float32, rate, frames the container declares or None), via FFmpeg."""
    import av  # lazily: only files libsndfile cannot read need FFmpeg

    chunks: list[np.ndarray] = []  # each [channels, n] float32
    try:
        with av.open(source, metadata_errors="ignore") as container:
            if not container.streams.audio:
                kinds = sorted({s.type for s in container.streams}) or ["none"]
                name = container.format.name
                raise _DecoderFailed(f"no audio stream in the {name} container (streams: {kinds})")
            stream = container.streams.audio[0]
            resampler = None
            for frame in container.decode(stream):
                if resampler is None:
                    # Planar float at the stream's own rate and layout: a format conversion only
                    # (ints scaled to [-1, 1]); rate conversion is left to soxr below.
                    resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=frame.sample_rate)
                    rate = frame.sample_rate
                chunks.extend(f.to_ndarray() for f in resampler.resample(frame))
            if resampler is not None:
                chunks.extend(f.to_ndarray() for f in resampler.resample(None))
            declared_s = _declared_seconds(container, stream)
    except _DecoderFailed:
        raise
    except Exception as exc:  # FFmpegError subclasses, plus ValueError/OSError from PyAV itself
        raise _DecoderFailed(_short(exc)) from exc
    if resampler is None:
        raise _DecoderFailed("the audio stream holds no decodable frames")
    frames = np.concatenate(chunks, axis=1).T if chunks else np.zeros((0, 1), np.float32)
    declared = None if declared_s is None else round(declared_s * rate)
    return np.ascontiguousarray(frames, dtype=np.float32), rate, declared


def _declared_seconds(container: Any, stream: Any) -> float | None:
    """The audio stream's duration as its header states it; None where FFmpeg would only guess."""
    if not set(container.format.name.split(",")) & _EXACT_DURATION_FORMATS:
        return None
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    # Matroska/WebM state one duration for the whole file: it is the audio's only without video.
    if len(container.streams) == 1 and container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE units
    return None


def _short(exc: BaseException) -> str:
    """An exception as one line without the opaque object reprs soundfile puts in its messages."""
    text = str(exc).replace("\n", " ").strip() or type(exc).__name__
    if text.startswith("Error opening "):  # "Error opening <_io.BytesIO object at 0x..>: <reason>"
        text = text.split(">: ", 1)[-1] if ">: " in text else text.split(": ", 1)[-1]
    return text


__all__ = ["RAM_DIR", "AudioDecodeError", "DecodedAudio", "audio_duration", "decode_audio", "read_audio"]
