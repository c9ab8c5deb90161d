"""What a caller hands the Python API -> mono float32 samples at 16 kHz, or an error naming the fix.

`Transcriber.transcribe` takes file paths, encoded bytes and sample arrays. Paths and bytes carry
their own rate and go through the pipeline's decoder (`decode.read_audio`); an array carries
nothing, so its rate must be given, and only a 1-D float array is taken as mono audio: a stereo
array read as mono gives one empty record per sample frame, and a 44.1 kHz array read as 16 kHz
gives nonsense, both without any error (issue 19).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import soxr

from batchscribe.audio.decode.base import AudioDecodeError, count_nonfinite
from batchscribe.audio.decode.read import decode_audio
from batchscribe.constants import SAMPLE_RATE

ENCODED = (str, os.PathLike, bytes, bytearray, memoryview)
AudioLike = str | os.PathLike | bytes | bytearray | memoryview | np.ndarray


def is_audio(value: object) -> bool:
    """One item's audio (a path, bytes or an array), as opposed to a list of items or an (id, audio) pair."""
    return isinstance(value, ENCODED) or (isinstance(value, np.ndarray) and value.ndim != 0)


def mapping_hint(value: Mapping) -> str:
    """Why a dict is not audio, and what to pass instead. NOTE: iterated as a list of items, a
    Hugging Face audio cell {"array", "sampling_rate", "path"} became three missing files."""
    if "array" in value:
        return ("is a dict with 'array' (a Hugging Face datasets audio cell); pass its samples and rate: "
                "transcribe(audio['array'], sample_rate=audio['sampling_rate'])")
    return "is a dict; pass a list of (id, item) pairs instead, e.g. list(items.items())"


def item_label(value: object, index: int) -> str:
    """The id an item without one gets: a path as given, else its position in the list."""
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) else str(index)


def prepare_audio(item_id: str, audio: object, sample_rate: int | None) -> np.ndarray:
    """One item's audio -> [n_samples] float32 mono at 16 kHz.

    Paths and bytes are decoded (their own rate; `sample_rate` is not needed). An array must be
    1-D float audio at `sample_rate` Hz; it is resampled with soxr (HQ) as the pipeline's decoder
    resamples files.
    """
    if isinstance(audio, ENCODED):
        try:
            return decode_audio(audio)
        except AudioDecodeError as exc:
            raise AudioDecodeError(f"audio for {item_id!r}: {exc}") from None
    if isinstance(audio, Mapping):
        raise TypeError(f"audio for {item_id!r} {mapping_hint(audio)}")
    if not isinstance(audio, np.ndarray):
        raise TypeError(
            f"audio for {item_id!r} is a {type(audio).__name__}; pass a file path, encoded bytes or a "
            "numpy array of samples (e.g. np.asarray(x, dtype=np.float32))"
        )
    check_array(item_id, audio)
    check_rate(sample_rate, item_id)
    check_finite(item_id, audio)
    samples = np.ascontiguousarray(audio, dtype=np.float32)
    if sample_rate != SAMPLE_RATE and samples.size:
        samples = soxr.resample(samples, int(sample_rate), SAMPLE_RATE, quality="HQ").astype(np.float32, copy=False)
    return samples


def check_rate(sample_rate: object, item_id: str | None = None) -> None:
    """Refuse an array (`item_id`'s) without a rate, or a rate that is not a positive whole number of Hz."""
    if sample_rate is None:
        whose = "arrays have" if item_id is None else f"audio for {item_id!r} is an array with"
        raise ValueError(
            f"{whose} no sample rate; pass sample_rate=... (the rate it was read at, e.g. "
            "audio, sr = soundfile.read(path); transcribe(audio, sample_rate=sr))"
        )
    if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise ValueError(f"sample_rate={sample_rate!r} must be a positive whole number of Hz, e.g. 16000")


def check_finite(item_id: str, audio: np.ndarray) -> None:
    """Refuse NaN or Inf samples (the model would turn them into a confident nonsense transcript).
    A data error, not a usage one: AudioDecodeError, which a stream makes the item's error record.
    One BLAS pass in the common case (count_nonfinite)."""
    bad = count_nonfinite(audio)
    if bad:
        raise AudioDecodeError(f"audio for {item_id!r} has {bad} NaN or Inf samples; replace them, "
                               "e.g. np.nan_to_num(audio)")  # fmt: skip


def check_array(item_id: str, audio: np.ndarray) -> None:
    """Refuse what is not 1-D float audio, saying how to make it so. O(1): no pass over the samples."""
    if audio.ndim != 1:
        # Channels are the short axis: (n, 2) from soundfile, (2, n) from torchaudio/librosa.
        axis = int(np.argmin(audio.shape)) if audio.ndim == 2 else None
        fix = f"pass audio.mean(axis={axis})" if axis is not None else "pass one channel of samples as a 1-D array"
        raise ValueError(f"audio for {item_id!r} has shape {audio.shape}: batchscribe takes mono audio; {fix}")
    if not np.issubdtype(audio.dtype, np.floating):
        if np.issubdtype(audio.dtype, np.integer):
            scale = float(np.iinfo(audio.dtype).max) + 1
            fix = f"pass audio.astype(np.float32) / {scale:.0f} (samples in [-1, 1])"
        else:
            fix = "pass float32 samples in [-1, 1]"
        raise ValueError(f"audio for {item_id!r} has dtype {audio.dtype}: batchscribe takes float audio; {fix}")
