"""PyAV (FFmpeg) for what libsndfile cannot read: ogg opus, m4a/aac, webm, mp4, wma, ..."""

from __future__ import annotations

from typing import Any

import numpy as np

from batchscribe.audio.decode.base import DecoderFailed, short_message

# FFmpeg containers whose header states the duration; for others FFmpeg may only estimate it
# (e.g. ADTS AAC from the bitrate), which would make good files look truncated.
_EXACT_DURATION_FORMATS = frozenset({"matroska", "webm", "mov", "mp4"})


def read_pyav(source: object) -> tuple[np.ndarray, int, int | None]:
    """-> ([n, channels] float32, rate, frames the container declares or None), via FFmpeg."""
    import av  # lazily: only files libsndfile cannot read need FFmpeg

    chunks: list[np.ndarray] = []  # each [n, channels] float32
    try:
        with av.open(source, metadata_errors="ignore") as container:
            if not container.streams.audio:
                kinds = sorted({s.type for s in container.streams}) or ["none"]
                name = container.format.name
                raise DecoderFailed(f"no audio stream in the {name} container (streams: {kinds})")
            stream = container.streams.audio[0]
            resampler = None
            for frame in container.decode(stream):
                if resampler is None:
                    # Packed float at the stream's own rate and layout: a format conversion only
                    # (ints scaled to [-1, 1]); rate conversion is left to soxr. Packed, not planar:
                    # one plane whatever the channel count (PyAV reads a frame of more than 8
                    # planes out of bounds, and a corrupt header can declare 59 channels).
                    resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=frame.sample_rate)
                    rate, channels = frame.sample_rate, len(frame.layout.channels)
                chunks.extend(_samples(f, channels) for f in resampler.resample(frame))
            if resampler is not None:
                chunks.extend(_samples(f, channels) for f in resampler.resample(None))
            declared_s = _declared_seconds(container, stream)
    except DecoderFailed:
        raise
    except Exception as exc:  # FFmpegError subclasses, plus ValueError/OSError from PyAV itself
        raise DecoderFailed(short_message(exc)) from exc
    if resampler is None:
        raise DecoderFailed("the audio stream holds no decodable frames")
    frames = np.concatenate(chunks, axis=0) if chunks else np.zeros((0, 1), np.float32)
    declared = None if declared_s is None else round(declared_s * rate)
    return np.ascontiguousarray(frames, dtype=np.float32), rate, declared


def _samples(frame: Any, channels: int) -> np.ndarray:
    """A packed float frame -> [n, channels] float32 (PyAV gives its one plane as [1, n * channels])."""
    return frame.to_ndarray().reshape(-1, channels)


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
