"""Voice activity: which stretches of an item hold speech (`--vad`), as faster-whisper's batched
pipeline finds them: Silero VAD's speech timestamps, merged into chunks of at most 30 s.

As there, the silence is cut out (between chunks and within them: a window spanning 20 s of silence
lets Whisper's timestamps drift across it), the speech is joined, each chunk is a clip that no
window crosses (openai transcribe()'s clip_timestamps), and `SpeechMap` maps the decoded times back
to the item's own timeline. silero-vad is an optional extra (`pip install 'batchscribe[vad]'`); it
is imported only when a detector is built.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from batchscribe.config import require_vad
from batchscribe.constants import SAMPLE_RATE

MAX_CHUNK_SECONDS = 30.0  # one Whisper window
# faster-whisper BatchedInferencePipeline's VAD settings: chunks up to a window, 160 ms of silence
# splits speech, 400 ms of padding keeps word onsets and tails.
MIN_SILENCE_MS, SPEECH_PAD_MS, THRESHOLD = 160, 400, 0.5


def merge_spans(spans: list[tuple[int, int]], max_samples: int) -> list[tuple[int, int]]:
    """Speech spans (samples) -> chunks of consecutive spans no longer than `max_samples` from the
    first start to the last end (faster-whisper's merge_segments; a longer single span stays whole,
    and the windows within it are planned as usual)."""
    if not spans:
        return []
    merged, start, end = [], spans[0][0], spans[0][0]
    for s, e in spans:
        if e - start > max_samples and end > start:
            merged.append((start, end))
            start = s
        end = e
    merged.append((start, end))
    return merged


@dataclass(frozen=True)
class SpeechMap:
    """Where the joined speech came from: span k of the joined audio starts at `joined[k]` seconds
    and came from `original[k]` seconds of the item, for `lengths[k]` seconds."""

    joined: np.ndarray  # [K] float64 seconds, increasing
    original: np.ndarray  # [K] float64 seconds
    lengths: np.ndarray  # [K] float64 seconds

    def to_original(self, t: float, is_end: bool = False) -> float:
        """A joined-audio time on the item's timeline. A time on the seam of two spans is the
        later span's start, or (`is_end`) the earlier span's end: nothing is timed in the cut."""
        k = int(np.searchsorted(self.joined, t, side="left" if is_end else "right")) - 1
        k = max(k, 0)
        return float(self.original[k] + min(max(t - self.joined[k], 0.0), self.lengths[k]))


def join_speech(audio: np.ndarray, spans: list[tuple[int, int]], chunks: list[tuple[int, int]]) -> tuple[np.ndarray, list[tuple[int, int]], SpeechMap]:
    """The speech spans (samples) joined, the chunks as (start, end) samples of the joined audio, and
    the map back. Each chunk is a run of consecutive spans, so it is contiguous once joined."""
    lengths = np.array([e - s for s, e in spans], dtype=np.int64)
    joined = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if spans else np.zeros(0, dtype=np.int64)
    where = {s: int(j) for (s, _), j in zip(spans, joined)}
    ends = {e: int(j + n) for (_, e), j, n in zip(spans, joined, lengths)}
    out = np.concatenate([audio[s:e] for s, e in spans]) if spans else audio[:0]
    clips = [(where[s], ends[e]) for s, e in chunks]
    rate = float(SAMPLE_RATE)
    starts = np.array([s for s, _ in spans], dtype=np.float64)
    return out, clips, SpeechMap(joined / rate, starts / rate, lengths / rate)


class SpeechDetector:
    """Silero VAD, loaded once (its model ships in the wheel); one lock: the model keeps state."""

    def __init__(self) -> None:
        require_vad()
        from silero_vad import get_speech_timestamps, load_silero_vad

        self._model, self._timestamps, self._lock = load_silero_vad(), get_speech_timestamps, threading.Lock()

    def speech(self, audio: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The item's speech spans and their chunks (at most 30 s each, see merge_spans), as
        (start, end) samples; padded spans that overlap are joined into one."""
        import torch

        with self._lock, torch.inference_mode():
            found = self._timestamps(torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)), self._model,
                                     threshold=THRESHOLD, sampling_rate=SAMPLE_RATE,
                                     min_silence_duration_ms=MIN_SILENCE_MS, speech_pad_ms=SPEECH_PAD_MS,
                                     max_speech_duration_s=MAX_CHUNK_SECONDS)  # fmt: skip
        spans: list[tuple[int, int]] = []
        for t in found:
            s, e = int(t["start"]), min(int(t["end"]), len(audio))
            if spans and s <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(e, spans[-1][1]))
            elif e > s:
                spans.append((s, e))
        return spans, merge_spans(spans, int(MAX_CHUNK_SECONDS * SAMPLE_RATE))
