"""Whisper's log-mel spectrogram, batched, in torch (CPU or GPU).

Recipe as openai/whisper `log_mel_spectrogram` and transformers' `WhisperFeatureExtractor`:
centred reflect-padded STFT (n_fft 400, hop 160, periodic Hann), last frame dropped, power
spectrum, Slaney mel filter bank (0-8000 Hz), log10 clamped at 1e-10, floor at the example's
maximum minus 8, then (x + 4) / 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from batchscribe.constants import HOP_LENGTH, N_FFT, N_SAMPLES, SAMPLE_RATE

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)

SUPPORTED_N_MELS = (80, 128)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    min_log_hz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    linear = 3.0 * hz / 200.0
    log = min_log_mel + np.log(np.maximum(hz, min_log_hz) / min_log_hz) / logstep
    return np.where(hz >= min_log_hz, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    min_log_hz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    linear = 200.0 * mel / 3.0
    log = min_log_hz * np.exp(logstep * (np.maximum(mel, min_log_mel) - min_log_mel))
    return np.where(mel >= min_log_mel, log, linear)


def mel_filter_bank(n_mels: int, *, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Triangular Slaney-scale filters with Slaney area normalisation, 0 Hz to Nyquist.

    Returns float32 [n_mels, n_fft // 2 + 1], the layout of whisper's mel_filters.npz.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)  # [n_freq]
    edges_mel = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2)
    edges_hz = _mel_to_hz(edges_mel)  # [n_mels + 2]: lower edge, centre, upper edge per filter
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (fft_hz[None, :] - lower) / (centre - lower)
    falling = (upper - fft_hz[None, :]) / (upper - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling))  # [n_mels, n_freq]
    # Slaney normalisation: each triangle has unit area in Hz, so energy per band is comparable.
    weights *= (2.0 / (upper - lower))
    return weights.astype(np.float32)


def pad_or_trim(audio: ArrayT, length: int = N_SAMPLES) -> ArrayT:
    """Zero-pad or cut the last axis to `length` samples (numpy or torch, any leading shape)."""
    n = audio.shape[-1]
    if n > length:
        return audio[..., :length]
    if n == length:
        return audio
    if isinstance(audio, torch.Tensor):
        return torch.nn.functional.pad(audio, (0, length - n))
    widths = [(0, 0)] * (audio.ndim - 1) + [(0, length - n)]
    return np.pad(audio, widths)


def pad_batch(
    arrays: Sequence[np.ndarray], length: int = N_SAMPLES, *, pin_memory: bool = False
) -> torch.Tensor:
    """Stack variable-length 1-D float arrays into a zero-padded float32 batch [B, length].

    Raises ValueError for an array that is not 1-D or is longer than `length`: a window longer
    than 30 s must be cut by the caller (the seek loop), never silently here.
    """
    batch = torch.zeros((len(arrays), length), dtype=torch.float32, pin_memory=pin_memory)
    for row, audio in enumerate(arrays):
        if audio.ndim != 1:
            raise ValueError(f"pad_batch: item {row} has shape {audio.shape}; pass mono 1-D arrays")
        if audio.shape[0] > length:
            raise ValueError(
                f"pad_batch: item {row} has {audio.shape[0]} samples, more than {length}; "
                "cut it into windows first (or call pad_or_trim)"
            )
        batch[row, : audio.shape[0]] = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    return batch


class LogMel:
    """Log-mel features for batches of 30 s windows; window and filters live on `device`."""

    def __init__(self, n_mels: int = 80, device: str | torch.device = "cpu") -> None:
        if n_mels not in SUPPORTED_N_MELS:
            raise ValueError(f"n_mels={n_mels} is not a Whisper feature size; use one of {SUPPORTED_N_MELS}")
        self.n_mels = n_mels
        self.device = torch.device(device)
        self.window = torch.hann_window(N_FFT, device=self.device)  # [400], periodic, as torch.stft expects
        self.filters = torch.from_numpy(mel_filter_bank(n_mels)).to(self.device)  # [n_mels, 201]

    def _log_mel(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, N] float32 on self.device -> unfloored log10 mel [B, n_mels, N // 160]."""
        stft = torch.stft(
            audio, N_FFT, HOP_LENGTH, window=self.window, center=True, pad_mode="reflect", return_complex=True
        )  # [B, 201, N // 160 + 1]
        # Whisper drops the last frame so 480000 samples give exactly 3000 frames.
        power = stft[..., :-1].abs().square()  # [B, 201, frames]
        # NOTE: on CUDA this matmul follows torch.backends.cuda.matmul TF32 settings; TF32
        # (off by default) would add ~1e-4 error on the log scale.
        mel = torch.matmul(self.filters, power)  # [B, n_mels, frames]
        return mel.clamp_min(1e-10).log10()

    def __call__(self, audio: torch.Tensor | np.ndarray) -> torch.Tensor:
        """audio [B, N_SAMPLES] float32 (any device) -> log-mel [B, n_mels, N_FRAMES] on self.device."""
        audio = torch.as_tensor(audio).to(self.device, torch.float32, non_blocking=True)
        if audio.ndim != 2 or audio.shape[1] != N_SAMPLES:
            raise ValueError(
                f"LogMel expects a batch [B, {N_SAMPLES}]; got shape {tuple(audio.shape)}. "
                "Build it with pad_batch() or pad_or_trim()"
            )
        log_spec = self._log_mel(audio)  # [B, n_mels, N_FRAMES]
        # Each row is floored against its own maximum: rows in a batch must not influence each other.
        row_max = log_spec.amax(dim=(1, 2), keepdim=True)  # [B, 1, 1]
        log_spec = torch.maximum(log_spec, row_max - 8.0)
        return (log_spec + 4.0) / 4.0

    def whole(self, audio: torch.Tensor | np.ndarray, padding: int = 0) -> torch.Tensor:
        """Log-mel of one whole recording [N] -> [n_mels, (N + padding) // 160].

        Same as openai `whisper.log_mel_spectrogram(audio, n_mels, padding)`: one STFT over the
        whole file and one maximum for the floor, which is what openai transcribe() slices its
        30 s windows from (their edges and floor differ slightly from per-window features).
        """
        audio = torch.as_tensor(audio).to(self.device, torch.float32)
        if audio.ndim != 1:
            raise ValueError(f"LogMel.whole expects mono 1-D audio; got shape {tuple(audio.shape)}")
        if padding > 0:
            audio = torch.nn.functional.pad(audio, (0, padding))
        log_spec = self._log_mel(audio[None])[0]  # [n_mels, frames]
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0


__all__ = ["LogMel", "mel_filter_bank", "pad_batch", "pad_or_trim"]
