"""Decoded frames -> checked mono samples at the target rate, in caller memory when asked."""

from __future__ import annotations

import numpy as np
import soxr

from batchscribe.audio.decode.base import Allocate, AudioDecodeError, DecodedAudio, DecoderName, count_nonfinite


def to_mono(
    label: str, frames: np.ndarray, rate: int, decoder: DecoderName, sample_rate: int,
    allocate: Allocate | None,
) -> DecodedAudio:
    """[n, channels] float32 at `rate` -> checked mono samples at `sample_rate`, in `allocate`'s array."""
    if frames.shape[0] == 0:
        raise AudioDecodeError(
            f"{label}: decoded 0 samples (the file is well formed but holds no audio); "
            "drop this item or fix its source"
        )
    bad = count_nonfinite(frames)
    if bad:
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
    if (channels != 1 or rate != sample_rate) and count_nonfinite(mono):
        # Finite but huge float samples (a corrupt float file) overflow float32 when channels
        # are averaged or resampled; the model must never see NaN or Inf. Untouched samples were
        # checked above.
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


def allocate_once(allocate: Allocate) -> Allocate:
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
