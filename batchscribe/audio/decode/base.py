"""Types every decoder shares: the input and `allocate` types, the result, and the errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

AudioInput = bytes | bytearray | memoryview | str | os.PathLike
# n_samples -> a writable, C-contiguous [n_samples] float32 array for the samples (caller memory).
Allocate = Callable[[int], np.ndarray]
DecoderName = Literal["dr_flac", "soundfile", "pyav"]


class AudioDecodeError(ValueError):
    """Audio that cannot be turned into samples; the message names the problem and the fix."""


def count_nonfinite(samples: np.ndarray) -> int:
    """NaN and Inf values in `samples` (any shape). One BLAS pass in the common case, since NaN
    and Inf carry through a sum of squares; the values are counted only when that sum is not
    finite, which loud float audio (finite, but squares past float32's range) can also cause."""
    flat = samples.reshape(-1)
    if not flat.size or np.isfinite(np.dot(flat, flat)):
        return 0
    return int(flat.size - np.count_nonzero(np.isfinite(flat)))


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # [n_samples] float32, mono, at sample_rate; caller memory with `allocate`
    sample_rate: int
    source_rate: int  # the file's own rate before resampling
    channels: int  # the file's channel count before averaging
    decoder: DecoderName


class DecoderFailed(Exception):
    """One decoder could not read the input; `declared_frames` when the header was understood."""

    def __init__(self, message: str, declared_frames: int | None = None) -> None:
        super().__init__(message)
        self.declared_frames = declared_frames


def short_message(exc: BaseException) -> str:
    """An exception as one line without the opaque object reprs soundfile puts in its messages."""
    text = str(exc).replace("\n", " ").strip() or type(exc).__name__
    if text.startswith("Error opening "):  # "Error opening <_io.BytesIO object at 0x..>: <reason>"
        text = text.split(">: ", 1)[-1] if ">: " in text else text.split(": ", 1)[-1]
    return text
