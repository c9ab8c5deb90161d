"""Test signals and their encodings (written with soundfile and PyAV, the independent references)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import soxr

# A core dependency, but the GPU machine's image lacks it: its modules skip there rather than fail to collect.
av = pytest.importorskip("av")

RATE = 16_000


def sine(rate: int, seconds: float, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


ONSET_S = 0.5  # the test signal: silence, then a 440 Hz tone from 0.5 s to the end


def encode_with_pyav(container_format: str, codec: str, rate: int, seconds: float = 1.5) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        wave = sine(rate, seconds)
        wave[: int(ONSET_S * rate)] = 0.0
        frame = av.AudioFrame.from_ndarray(np.stack([wave, wave]), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def wav_bytes(samples: np.ndarray, rate: int, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def flac_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="FLAC", subtype=subtype)
    return buf.getvalue()


def noisy_tones(rate: int, channels: int, seconds: float = 1.3) -> np.ndarray:
    """[frames, channels] float32: a different tone per channel plus noise, so every bit varies."""
    rng = np.random.default_rng(rate + channels)
    tones = [sine(rate, seconds, freq=220.0 * (c + 1), amp=0.4) for c in range(channels)]
    noise = 0.2 * rng.standard_normal((tones[0].size, channels))
    return np.clip(np.stack(tones, axis=1) + noise, -1.0, 1.0).astype(np.float32)


def soundfile_reference(data: bytes) -> np.ndarray:
    """libsndfile's float32 samples, channels averaged in float32, soxr HQ to 16 kHz."""
    frames, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0]
    if rate != RATE:
        mono = soxr.resample(np.ascontiguousarray(mono), rate, RATE, quality="HQ").astype(np.float32)
    return mono
