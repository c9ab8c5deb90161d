"""Encoded audio (bytes or a path) -> mono float32 samples at 16 kHz.

- `read`: input checks and the chain: dr_flac for FLAC, then soundfile, then PyAV, each result
  checked against the length its header declares;
- `dr_flac`, `libsndfile`, `pyav`: one module per decoder;
- `mono`: channels averaged, integer formats scaled to [-1, 1], other rates resampled with soxr
  (HQ), the samples copied into caller memory when asked (`allocate`);
- `base`: the shared types and errors.

Pure functions: they run in decoder worker processes. Every failure is an `AudioDecodeError`
whose message names the problem and the fix; the caller turns it into an error record.
"""

from __future__ import annotations

from batchscribe.audio.decode.base import AudioDecodeError, DecodedAudio
from batchscribe.audio.decode.read import audio_duration, decode_audio, read_audio
from batchscribe.audio.ram_dir import RAM_DIR

__all__ = ["RAM_DIR", "AudioDecodeError", "DecodedAudio", "audio_duration", "decode_audio", "read_audio"]
