"""Voice activity: which stretches of an item hold speech (`--vad`), as faster-whisper's batched
pipeline finds them: Silero VAD's speech timestamps, merged into chunks of at most 30 s. Silero's
probabilities are computed for a batch of items at once (`SpeechDetector.detect`), and its
`get_speech_timestamps` rules applied to each item on the host (`vad_spans`).

As there, the silence is cut out (between chunks and within them: a window spanning 20 s of silence
lets Whisper's timestamps drift across it), the speech is joined, each chunk is a clip that no
window crosses (openai transcribe()'s clip_timestamps), and `SpeechMap` maps the decoded times back
to the item's own timeline. silero-vad is an optional extra (`pip install 'batchscribe[vad]'`); it
is imported only when a detector is built.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchscribe.audio.vad_model import SequenceScorer, stepwise
from batchscribe.audio.vad_spans import SpanRules, speech_spans
from batchscribe.config import require_vad
from batchscribe.constants import SAMPLE_RATE

log = logging.getLogger(__name__)

MAX_CHUNK_SECONDS = 30.0  # one Whisper window
# Items per call of the fixed-shape scorer (`invariant`): the LSTM steps all of them, so the GPU's
# latency-bound steps take a whole stage batch at once, while the CPU pays for each padding row.
INVARIANT_ITEMS = {"cuda": 64, "cpu": 4}
# faster-whisper BatchedInferencePipeline's VAD settings: chunks up to a window, 160 ms of silence
# splits speech, 400 ms of padding keeps word onsets and tails.
MIN_SILENCE_MS, SPEECH_PAD_MS, THRESHOLD = 160, 400, 0.5
RULES = SpanRules.silero(threshold=THRESHOLD, max_speech_s=MAX_CHUNK_SECONDS, min_silence_ms=MIN_SILENCE_MS,
                         speech_pad_ms=SPEECH_PAD_MS, rate=SAMPLE_RATE)  # fmt: skip


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


@dataclass(frozen=True)
class Speech:
    """An item's speech: (start, end) sample spans, padded and merged where they overlap, and the
    chunks they form (merge_spans); `error`: why detection failed (then both are empty)."""

    spans: tuple[tuple[int, int], ...]
    chunks: tuple[tuple[int, int], ...]
    error: str | None = None


def _item_speech(probs: np.ndarray, n_samples: int) -> Speech:
    """One item's probabilities ([ceil(n_samples / 512)] float32) -> its Speech."""
    if not np.isfinite(probs).all():
        return Speech((), (), "voice activity detection (--vad) found non-finite speech probabilities: "
                              "the audio holds NaN or infinite samples; pass finite samples in [-1, 1]")  # fmt: skip
    spans: list[tuple[int, int]] = []
    for s, e in speech_spans(probs, n_samples, RULES):
        e = min(e, n_samples)
        if spans and s <= spans[-1][1]:  # padding made them overlap: one span
            spans[-1] = (spans[-1][0], max(e, spans[-1][1]))
        elif e > s:
            spans.append((s, e))
    return Speech(tuple(spans), tuple(merge_spans(spans, int(MAX_CHUNK_SECONDS * SAMPLE_RATE))))


def length_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Item indices for each call of the model, longest first: a call takes items down to half its
    longest, so padding at most doubles an item's steps (the model steps every row to the end)."""
    groups: list[list[int]] = []
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        if groups and 2 * lengths[k] >= lengths[groups[-1][0]]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


class SpeechDetector:
    """Silero VAD, loaded once (its model ships in the wheel) on `device`, scoring several items
    at once (vad_model.py): by default its encoder over every chunk at once and its LSTM over
    whole sequences (`sequence`), else (`sequence=False`, or a model whose parts are not the
    expected ones) its own `audio_forward` over the items as rows of one batch. Either way an
    item's probabilities equal get_speech_timestamps's up to float rounding (tests/audio/test_vad.py).
    `invariant` (`--batch-invariant`): an item's probabilities are the same bits whichever items
    share its call (the sequence path at fixed shapes; audio_forward one item a call).
    One lock: the model object holds the stepwise path's state between its chunk steps."""

    def __init__(self, device: str | Any = "cpu", sequence: bool = True, invariant: bool = False) -> None:
        require_vad()
        import torch
        from silero_vad import load_silero_vad

        self.device = torch.device(device)
        model = load_silero_vad()  # on the CPU
        fits = sequence and SequenceScorer.fits(model)
        self._model = model.to(self.device)
        self._lock = threading.Lock()
        # On CUDA its own stream, so the engine's work on the default stream does not wait for it.
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        rows = INVARIANT_ITEMS.get(self.device.type, 1) if invariant else None
        self._sequence = SequenceScorer(self._model, self.device, rows) if fits else None
        self.invariant = invariant
        if sequence and not fits:
            log.warning("this silero-vad model's parts are not the ones batchscribe scores all at once; "
                        "--vad uses its audio_forward, chunk step by chunk step (slower)")  # fmt: skip

    def _on_stream(self) -> Any:
        import torch

        return contextlib.nullcontext() if self._stream is None else torch.cuda.stream(self._stream)

    def probabilities(self, audios: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each item's speech probability per 512-sample chunk ([ceil(n / 512)] float32, host), as
        get_speech_timestamps scores it (a last partial chunk zero-padded, state from zero), in one
        pass over the items (stepwise: padded to the longest)."""
        import torch

        if not audios:
            return []
        with self._lock, self._on_stream(), torch.inference_mode():
            if self._sequence is not None:
                return self._sequence(audios)
            if self.invariant:  # audio_forward alone per item: its own shape
                return [stepwise(self._model, [a], self.device)[0] for a in audios]
            return stepwise(self._model, audios, self.device)

    def detect(self, audios: Sequence[np.ndarray]) -> list[Speech]:
        """Every item's Speech, in order, scored in one call of the model per `length_groups` group
        (an item with non-finite probabilities gets an error; the others are unaffected: rows are
        independent)."""
        found: list[Speech] = [Speech((), ())] * len(audios)
        for group in length_groups([len(a) for a in audios]):
            for k, probs in zip(group, self.probabilities([audios[k] for k in group])):
                found[k] = _item_speech(probs, len(audios[k]))
        return found
